package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// control starts the agent's reader of the control stream on h's session,
// as serve does after the handshake, and returns the coordinator's end of
// that stream.
func (h *harness) control(t *testing.T) *yamux.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type accepted struct {
		st  *yamux.Stream
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		st, _, err := h.srv.Accept(ctx)
		ch <- accepted{st, err}
	}()
	ctl, err := h.client.Open(ctx, protocol.KindControl, protocol.ControlParams{})
	if err != nil {
		t.Fatal(err)
	}
	a := <-ch
	if a.err != nil {
		t.Fatal(a.err)
	}
	var wg sync.WaitGroup
	h.a.startControl(ctl, h.client, &wg, nil, nil, h.a.log)
	t.Cleanup(func() {
		h.client.Close() // ends the reader
		wg.Wait()
	})
	return a.st
}

// cancelStream sends the coordinator's out-of-band cancel of stream id.
func cancelStream(t *testing.T, ctl *yamux.Stream, id uint32) {
	t.Helper()
	ctl.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := protocol.WriteJSONFrame(ctl, protocol.FrameCancelStream, &protocol.CancelStream{StreamID: id}); err != nil {
		t.Fatal(err)
	}
}

// fillStdin writes stdin frames to e until the stream takes no more (a
// write waits past its deadline: the stream's window is used up, since the
// agent stopped reading) and returns the bytes written. A frame cut by the
// deadline stays cut: nothing more is written.
func fillStdin(e *execStream) int64 {
	chunk := make([]byte, protocol.ChunkSize)
	var n int64
	for {
		e.st.SetWriteDeadline(time.Now().Add(2 * time.Second))
		if err := protocol.WriteFrame(e.st, protocol.FrameStdin, chunk); err != nil {
			return n
		}
		n += int64(len(chunk))
	}
}

// TestCancelStreamReachesExecIgnoringStdin: with the stream's window full
// of stdin the command never reads, an in-band cancel cannot arrive; the
// out-of-band one (FrameCancelStream on the control stream) kills the
// process group and the cancelled exit status still comes on the stream.
func TestCancelStreamReachesExecIgnoringStdin(t *testing.T) {
	h := newHarness(t, nil)
	ctl := h.control(t)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"sh", "-c", "echo $$; exec sleep 1000"}, Stdin: true})
	e.until(t, "the pid", func() bool { return e.stdout.Len() > 0 && e.stdout.Bytes()[e.stdout.Len()-1] == '\n' })
	pid := firstLinePID(t, e.stdout.String())

	// Until the stream takes no more: a FrameCancel would be stuck too.
	if n := fillStdin(e); n < 128<<10 {
		t.Fatalf("only %d bytes of stdin went into the stream", n)
	}
	cancelStream(t, ctl, e.st.StreamID())
	for e.exit == nil && e.errInfo == nil {
		if !e.next(t) {
			t.Fatal("stream ended without a final frame")
		}
	}
	if e.exit == nil || !e.exit.Cancelled {
		t.Fatalf("final frame: exit %+v, error %+v; want a cancelled exit", e.exit, e.errInfo)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("process %d still running", pid)
	}
}

// TestCancelStreamBeforeItsExecStarts: a cancel that overtakes its stream
// (read before the exec registered) is remembered and applied as the exec
// starts.
func TestCancelStreamBeforeItsExecStarts(t *testing.T) {
	reached := make(chan struct{})
	proceed := make(chan struct{})
	h := newHarnessWith(t, nil, func(a *Agent) {
		a.testHook = func(point string, _ any) {
			if point == "exec" {
				close(reached)
				<-proceed
			}
		}
	})
	ctl := h.control(t)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"sleep", "1000"}})
	<-reached
	cancelStream(t, ctl, e.st.StreamID())
	waitFor(t, testWait, "the early cancel to be recorded", func() bool {
		h.a.cancels.mu.Lock()
		defer h.a.cancels.mu.Unlock()
		for _, tab := range h.a.cancels.m {
			tab.mu.Lock()
			early := tab.early[e.st.StreamID()]
			tab.mu.Unlock()
			if early {
				return true
			}
		}
		return false
	})
	close(proceed)
	e.finish(t)
	if e.exit == nil || !e.exit.Cancelled {
		t.Fatalf("final frame: exit %+v, error %+v; want a cancelled exit", e.exit, e.errInfo)
	}
}

// TestCancelStreamAbortsCopy: a push waiting for the sender is aborted by
// the out-of-band cancel, as by the session's end: the agent ends the
// stream with its cancel and the destination is not created.
func TestCancelStreamAbortsCopy(t *testing.T) {
	h := newHarness(t, nil)
	ctl := h.control(t)
	dst := filepath.Join(h.a.cfg.DataDir, "pushed")
	st, err := h.srv.Open(copyCtx(t), protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.SetReadDeadline(time.Now().Add(20 * time.Second))
	fr := protocol.NewFrameReader(st)
	// The receiver's manifest comes first; then it waits for entries,
	// which never come.
	for {
		f, err := fr.Next()
		if err != nil {
			t.Fatalf("read the agent's manifest: %v", err)
		}
		if f.Type == protocol.FrameManifestEnd {
			break
		}
	}
	cancelStream(t, ctl, st.StreamID())
	var last protocol.FrameType
	for {
		f, err := fr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read after the cancel: %v", err)
		}
		last = f.Type
	}
	if last != protocol.FrameCancel && last != protocol.FrameError {
		t.Errorf("the agent ended the copy with %v, want its cancel", last)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("destination after the cancelled push: %v, want none", err)
	}
}

// TestControlStreamSurvivesBadFrames: a cancel-stream frame that does not
// decode is skipped; a frame of a type the agent does not know ends the
// interpretation but not the reading (the coordinator's writes never
// block), and the session serves on.
func TestControlStreamSurvivesBadFrames(t *testing.T) {
	// A 256 KiB window (yamux's least), so that 2 MiB is eight windows.
	h := newHarnessTunnel(t, nil, nil, func(c *tunnel.Config) { c.MaxStreamWindow = 256 << 10 })
	ctl := h.control(t)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"sleep", "1000"}})
	ctl.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := protocol.WriteFrame(ctl, protocol.FrameCancelStream, []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	cancelStream(t, ctl, e.st.StreamID())
	e.finish(t)
	if e.exit == nil || !e.exit.Cancelled {
		t.Fatalf("final frame: exit %+v, error %+v; want a cancelled exit", e.exit, e.errInfo)
	}

	// A frame from the future (type 250): then 2 MiB more, eight times the
	// stream's window, which the agent must keep reading. (With the default
	// 16 MiB window this needed 20 MiB, which hit the session's write
	// timeout on a loaded machine.)
	ctl.SetWriteDeadline(time.Now().Add(20 * time.Second))
	if _, err := ctl.Write([]byte{250, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 1<<20)
	for range 2 {
		if _, err := ctl.Write(junk); err != nil {
			t.Fatalf("the agent stopped reading its control stream: %v", err)
		}
	}
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"echo", "still serving"}})
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 || e.stdout.String() != "still serving\n" {
		t.Errorf("exec after the bad frames: exit %+v, stdout %q", e.exit, e.stdout.String())
	}
}

// FuzzReadControl: whatever a coordinator sends on the control stream, the
// reader neither panics nor stops reading before the stream's end, and
// cancels only registered streams, each at most once.
func FuzzReadControl(f *testing.F) {
	frame := func(t protocol.FrameType, payload string) []byte {
		var b bytes.Buffer
		protocol.WriteFrame(&b, t, []byte(payload))
		return b.Bytes()
	}
	f.Add(frame(protocol.FrameCancelStream, `{"stream_id":2}`))
	f.Add(append(frame(protocol.FrameCancelStream, `{"stream_id":2}`), frame(protocol.FrameCancelStream, `{"stream_id":4}`)...))
	f.Add(frame(protocol.FrameCancelStream, `{"stream_id":-1}`))
	f.Add(frame(protocol.FrameHeartbeat, `{}`))
	f.Add([]byte{250, 0, 0, 0, 1, 'x'})
	f.Add([]byte{byte(protocol.FrameCancelStream), 0xff, 0xff, 0xff, 0xff})
	a := &Agent{}
	f.Fuzz(func(t *testing.T, data []byte) {
		tab := newStreamCancels()
		var calls [2]int
		tab.add(2, func() { calls[0]++ })
		tab.add(4, func() { calls[1]++ })
		r := bytes.NewReader(data)
		a.readControl(r, tab, nil, nil, slog.New(slog.DiscardHandler))
		if r.Len() != 0 {
			t.Fatalf("reader stopped with %d bytes unread", r.Len())
		}
		if calls[0] > 1 || calls[1] > 1 {
			t.Fatalf("a stream cancelled more than once: %v", calls)
		}
		if len(tab.early) > maxEarlyCancels || len(tab.order) != len(tab.early) {
			t.Fatalf("early cancels: %d remembered, %d in order", len(tab.early), len(tab.order))
		}
	})
}
