package protocol

import (
	"errors"
	"strings"
	"testing"
)

func TestParamsUser(t *testing.T) {
	for _, u := range []string{"", "alice", "deploy-bot", "svc_1", "1000", "user.name", "a$"} {
		p := ExecParams{Argv: []string{"true"}, User: u}
		if err := p.Validate(); err != nil {
			t.Errorf("user %q: %v", u, err)
		}
	}
	for _, u := range []string{"-root", "+x", ".", "..", "a b", "a/b", "a:b", "a\x00", "a\n", "~x", "\xff"} {
		for name, err := range map[string]error{
			"exec": (&ExecParams{Argv: []string{"true"}, User: u}).Validate(),
			"pty":  (&PTYParams{User: u}).Validate(),
			"copy": (&CopyParams{Direction: CopyPush, Path: "/x", User: u}).Validate(),
		} {
			if err == nil || !strings.Contains(err.Error(), "user") {
				t.Errorf("%s user %q: got %v, want a user error", name, u, err)
			}
		}
	}
	err := (&ExecParams{Argv: []string{"true"}, User: strings.Repeat("u", MaxUserLen+1)}).Validate()
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("long user: got %v, want ErrTooLarge", err)
	}
}
