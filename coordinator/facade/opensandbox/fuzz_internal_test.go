package opensandbox

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	osb "github.com/tetherfleet/tether/protocol/opensandbox"
)

// FuzzEndpointRewrite rewrites a node's answer to GET .../endpoints/{port}
// (rewriteEndpointBody) as the facade does: the result is a JSON object
// whose endpoint is the facade's proxy route, byte for byte (no HTML
// escaping of the caller's Host), and whose every other field is the
// node's, compacted but otherwise verbatim.
func FuzzEndpointRewrite(f *testing.F) {
	f.Add([]byte(`{"endpoint":"10.0.0.5:8080/x","headers":{"X-Token":"a<b>&c"}}`), "facade.example:9000", "sb-1", uint16(44772))
	f.Add([]byte(`{"endpoint":null}`), "h<&>", "id", uint16(1))
	f.Add([]byte(`[]`), "h", "id", uint16(80))
	f.Add([]byte(`null`), "h", "id", uint16(80))
	f.Add([]byte(`{"a":1,"a":2," \u003c ":"\u0026"}`), "h", "id", uint16(65535))
	f.Fuzz(func(t *testing.T, body []byte, host, id string, port uint16) {
		if port == 0 || !strings.Contains(osb.ProxyEndpoint(host, id, int(port)), "/proxy/") {
			return
		}
		ep := osb.ProxyEndpoint(host, id, int(port))
		out, err := rewriteEndpointBody(body, ep)
		var in map[string]json.RawMessage
		inErr := json.Unmarshal(body, &in)
		if err != nil {
			if inErr == nil && in != nil {
				t.Fatalf("%q: refused a JSON object: %v", body, err)
			}
			return
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%q → %q: not JSON: %v", body, out, err)
		}
		var gotEP string
		var wantEP string // invalid UTF-8 becomes U+FFFD in JSON, byte by byte
		wb, _ := json.Marshal(ep)
		json.Unmarshal(wb, &wantEP)
		if err := json.Unmarshal(got["endpoint"], &gotEP); err != nil || gotEP != wantEP {
			t.Fatalf("%q → endpoint %s, want %q (%v)", body, got["endpoint"], ep, err)
		}
		if utf8Valid(ep) && bytes.Contains(out, []byte(`\u003c`)) && !bytes.Contains(body, []byte(`\u003c`)) {
			t.Fatalf("%q → %q: '<' escaped", body, out)
		}
		for k, v := range in {
			if k == "endpoint" {
				continue
			}
			var want bytes.Buffer
			if err := json.Compact(&want, v); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[k], want.Bytes()) {
				t.Fatalf("%q → %q: field %q changed from %s to %s", body, out, k, want.Bytes(), got[k])
			}
		}
		if len(got) != len(in)+btoi(in["endpoint"] == nil) {
			t.Fatalf("%q → %q: fields added or lost", body, out)
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }

// FuzzLocationRewrite points a node's Location header at the facade
// (rewriteLocation): an absolute URL keeps its path, query and fragment and
// gets the facade's host (and, for http(s), scheme); anything else is left
// as the node sent it.
func FuzzLocationRewrite(f *testing.F) {
	for _, s := range []string{"http://10.0.0.5:8080/v1/sandboxes/x?y=1#z", "/v1/sandboxes/x", "", "https://u:p@h/%zz", "//h/p", "ws://h/p", "::"} {
		f.Add(s, "facade:9000", true)
	}
	f.Fuzz(func(t *testing.T, loc, host string, tls bool) {
		// host is the caller's Host header (or the configured external
		// host): one that makes a URL's authority, as the HTTP server
		// admits only such.
		if hu, err := url.Parse("http://" + host + "/"); host != "" && (err != nil || hu.Host != host) {
			return
		}
		st := &reqState{host: host, scheme: "http"}
		if tls {
			st.scheme = "https"
		}
		resp := &http.Response{Header: http.Header{}}
		if loc != "" {
			resp.Header["Location"] = []string{loc}
		}
		(&Facade{}).rewriteLocation(resp, st)
		got := resp.Header.Get("Location")
		u, err := url.Parse(loc)
		if err != nil || u.Host == "" || host == "" {
			if got != loc {
				t.Fatalf("Location %q rewritten to %q", loc, got)
			}
			return
		}
		g, err := url.Parse(got)
		if err != nil {
			t.Fatalf("Location %q rewritten to %q, which does not parse: %v", loc, got, err)
		}
		if g.EscapedPath() != u.EscapedPath() || g.RawQuery != u.RawQuery || g.Fragment != u.Fragment {
			t.Fatalf("Location %q rewritten to %q: path, query or fragment changed", loc, got)
		}
		if (u.Scheme == "http" || u.Scheme == "https") && g.Scheme != st.scheme {
			t.Fatalf("Location %q rewritten to %q: scheme %q, want %q", loc, got, g.Scheme, st.scheme)
		}
	})
}

// FuzzListQuery reads a caller's list query as the facade does: paging
// (pagingParams) is within the server's bounds or reported as issues, one
// per bad parameter, each naming its parameter and input; the filters
// passed on to nodes (filterQuery) are exactly the state and metadata
// segments of the query, as the caller encoded them.
func FuzzListQuery(f *testing.F) {
	for _, s := range []string{"", "page=2&pageSize=50&state=Running&metadata=a%3D1", "page=x&pageSize=0", "page=1&page=99999999999999999999",
		"%zz=1&state", "metadata=a=b&&state=Paused&pageSize=%20201", "st%61te=x;y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, _ := url.ParseQuery(raw)
		page, size, issues := pagingParams(q)
		for _, is := range issues {
			if len(is.Loc) != 2 || is.Loc[0] != "query" || (is.Loc[1] != "page" && is.Loc[1] != "pageSize") || is.Type == "" || is.Msg == "" {
				t.Fatalf("%q: malformed issue %+v", raw, is)
			}
		}
		if len(issues) > 2 {
			t.Fatalf("%q: %d issues for two parameters", raw, len(issues))
		}
		if len(issues) == 0 && (page < 1 || size < 1 || size > osb.MaxPageSize) {
			t.Fatalf("%q: page %d, pageSize %d accepted", raw, page, size)
		}
		fq := filterQuery(raw)
		if filterQuery(fq) != fq {
			t.Fatalf("%q: filters %q are not kept by a second filtering (%q)", raw, fq, filterQuery(fq))
		}
		segs := strings.Split(raw, "&")
		for seg := range strings.SplitSeq(fq, "&") {
			if fq == "" {
				break
			}
			k, _, _ := strings.Cut(seg, "=")
			key, err := url.QueryUnescape(k)
			if err != nil || key != "state" && key != "metadata" {
				t.Fatalf("%q: filters %q pass on %q", raw, fq, seg)
			}
			found := false
			for _, s := range segs {
				found = found || s == seg
			}
			if !found {
				t.Fatalf("%q: filters %q hold %q, not a segment of the query", raw, fq, seg)
			}
		}
	})
}

// TestEndpointRewriteKeepsFieldsVerbatim: the rewrite re-encoded the
// node's answer with json.Marshal, which escapes '<', '>' and '&' (a
// header value "a<b>&c" came back as "a\u003cb\u003e\u0026c").
func TestEndpointRewriteKeepsFieldsVerbatim(t *testing.T) {
	out, err := rewriteEndpointBody([]byte(`{"endpoint":"10.0.0.5:8080", "headers": {"Cookie":"a<b>&c"}}`), osb.ProxyEndpoint("127.0.0.1:9000", "sb-1", 8080))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"endpoint":"127.0.0.1:9000/sandboxes/sb-1/proxy/8080","headers":{"Cookie":"a<b>&c"}}`; string(out) != want {
		t.Errorf("rewritten to %s, want %s", out, want)
	}
}
