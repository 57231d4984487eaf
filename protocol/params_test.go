package protocol_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// Params the agent would index, run or hand to a syscall must be refused by
// their Validate, with a message naming the field (and the index, in a
// list). Values that merely do nothing (a whitespace-only command) are
// accepted.
func TestParamsRefuseWhatTheAgentCannotRun(t *testing.T) {
	many := make([]string, protocol.MaxArgs+1)
	for i := range many {
		many[i] = "x"
	}
	manyEnv := map[string]string{}
	for i := 0; i <= protocol.MaxEnv; i++ {
		manyEnv[fmt.Sprintf("K%d", i)] = "v"
	}
	tests := []struct {
		name string
		p    interface{ Validate() error }
		want string // "" = valid
	}{
		{"exec: one empty command", &protocol.ExecParams{Commands: []string{""}}, "commands[0] is empty"},
		{"exec: an empty command in a batch", &protocol.ExecParams{Commands: []string{"true", ""}}, "commands[1] is empty"},
		{"exec: empty commands fail-fast", &protocol.ExecParams{Commands: []string{""}, FailFast: true}, "commands[0] is empty"},
		{"exec: empty command detached", &protocol.ExecParams{Commands: []string{""}, Detach: true, JobID: "j1"}, "commands[0] is empty"},
		{"exec: whitespace command is a no-op", &protocol.ExecParams{Commands: []string{" \t"}}, ""},
		{"exec: whitespace command fail-fast", &protocol.ExecParams{Commands: []string{" "}, FailFast: true}, ""},
		{"exec: NUL in a fail-fast command", &protocol.ExecParams{Commands: []string{"a\x00b"}, FailFast: true}, "commands[0] contains NUL"},
		{"exec: NUL in an argument", &protocol.ExecParams{Argv: []string{"true", "a\x00"}}, "argv[1] contains NUL"},
		{"exec: too many arguments", &protocol.ExecParams{Argv: many}, "argv has"},
		{"exec: too many env vars", &protocol.ExecParams{Argv: []string{"true"}, Env: manyEnv}, "env has"},
		{"exec: timeout past what a duration holds", &protocol.ExecParams{Argv: []string{"true"}, TimeoutMS: math.MaxInt64}, "timeout_ms"},
		{"exec: ok", &protocol.ExecParams{Argv: []string{"true", ""}, TimeoutMS: 1000}, ""},
		{"pty: NUL in an env value", &protocol.PTYParams{Env: map[string]string{"A": "b\x00"}}, "value contains NUL"},
		{"pty: NUL in cwd", &protocol.PTYParams{Cwd: "/tmp\x00"}, "cwd contains NUL"},
		{"pty: NUL in term", &protocol.PTYParams{Term: "xterm\x00"}, "term contains NUL"},
		{"pty: NUL in an argument", &protocol.PTYParams{Argv: []string{"sh", "\x00"}}, "argv[1] contains NUL"},
		{"pty: too many env vars", &protocol.PTYParams{Env: manyEnv}, "env has"},
		{"pty: login shell", &protocol.PTYParams{}, ""},
		// Which of the two a path breaks, and where (it said "contains NUL
		// or is longer than 4096 bytes" for either).
		{"copy: NUL in the path", &protocol.CopyParams{Direction: protocol.CopyPush, Path: "/srv/a\x00b"}, "path: a NUL byte at byte 7 of 8"},
		{"copy: path too long", &protocol.CopyParams{Direction: protocol.CopyPush, Path: "/" + strings.Repeat("p", protocol.MaxCopyPathLen)}, "path: 4097 bytes, over the limit of 4096"},
		{"copy: NUL in a root", &protocol.CopyParams{Direction: protocol.CopyPush, Path: "/srv", Roots: []string{"/srv", "/a\x00"}}, "roots[1]: a NUL byte at byte 3 of 3"},
		{"copy: root too long", &protocol.CopyParams{Direction: protocol.CopyPush, Path: "/srv", Roots: []string{"/" + strings.Repeat("r", protocol.MaxCopyPathLen)}}, "roots[0]: 4097 bytes, over the limit of 4096"},
		{"copy: relative root", &protocol.CopyParams{Direction: protocol.CopyPush, Path: "/srv", Roots: []string{"srv"}}, `roots[0] "srv": must be absolute`},
		{"copy: unclean root", &protocol.CopyParams{Direction: protocol.CopyPush, Path: "/srv", Roots: []string{"/srv/../etc"}}, `roots[0] "/srv/../etc": must be clean (/etc)`},
		{"copy: ok", &protocol.CopyParams{Direction: protocol.CopyPush, Path: "/srv", Roots: []string{"/srv"}}, ""},
		{"sandbox op: id '..' would leave the sandboxes path", &protocol.SandboxOpParams{Op: "delete", Provider: "opensandbox", ID: ".."}, "id"},
		{"sandbox op: id with a slash", &protocol.SandboxOpParams{Op: "delete", Provider: "opensandbox", ID: "a/../../v1"}, "id"},
		{"sandbox op: NUL in a name", &protocol.SandboxOpParams{Op: "delete", Provider: "openshell", Name: "a\x00"}, "name"},
		{"sandbox op: long workspace", &protocol.SandboxOpParams{Op: "delete", Provider: "openshell", Name: "a", Workspace: strings.Repeat("w", protocol.MaxSandboxIDLen+1)}, "workspace"},
		{"sandbox op: ok", &protocol.SandboxOpParams{Op: "delete", Provider: "opensandbox", ID: "3f2a-11"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want ok", err)
			case tt.want != "" && err == nil:
				t.Fatalf("Validate() = nil, want an error naming %q", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("Validate() = %v, want it to name %q", err, tt.want)
			}
		})
	}
}

// The coordinator refuses an exec request with an empty command with a 400
// naming its index: it validates the request through the same
// ExecParams.Validate the agent runs.
func TestDecodeExecRequestEmptyCommand(t *testing.T) {
	for _, body := range []string{
		`{"target":{"node":"a"},"commands":[""]}`,
		`{"target":{"all":true},"commands":[""],"detach":true}`,
		`{"target":{"node":"a"},"commands":["echo a",""],"fail_fast":true}`,
	} {
		_, e := protocol.DecodeExecRequest([]byte(body))
		if e == nil || e.Status != 400 || e.Code != protocol.ErrCodeInvalid || !strings.Contains(e.Message, "] is empty") {
			t.Errorf("%s: got %v, want 400 %s naming the empty command", body, e, protocol.ErrCodeInvalid)
		}
	}
}

// A registered sandbox's id ends up in the reaper's OpenSandbox delete URL:
// "." and ".." are not ids.
func TestRegisterRefusesDotIDs(t *testing.T) {
	for _, id := range []string{".", ".."} {
		r := protocol.SandboxRegisterRequest{Provider: protocol.ProviderOpenSandbox, Node: "n", ID: id}
		if e := r.Validate(); e == nil || e.Status != 400 {
			t.Errorf("id %q: Validate = %v, want 400", id, e)
		}
	}
}

// CheckStreamParams is the agent's check of a header's params, for a relay:
// strict decoding, then the kind's Validate, errors matching
// ErrMalformedJSON and ErrTooLarge; StreamParamsAPIError maps them to 400
// and 413.
func TestCheckStreamParams(t *testing.T) {
	many := `"` + strings.Repeat(`x","`, protocol.MaxArgs) + `x"`
	tests := []struct {
		kind   protocol.Kind
		params string
		status int    // 0 = valid
		want   string // part of the message
	}{
		{protocol.KindExec, `{"argv":["true"]}`, 0, ""},
		{protocol.KindExec, `{"argv":["true"],"extra":1}`, 400, `exec stream params: protocol: malformed JSON payload: unknown field "extra"`},
		{protocol.KindExec, `{"argv":["true"]}{}`, 400, "trailing data"},
		{protocol.KindExec, `{"commands":[""]}`, 400, "exec params: commands[0] is empty"},
		{protocol.KindExec, `{"argv":[""],"cwd":"\u0000"}`, 400, "exec params: argv[0] is empty; cwd contains NUL"},
		{protocol.KindExec, `{"argv":[` + many + `],"cwd":"\u0000"}`, 413, "exec params: argv has 4097 entries, over the limit of 4096"},
		{protocol.KindPTY, `{}`, 0, ""},
		{protocol.KindPTY, `{"term":"x\u0000"}`, 400, "pty params: term contains NUL"},
		{protocol.KindCopy, `{"direction":"pull","path":"/srv"}`, 0, ""},
		{protocol.KindCopy, `{"direction":"pull"}`, 400, `copy params: path "": must be absolute`},
		{protocol.KindDial, `{"target":"anything goes"}`, 0, ""}, // the node's allow-list judges
		{protocol.KindDial, `{"target":"web","addr":"10.0.0.1:80"}`, 400, `unknown field "addr"`},
		{protocol.KindJob, `{}`, 400, "no params check"},
	}
	for _, tt := range tests {
		t.Run(tt.kind.String()+" "+tt.params[:min(len(tt.params), 40)], func(t *testing.T) {
			e := protocol.StreamParamsAPIError(tt.kind, []byte(tt.params))
			if tt.status == 0 {
				if e != nil {
					t.Fatalf("refused: %v", e)
				}
				return
			}
			if e == nil || e.Status != tt.status || !strings.Contains(e.Message, tt.want) {
				t.Fatalf("StreamParamsAPIError = %v, want %d mentioning %q", e, tt.status, tt.want)
			}
			err := protocol.CheckStreamParams(tt.kind, []byte(tt.params))
			if big := errors.Is(err, protocol.ErrTooLarge); big != (tt.status == 413) {
				t.Errorf("CheckStreamParams = %v: matches ErrTooLarge %v, want %v", err, big, tt.status == 413)
			}
		})
	}
}
