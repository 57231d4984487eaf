package coordinator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// endlessStdin is a standard input that never ends (like `yes`), counting
// the bytes read from it.
type endlessStdin struct{ n atomic.Int64 }

func (r *endlessStdin) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'y'
	}
	r.n.Add(int64(len(p)))
	return len(p), nil
}

// queuedStdin is how much stdin the tests below wait to see read before
// they cancel: more than the agent can take in while the command ignores
// its stdin (the agent's 256 KiB stream window, the exec's stdin queue of
// 8 frames, a 64 KiB pipe), so that a cancel frame sent behind it cannot
// reach the agent's frame reader; less than everything in between can hold
// (the coordinator's 8 MiB pipe window besides).
const queuedStdin = 4 << 20

// cancelFleet is a fleet whose agent has a small stream window, so that a
// few MiB of stdin the command does not read fill everything between the
// client and the command.
func cancelFleet(t *testing.T) *fleettest.Fleet {
	return startFleet(t, fleettest.Options{Logger: testLogger(t), Agent: func(_ int, c *agent.Config) {
		c.Tunnel = tunnel.DefaultConfig()
		c.Tunnel.MaxStreamWindow = 256 << 10
		c.KillGrace = 200 * time.Millisecond
	}})
}

// TestExecStreamCancelReachesCommandIgnoringStdin: a streamed exec whose
// command never reads its stdin while MiBs of stdin are queued behind it
// (`yes | tether exec --node n -- sleep 1000`, then Ctrl-C) is cancelled:
// the process is killed and ExecStream returns the cancelled result, with
// ctx's error, without waiting for the command's own end.
func TestExecStreamCancelReachesCommandIgnoringStdin(t *testing.T) {
	f := cancelFleet(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdin := &endlessStdin{}
	var mu sync.Mutex
	var out bytes.Buffer
	type ret struct {
		res *protocol.ExecResult
		err error
	}
	done := make(chan ret, 1)
	go func() {
		// sh prints its pid, then becomes sleep (same pid), which never
		// reads stdin.
		res, err := f.Client.ExecStream(ctx, &protocol.ExecRequest{
			Target: protocol.Target{Node: "node-0"},
			Argv:   []string{"sh", "-c", "echo $$; exec sleep 1000"},
		}, stdin, clientOutput(&mu, &out))
		done <- ret{res, err}
	}()
	var pid int
	checkFor(t, defaultTestTimeout, func() error {
		mu.Lock()
		defer mu.Unlock()
		line, _, ok := strings.Cut(out.String(), "\n")
		if !ok {
			return errors.New("no pid printed yet")
		}
		var err error
		pid, err = strconv.Atoi(line)
		return err
	})
	checkFor(t, defaultTestTimeout, func() error {
		if n := stdin.n.Load(); n < queuedStdin {
			return fmt.Errorf("%d bytes of stdin read, want %d queued", n, queuedStdin)
		}
		return nil
	})
	cancel()
	var r ret
	select {
	case r = <-done:
	case <-time.After(defaultTestTimeout):
		t.Fatalf("ExecStream did not return within %v of the cancel (process %d alive: %v)", defaultTestTimeout, pid, pidAlive(pid))
	}
	if pidAlive(pid) {
		t.Errorf("process %d still running after ExecStream returned", pid)
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("ExecStream error = %v, want context.Canceled", r.err)
	}
	if r.res == nil || len(r.res.Results) != 1 || !r.res.Results[0].Cancelled {
		t.Fatalf("ExecStream result = %+v, want the cancelled node result", r.res)
	}
}

// clientOutput collects an exec's stdout into out under mu.
func clientOutput(mu *sync.Mutex, out *bytes.Buffer) client.ExecOptions {
	return client.ExecOptions{Output: func(_, stream string, b []byte) {
		if stream == protocol.ReplyStdout {
			mu.Lock()
			out.Write(b)
			mu.Unlock()
		}
	}}
}

// TestStreamCloseReachesPTYIgnoringStdin: a client that closes a pty
// stream while the terminal has stopped taking its keystrokes (the program
// does not read them and the terminal's input buffer is full) still ends
// the program on the node.
func TestStreamCloseReachesPTYIgnoringStdin(t *testing.T) {
	f := cancelFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindPTY,
		protocol.PTYParams{Argv: []string{"sh", "-c", "stty -echo; echo pid=$$; exec sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Read the terminal's output (the pid) and keep draining it.
	pidCh := make(chan int, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		found := pidCh
		var out bytes.Buffer
		fr := protocol.NewFrameReader(st)
		for {
			fm, err := fr.Next()
			if err != nil {
				return
			}
			if fm.Type != protocol.FrameStdout || found == nil {
				continue
			}
			out.Write(fm.Payload)
			s := out.String()
			if i := strings.Index(s, "pid="); i >= 0 {
				if j := strings.IndexAny(s[i:], "\r\n"); j > 0 {
					pid, _ := strconv.Atoi(s[i+4 : i+j])
					found <- pid
					found = nil
				}
			}
		}
	}()
	var pid int
	select {
	case pid = <-pidCh:
	case <-time.After(defaultTestTimeout):
		t.Fatal("no pid from the pty")
	}
	// Type lines the program never reads, until MiBs wait behind them.
	var sent atomic.Int64
	writeDone := make(chan struct{})
	go func() {
		defer close(writeDone)
		line := bytes.Repeat([]byte("x"), 1023)
		line = append(line, '\n')
		chunk := bytes.Repeat(line, protocol.ChunkSize/len(line))
		for {
			if err := protocol.WriteFrame(st, protocol.FrameStdin, chunk); err != nil {
				return
			}
			sent.Add(int64(len(chunk)))
		}
	}()
	checkFor(t, defaultTestTimeout, func() error {
		if n := sent.Load(); n < queuedStdin {
			return fmt.Errorf("%d bytes of keystrokes sent, want %d queued", n, queuedStdin)
		}
		return nil
	})
	st.Close()
	<-writeDone
	<-readDone
	checkFor(t, defaultTestTimeout, func() error {
		if pidAlive(pid) {
			return fmt.Errorf("pty program %d still running after the client closed its stream", pid)
		}
		return nil
	})
}

// TestRelaySendsCancelStreamToAgentsThatTakeIt: when the client cancels
// (Stream.Cancel) or goes away, an agent whose Hello listed cancel_stream
// gets FrameCancelStream naming the stream on its control stream, besides
// the in-band cancel; the stream's answer still reaches a cancelling
// client.
func TestRelaySendsCancelStreamToAgentsThatTakeIt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cancel bool // Stream.Cancel; else Close
	}{{"cancel", true}, {"close", false}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			ids := make(chan uint32, 1)
			a := h.dialAgent(t, agentOpts{id: "n1", heartbeat: true, features: []string{protocol.FeatureCancelStream},
				handler: func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
					ids <- st.StreamID()
					// Reads nothing until told out of band, then
					// answers as a cancelled command would.
					<-a.ctx.Done()
				}})
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			st, err := h.streamClient().OpenStream(ctx, "n1", protocol.KindExec, protocol.ExecParams{Argv: []string{"x"}, Stdin: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var id uint32
			select {
			case id = <-ids:
			case <-ctx.Done():
				t.Fatal("the stream did not reach the agent")
			}
			if tc.cancel {
				err = st.Cancel()
			} else {
				err = st.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			a.ctrl.SetReadDeadline(time.Now().Add(defaultTestTimeout))
			fr := protocol.NewFrameReader(a.ctrl)
			for {
				f, err := fr.Next()
				if err != nil {
					t.Fatalf("read the control stream: %v", err)
				}
				if f.Type != protocol.FrameCancelStream {
					continue
				}
				var c protocol.CancelStream
				if err := protocol.DecodeJSON(f.Payload, &c); err != nil || c.StreamID != id {
					t.Fatalf("cancel-stream %s (%v), want stream %d", f.Payload, err, id)
				}
				return
			}
		})
	}
}

// TestJobCancelReachesCommandIgnoringStdin: the same on the job path
// (tether.v1.exec with stdin in the request, up to 512 KiB): a command
// that never reads it leaves the agent's frame reader waiting behind it,
// and the job's in-band cancel with it; the job's cancel reaches the
// command anyway, the process is killed and the result says cancelled.
func TestJobCancelReachesCommandIgnoringStdin(t *testing.T) {
	f := cancelFleet(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var out bytes.Buffer
	type ret struct {
		res *protocol.ExecResult
		err error
	}
	done := make(chan ret, 1)
	go func() {
		opts := clientOutput(&mu, &out)
		res, err := f.Client.ExecWith(ctx, &protocol.ExecRequest{
			Target: protocol.Target{Node: "node-0"},
			Argv:   []string{"sh", "-c", "echo $$; exec sleep 1000"},
			Stdin:  bytes.Repeat([]byte("y\n"), protocol.MaxStdinSize/2),
		}, opts)
		done <- ret{res, err}
	}()
	var pid int
	checkFor(t, defaultTestTimeout, func() error {
		mu.Lock()
		defer mu.Unlock()
		line, _, ok := strings.Cut(out.String(), "\n")
		if !ok {
			return errors.New("no pid printed yet")
		}
		var err error
		pid, err = strconv.Atoi(line)
		return err
	})
	cancel()
	var r ret
	select {
	case r = <-done:
	case <-time.After(defaultTestTimeout):
		t.Fatalf("ExecWith did not return within %v of the cancel (process %d alive: %v)", defaultTestTimeout, pid, pidAlive(pid))
	}
	if r.res == nil || len(r.res.Results) != 1 || !r.res.Results[0].Cancelled || r.res.Results[0].Error != "" {
		t.Errorf("ExecWith = %+v, %v; want the cancelled node result", r.res, r.err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if pidAlive(pid) {
			return fmt.Errorf("process %d still running after the job's cancel", pid)
		}
		return nil
	})
}
