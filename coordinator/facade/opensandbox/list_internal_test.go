package opensandbox

import (
	"encoding/json"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	osb "github.com/tetherfleet/tether/protocol/opensandbox"
)

func TestPagingParams(t *testing.T) {
	tests := []struct {
		query        string
		page, size   int
		wantIssueFor []string // loc[1] of each issue
		wantTypes    []string
	}{
		{query: "", page: 1, size: osb.DefaultPageSize},
		{query: "page=3&pageSize=200", page: 3, size: 200},
		{query: "pageSize=201", wantIssueFor: []string{"pageSize"}, wantTypes: []string{"less_than_equal"}},
		{query: "page=0", wantIssueFor: []string{"page"}, wantTypes: []string{"greater_than_equal"}},
		{query: "page=abc&pageSize=0", wantIssueFor: []string{"page", "pageSize"}, wantTypes: []string{"int_parsing", "greater_than_equal"}},
		{query: "page=1&page=2", page: 2, size: osb.DefaultPageSize},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			q, err := url.ParseQuery(tt.query)
			if err != nil {
				t.Fatal(err)
			}
			page, size, issues := pagingParams(q)
			var locs, types []string
			for _, is := range issues {
				locs = append(locs, is.Loc[1].(string))
				types = append(types, is.Type)
				if is.Loc[0] != "query" {
					t.Errorf("issue loc %v, want query first", is.Loc)
				}
			}
			if diff := cmp.Diff(tt.wantIssueFor, locs); diff != "" {
				t.Errorf("issues (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantTypes, types); diff != "" {
				t.Errorf("issue types (-want +got):\n%s", diff)
			}
			if len(issues) == 0 && (page != tt.page || size != tt.size) {
				t.Errorf("page, size = %d, %d; want %d, %d", page, size, tt.page, tt.size)
			}
		})
	}
}

func TestFilterQuery(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"page=2&pageSize=5", ""},
		{"metadata=a%3D1%26broken&page=1", "metadata=a%3D1%26broken"},
		{"state=Running&state=Paused&metadata=nemo-gym.nvidia.com%2Frun%3Drun-123&pageSize=200", "state=Running&state=Paused&metadata=nemo-gym.nvidia.com%2Frun%3Drun-123"},
		{"%73tate=Pending", "%73tate=Pending"},
	}
	for _, tt := range tests {
		if got := filterQuery(tt.in); got != tt.want {
			t.Errorf("filterQuery(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestPageOf(t *testing.T) {
	var items []listItem
	for i := range 5 {
		items = append(items, listItem{id: strconv.Itoa(i), createdAt: time.Unix(int64(i), 0), raw: json.RawMessage(`"` + strconv.Itoa(i) + `"`)})
	}
	tests := []struct {
		n, page, size int
		want          string
	}{
		{0, 1, 20, `{"items":[],"pagination":{"page":1,"pageSize":20,"totalItems":0,"totalPages":0,"hasNextPage":false}}`},
		{5, 1, 2, `{"items":["0","1"],"pagination":{"page":1,"pageSize":2,"totalItems":5,"totalPages":3,"hasNextPage":true}}`},
		{5, 3, 2, `{"items":["4"],"pagination":{"page":3,"pageSize":2,"totalItems":5,"totalPages":3,"hasNextPage":false}}`},
		{5, 4, 2, `{"items":[],"pagination":{"page":4,"pageSize":2,"totalItems":5,"totalPages":3,"hasNextPage":false}}`},
		{5, 1 << 62, 200, `{"items":[],"pagination":{"page":4611686018427387904,"pageSize":200,"totalItems":5,"totalPages":1,"hasNextPage":false}}`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(pageOf(items[:tt.n], tt.page, tt.size))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tt.want {
			t.Errorf("pageOf(%d items, page %d, size %d) =\n%s\nwant\n%s", tt.n, tt.page, tt.size, b, tt.want)
		}
	}
}
