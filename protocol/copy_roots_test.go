package protocol

import (
	"strings"
	"testing"
)

// TestCopyParamsRoots: roots are absolute, clean, without NUL, and at most
// MaxCopyRoots; they survive encoding.
func TestCopyParamsRoots(t *testing.T) {
	ok := CopyParams{Direction: CopyPull, Path: "/srv/app/x", Roots: []string{"/srv/app", "/"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("good roots: %v", err)
	}
	b, err := ok.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var back CopyParams
	if err := back.UnmarshalJSON(b); err != nil || strings.Join(back.Roots, ",") != "/srv/app,/" {
		t.Fatalf("roots after a round trip: %q, %v (%s)", back.Roots, err, b)
	}
	many := make([]string, MaxCopyRoots+1)
	for i := range many {
		many[i] = "/r"
	}
	for _, tt := range []struct {
		roots []string
		want  string
	}{
		{[]string{"srv"}, "roots[0]"},
		{[]string{"/srv/"}, "roots[0]"},
		{[]string{"/ok", "/srv/../etc"}, "roots[1]"},
		{[]string{"/a\x00b"}, "roots[0]"},
		{many, "at most 64"},
	} {
		p := CopyParams{Direction: CopyPull, Path: "/x", Roots: tt.roots}
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("roots %q: %v, want an error naming %q", tt.roots, err, tt.want)
		}
	}
}
