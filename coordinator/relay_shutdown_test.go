package coordinator_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
)

// signalHandler passes records to next and closes seen once a record's
// message starts with prefix.
type signalHandler struct {
	slog.Handler
	prefix string
	once   *sync.Once
	seen   chan struct{}
}

func (h signalHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.once.Do(func() { close(h.seen) })
	}
	return h.Handler.Handle(ctx, r)
}

func (h signalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h signalHandler) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// shutdownHarness is a harness whose coordinator drains for 50 ms only,
// and a channel closed once its drain ends a relay (relay.shutdown).
func shutdownHarness(t *testing.T) (*harness, <-chan struct{}) {
	stopped := make(chan struct{})
	h := newHarness(t, func(c *coordinator.Config) {
		c.DrainTimeout = 50 * time.Millisecond
		c.Logger = slog.New(signalHandler{Handler: testLogger(t).Handler(), prefix: "shutting down: ending the stream", once: new(sync.Once), seen: stopped})
	})
	return h, stopped
}

// waitCancel reads the client's frames on st until FrameCancel, then
// answers with a cancelled exit status, and closes cancelled.
func waitCancel(st *yamux.Stream, cancelled chan<- struct{}) {
	fr := protocol.NewFrameReader(st)
	for {
		f, err := fr.Next()
		if err != nil {
			return
		}
		if f.Type == protocol.FrameCancel {
			close(cancelled)
			protocol.WriteJSONFrame(st, protocol.FrameExit, &protocol.ExitStatus{ExitCode: 143, Signal: "TERM", Cancelled: true})
			return
		}
	}
}

// TestStreamedExecShutdownResult: a coordinator that shuts down while an
// exec with streamed stdin (client.ExecStream over tether.v1.stream) runs
// gives it the job path's result: "coordinator ID is shutting down; job
// cancelled", error_code shutdown, cancelled; not a broken pipe. The agent
// is told to cancel the command.
func TestStreamedExecShutdownResult(t *testing.T) {
	h, _ := shutdownHarness(t)
	cancelled := make(chan struct{})
	h.dialAgent(t, agentOpts{id: "n1", heartbeat: true, handler: func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
		protocol.WriteFrame(st, protocol.FrameStdout, []byte("started\n"))
		waitCancel(st, cancelled)
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*defaultTestTimeout)
	defer cancel()
	stdin, stdinW := io.Pipe() // never ends: the command is still running
	defer stdinW.Close()
	started := make(chan struct{})
	var once sync.Once
	type outcome struct {
		res *protocol.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := h.streamClient().ExecStream(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"x"}}, stdin,
			client.ExecOptions{Output: func(string, string, []byte) { once.Do(func() { close(started) }) }})
		done <- outcome{res, err}
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the command's output did not arrive")
	}
	stopErr := make(chan error, 1)
	go func() { stopErr <- h.stop() }()
	var o outcome
	select {
	case o = <-done:
	case <-ctx.Done():
		t.Fatal("ExecStream did not return after the coordinator shut down")
	}
	if o.err != nil || o.res == nil || len(o.res.Results) != 1 {
		t.Fatalf("ExecStream = %+v, %v; want the shutdown result", o.res, o.err)
	}
	r := o.res.Results[0]
	if r.Error != "coordinator coord-test is shutting down; job cancelled" || r.ErrorCode != protocol.ResultCodeShutdown || !r.Cancelled || r.OK() {
		t.Errorf("result %+v; want the job path's shutdown result", r)
	}
	select {
	case <-cancelled:
	case <-ctx.Done():
		t.Error("the agent was not told to cancel the command")
	}
	if err := <-stopErr; err != nil {
		t.Fatal(err)
	}
}

// TestRelayShutdownMidFrame: when the drain ends a relay while the agent is
// in the middle of a frame, the client still reads that frame whole, then
// the shutdown's error frame, then EOF: the frames stay well formed.
func TestRelayShutdownMidFrame(t *testing.T) {
	h, stopped := shutdownHarness(t)
	cancelled := make(chan struct{})
	h.dialAgent(t, agentOpts{id: "n1", heartbeat: true, handler: func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
		payload := []byte("0123456789")
		var hdr [5]byte
		hdr[0] = byte(protocol.FrameStdout)
		binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
		st.Write(hdr[:3]) // part of the header
		select {
		case <-stopped:
		case <-a.ctx.Done():
			return
		}
		st.Write(append(hdr[3:], payload[:4]...))
		st.Write(payload[4:])
		protocol.WriteFrame(st, protocol.FrameStdout, []byte("after the stop")) // never relayed
		waitCancel(st, cancelled)
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*defaultTestTimeout)
	defer cancel()
	st, err := h.streamClient().OpenStream(ctx, "n1", protocol.KindExec, protocol.ExecParams{Argv: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	stopErr := make(chan error, 1)
	go func() { stopErr <- h.stop() }()
	fr := protocol.NewFrameReader(st)
	f, err := fr.Next()
	if err != nil || f.Type != protocol.FrameStdout || string(f.Payload) != "0123456789" {
		t.Fatalf("first frame %s %q, %v; want the whole stdout frame", f.Type, f.Payload, err)
	}
	f, err = fr.Next()
	var ei protocol.ErrorInfo
	if err != nil || f.Type != protocol.FrameError || protocol.DecodeJSON(f.Payload, &ei) != nil ||
		ei.Code != protocol.ResultCodeShutdown || ei.Message != "coordinator coord-test is shutting down; job cancelled" {
		t.Fatalf("second frame %s %q, %v; want the shutdown's error frame", f.Type, f.Payload, err)
	}
	if f, err = fr.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the error frame: %s %q, %v; want EOF", f.Type, f.Payload, err)
	}
	st.Close()
	select {
	case <-cancelled:
	case <-ctx.Done():
		t.Error("the agent was not told to cancel the command")
	}
	if err := <-stopErr; err != nil {
		t.Fatal(err)
	}
}
