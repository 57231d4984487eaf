package coordinator

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// TestCopyRoots: the roots a copy goes to the node with are the granting
// rule's prefixes, clean, without those another one covers, the one
// holding the path first; none when no prefix holds it; bounded.
func TestCopyRoots(t *testing.T) {
	for _, tt := range []struct {
		paths []string
		path  string
		want  string
	}{
		{[]string{"/tmp/f10/pub"}, "/tmp/f10/pub/e2/secret", "/tmp/f10/pub"},
		{[]string{"/a", "/b/c", "/b"}, "/b/c/x", "/b,/a"},
		{[]string{"/srv/app/", "/srv/app/logs"}, "/srv/app/logs/x", "/srv/app"},
		{[]string{"/"}, "/etc/x", "/"},
		{[]string{"/srv/app"}, "/srv/application", ""},
		{[]string{"/srv/app"}, "/srv/app/../../etc", ""},
	} {
		if got := strings.Join(copyRoots(tt.paths, tt.path), ","); got != tt.want {
			t.Errorf("copyRoots(%q, %q) = %q, want %q", tt.paths, tt.path, got, tt.want)
		}
	}
	var many []string
	for i := range 3 * protocol.MaxCopyRoots {
		many = append(many, "/r/"+strings.Repeat("x", i+1))
	}
	got := copyRoots(many, many[len(many)-1]+"/f")
	if len(got) != protocol.MaxCopyRoots || got[0] != many[len(many)-1] {
		t.Errorf("copyRoots of %d prefixes: %d roots, first %q; want %d, the one holding the path first", len(many), len(got), got[0], protocol.MaxCopyRoots)
	}
	p := protocol.CopyParams{Direction: protocol.CopyPull, Path: "/r/f", Roots: got}
	if err := p.Validate(); err != nil {
		t.Errorf("the bounded roots do not validate: %v", err)
	}
}
