package coordinator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// readExec reads an exec stream's frames until its exit frame and returns
// stdout and the exit status.
func readExec(t *testing.T, r io.Reader) (string, protocol.ExitStatus) {
	t.Helper()
	var out bytes.Buffer
	fr := protocol.NewFrameReader(r)
	for {
		f, err := fr.Next()
		if err != nil {
			t.Fatalf("read frame: %v (stdout so far %q)", err, out.String())
		}
		switch f.Type {
		case protocol.FrameStdout:
			out.Write(f.Payload)
		case protocol.FrameExit:
			var es protocol.ExitStatus
			if err := protocol.DecodeJSON(f.Payload, &es); err != nil {
				t.Fatal(err)
			}
			return out.String(), es
		case protocol.FrameError:
			t.Fatalf("error frame: %s", f.Payload)
		}
	}
}

func TestRelayExecWithStdin(t *testing.T) {
	f := startFleet(t, fleettest.Options{Logger: testLogger(t)})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindExec, protocol.ExecParams{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Big enough to need several pipe windows' worth of acks.
	want := strings.Repeat("tether relays bytes\n", 1<<16)
	go func() {
		for b := []byte(want); len(b) > 0; {
			n := min(len(b), protocol.ChunkSize)
			if err := protocol.WriteFrame(st, protocol.FrameStdin, b[:n]); err != nil {
				t.Errorf("write stdin: %v", err)
				return
			}
			b = b[n:]
		}
		protocol.WriteFrame(st, protocol.FrameStdinClose, nil)
		st.CloseWrite()
	}()
	out, es := readExec(t, st)
	if out != want || es.ExitCode != 0 {
		t.Fatalf("got %d bytes of stdout (want %d), exit %d", len(out), len(want), es.ExitCode)
	}
	// The agent closes after its exit frame: a clean EOF.
	if _, err := protocol.NewFrameReader(st).Next(); err != io.EOF {
		t.Fatalf("after exit: %v, want io.EOF", err)
	}
	if err := st.Err(); err != nil {
		t.Errorf("Err after a clean end: %v", err)
	}
}

// TestRelayExecDefaultTimeout: an exec stream without a timeout gets the
// coordinator's default timeout, as an exec job does; its own timeout wins.
func TestRelayExecDefaultTimeout(t *testing.T) {
	f := startFleet(t, fleettest.Options{Logger: testLogger(t), Coordinator: func(c *coordinator.Config) {
		c.DefaultTimeout = 200 * time.Millisecond
	}})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	for _, tt := range []struct {
		params   protocol.ExecParams
		timedOut bool
	}{
		{protocol.ExecParams{Argv: []string{"sleep", "30"}}, true},
		{protocol.ExecParams{Argv: []string{"sh", "-c", "sleep 0.5 && echo '<done>'"}, TimeoutMS: 20_000}, false},
	} {
		st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindExec, tt.params)
		if err != nil {
			t.Fatal(err)
		}
		out, es := readExec(t, st)
		st.Close()
		if es.TimedOut != tt.timedOut || (!tt.timedOut && out != "<done>\n") {
			t.Errorf("%v: exit %+v, stdout %q; want timed out %v", tt.params.Argv, es, out, tt.timedOut)
		}
	}
}

func TestRelayRefusals(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	exec := protocol.ExecParams{Argv: []string{"true"}}
	tests := []struct {
		name       string
		node       string
		kind       protocol.Kind
		params     any
		wantStatus int
		wantCode   string
		wantMsg    string
	}{
		{"unknown node", "node-9", protocol.KindExec, exec, 404, protocol.ErrCodeUnknownNode, `node "node-9" is not connected to coordinator fleettest`},
		{"control kind", "node-0", protocol.KindControl, exec, 400, protocol.ErrCodeInvalid, `kind "control": want exec, copy, pty, dial or ssh`},
		{"ssh kind with params", "node-0", protocol.KindSSH, exec, 400, protocol.ErrCodeInvalid, "an ssh stream takes none"},
		{"null params", "node-0", protocol.KindExec, nil, 400, protocol.ErrCodeInvalid, "params"},
		{"array params", "node-0", protocol.KindExec, []int{1}, 400, protocol.ErrCodeInvalid, "params"},
		{"huge params", "node-0", protocol.KindExec, protocol.ExecParams{Script: strings.Repeat("x", protocol.MaxHeaderSize)}, 413, protocol.ErrCodeTooLarge, "params are"},
		{"bad node id", "no/de", protocol.KindExec, exec, 400, protocol.ErrCodeInvalid, "node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := f.Client.OpenStream(ctx, tt.node, tt.kind, tt.params)
			if err == nil {
				st.Close()
				t.Fatal("stream opened")
			}
			var e *protocol.APIError
			if !errors.As(err, &e) || e.Status != tt.wantStatus || e.Code != tt.wantCode || !strings.Contains(e.Message, tt.wantMsg) {
				t.Fatalf("err = %v, want %d %s containing %q", err, tt.wantStatus, tt.wantCode, tt.wantMsg)
			}
		})
	}
}

// TestRelayChecksParams: the coordinator checks a relayed stream's params
// with the agent's own rules (decoded strictly, then the kind's Validate)
// and refuses bad ones on the request, as tether.v1.exec does: 400
// invalid_request, or 413 too_large for what is too big; nothing reaches
// the node. Good params reach it byte for byte.
func TestRelayChecksParams(t *testing.T) {
	h := newHarness(t, nil)
	headers := make(chan protocol.Header, 16)
	h.dialAgent(t, agentOpts{id: "n1", heartbeat: true, header: func(hd protocol.Header) { headers <- hd }})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	c := h.streamClient()
	many := `"` + strings.Repeat(`a","`, protocol.MaxArgs) + `a"`
	for _, tc := range []struct {
		kind   protocol.Kind
		params string
		status int
		code   string
		msg    string // part of the message
	}{
		{protocol.KindExec, `{"no_such_field":1}`, 400, protocol.ErrCodeInvalid, `unknown field "no_such_field"`},
		{protocol.KindExec, `{"argv":[""]}`, 400, protocol.ErrCodeInvalid, "argv[0] is empty"},
		{protocol.KindExec, `{"commands":["true",""]}`, 400, protocol.ErrCodeInvalid, "commands[1] is empty"},
		{protocol.KindExec, `{}`, 400, protocol.ErrCodeInvalid, "nothing to run"},
		{protocol.KindExec, `{"argv":["x"],"timeout_ms":-1}`, 400, protocol.ErrCodeInvalid, "timeout must not be negative"},
		{protocol.KindExec, `{"argv":[` + many + `]}`, 413, protocol.ErrCodeTooLarge, "argv has 4097 entries"},
		{protocol.KindPTY, `{"argv":["sh"],"cwd":"/tmp\u0000"}`, 400, protocol.ErrCodeInvalid, "cwd contains NUL"},
		{protocol.KindPTY, `{"rows":"tall"}`, 400, protocol.ErrCodeInvalid, "pty"},
		{protocol.KindCopy, `{"direction":"sideways","path":"/srv"}`, 400, protocol.ErrCodeInvalid, `direction "sideways"`},
		{protocol.KindCopy, `{"direction":"push","path":"srv"}`, 400, protocol.ErrCodeInvalid, "must be absolute"},
		{protocol.KindDial, `{"target":"openshell","port":1}`, 400, protocol.ErrCodeInvalid, `unknown field "port"`},
	} {
		t.Run(tc.kind.String()+" "+tc.params[:min(len(tc.params), 40)], func(t *testing.T) {
			st, err := c.OpenStream(ctx, "n1", tc.kind, json.RawMessage(tc.params))
			if err == nil {
				st.Close()
				t.Fatalf("stream opened, want %d %s", tc.status, tc.code)
			}
			var ae *protocol.APIError
			if !errors.As(err, &ae) || ae.Status != tc.status || ae.Code != tc.code || !strings.Contains(ae.Message, tc.msg) {
				t.Errorf("OpenStream = %v, want %d %s mentioning %q", err, tc.status, tc.code, tc.msg)
			}
		})
	}
	select {
	case hd := <-headers:
		t.Errorf("a %s stream with params %s reached the node", hd.Kind, hd.Params)
	default:
	}

	// Good params are passed on as they were sent, not re-encoded (which
	// would reorder the fields and undo the escape).
	raw := `{"timeout_ms":5000,"argv":["ok","\u0041"]}`
	st, err := c.OpenStream(ctx, "n1", protocol.KindExec, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	select {
	case hd := <-headers:
		if string(hd.Params) != raw {
			t.Errorf("node got params %s, want %s", hd.Params, raw)
		}
	case <-time.After(defaultTestTimeout):
		t.Fatal("the stream did not reach the node")
	}
}

// pidAlive reports whether process pid exists.
func pidAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestRelayClientCloseKillsExec: a client that closes its stream mid-run
// makes the agent kill the process (the relay sends FrameCancel and closes
// the tunnel stream).
func TestRelayClientCloseKillsExec(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before closing, the client leaves its bytes mid-frame
		midFrame bool
	}{{"at frame boundary", false}, {"mid frame", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFleet(t, fleettest.Options{Logger: testLogger(t)})
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			// sh prints its pid, then becomes sleep (same pid).
			st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindExec,
				protocol.ExecParams{Argv: []string{"sh", "-c", "echo $$; exec sleep 60"}, Stdin: true})
			if err != nil {
				t.Fatal(err)
			}
			fr := protocol.NewFrameReader(st)
			fm, err := fr.Next()
			if err != nil || fm.Type != protocol.FrameStdout {
				t.Fatalf("first frame %v %q, %v", fm.Type, fm.Payload, err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(fm.Payload)))
			if err != nil {
				t.Fatal(err)
			}
			if !pidAlive(pid) {
				t.Fatalf("process %d not running", pid)
			}
			if tc.midFrame {
				// A stdin frame header announcing 10 bytes, and 3 of them.
				st.Write([]byte{byte(protocol.FrameStdin), 0, 0, 0, 10, 'a', 'b', 'c'})
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			checkFor(t, defaultTestTimeout, func() error {
				if pidAlive(pid) {
					return fmt.Errorf("process %d still running", pid)
				}
				return nil
			})
		})
	}
}

// TestRelayTunnelLost: the agent's tunnel dies mid-stream; the client's
// reads fail naming the node.
func TestRelayTunnelLost(t *testing.T) {
	h := newHarness(t, nil)
	a := h.dialAgent(t, agentOpts{id: "n1", heartbeat: true, handler: func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
		protocol.WriteFrame(st, protocol.FrameStdout, []byte("up"))
		<-a.ctx.Done()
	}})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	st, err := h.streamClient().OpenStream(ctx, "n1", protocol.KindExec, protocol.ExecParams{Argv: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fr := protocol.NewFrameReader(st)
	if _, err := fr.Next(); err != nil {
		t.Fatal(err)
	}
	a.close()
	_, err = fr.Next()
	if err == nil || !strings.Contains(err.Error(), "tunnel to node n1 lost") {
		t.Fatalf("read after tunnel loss = %v, want an error naming the node", err)
	}
}

// TestRelayAbortSendsCancel pins down what an agent sees when the client
// aborts: FrameCancel, then EOF; and after a half-close only EOF.
func TestRelayAbortSendsCancel(t *testing.T) {
	for _, tc := range []struct {
		name      string
		halfClose bool
		want      []string
	}{
		{"abort", false, []string{"stdin", "cancel", "EOF"}},
		{"half-close", true, []string{"stdin", "EOF"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			seen := make(chan []string, 1)
			h.dialAgent(t, agentOpts{id: "n1", heartbeat: true, handler: func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
				var got []string
				fr := protocol.NewFrameReader(st)
				for {
					f, err := fr.Next()
					if err != nil {
						if err == io.EOF {
							got = append(got, "EOF")
						} else {
							got = append(got, "error: "+err.Error())
						}
						break
					}
					got = append(got, f.Type.String())
					if f.Type == protocol.FrameStdin {
						protocol.WriteFrame(st, protocol.FrameStdout, f.Payload)
					}
				}
				seen <- got
			}})
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			st, err := h.streamClient().OpenStream(ctx, "n1", protocol.KindExec, protocol.ExecParams{Argv: []string{"x"}, Stdin: true})
			if err != nil {
				t.Fatal(err)
			}
			protocol.WriteFrame(st, protocol.FrameStdin, []byte("hi"))
			// Wait for the echo so the stdin frame is through.
			if f, err := protocol.NewFrameReader(st).Next(); err != nil || string(f.Payload) != "hi" {
				t.Fatalf("echo: %q, %v", f.Payload, err)
			}
			if tc.halfClose {
				st.CloseWrite()
			}
			st.Close()
			select {
			case got := <-seen:
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("agent saw (-want +got):\n%s", diff)
				}
			case <-time.After(defaultTestTimeout):
				t.Fatal("agent handler did not finish")
			}
		})
	}
}

func TestRelayMetricAndDrain(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.DrainTimeout = 50 * time.Millisecond })
	h.dialAgent(t, agentOpts{id: "n1", heartbeat: true, handler: func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
		io.Copy(io.Discard, st) // until the coordinator closes the stream
	}})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	st, err := h.streamClient().OpenStream(ctx, "n1", protocol.KindExec, protocol.ExecParams{Argv: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := h.metric("tether_coordinator_streams_opened_total", "kind", "exec"); got != 1 {
		t.Errorf("streams opened (exec) = %v, want 1", got)
	}
	// Shutting down ends the relay (after DrainTimeout) and tells the
	// client, with an error frame.
	done := make(chan error, 1)
	go func() { done <- h.stop() }()
	f, err := protocol.NewFrameReader(st).Next()
	if err != nil || f.Type != protocol.FrameError || !strings.Contains(string(f.Payload), "shutting down") {
		t.Errorf("read during shutdown = %s %q, %v; want the shutdown reason", f.Type, f.Payload, err)
	}
	st.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
