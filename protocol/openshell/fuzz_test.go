package openshell_test

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol/openshell"
)

// FuzzParseLabelSelector checks that the selector parser never panics, that
// everything it accepts is within its limits and valid label syntax, and
// that re-joining an accepted selector parses to the same map. Its seed
// corpus runs as an ordinary test.
func FuzzParseLabelSelector(f *testing.F) {
	for _, s := range []string{
		"", "nemo-gym.sandbox=1, team = a ,", "team", "=a", "a==b", "a!=b", "team=",
		"a=1,a=2", "nemo-gym.nvidia.com/run=r1", "Team/x=a", ",,,", "a=b,c", "ü=ß",
		strings.Repeat("a=1,", 65),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := openshell.ParseLabelSelector(s)
		if err != nil {
			return
		}
		if len(sel) > openshell.MaxSelectorPairs {
			t.Fatalf("accepted %d pairs", len(sel))
		}
		if err := openshell.ValidateLabels(sel); err != nil {
			t.Fatalf("accepted invalid labels: %v", err)
		}
		if !openshell.MatchLabels(sel, sel) {
			t.Fatal("selector does not match its own labels")
		}
		var parts []string
		for k, v := range sel {
			parts = append(parts, k+"="+v)
		}
		again, err := openshell.ParseLabelSelector(strings.Join(parts, ","))
		if err != nil || len(again) != len(sel) {
			t.Fatalf("re-parse of %q: %v, %v", parts, again, err)
		}
		for k, v := range sel {
			if again[k] != v {
				t.Fatalf("re-parse changed %q: %q -> %q", k, v, again[k])
			}
		}
	})
}
