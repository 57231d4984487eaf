package client_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// TestRefusesInvalidUTF8: a request whose script, argv, commands, env or
// cwd holds bytes that are not UTF-8 is refused before it is sent, with a
// 400 invalid_request naming the field and the byte, by Exec, ExecStream
// and OpenStream (exec and pty params) alike. JSON, which carries it,
// would turn each such byte into U+FFFD, and the node would run another
// command than the one asked for; only the CLI refused them before.
func TestRefusesInvalidUTF8(t *testing.T) {
	s := runServer(t)
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		t.Errorf("a request with bytes that are not UTF-8 reached the coordinator: %+v", req)
	}, nil)
	c := client.New(connect(t, s))
	one := protocol.Target{Node: "n1"}
	for _, tc := range []struct {
		name string
		req  protocol.ExecRequest
		want string
	}{
		{"argv", protocol.ExecRequest{Target: one, Argv: []string{"echo", "ab\xff"}}, "argv[1]: not valid UTF-8 at byte 3"},
		{"script", protocol.ExecRequest{Target: one, Script: "echo \xc3("}, "script: not valid UTF-8 at byte 6"},
		{"commands", protocol.ExecRequest{Target: one, Commands: []string{"true", "\x80"}}, "commands[1]: not valid UTF-8 at byte 1"},
		{"env value", protocol.ExecRequest{Target: one, Argv: []string{"env"}, Env: map[string]string{"K": "v\xfe"}}, `env K: value not valid UTF-8 at byte 2`},
		{"env key", protocol.ExecRequest{Target: one, Argv: []string{"env"}, Env: map[string]string{"K\xfe": "v"}}, `env key "K\xfe": not valid UTF-8 at byte 2`},
		{"cwd", protocol.ExecRequest{Target: one, Argv: []string{"pwd"}, Cwd: "/tmp/\xff"}, "cwd: not valid UTF-8 at byte 6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				var e *protocol.APIError
				if !errors.As(err, &e) || e.Status != 400 || e.Code != protocol.ErrCodeInvalid || !strings.Contains(e.Message, tc.want) {
					t.Errorf("%s: error %v; want 400 invalid_request naming %q", what, err, tc.want)
				}
			}
			req := tc.req
			_, err := c.Exec(testCtx(t), &req, nil)
			check("Exec", err)
			req = tc.req
			if req.Commands == nil {
				_, err = c.ExecStream(testCtx(t), &req, nil, client.ExecOptions{})
				check("ExecStream", err)
			}
			p := tc.req.Params(0)
			_, err = c.OpenStream(testCtx(t), "n1", protocol.KindExec, &p)
			check("OpenStream exec", err)
			if tc.req.Argv != nil {
				pty := protocol.PTYParams{Argv: tc.req.Argv, Env: tc.req.Env, Cwd: tc.req.Cwd, Rows: 24, Cols: 80}
				_, err = c.OpenStream(testCtx(t), "n1", protocol.KindPTY, &pty)
				check("OpenStream pty", err)
			}
		})
	}
	f.nc.Flush()
}
