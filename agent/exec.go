package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/protocol"
)

const (
	// stdinQueue is how many stdin frames may wait between the frame reader
	// and the stdin feeder. While it is full the frame reader waits, so a
	// cancel frame queued behind stdin the process does not read is only
	// seen once the process reads (timeouts and session loss still apply).
	stdinQueue = 8
	// dataWriteTimeout bounds one output frame's wait for the coordinator
	// to make room. Past it the stream counts as broken: it is closed (the
	// coordinator sees a truncated frame, not a stream that merely went
	// quiet), the process group is killed since its result can no longer
	// be reported, and output is read and dropped until it is gone.
	dataWriteTimeout = time.Minute
	// groupPoll is how often the end of an exec checks whether a process
	// group it sent SIGTERM to is gone yet.
	groupPoll = 20 * time.Millisecond
)

// serveExec runs the exec stream st: it decodes and checks the params, runs
// the process, streams its output and writes exactly one final frame (exit or
// error) unless ctx ends first (the session is gone: the process group is
// killed and nothing can be reported). It closes st and returns once the
// process group is dead or exited and every goroutine it started returned.
//
// An exec beyond Config.MaxExecs running at once is refused with a busy error
// frame.
func (a *Agent) serveExec(ctx context.Context, st *yamux.Stream, h protocol.Header) {
	if n := a.running.Add(1); n > int64(a.cfg.MaxExecs) {
		a.running.Add(-1)
		a.log.Warn("exec refused: at the limit of concurrent execs", "stream", st.StreamID(), "max_execs", a.cfg.MaxExecs)
		a.refuse(st, protocol.CodeBusy, fmt.Sprintf("node %s is running %d execs, its limit", a.cfg.NodeID, a.cfg.MaxExecs))
		return
	}
	a.m.execsRunning.Inc()
	defer func() {
		a.running.Add(-1)
		a.m.execsRunning.Dec()
	}()
	defer st.Close()
	broken := make(chan struct{})
	x := &execution{
		a:  a,
		st: st,
		w: &frameWriter{st: st, finalTimeout: a.cfg.Tunnel.WriteTimeout, dataTimeout: a.dataWriteTimeout,
			onBroken: func() { close(broken) }},
		broken: broken,
		log:    a.log.With("stream", st.StreamID()),
	}
	if err := h.DecodeParams(&x.p); err != nil {
		x.fail(protocol.CodeBadRequest, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	if err := x.p.Validate(); err != nil {
		x.fail(protocol.CodeBadRequest, fmt.Sprintf("node %s: exec params: %v", a.cfg.NodeID, err))
		return
	}
	x.run(ctx)
}

// execution is one exec stream's state. Its fields are owned by the handler
// goroutine, except w (shared, locked) and the copiers' counters (written by
// each copier, read by the handler after the copier returned).
type execution struct {
	a      *Agent
	st     *yamux.Stream
	w      *frameWriter
	broken <-chan struct{} // closed when an output write failed and w closed st
	log    *slog.Logger
	p      protocol.ExecParams

	stdout, stderr outputCount
}

// outputCount is what one copier saw.
type outputCount struct {
	total     int64
	truncated bool
}

// fail writes the final error frame.
func (x *execution) fail(code, msg string) {
	x.log.Warn("exec failed", "code", code, "err", msg)
	if err := x.w.final(protocol.FrameError, &protocol.ErrorInfo{Code: code, Message: msg}); err != nil {
		x.log.Debug("write error frame", "err", err)
	}
}

// command builds the process from the params, not yet started.
func (x *execution) command() (*exec.Cmd, string) {
	var cmd *exec.Cmd
	var name string
	if x.p.Script != "" {
		cmd = exec.Command("bash", "-s")
		name = "bash -s"
	} else {
		cmd = exec.Command(x.p.Argv[0], x.p.Argv[1:]...)
		name = x.p.Argv[0]
	}
	// A relative Cwd is taken relative to the data directory.
	cmd.Dir = x.a.cfg.DataDir
	if x.p.Cwd != "" {
		cmd.Dir = filepath.Join(x.a.cfg.DataDir, x.p.Cwd)
		if filepath.IsAbs(x.p.Cwd) {
			cmd.Dir = filepath.Clean(x.p.Cwd)
		}
	}
	cmd.Env = x.a.childEnv(x.p.Env, cmd.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, name
}

// run starts the process and sees it through to the final frame.
func (x *execution) run(ctx context.Context) {
	a := x.a
	cmd, name := x.command()

	// Our own pipes (not cmd.StdoutPipe): os/exec then runs no copying
	// goroutines and Wait returns as soon as the leader exits, and we can
	// put deadlines on the read ends.
	outR, outW, err := os.Pipe()
	if err != nil {
		x.fail(protocol.CodeInternal, fmt.Sprintf("node %s: stdout pipe: %v", a.cfg.NodeID, err))
		return
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		x.fail(protocol.CodeInternal, fmt.Sprintf("node %s: stderr pipe: %v", a.cfg.NodeID, err))
		return
	}
	defer errR.Close()
	var inR, inW *os.File
	if x.p.Script != "" || x.p.Stdin {
		if inR, inW, err = os.Pipe(); err != nil {
			outW.Close()
			errW.Close()
			x.fail(protocol.CodeInternal, fmt.Sprintf("node %s: stdin pipe: %v", a.cfg.NodeID, err))
			return
		}
		cmd.Stdin = inR
	}
	cmd.Stdout, cmd.Stderr = outW, errW

	start := time.Now()
	err = cmd.Start()
	// The child holds its own copies now.
	outW.Close()
	errW.Close()
	if inR != nil {
		inR.Close()
	}
	if err != nil {
		if inW != nil {
			inW.Close()
		}
		x.fail(protocol.CodeStartFailed, fmt.Sprintf("node %s: start %q in %s: %v", a.cfg.NodeID, name, cmd.Dir, err))
		return
	}
	pgid := cmd.Process.Pid
	x.log.Debug("exec started", "cmd", name, "pid", pgid)

	var wg sync.WaitGroup
	done := make(chan struct{}) // closed when the handler is finishing
	waitCh := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		waitCh <- cmd.Wait()
	}()
	copyDone := make(chan struct{}, 2)
	limit := x.p.OutputLimit
	if limit == 0 {
		limit = a.cfg.OutputLimit
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		x.copyOut(outR, protocol.FrameStdout, limit, &x.stdout)
		copyDone <- struct{}{}
	}()
	go func() {
		defer wg.Done()
		x.copyOut(errR, protocol.FrameStderr, limit, &x.stderr)
		copyDone <- struct{}{}
	}()
	cancelCh := make(chan struct{}, 1)
	var stdinCh chan []byte
	if x.p.Stdin {
		stdinCh = make(chan []byte, stdinQueue)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		x.readFrames(stdinCh, cancelCh, done)
	}()
	if inW != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			feedStdin(inW, x.p.Script, stdinCh, done)
		}()
	}

	var (
		exited              bool
		waitErr             error
		end                 time.Time
		copiers             = 2
		timedOut, cancelled bool
		lost                bool
		termSent, killSent  bool
		timeoutC, graceC    <-chan time.Time
		drainC              <-chan time.Time
		drainStage          int
		ctxDone             = ctx.Done()
		brokenC             = x.broken
		cancelC             = (<-chan struct{})(cancelCh)
	)
	kill := func(sig syscall.Signal) {
		if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			x.log.Warn("kill process group", "pgid", pgid, "signal", signalName(sig), "err", err)
		}
	}
	terminate := func() {
		if termSent || killSent {
			return
		}
		termSent = true
		kill(syscall.SIGTERM)
		graceC = time.After(a.cfg.KillGrace)
	}
	if x.p.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(x.p.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeoutC = t.C
	}
	for !exited || copiers > 0 {
		select {
		case waitErr = <-waitCh:
			exited, end = true, time.Now()
			timeoutC = nil
			drainC = time.After(a.cfg.PipeWait)
		case <-copyDone:
			copiers--
		case <-timeoutC:
			timeoutC = nil
			timedOut = true
			x.log.Info("exec timed out; killing process group", "pgid", pgid, "timeout_ms", x.p.TimeoutMS)
			terminate()
		case <-cancelC:
			cancelC = nil
			if exited {
				// The outcome is known; just do not leave the group behind.
				killSent = true
				kill(syscall.SIGKILL)
				continue
			}
			cancelled = !timedOut
			x.log.Info("exec cancelled; killing process group", "pgid", pgid)
			terminate()
		case <-ctxDone:
			ctxDone = nil
			lost = true
			x.log.Info("session gone; killing process group", "pgid", pgid)
			if exited {
				killSent = true
				kill(syscall.SIGKILL)
				continue
			}
			terminate()
		case <-brokenC:
			brokenC = nil
			lost = true
			x.log.Warn("exec stream broken by a stalled output write; killing process group", "pgid", pgid)
			if exited {
				killSent = true
				kill(syscall.SIGKILL)
				continue
			}
			terminate()
		case <-graceC:
			graceC = nil
			killSent = true
			kill(syscall.SIGKILL)
		case <-drainC:
			if drainStage == 0 {
				// The leader is gone but something still holds its output
				// pipes: a background child. The job is over; end the group.
				x.log.Info("exec exited but its output pipes are still open; killing process group", "pgid", pgid)
				drainStage = 1
				killSent = true
				kill(syscall.SIGKILL)
				drainC = time.After(a.cfg.PipeWait)
				continue
			}
			// Held by a process outside the group (it called setsid):
			// stop reading.
			x.log.Warn("output pipes still open after killing the process group; abandoning them", "pgid", pgid)
			drainC = nil
			outR.SetReadDeadline(time.Now())
			errR.SetReadDeadline(time.Now())
		}
	}
	// SIGTERM was sent but not SIGKILL: give the rest of the group its
	// grace, then kill what is left.
	for termSent && !killSent && groupAlive(pgid) {
		select {
		case <-graceC:
			killSent = true
			kill(syscall.SIGKILL)
		case <-time.After(groupPoll):
		}
	}

	status, err := x.status(cmd, waitErr, start, end, timedOut, cancelled)
	a.m.execDuration.Observe(end.Sub(start).Seconds())
	switch {
	case lost:
		x.log.Info("exec ended without a usable stream; result dropped", "pid", pgid)
	case err != nil:
		x.fail(protocol.CodeInternal, fmt.Sprintf("node %s: wait for %q: %v", a.cfg.NodeID, name, err))
	default:
		x.log.Info("exec finished", "pid", pgid, "exit_code", status.ExitCode, "signal", status.Signal,
			"timed_out", status.TimedOut, "cancelled", status.Cancelled, "duration_ms", status.DurationMS)
		if err := x.w.final(protocol.FrameExit, status); err != nil {
			x.log.Warn("exec result not delivered", "err", err)
		}
	}

	// Stop the frame reader and the stdin feeder, wherever they block.
	close(done)
	x.st.SetReadDeadline(time.Now())
	if inW != nil {
		inW.SetWriteDeadline(time.Now())
	}
	wg.Wait()
}

// status builds the exit status from the leader's wait result.
func (x *execution) status(cmd *exec.Cmd, waitErr error, start, end time.Time, timedOut, cancelled bool) (*protocol.ExitStatus, error) {
	ps := cmd.ProcessState
	if ps == nil {
		return nil, waitErr
	}
	s := &protocol.ExitStatus{
		DurationMS:      float64(end.Sub(start).Microseconds()) / 1000,
		StdoutBytes:     x.stdout.total,
		StderrBytes:     x.stderr.total,
		StdoutTruncated: x.stdout.truncated,
		StderrTruncated: x.stderr.truncated,
		TimedOut:        timedOut,
		Cancelled:       cancelled,
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		s.ExitCode = 128 + int(ws.Signal())
		s.Signal = signalName(ws.Signal())
	default:
		s.ExitCode = ps.ExitCode()
	}
	if timedOut {
		s.ExitCode = 124
	}
	return s, nil
}

// copyOut forwards one output pipe as frames of type t until the pipe is
// closed (or its read deadline passes). Bytes past limit, and every byte
// once the stream is broken, are read and dropped so the process never
// blocks on a full pipe.
func (x *execution) copyOut(r *os.File, t protocol.FrameType, limit int64, c *outputCount) {
	buf := make([]byte, protocol.ChunkSize)
	var sent int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			c.total += int64(n)
			keep := min(int64(n), limit-sent)
			if keep > 0 {
				sent += keep
				x.w.data(t, buf[:keep])
			}
			if keep < int64(n) {
				c.truncated = true
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) {
				x.log.Warn("read process output", "frame", t.String(), "err", err)
			}
			return
		}
	}
}

// readFrames reads the coordinator's frames for the whole life of the exec:
// stdin data (queued for the feeder), stdin close, and cancel. A clean EOF
// (the coordinator half-closed) ends stdin but is not a cancel; any other
// read error (stream reset, session gone) is. It returns on a read error or
// when done is closed while it waits to queue stdin.
func (x *execution) readFrames(stdinCh chan<- []byte, cancelCh chan<- struct{}, done <-chan struct{}) {
	stdinOpen := stdinCh != nil
	closeStdin := func() {
		if stdinOpen {
			close(stdinCh)
			stdinOpen = false
		}
	}
	defer closeStdin()
	signalCancel := func() {
		select {
		case cancelCh <- struct{}{}:
		default:
		}
	}
	fr := protocol.NewFrameReader(x.st)
	for {
		f, err := fr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			select {
			case <-done: // our own deadline at the end
			default:
				x.log.Debug("exec stream broken; cancelling", "err", err)
				signalCancel()
			}
			return
		}
		switch f.Type {
		case protocol.FrameStdin:
			if !stdinOpen {
				continue
			}
			select {
			case stdinCh <- bytes.Clone(f.Payload):
			case <-done:
				return
			}
		case protocol.FrameStdinClose:
			closeStdin()
		case protocol.FrameCancel:
			signalCancel()
		default:
			x.log.Debug("ignoring unexpected frame on exec stream", "frame", f.Type.String())
		}
	}
}

// feedStdin writes the script (script mode) or the queued stdin frames
// (argv mode with stdin) into the process's stdin and closes it at the end.
// Once a write fails (the process closed stdin) later data is dropped.
func feedStdin(w *os.File, script string, stdinCh <-chan []byte, done <-chan struct{}) {
	defer w.Close()
	if script != "" {
		io.WriteString(w, script)
		return
	}
	broken := false
	for {
		select {
		case b, ok := <-stdinCh:
			if !ok {
				return
			}
			if !broken {
				if _, err := w.Write(b); err != nil {
					broken = true
				}
			}
		case <-done:
			return
		}
	}
}

// frameWriter serialises frames on an exec stream: output chunks from two
// copiers and the final frame never interleave.
type frameWriter struct {
	mu           sync.Mutex
	st           *yamux.Stream
	err          error // first write error; later writes are skipped
	finalTimeout time.Duration
	// dataTimeout bounds one data frame's write; zero means
	// dataWriteTimeout.
	dataTimeout time.Duration
	// onBroken, if set, is called once (under mu) after a failed data
	// write closed the stream.
	onBroken func()
}

// data writes one output frame, waiting at most dataTimeout for room. A
// write that fails or stalls may have sent part of the frame, so the stream
// is closed at once: the peer then reads a truncated frame (an error it
// reports) instead of waiting on a stream that can never carry a valid frame
// again. Later writes are skipped.
func (w *frameWriter) data(t protocol.FrameType, p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	d := w.dataTimeout
	if d <= 0 {
		d = dataWriteTimeout
	}
	w.st.SetWriteDeadline(time.Now().Add(d))
	if err := protocol.WriteFrame(w.st, t, p); err != nil {
		w.err = fmt.Errorf("write %s frame on stream %d: %w", t, w.st.StreamID(), err)
		w.st.Close()
		if w.onBroken != nil {
			w.onBroken()
		}
	}
	return w.err
}

// final writes the operation's last frame as JSON.
func (w *frameWriter) final(t protocol.FrameType, v any) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	w.st.SetWriteDeadline(time.Now().Add(w.finalTimeout))
	if err := protocol.WriteJSONFrame(w.st, t, v); err != nil {
		w.err = fmt.Errorf("write %s frame on stream %d: %w", t, w.st.StreamID(), err)
	}
	return w.err
}

// groupAlive reports whether process group pgid still has members (zombies
// not yet reaped by their new parent count too).
func groupAlive(pgid int) bool {
	return syscall.Kill(-pgid, 0) == nil
}

// signalName returns a signal's name without the SIG prefix ("KILL").
func signalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return strings.TrimPrefix(n, "SIG")
	}
	return fmt.Sprintf("%d", int(sig))
}
