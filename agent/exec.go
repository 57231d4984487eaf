package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

const (
	// stdinQueue is how many stdin frames may wait between the frame reader
	// and the stdin feeder. While it is full the frame reader waits, so a
	// cancel frame queued behind stdin the process does not read is only
	// seen once the process reads; the coordinator's out-of-band cancel
	// (cancel.go) is seen at once.
	stdinQueue = 8
	// dataWriteTimeout bounds one output frame's wait for the coordinator
	// to make room. Past it the stream counts as broken: it is closed (the
	// coordinator sees a truncated frame, not a stream that merely went
	// quiet), the process group is killed since its result can no longer
	// be reported, and output is read and dropped until it is gone.
	dataWriteTimeout = time.Minute
	// groupPoll is how often the end of an exec checks whether a process
	// group it sent SIGTERM to is gone yet (see groupWatch).
	groupPoll = 20 * time.Millisecond
)

// serveExec runs the exec stream st: it decodes and checks the params, runs
// the process (or, in fail-fast mode, each command in turn), streams its
// output and writes exactly one final frame (exit or error) unless ctx ends
// first (the session is gone: the process group is killed and nothing can be
// reported). It closes st and returns once the process group is dead or
// exited and every goroutine it started returned. A detached exec
// (ExecParams.Detach) is handed to the job table (jobs.go) and answered as
// soon as it started.
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
	// The slot is free before the final frame is written (x.final), and
	// at the latest before the stream closes (defers run last first): a
	// client that starts its next exec once it read one's result, or once
	// the stream ended, must not be refused as busy by the one that ended.
	var freed sync.Once
	release := func() {
		freed.Do(func() {
			a.running.Add(-1)
			a.m.execsRunning.Dec()
		})
	}
	defer st.Close()
	defer release()
	broken := make(chan struct{})
	x := &execution{
		a:       a,
		release: release,
		st:      st,
		w: &frameWriter{st: st, finalTimeout: a.cfg.Tunnel.WriteTimeout, dataTimeout: a.dataWriteTimeout,
			onBroken: func() { close(broken) }},
		broken: broken,
		crash:  newCrash(),
		log:    a.log.With("stream", st.StreamID()),
	}
	defer a.guard.Recover("exec stream", a.answerPanic(st, x.w))
	if err := h.DecodeParams(&x.p); err != nil {
		x.fail(protocol.CodeBadRequest, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	if err := x.p.Validate(); err != nil {
		x.fail(protocol.CodeBadRequest, fmt.Sprintf("node %s: exec params: %s", a.cfg.NodeID, strings.ReplaceAll(err.Error(), "\n", "; ")))
		return
	}
	acct, refusal := a.runAs(x.p.User, "exec")
	if refusal != nil {
		x.fail(refusal.Code, refusal.Message)
		return
	}
	x.acct = acct
	if x.p.Detach {
		a.startDetached(x)
		return
	}
	x.run(ctx)
}

// execution is one exec stream's state. Its fields are owned by the handler
// goroutine, except w (shared, locked) and the copiers' counters (written by
// each copier, read by the handler after the copier returned).
type execution struct {
	a       *Agent
	release func() // frees the exec's MaxExecs slot; idempotent
	st      *yamux.Stream
	w       *frameWriter
	broken  <-chan struct{} // closed when an output write failed and w closed st
	// crash records a panic contained in one of the exec's helper
	// goroutines (copiers, frame reader, waiter, stdin feeder): the process
	// group is killed and the exec answered with an internal error.
	crash *crash
	log   *slog.Logger
	p     protocol.ExecParams
	// acct is the account the exec's processes run as (runas.go).
	acct *account

	// stdout and stderr count the output of every process of the exec
	// (fail-fast batches run several); the limit applies to the sum.
	stdout, stderr outputCount

	// after is what the exec's processes leave to do once the final frame
	// is written (runAfter): closing their output pipes' read ends and
	// clearing their group records (orphans.go), which nobody waiting for
	// the result needs first. Owned by the handler goroutine.
	after []func()
}

// runAfter runs and forgets x.after, in the order it was added.
func (x *execution) runAfter() {
	for _, f := range x.after {
		f()
	}
	x.after = nil
}

// outputCount is what the copiers of one output stream saw.
type outputCount struct {
	total     int64 // bytes read
	sent      int64 // bytes forwarded (at most the limit)
	truncated bool
}

// fail writes the final error frame.
func (x *execution) fail(code, msg string) {
	x.log.Warn("exec failed", "code", code, "err", msg)
	x.release()
	if err := x.w.final(protocol.FrameError, &protocol.ErrorInfo{Code: code, Message: msg}); err != nil {
		x.log.Debug("write error frame", "err", err)
	}
}

// procSpec is one process an exec runs.
type procSpec struct {
	argv   []string
	name   string // for messages: "bash -s", "bash -c" or argv[0]
	script string // fed on stdin (bash -s); "" for none
	stdin  bool   // stdin frames are fed to it
}

// processes lists what the params run: one process, or one per command in
// fail-fast mode.
func (x *execution) processes() []procSpec {
	if s := x.p.ShellScript(); s != "" {
		return []procSpec{{argv: []string{"bash", "-s"}, name: "bash -s", script: s}}
	}
	if x.p.FailFast {
		specs := make([]procSpec, len(x.p.Commands))
		for i, c := range x.p.Commands {
			specs[i] = procSpec{argv: []string{"bash", "-c", c}, name: "bash -c"}
		}
		return specs
	}
	return []procSpec{{argv: x.p.Argv, name: x.p.Argv[0], stdin: x.p.Stdin}}
}

// workDir resolves the params' cwd for acct (relative to the data
// directory, or to a named account's home: Agent.resolveDir) and checks
// that it is a directory, so that a bad cwd is reported as such rather than
// as a failure to start the command. (The check is the agent's; a
// directory the account may not enter fails the start.)
func (a *Agent) workDir(acct *account, cwd string) (string, error) {
	dir := a.resolveDir(acct, cwd)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("cwd %s: no such file or directory", protocol.QuoteName(dir))
	case err != nil:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", fmt.Errorf("cwd %s: %v", protocol.QuoteName(dir), err)
	case !fi.IsDir():
		return "", fmt.Errorf("cwd %s: not a directory", protocol.QuoteName(dir))
	}
	return dir, nil
}

// runState is what ends an exec, shared by its processes: the channels are
// set to nil once they fired, and the flags record what happened.
type runState struct {
	timeout <-chan time.Time
	cancel  <-chan struct{}
	ctxDone <-chan struct{}
	// cause is context.Cause of the exec's ctx: errSessionGone when the
	// session died, else the agent is shutting down.
	cause   func() error
	broken  <-chan struct{}
	crashed <-chan struct{}

	timedOut, cancelled, lost bool
	// shutdown: lost because the agent is stopping, not because the
	// session died; the coordinator is told so.
	shutdown  bool
	outputCut bool
	failed    bool // a helper goroutine panicked
}

// stopping reports whether the exec must not start another process.
func (rs *runState) stopping() bool { return rs.timedOut || rs.cancelled || rs.lost || rs.failed }

// procResult is how one process ended.
type procResult struct {
	cmd     *exec.Cmd
	waitErr error
	end     time.Time
}

// run runs the processes of the exec and sees them through to the final
// frame.
func (x *execution) run(ctx context.Context) {
	a := x.a
	dir, err := a.workDir(x.acct, x.p.Cwd)
	if err != nil {
		x.fail(protocol.CodeStartFailed, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	specs := x.processes()
	a.hook("exec", &x.p)
	defer x.runAfter() // after the final frame, however the exec ends

	var wg sync.WaitGroup
	done := make(chan struct{}) // closed when the handler is finishing
	cancelCh := make(chan struct{}, 1)
	var stdinCh chan []byte
	if x.p.Stdin {
		stdinCh = make(chan []byte, stdinQueue)
	}
	// The coordinator's out-of-band cancel (cancel.go) is a FrameCancel
	// that cannot be stuck behind stdin.
	defer a.cancels.add(x.st, func() {
		select {
		case cancelCh <- struct{}{}:
		default:
		}
	})()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer a.guard.Recover("exec frame reader", x.crash.report)
		x.readFrames(stdinCh, cancelCh, done)
	}()
	defer func() {
		// Stop the frame reader wherever it blocks.
		close(done)
		x.st.SetReadDeadline(time.Now())
		wg.Wait()
	}()

	rs := &runState{cancel: cancelCh, ctxDone: ctx.Done(), cause: func() error { return context.Cause(ctx) }, broken: x.broken, crashed: x.crash.done()}
	if x.p.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(x.p.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		rs.timeout = t.C
	}
	limit := x.p.OutputLimit
	if limit == 0 {
		limit = a.cfg.OutputLimit
	}

	start := time.Now()
	var last procResult
	var failed *int
	for i, spec := range specs {
		if rs.stopping() {
			break
		}
		r, err := x.runProcess(spec, dir, limit, rs, stdinCh)
		if err != nil {
			x.fail(startFailCode(err, dir), fmt.Sprintf("node %s: %s", a.cfg.NodeID, startFailure(spec.name, err, dir)))
			return
		}
		last = r
		if x.p.FailFast && (rs.stopping() || r.cmd.ProcessState == nil || !r.cmd.ProcessState.Success()) {
			failed = &i
			break
		}
	}
	a.m.execDuration.Observe(last.end.Sub(start).Seconds())

	status, err := x.status(last, start, rs)
	switch {
	case rs.shutdown:
		// Said in the node's terms: without it the coordinator would see
		// the stream end and report "tunnel lost: unexpected EOF".
		x.fail(protocol.ResultCodeShutdown, fmt.Sprintf("node %s: its agent shut down; job cancelled", a.cfg.NodeID))
	case rs.lost:
		x.log.Info("exec ended without a usable stream; result dropped")
	case rs.failed:
		x.fail(protocol.CodeInternal, fmt.Sprintf("node %s: %v", a.cfg.NodeID, x.crash.error()))
	case err != nil:
		x.fail(protocol.CodeInternal, fmt.Sprintf("node %s: wait for %s: %v", a.cfg.NodeID, specs[0].name, err))
	default:
		status.FailedCommand = failed
		// The result first, the log line after: the coordinator and its
		// client wait for the one, nobody for the other (a log write is
		// a system call, more with journald).
		x.release()
		err := x.w.final(protocol.FrameExit, status)
		x.runAfter()
		x.log.Info("exec finished", "exit_code", status.ExitCode, "signal", status.Signal,
			"timed_out", status.TimedOut, "cancelled", status.Cancelled, "duration_ms", status.DurationMS,
			"output_cut", status.OutputCut)
		if err != nil {
			x.log.Warn("exec result not delivered", "err", err)
		}
	}
}

// runProcess starts one process of the exec in its own process group and
// drives it to its end: it returns once the group is dead or its leader
// exited and its output pipes were closed (or abandoned). It fails only when
// the process could not be started.
func (x *execution) runProcess(spec procSpec, dir string, limit int64, rs *runState, stdinCh <-chan []byte) (procResult, error) {
	a := x.a
	// The previous process's leftovers first: an exec holds one record
	// slot at a time (the slot file stays within MaxExecs slots).
	x.runAfter()
	cmd := exec.Command(spec.argv[0], spec.argv[1:]...)
	cmd.Dir = dir
	cmd.Env = a.procEnv(x.acct, x.p.Env, dir)
	// Pdeathsig: if the agent dies (even by SIGKILL) the kernel kills the
	// leader at once. The rest of its group survives that: the group is
	// recorded below (orphans.go), and the next agent to start kills it.
	// Linux ties the signal to the forking thread, not the process: nothing
	// in the agent may end an OS thread (a goroutine that exits while
	// locked with runtime.LockOSThread), or it would kill leaders early.
	// The Go runtime ends a thread only then, and the agent locks none
	// (the shim of a detached job, which must fork from a thread that
	// lives as long as it does, forks from its locked main thread:
	// jobshim.go). We keep it as the first guard rather than rely on the
	// record alone: it acts at the agent's death, not at its next start
	// (which may never come), and costs nothing.
	// Credential: the account's uid, gid and groups (nil: the agent's own).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: x.acct.credential()}

	// Our own pipes (not cmd.StdoutPipe): os/exec then runs no copying
	// goroutines and Wait returns as soon as the leader exits, and we can
	// put deadlines on the read ends.
	// Only the agent's ends are in the poller (childPipe).
	outR, outW, err := childPipe(false)
	if err != nil {
		return procResult{}, fmt.Errorf("stdout pipe: %w", err)
	}
	// Closed once the exec's final frame is written (a group of
	// fail-fast's processes' pipes at once): its copiers are done by
	// then, and nobody waits for the close.
	x.after = append(x.after, func() { outR.Close() })
	errR, errW, err := childPipe(false)
	if err != nil {
		outW.Close()
		return procResult{}, fmt.Errorf("stderr pipe: %w", err)
	}
	x.after = append(x.after, func() { errR.Close() })
	var inR, inW *os.File
	if spec.script != "" || spec.stdin {
		if inW, inR, err = childPipe(true); err != nil {
			outW.Close()
			errW.Close()
			return procResult{}, fmt.Errorf("stdin pipe: %w", err)
		}
		cmd.Stdin = inR
	} else if null, err := devNull(); err == nil {
		cmd.Stdin = null // else os/exec opens /dev/null itself
	}
	cmd.Stdout, cmd.Stderr = outW, errW

	forked := bracketFork()
	err = cmd.Start()
	ft := forked()
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
		return procResult{}, err
	}
	pgid := cmd.Process.Pid
	log := x.log.With("pid", pgid)
	log.Debug("exec started", "cmd", spec.name)
	// Cleared once the exec's final frame is written (x.after), the
	// group being over by then (the defers below run first and this
	// function returns only then); an agent killed in between leaves a
	// record of a group that is over, which the next agent leaves alone.
	unrecord := a.recordStartedGroup(pgid, ft)
	x.after = append(x.after, unrecord)

	var wg sync.WaitGroup
	procDone := make(chan struct{}) // closed when this process's run ends
	defer func() {
		close(procDone)
		if inW != nil {
			inW.SetWriteDeadline(time.Now())
		}
		wg.Wait()
	}()
	// A panic unwinding the loop below must not wait (above) for copiers
	// of a process that keeps running: end the group and stop reading.
	returned := false
	defer func() {
		if !returned {
			syscall.Kill(-pgid, syscall.SIGKILL)
			outR.SetReadDeadline(time.Now())
			errR.SetReadDeadline(time.Now())
		}
	}()
	waitCh := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer a.guard.Recover("exec waiter", func(e *panics.Error) {
			x.crash.report(e)
			waitCh <- e
		})
		waitCh <- cmd.Wait()
	}()
	copyDone := make(chan struct{}, 2)
	wg.Add(2)
	for _, c := range []struct {
		r     *os.File
		t     protocol.FrameType
		count *outputCount
	}{{outR, protocol.FrameStdout, &x.stdout}, {errR, protocol.FrameStderr, &x.stderr}} {
		go func() {
			defer wg.Done()
			defer func() { copyDone <- struct{}{} }()
			defer a.guard.Recover("exec output copier", x.crash.report)
			x.copyOut(c.r, c.t, limit, c.count)
		}()
	}
	if inW != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer a.guard.Recover("exec stdin feeder", x.crash.report)
			feedStdin(inW, spec.script, stdinCh, procDone)
		}()
	}

	var (
		res                = procResult{cmd: cmd}
		exited             bool
		copiers            = 2
		termSent, killSent bool
		graceC, drainC     <-chan time.Time
		abandonC           <-chan time.Time
		abandoned          bool
	)
	kill := func(sig syscall.Signal) {
		if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			log.Warn("kill process group", "pgid", pgid, "signal", signalName(sig), "err", err)
		}
	}
	// end stops the group: SIGTERM and a grace while the leader runs,
	// SIGKILL at once when only the rest of its group is left.
	end := func() {
		if exited {
			if !killSent {
				killSent = true
				kill(syscall.SIGKILL)
			}
			return
		}
		if termSent || killSent {
			return
		}
		termSent = true
		kill(syscall.SIGTERM)
		graceC = time.After(a.cfg.KillGrace)
	}
	for !exited || copiers > 0 {
		select {
		case res.waitErr = <-waitCh:
			exited, res.end = true, time.Now()
			if a.cfg.PipeWait > 0 && !killSent {
				drainC = time.After(a.cfg.PipeWait)
			}
		case <-copyDone:
			copiers--
		case <-rs.timeout:
			rs.timeout = nil
			rs.timedOut = true
			log.Info("exec timed out; killing process group", "timeout_ms", x.p.TimeoutMS)
			end()
		case <-rs.cancel:
			rs.cancel = nil
			if !exited && !rs.timedOut {
				rs.cancelled = true
			}
			log.Info("exec cancelled; killing process group")
			end()
		case <-rs.ctxDone:
			rs.ctxDone = nil
			rs.lost = true
			if rs.cause != nil && !errors.Is(rs.cause(), errSessionGone) {
				rs.shutdown = true
				log.Info("agent shutting down; killing process group")
			} else {
				log.Info("session gone; killing process group")
			}
			end()
		case <-rs.broken:
			rs.broken = nil
			rs.lost = true
			log.Warn("exec stream broken by a stalled output write; killing process group")
			end()
		case <-rs.crashed:
			rs.crashed = nil
			rs.failed = true
			log.Error("exec failed with an internal error; killing process group")
			end()
		case <-graceC:
			graceC = nil
			killSent = true
			kill(syscall.SIGKILL)
		case <-drainC:
			// The leader is gone but something still holds its output
			// pipes past PipeWait: a background child. End the group.
			drainC = nil
			rs.outputCut = true
			log.Info("exec exited but its output pipes are still open past the pipe wait; killing process group", "pipe_wait", a.cfg.PipeWait)
			killSent = true
			kill(syscall.SIGKILL)
		case <-abandonC:
			// Held by a process outside the group (it called setsid):
			// stop reading.
			abandonC = nil
			abandoned = true
			log.Warn("output pipes still open after killing the process group; abandoning them")
			outR.SetReadDeadline(time.Now())
			errR.SetReadDeadline(time.Now())
		}
		if exited && killSent && !abandoned && abandonC == nil && copiers > 0 {
			abandonC = time.After(a.cfg.KillGrace)
		}
	}
	if res.end.IsZero() {
		res.end = time.Now()
	}
	// SIGTERM was sent but not SIGKILL: give the rest of the group its
	// grace, then kill what is left. Zombies are dead: a group of nothing
	// else is over at once (see groupWatch).
	group := groupWatch{pgid: pgid}
	for termSent && !killSent && group.alive() {
		select {
		case <-graceC:
			killSent = true
			kill(syscall.SIGKILL)
		case <-time.After(groupPoll):
		}
	}
	returned = true
	return res, nil
}

// status builds the exit status from the last process's wait result.
func (x *execution) status(r procResult, start time.Time, rs *runState) (*protocol.ExitStatus, error) {
	if r.cmd == nil || r.cmd.ProcessState == nil {
		if r.waitErr == nil {
			r.waitErr = errors.New("no process ran")
		}
		return nil, r.waitErr
	}
	ps := r.cmd.ProcessState
	s := &protocol.ExitStatus{
		DurationMS:      float64(r.end.Sub(start).Microseconds()) / 1000,
		StdoutBytes:     x.stdout.total,
		StderrBytes:     x.stderr.total,
		StdoutTruncated: x.stdout.truncated,
		StderrTruncated: x.stderr.truncated,
		TimedOut:        rs.timedOut,
		Cancelled:       rs.cancelled,
		OutputCut:       rs.outputCut,
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		s.ExitCode = 128 + int(ws.Signal())
		s.Signal = signalName(ws.Signal())
	default:
		s.ExitCode = ps.ExitCode()
	}
	if rs.timedOut {
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
	for {
		n, err := r.Read(buf)
		if n > 0 {
			x.a.hook("exec-output", &x.p)
			c.total += int64(n)
			keep := min(int64(n), limit-c.sent)
			if keep > 0 {
				c.sent += keep
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
	// finished is set once the final frame was written; later data and
	// final frames are skipped.
	finished bool
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
	if w.finished {
		return errFinalWritten
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

// errFinalWritten is what a frameWriter returns for a frame after the
// final one, which it does not write.
var errFinalWritten = errors.New("final frame already written")

// final writes the operation's last frame as JSON, once: a later call
// (a contained panic's error after the exit frame) writes nothing.
func (w *frameWriter) final(t protocol.FrameType, v any) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if w.finished {
		return errFinalWritten
	}
	w.finished = true
	w.st.SetWriteDeadline(time.Now().Add(w.finalTimeout))
	if err := protocol.WriteJSONFrame(w.st, t, v); err != nil {
		w.err = fmt.Errorf("write %s frame on stream %d: %w", t, w.st.StreamID(), err)
	}
	return w.err
}

// signalName returns a signal's name without the SIG prefix ("KILL").
func signalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return strings.TrimPrefix(n, "SIG")
	}
	return fmt.Sprintf("%d", int(sig))
}
