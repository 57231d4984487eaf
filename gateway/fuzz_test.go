package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/protocol/opensandbox"
)

// pagesTransport answers the i-th request with the i-th body of pages
// (the last one again once they run out): status 500 for a body that
// starts with '!', else 200.
type pagesTransport struct {
	pages [][]byte
	n     int
}

func (p *pagesTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	b := p.pages[min(p.n, len(p.pages)-1)]
	p.n++
	status := http.StatusOK
	if bytes.HasPrefix(b, []byte("!")) {
		status, b = http.StatusInternalServerError, b[1:]
	}
	return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(b)), Request: r}, nil
}

// FuzzOpenSandboxList serves arbitrary pages (NUL-separated bodies) as an
// OpenSandbox server's answers to the agent's listing (gateway.OpenSandbox
// List, which feeds the node's inventory): the listing ends after a
// bounded number of requests, however the pages claim more, and lists
// each sandbox once, matching the metadata filter.
func FuzzOpenSandboxList(f *testing.F) {
	page := func(ids []string, hasNext bool, total, pages int) string {
		var items []opensandbox.Sandbox
		for _, id := range ids {
			items = append(items, opensandbox.Sandbox{ID: id, Metadata: map[string]string{"team": "a"}})
		}
		b, _ := json.Marshal(opensandbox.ListSandboxesResponse{Items: items, Pagination: opensandbox.Pagination{HasNextPage: hasNext, TotalItems: total, TotalPages: pages}})
		return string(b)
	}
	f.Add(page([]string{"a", "b"}, false, 2, 1))
	f.Add(page([]string{"a"}, true, 2, 2) + "\x00" + page([]string{"b"}, false, 2, 2))
	f.Add(page([]string{"a"}, true, 1<<40, 1<<40))
	f.Add(page(nil, true, 5, 9))
	f.Add(`!{"code":"E","message":"boom"}`)
	f.Add(`{"items":[{"id":"x","metadata":{"team":"b"}}],"pagination":{"hasNextPage":true,"totalPages":99999999,"totalItems":1}}`)
	f.Fuzz(func(t *testing.T, data string) {
		tr := &pagesTransport{}
		for _, p := range strings.Split(data, "\x00") {
			tr.pages = append(tr.pages, []byte(p))
		}
		o := &gateway.OpenSandbox{HTTP: &http.Client{Transport: tr}, BaseURL: "http://osb.invalid", Metadata: map[string]string{"team": "a"}}
		out, _ := o.List(context.Background())
		if tr.n > 3*1001 {
			t.Fatalf("the listing took %d requests", tr.n)
		}
		seen := map[string]bool{}
		for _, sb := range out {
			if seen[sb.ID] {
				t.Fatalf("sandbox %q listed twice", sb.ID)
			}
			seen[sb.ID] = true
			if sb.Labels["team"] != "a" {
				t.Fatalf("sandbox %q listed against the filter: %v", sb.ID, sb.Labels)
			}
		}
	})
}

// TestOpenSandboxListEndsOnRepeatedPage: a server answering every page
// with the same items and "hasNextPage" kept the agent's listing going for
// as many pages as it claimed (2^40 here: for ever).
func TestOpenSandboxListEndsOnRepeatedPage(t *testing.T) {
	b, _ := json.Marshal(opensandbox.ListSandboxesResponse{Items: []opensandbox.Sandbox{{ID: "a"}},
		Pagination: opensandbox.Pagination{HasNextPage: true, TotalItems: 1 << 40, TotalPages: 1 << 40}})
	tr := &pagesTransport{pages: [][]byte{b}}
	o := &gateway.OpenSandbox{HTTP: &http.Client{Transport: tr}, BaseURL: "http://osb.invalid"}
	if _, err := o.List(context.Background()); err == nil || !strings.Contains(err.Error(), "earlier pages") {
		t.Errorf("List = %v, want an error about the repeated page", err)
	}
	if tr.n > 10 {
		t.Errorf("%d requests", tr.n)
	}
}
