package policy

import (
	"regexp"
	"testing"
)

// simpleKey agrees with the expression it replaces on keys of every kind.
func TestSimpleKeyMatchesExpression(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	for _, k := range []string{"", "a", "Z9", "run_id", "gpu-type", "a.b", "a b", "é", "a/b", "-", "_", "a\n", "[x]", "0"} {
		if got, want := simpleKey(k), re.MatchString(k); got != want {
			t.Errorf("simpleKey(%q) = %v, want %v", k, got, want)
		}
	}
}
