package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

const (
	// defaultPTYTerm is TERM when the params name none.
	defaultPTYTerm = "xterm-256color"
	// defaultPTYRows and defaultPTYCols are the window size when the params
	// give none.
	defaultPTYRows, defaultPTYCols = 24, 80
	// ptyEOF is the character FrameStdinClose types: the terminal's default
	// VEOF (Ctrl-D). At the start of a line it makes the reader see EOF.
	ptyEOF = 0x04
	// ptySignalQueue is how many FrameSignal requests may wait for the
	// handler.
	ptySignalQueue = 4
)

// ptySignals are the signals a FrameSignal may deliver, by name.
var ptySignals = map[string]syscall.Signal{
	"INT": syscall.SIGINT, "TERM": syscall.SIGTERM, "QUIT": syscall.SIGQUIT,
	"HUP": syscall.SIGHUP, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
	"WINCH": syscall.SIGWINCH, "KILL": syscall.SIGKILL, "CONT": syscall.SIGCONT,
	"STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP,
}

// hangupReason says why a pty session was hung up.
type hangupReason int

const (
	hangupCancel hangupReason = iota + 1 // FrameCancel
	hangupClosed                         // the client closed or broke the stream
)

// servePTY runs the pty stream st: it decodes and checks the params, starts
// the process on a new pseudo-terminal (its own session, the terminal as its
// controlling tty), relays the terminal both ways and writes FrameExit when
// the process ended, unless ctx ended first (the session is gone). It closes
// st and returns once the process's session is dead or exited and every
// goroutine it started returned.
func (a *Agent) servePTY(ctx context.Context, st *yamux.Stream, h protocol.Header) {
	defer st.Close()
	s := &ptySession{
		a:   a,
		st:  st,
		w:   &frameWriter{st: st, finalTimeout: a.cfg.Tunnel.WriteTimeout},
		log: a.log.With("stream", st.StreamID(), "kind", "pty"),
	}
	defer a.guard.Recover("pty stream", a.answerPanic(st, s.w))
	if err := h.DecodeParams(&s.p); err != nil {
		s.fail(protocol.CodeBadRequest, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	if err := s.p.Validate(); err != nil {
		s.fail(protocol.CodeBadRequest, fmt.Sprintf("node %s: pty params: %v", a.cfg.NodeID, err))
		return
	}
	acct, refusal := a.runAs(s.p.User, "shell")
	if refusal != nil {
		s.fail(refusal.Code, refusal.Message)
		return
	}
	s.acct = acct
	s.run(ctx)
}

// ptySession is one pty stream's state, owned by the handler goroutine
// except w (locked) and master (safe for concurrent use).
type ptySession struct {
	a      *Agent
	st     *yamux.Stream
	w      *frameWriter
	log    *slog.Logger
	p      protocol.PTYParams
	acct   *account // the account the process runs as (runas.go)
	master *os.File
	sid    int // the process's pid, session id and process group id
	output int64
	// abandoned is set when the handler stops reading a terminal that a
	// process outside the session keeps open (see copyOut).
	abandoned atomic.Bool
}

// fail writes the final error frame.
func (s *ptySession) fail(code, msg string) {
	s.log.Warn("pty failed", "code", code, "err", msg)
	if err := s.w.final(protocol.FrameError, &protocol.ErrorInfo{Code: code, Message: msg}); err != nil {
		s.log.Debug("write error frame", "err", err)
	}
}

// command builds the process from the params, not yet started: Argv, or
// the account's login shell with a "-" argv[0] (the passwd entry's shell
// for a named account; $SHELL for the agent's own; else /bin/bash). Its
// environment is the account's (Agent.procEnv) with TERM, then the
// params' Env.
func (s *ptySession) command() (*exec.Cmd, string) {
	var cmd *exec.Cmd
	var name string
	if len(s.p.Argv) > 0 {
		cmd = exec.Command(s.p.Argv[0], s.p.Argv[1:]...)
		name = s.p.Argv[0]
	} else {
		shell := os.Getenv("SHELL")
		if s.acct.named || shell == "" {
			shell = s.acct.shellPath()
		}
		cmd = exec.Command(shell)
		// The login convention: argv[0] starting with '-'.
		cmd.Args[0] = "-" + filepath.Base(shell)
		name = shell
	}
	cmd.Dir = s.a.resolveDir(s.acct, s.p.Cwd)
	term := s.p.Term
	if term == "" {
		term = defaultPTYTerm
	}
	cmd.Env = append(s.a.procEnv(s.acct, nil, cmd.Dir), "TERM="+term)
	keys := make([]string, 0, len(s.p.Env))
	for k := range s.p.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+s.p.Env[k])
	}
	return cmd, name
}

// run starts the process and sees it through to the final frame.
func (s *ptySession) run(ctx context.Context) {
	a := s.a
	cmd, name := s.command()
	rows, cols := s.p.Rows, s.p.Cols
	if rows == 0 {
		rows = defaultPTYRows
	}
	if cols == 0 {
		cols = defaultPTYCols
	}
	start := time.Now()
	m, err := startPTY(cmd, s.acct, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		s.fail(startFailCode(err, cmd.Dir), fmt.Sprintf("node %s: %s (on a pty, in %s)", a.cfg.NodeID, startFailure(name, err, cmd.Dir), protocol.QuoteName(cmd.Dir)))
		return
	}
	s.sid = cmd.Process.Pid
	s.master, err = pollable(m)
	if err != nil {
		syscall.Kill(-s.sid, syscall.SIGKILL)
		cmd.Wait()
		s.fail(protocol.CodeInternal, fmt.Sprintf("node %s: pty master: %v", a.cfg.NodeID, err))
		return
	}
	defer s.master.Close()
	s.log.Debug("pty started", "cmd", name, "pid", s.sid, "rows", rows, "cols", cols)

	var wg sync.WaitGroup
	done := make(chan struct{}) // closed when the handler is finishing
	waitCh := make(chan error, 1)
	outDone := make(chan struct{})
	sigCh := make(chan syscall.Signal, ptySignalQueue)
	hangupCh := make(chan hangupReason, 2)
	// The coordinator's out-of-band cancel (cancel.go): a FrameCancel that
	// cannot be stuck behind keystrokes the terminal does not take. It
	// sends at most once, readFrames too: the buffer holds both.
	defer a.cancels.add(s.st, func() {
		select {
		case hangupCh <- hangupCancel:
		default:
		}
	})()
	cr := newCrash() // a helper below panicked
	// A panic unwinding the loop below ends the terminal's session and
	// waits for the helpers, as the normal end does.
	returned := false
	defer func() {
		if !returned {
			s.killSession(syscall.SIGKILL)
			close(done)
			s.st.SetReadDeadline(time.Now())
			s.master.SetDeadline(time.Now())
			wg.Wait()
		}
	}()
	wg.Add(3)
	go func() {
		defer wg.Done()
		defer a.guard.Recover("pty waiter", func(e *panics.Error) {
			cr.report(e)
			waitCh <- e
		})
		waitCh <- cmd.Wait()
	}()
	go func() {
		defer wg.Done()
		defer close(outDone)
		defer a.guard.Recover("pty output copier", cr.report)
		s.copyOut()
	}()
	go func() {
		defer wg.Done()
		defer a.guard.Recover("pty frame reader", cr.report)
		s.readFrames(sigCh, hangupCh, done)
	}()

	var (
		exited, outClosed bool
		waitErr           error
		end               time.Time
		cancelled, lost   bool
		failed            bool // a helper panicked
		crashC            = cr.done()
		hupSent, killSent bool
		graceC, drainC    <-chan time.Time
		drainStage        int
		ctxDone           = ctx.Done()
		hangupC           = (<-chan hangupReason)(hangupCh)
		signalC           = (<-chan syscall.Signal)(sigCh)
		outDoneC          = (<-chan struct{})(outDone)
	)
	killAll := func() {
		killSent = true
		s.killSession(syscall.SIGKILL)
	}
	// hangup ends the session: SIGHUP now, SIGKILL after the grace (or at
	// once when the leader already exited: its outcome is known).
	hangup := func() {
		switch {
		case exited:
			killAll()
		case !hupSent && !killSent:
			hupSent = true
			s.killSession(syscall.SIGHUP)
			graceC = time.After(a.cfg.KillGrace)
		}
	}
	for !exited || !outClosed {
		select {
		case waitErr = <-waitCh:
			exited, end = true, time.Now()
			drainC = time.After(a.cfg.PipeWait)
		case <-outDoneC:
			outDoneC, outClosed = nil, true
		case sig := <-signalC:
			if !exited {
				s.signal(sig)
			}
		case r := <-hangupC:
			hangupC = nil
			cancelled = r == hangupCancel && !exited
			s.log.Info("pty hung up; ending its session", "pid", s.sid, "cancel", r == hangupCancel)
			hangup()
		case <-ctxDone:
			ctxDone, lost = nil, true
			s.log.Info("tunnel session gone; ending pty session", "pid", s.sid)
			hangup()
		case <-crashC:
			crashC, failed = nil, true
			s.log.Error("pty failed with an internal error; killing its session", "pid", s.sid)
			killAll()
		case <-graceC:
			graceC = nil
			killAll()
		case <-drainC:
			drainC = s.drainStep(&drainStage, killAll)
			a.hook("pty-drain", &s.p)
		}
	}
	// SIGHUP was sent but not SIGKILL: give the rest of the session its
	// grace, then kill what is left.
	for hupSent && !killSent && s.sessionAlive() {
		select {
		case <-graceC:
			killAll()
		case <-time.After(groupPoll):
		}
	}

	status, err := ptyStatus(cmd, waitErr, start, end, cancelled)
	switch {
	case lost:
		s.log.Info("pty ended without a session; result dropped", "pid", s.sid)
	case failed:
		s.fail(protocol.CodeInternal, fmt.Sprintf("node %s: %v", a.cfg.NodeID, cr.error()))
	case err != nil:
		s.fail(protocol.CodeInternal, fmt.Sprintf("node %s: wait for %q: %v", a.cfg.NodeID, name, err))
	default:
		status.StdoutBytes = s.output
		s.log.Info("pty finished", "pid", s.sid, "exit_code", status.ExitCode, "signal", status.Signal,
			"cancelled", status.Cancelled, "duration_ms", status.DurationMS)
		if err := s.w.final(protocol.FrameExit, status); err != nil {
			s.log.Debug("pty result not delivered", "err", err)
		}
	}

	// Stop the frame reader wherever it blocks (stream read, terminal write).
	returned = true
	close(done)
	s.st.SetReadDeadline(time.Now())
	s.master.SetWriteDeadline(time.Now())
	wg.Wait()
}

// drainStep is one step of a pty's end after its leader exited, at
// *stage: it returns when to take the next step (nil: never). The leader's
// exit ends the session: what is left of it is killed (killAll). The
// output copier reads on until the terminal closes, so that what the
// processes wrote reaches the client; only a terminal kept open by a
// process outside the session, once the session is dead, is abandoned.
func (s *ptySession) drainStep(stage *int, killAll func()) <-chan time.Time {
	if *stage == 0 {
		*stage = 1
		if s.sessionAlive() {
			s.log.Info("pty process exited but its session lives on; killing it", "pid", s.sid)
		}
		killAll()
		return time.After(max(s.a.cfg.PipeWait, groupPoll))
	}
	// Every process that held the terminal closed it (the copier reads
	// what they wrote to the end, then EIO), or killed processes are still
	// dying: wait for the copier.
	if s.terminalClosed() || s.sessionAlive() {
		return time.After(groupPoll)
	}
	// Held by a process outside the session: read what is buffered, then
	// stop.
	s.log.Warn("pty terminal still open after its session ended; abandoning it", "pid", s.sid)
	s.abandoned.Store(true)
	s.master.SetReadDeadline(time.Now())
	return nil
}

// pollable returns a copy of the pty master m that the Go runtime polls, so
// that deadlines and Close interrupt its reads and writes, and closes m.
// (creack/pty hands out a master in blocking mode: its ioctls use Fd.)
func pollable(m *os.File) (*os.File, error) {
	defer m.Close()
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set non-blocking: %w", err)
	}
	return os.NewFile(uintptr(fd), m.Name()), nil
}

// ptyStatus builds the exit status from the leader's wait result.
func ptyStatus(cmd *exec.Cmd, waitErr error, start, end time.Time, cancelled bool) (*protocol.ExitStatus, error) {
	ps := cmd.ProcessState
	if ps == nil {
		return nil, waitErr
	}
	st := &protocol.ExitStatus{
		DurationMS: float64(end.Sub(start).Microseconds()) / 1000,
		Cancelled:  cancelled,
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		st.ExitCode = 128 + int(ws.Signal())
		st.Signal = signalName(ws.Signal())
	} else {
		st.ExitCode = ps.ExitCode()
	}
	return st, nil
}

// copyOut forwards the terminal's output as FrameStdout chunks until the
// master reports the end (EIO once no process holds the terminal) or its
// read deadline passes. Once the stream is broken, output is read and
// dropped so the processes never block on a full terminal.
func (s *ptySession) copyOut() {
	buf := make([]byte, protocol.ChunkSize)
	for {
		s.a.hook("pty-output", &s.p)
		n, err := s.master.Read(buf)
		if n > 0 {
			s.output += int64(n)
			s.w.data(protocol.FrameStdout, buf[:n])
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && s.abandoned.Load() {
				s.drainBuffered(buf)
			}
			if !errors.Is(err, syscall.EIO) && !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) {
				s.log.Warn("read pty output", "err", err)
			}
			return
		}
	}
}

// maxAbandonDrain bounds what drainBuffered forwards: more than the
// kernel buffers of a terminal hold (n_tty's 4 KiB plus 64 KiB of flip
// buffers), so all that was written before the terminal was abandoned, but
// not a stream without end from the process still holding it.
const maxAbandonDrain = 256 << 10

// drainBuffered forwards what the abandoned terminal has buffered, reading
// without waiting (a read past the deadline would not even look), so that
// output written before the session ended is not lost with the terminal.
func (s *ptySession) drainBuffered(buf []byte) {
	total := 0
	s.control(func(fd int) error {
		for total < maxAbandonDrain {
			n, err := unix.Read(fd, buf)
			if n <= 0 || err != nil {
				return err
			}
			total += n
			s.output += int64(n)
			s.w.data(protocol.FrameStdout, buf[:n])
		}
		return nil
	})
}

// terminalClosed reports whether no process holds the terminal any more:
// the master then polls as hung up, and reading it returns what is left
// and then EIO.
func (s *ptySession) terminalClosed() bool {
	hup := false
	s.control(func(fd int) error {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		hup = err == nil && n > 0 && fds[0].Revents&unix.POLLHUP != 0
		return err
	})
	return hup
}

// readFrames reads the client's frames for the whole life of the pty:
// keystrokes and EOF go to the terminal, resizes are applied, signals are
// queued for the handler. FrameCancel, the end of the stream or a broken
// stream is a hang-up, reported once on hangupCh. It returns on a read
// error or when done is closed while it waits.
func (s *ptySession) readFrames(sigCh chan<- syscall.Signal, hangupCh chan<- hangupReason, done <-chan struct{}) {
	hungUp := false
	report := func(r hangupReason) {
		if !hungUp {
			hungUp = true
			hangupCh <- r // buffered: the only send
		}
	}
	fr := protocol.NewFrameReader(s.st)
	for {
		f, err := fr.Next()
		if err != nil {
			select {
			case <-done: // our own deadline at the end
			default:
				s.log.Debug("pty stream ended; hanging up", "err", err)
				report(hangupClosed)
			}
			return
		}
		switch f.Type {
		case protocol.FrameStdin:
			s.writeTerminal(f.Payload)
		case protocol.FrameStdinClose:
			s.writeTerminal([]byte{ptyEOF})
		case protocol.FrameResize:
			var ws protocol.WindowSize
			if err := protocol.DecodeJSON(f.Payload, &ws); err != nil {
				s.log.Debug("ignoring bad resize frame", "err", err)
				continue
			}
			if err := s.setSize(ws); err != nil {
				s.log.Debug("resize pty", "rows", ws.Rows, "cols", ws.Cols, "err", err)
			}
		case protocol.FrameSignal:
			var sg protocol.Signal
			if err := protocol.DecodeJSON(f.Payload, &sg); err != nil {
				s.log.Debug("ignoring bad signal frame", "err", err)
				continue
			}
			sig, ok := ptySignals[strings.TrimPrefix(strings.ToUpper(sg.Name), "SIG")]
			if !ok {
				s.log.Warn("ignoring signal frame: signal not allowed", "signal", sg.Name)
				continue
			}
			select {
			case sigCh <- sig:
			case <-done:
				return
			}
		case protocol.FrameCancel:
			report(hangupCancel)
		default:
			s.log.Debug("ignoring unexpected frame on pty stream", "frame", f.Type.String())
		}
	}
}

// writeTerminal types p into the terminal. A failed write (the terminal is
// gone, or the end's deadline) drops p.
func (s *ptySession) writeTerminal(p []byte) {
	if _, err := s.master.Write(p); err != nil {
		s.log.Debug("write to pty", "err", err)
	}
}

// setSize sets the terminal's window size; the kernel sends SIGWINCH to its
// foreground process group. Zero dimensions are ignored.
func (s *ptySession) setSize(ws protocol.WindowSize) error {
	if ws.Rows == 0 || ws.Cols == 0 {
		return fmt.Errorf("window size %dx%d has a zero dimension", ws.Rows, ws.Cols)
	}
	return s.control(func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	})
}

// control runs f on the master's descriptor without taking it out of the
// runtime's poller (as Fd would).
func (s *ptySession) control(f func(fd int) error) error {
	rc, err := s.master.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// signal delivers sig to the terminal's foreground process group (where a
// typed Ctrl-C would go: the running job, or the shell at its prompt),
// falling back to the leader's group.
func (s *ptySession) signal(sig syscall.Signal) {
	pgrp := 0
	s.control(func(fd int) error {
		var err error
		pgrp, err = unix.IoctlGetInt(fd, unix.TIOCGPGRP)
		return err
	})
	if pgrp <= 0 || !s.inSession(pgrp) {
		pgrp = s.sid
	}
	s.log.Debug("signalling pty foreground group", "pgid", pgrp, "signal", signalName(sig))
	if err := syscall.Kill(-pgrp, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		s.log.Warn("signal pty process group", "pgid", pgrp, "signal", signalName(sig), "err", err)
	}
}

// killSession sends sig to every process group of the pty's session: the
// leader's and each job's (an interactive shell runs jobs in groups of
// their own).
func (s *ptySession) killSession(sig syscall.Signal) {
	groups := map[int]bool{s.sid: true}
	for _, p := range sessionProcs(s.sid) {
		groups[p.pgrp] = true
	}
	for g := range groups {
		if err := syscall.Kill(-g, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			s.log.Warn("kill pty process group", "pgid", g, "signal", signalName(sig), "err", err)
		}
	}
}

// sessionAlive reports whether the pty's session still has live members
// (zombies waiting to be reaped are dead and do not count). Without /proc it
// falls back to the leader's process group, zombies included.
func (s *ptySession) sessionAlive() bool {
	procs, ok := liveProcs(func(p procInfo) bool { return p.sid == s.sid })
	if !ok {
		return syscall.Kill(-s.sid, 0) == nil
	}
	return len(procs) > 0
}

// inSession reports whether process group pgrp belongs to the pty's session.
func (s *ptySession) inSession(pgrp int) bool {
	if pgrp == s.sid {
		return true
	}
	for _, p := range sessionProcs(s.sid) {
		if p.pgrp == pgrp {
			return true
		}
	}
	return false
}

// sessionProcs lists the live (non-zombie) processes of session sid from
// /proc. Where there is no /proc it returns nothing, and callers fall back to
// the leader's process group.
func sessionProcs(sid int) []procInfo {
	procs, _ := liveProcs(func(p procInfo) bool { return p.sid == sid })
	return procs
}

// startPTY starts cmd as acct on a new pseudo-terminal, in its own session
// with the terminal as its controlling tty, as pty.StartWithSize does, and
// returns the master. For another account the terminal is first given to
// it (owner the account, group tty, mode 0620, as login and sshd do), so
// that what checks its terminal's owner (mesg, write, sudo's tty
// tickets) sees its own.
func startPTY(cmd *exec.Cmd, acct *account, ws *pty.Winsize) (*os.File, error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, err
	}
	defer tty.Close()
	if !acct.self {
		gid := int(acct.GID)
		if g, err := user.LookupGroup("tty"); err == nil {
			if n, err := strconv.Atoi(g.Gid); err == nil {
				gid = n
			}
		}
		if err := tty.Chown(int(acct.UID), gid); err != nil {
			m.Close()
			return nil, fmt.Errorf("give the terminal to %s: %w", acct, err)
		}
		if err := tty.Chmod(0o620); err != nil {
			m.Close()
			return nil, fmt.Errorf("give the terminal to %s: %w", acct, err)
		}
	}
	if err := pty.Setsize(m, ws); err != nil {
		m.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Credential: acct.credential()}
	if err := cmd.Start(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}
