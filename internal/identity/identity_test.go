package identity

import (
	"strings"
	"testing"
)

// TestCheckCaller: an identity as callers are named (job owners, audit
// events) is checked by the rules of a policy's identities entries, and
// nats-account, which names no single caller, is refused.
func TestCheckCaller(t *testing.T) {
	for s, want := range map[string]string{
		"nats:alice":           "",
		"cert:build bot":       "",
		"token:ci-1":           "",
		"nats:bob smith":       `character ' '`,
		"robot:x":              `unknown kind "robot"`,
		"alice":                "want KIND:VALUE",
		"nats:":                "the name is empty",
		"nats-account:ops":     "give nats:USER",
		"ssh-principal:deploy": "",
		"token:" + "t\x00":     "not allowed",
	} {
		err := CheckCaller(s)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("CheckCaller(%q) = %v, want %q", s, err, want)
		}
	}
}
