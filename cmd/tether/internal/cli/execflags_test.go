package cli

import (
	"strings"
	"testing"
)

// exec's own flags are refused in the CLI's words (the flag, a 1-based
// byte as every other byte position it prints) before a request is sent:
// the API's check named its JSON field (idempotency_key) and a 0-based
// byte. A --env name given twice with two values is refused: the request
// is a map, so one of them was dropped without a word.
func TestExecFlagsRefusedInTheCLIsWords(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts execOptions
		want string
	}{
		{"key control char", execOptions{Node: "n1", IdempotencyKey: "ab\x1bc", IdempotencyKeyGiven: true}, `--idempotency-key: a control character '\x1b' at byte 3`},
		{"key not UTF-8", execOptions{Node: "n1", IdempotencyKey: "a\xffb", IdempotencyKeyGiven: true}, "--idempotency-key: not valid UTF-8 at byte 2"},
		{"key too long", execOptions{Node: "n1", IdempotencyKey: strings.Repeat("k", 1000), IdempotencyKeyGiven: true}, "--idempotency-key: 1000 bytes, at most"},
		{"env name with a space", execOptions{Node: "n1", Env: []string{"A B=2"}}, `--env: env name A B: character ' ' at byte 2`},
		{"env name with an escape", execOptions{Node: "n1", Env: []string{"X\x1b]0;T\a=1"}}, `character '\x1b' at byte 2`},
		{"env twice", execOptions{Node: "n1", Env: []string{"A=1", "B=2", "A=3"}}, `--env A is given twice, with different values`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.Validate([]string{"true"})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "idempotency_key") {
				t.Errorf("error names the API's JSON field: %v", err)
			}
		})
	}
	same := execOptions{Node: "n1", Env: []string{"A=1", "A=1"}}
	if err := same.Validate([]string{"true"}); err != nil {
		t.Errorf("--env A=1 twice (the same value) refused: %v", err)
	}
}
