package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// The join token and the gateway credentials never reach a job's
// environment, while the rest of the agent's environment and the job's own
// variables do.
func TestExecEnvWithoutToken(t *testing.T) {
	t.Setenv("TETHER_TOKEN", "agent-secret")
	t.Setenv("TETHER_OPENSHELL_TOKEN", "agent-secret")
	t.Setenv("TETHER_OPENSANDBOX_API_KEY", "agent-secret")
	t.Setenv("TETHER_TEST_KEEP", "kept")
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"env"}, Env: map[string]string{"JOB_VAR": "x"}})
	e.finish(t)
	out := e.stdout.String()
	if strings.Contains(out, "agent-secret") || strings.Contains(out, "TETHER_TOKEN=") ||
		strings.Contains(out, "TETHER_OPENSHELL_TOKEN=") || strings.Contains(out, "TETHER_OPENSANDBOX_API_KEY=") {
		t.Errorf("job environment has a secret:\n%s", out)
	}
	for _, want := range []string{"TETHER_TEST_KEEP=kept\n", "JOB_VAR=x\n", "PWD=" + h.a.cfg.DataDir + "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("job environment lacks %q", want)
		}
	}
}

func TestExecBusyPastMaxExecs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.MaxExecs = 1 })
	first := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"bash", "-c", "echo started; sleep 300"}})
	first.until(t, "the first exec to start", func() bool { return strings.Contains(first.stdout.String(), "started") })
	second := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}})
	second.finish(t)
	if second.errInfo == nil || second.errInfo.Code != protocol.CodeBusy ||
		second.errInfo.Message != "node node-a is running 1 execs, its limit" {
		t.Errorf("second exec: exit %+v, error %+v; want busy", second.exit, second.errInfo)
	}
	first.send(t, protocol.FrameCancel, nil)
	first.finish(t)
	// The slot is free again.
	third := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}})
	third.finish(t)
	if third.exit == nil || third.exit.ExitCode != 0 {
		t.Errorf("third exec: exit %+v, error %+v", third.exit, third.errInfo)
	}
}

// blockingPinger is a session whose pings never get an answer until Close.
type blockingPinger struct {
	once   sync.Once
	closed chan struct{}
}

func (p *blockingPinger) Ping() (time.Duration, error) {
	<-p.closed
	return 0, errors.New("session closed")
}

func (p *blockingPinger) Close() error {
	p.once.Do(func() { close(p.closed) })
	return nil
}

// Heartbeats leave on schedule even while a ping waits for its answer.
func TestHeartbeatsDoNotWaitForPing(t *testing.T) {
	t.Parallel()
	a, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	client, srv := tunneltest.Pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctl, err := client.Open(ctx, protocol.KindControl, protocol.ControlParams{})
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := srv.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := &blockingPinger{closed: make(chan struct{})}
	hctx, hcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.heartbeat(hctx, p, ctl, 20*time.Millisecond, a.log)
	}()
	fr := protocol.NewFrameReader(st)
	st.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := 0; i < 3; i++ {
		f, err := fr.Next()
		if err != nil {
			t.Fatalf("heartbeat %d: %v", i, err)
		}
		if f.Type != protocol.FrameHeartbeat {
			t.Fatalf("got %s frame, want heartbeat", f.Type)
		}
	}
	hcancel()
	p.Close() // as serve closes the session
	select {
	case <-done:
	case <-time.After(testWait):
		t.Fatal("heartbeat loop did not return")
	}
}

// A stream whose opener never sends its header does not hold up the
// streams opened after it.
func TestSlowOpenerDoesNotBlockOtherStreams(t *testing.T) {
	t.Parallel()
	a, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := net.Pipe()
	cfg := tunneltest.Config(t) // HeaderTimeout 5 s
	agentSide, err := tunnel.Client(c1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ycfg := yamux.DefaultConfig()
	ycfg.LogOutput = io.Discard
	coord, err := yamux.Server(c2, ycfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.serveStreams(ctx, agentSide)
	}()
	t.Cleanup(func() {
		cancel()
		agentSide.Close()
		coord.Close()
		<-done
	})

	silent, err := coord.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	st, err := coord.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := protocol.WriteHeader(st, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	// Well under the header timeout the silent stream could hold it up for.
	st.SetReadDeadline(time.Now().Add(cfg.HeaderTimeout / 2))
	e := &execStream{st: st, fr: protocol.NewFrameReader(st)}
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 {
		t.Errorf("exec: exit %+v, error %+v", e.exit, e.errInfo)
	}
}

// An output write that stalls (the coordinator stopped reading) closes the
// stream and kills the job, instead of leaving half a frame on a stream that
// stays open.
func TestStalledOutputWriteClosesStream(t *testing.T) {
	t.Parallel()
	// A 256 KiB window (yamux's least): it fills at once, where the default
	// 16 MiB took a starved race build longer than any wait.
	h := newHarnessTunnel(t, nil, nil, func(c *tunnel.Config) { c.MaxStreamWindow = 256 << 10 })
	h.a.dataWriteTimeout = 200 * time.Millisecond
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"bash", "-c", "echo $$; exec yes"}})
	e.until(t, "the pid", func() bool { return strings.Contains(e.stdout.String(), "\n") })
	pgid := firstLinePID(t, e.stdout.String())
	// Stop reading: the stream's window fills and the agent's write stalls.
	// The stall is detected dataWriteTimeout after that; the wait only has
	// to outlast a starved machine.
	waitFor(t, time.Minute, "the exec to end", func() bool { return h.a.running.Load() == 0 })
	e.st.SetReadDeadline(time.Now().Add(time.Minute))
	var err error
	for err == nil {
		var f protocol.Frame
		f, err = e.fr.Next()
		if err == nil && (f.Type == protocol.FrameExit || f.Type == protocol.FrameError) {
			t.Fatalf("got a %s frame from a broken stream", f.Type)
		}
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("stream ended with %v, want EOF or a truncated frame", err)
	}
	if pids := groupMembers(t, pgid); len(pids) > 0 {
		t.Errorf("process group %d still has live members %v", pgid, pids)
	}
}

// A client that starts its next exec as soon as it reads the previous one's
// exit frame (not the stream's end, which comes later) is never refused as
// busy on a MaxExecs=1 node: the slot is free before the exit frame leaves.
// The coordinator publishes a result on the exit frame, so a tight loop of
// `tether exec` against a one-slot node hit this.
func TestExecSlotFreeBeforeExitFrame(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.MaxExecs = 1 })
	for i := 0; i < 100; i++ {
		e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}})
		e.until(t, "the exit frame", func() bool { return e.exit != nil || e.errInfo != nil })
		if e.errInfo != nil {
			t.Fatalf("exec %d: error %+v; want exit 0 (the previous exec's slot was not yet free)", i, e.errInfo)
		}
		// The stream is left open here: its end is not what the next waits for.
	}
}
