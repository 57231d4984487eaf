package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/internal/countcopy"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// maxEnvRequests bounds the env requests one session channel keeps.
const maxEnvRequests = 256

// Payloads of session channel requests (RFC 4254 §6).
type (
	ptyReqMsg struct {
		Term          string
		Cols, Rows    uint32
		Width, Height uint32
		Modes         string
	}
	windowChangeMsg struct {
		Cols, Rows    uint32
		Width, Height uint32
	}
	envMsg     struct{ Name, Value string }
	execMsg    struct{ Command string }
	signalMsg  struct{ Name string }
	subsysMsg  struct{ Name string }
	exitStatus struct{ Status uint32 }
	exitSignal struct {
		Signal     string
		CoreDumped bool
		Message    string
		Lang       string
	}
)

// session is one session channel.
type session struct {
	c     *conn
	ch    ssh.Channel
	n     int
	login *Login
	start time.Time

	env  map[string]string
	pty  *ptyReqMsg
	proc *process
	// release gives back the process slot (Config.Acquire) once proc
	// ended; nil without one.
	release func()
	// notServed: an exec, shell or subsystem request could not start
	// (notStarted told the client why on its stderr).
	notServed bool
	ev        protocol.SSHChannelEvent
	in        atomic.Int64 // bytes from the client
	out       atomic.Int64 // bytes to the client (stdout and stderr)
}

// process is what a session runs.
type process struct {
	cmd  *exec.Cmd
	pgid int
	ptm  *os.File      // the terminal's master, with a pty
	done chan struct{} // closed when the leader exited and its output was relayed
	// leaderDone is closed when the leader exited (state is set).
	leaderDone chan struct{}
	wg         sync.WaitGroup
	// state is the leader's wait status, set before done is closed.
	state *os.ProcessState

	// outputs are the read ends of a process's stdout and stderr pipes.
	outputs []*os.File

	killOnce sync.Once
	mu       sync.Mutex // guards timer, stopped and killing
	// timer is the kill's next step, or, after the leader exited, the
	// end of the wait for output its background processes hold.
	timer   *time.Timer
	stopped bool
	killing bool // kill was called: its timer is the one
}

func (c *conn) serveSession(ctx context.Context, nch ssh.NewChannel, n int, login *Login) {
	ch, reqs, err := nch.Accept()
	if err != nil {
		c.log.Debug("ssh session channel accept failed", "channel", n, "err", err)
		return
	}
	s := &session{c: c, ch: ch, n: n, login: login, start: time.Now(), env: map[string]string{}}
	defer c.cfg.Guard.Recover("ssh session channel", func(e *panics.Error) {
		if s.proc != nil {
			syscall.Kill(-s.proc.pgid, syscall.SIGKILL)
		}
		c.panicked(e)
	})
	s.ev = protocol.SSHChannelEvent{Channel: n, Login: login.Name, Start: s.start}
	s.run(ctx, reqs)
}

// run serves the channel's requests until the client closes the channel
// or ctx ends, and reports the channel.
func (s *session) run(ctx context.Context, reqs <-chan *ssh.Request) {
	defer s.ch.Close()
	var done <-chan struct{}
	exited := false
	for {
		select {
		case r, ok := <-reqs:
			if !ok {
				// The client closed the channel (or the connection
				// ended): its processes go too.
				s.finish(exited)
				return
			}
			if s.handle(r) && s.proc != nil {
				done = s.proc.done
			}
		case <-done:
			done = nil
			exited = true
			s.exited()
		case <-ctx.Done():
			s.finish(exited)
			return
		}
	}
}

// finish ends the channel and reports it. A process still running when
// the client closed the channel (or the connection ended) is killed with
// what is left of its group: a client that went leaves nothing behind. A
// command that exited keeps its background processes, as under sshd; a
// pty session's were hung up when the leader exited (startPTY).
func (s *session) finish(exited bool) {
	if p := s.proc; p != nil {
		if !exited {
			select {
			case <-p.leaderDone:
				// The command exited; what holds its output is a
				// background process, which stays: stop reading.
				p.abandon()
			default:
				p.kill(s.c.cfg.KillGrace)
			}
			<-p.done
			s.fillExit()
			if s.ev.Error == "" {
				s.ev.Error = "the channel was closed before the command ended"
			}
			s.ev.Result = protocol.AuditFailed
		}
		p.wg.Wait()
		p.stopKill()
		if s.release != nil {
			s.release()
		}
	}
	if s.ev.Type == "" {
		// Closed without starting anything: nothing was refused.
		s.ev.Type = protocol.SSHChannelShell
		s.ev.Result = protocol.AuditFailed
		s.ev.Error = s.c.whyNoRequest(s.c.cfg.KillGrace)
	}
	s.ev.BytesIn, s.ev.BytesOut = s.in.Load(), s.out.Load()
	s.c.log.Info("ssh channel ended", "channel", s.n, "type", s.ev.Type, "result", s.ev.Result,
		"exit_status", exitStatusAttr(s.ev.ExitStatus), "exit_signal", s.ev.ExitSignal, "bytes_in", s.ev.BytesIn, "bytes_out", s.ev.BytesOut)
	s.c.event(&s.ev)
}

// exited tells the client how the process ended and closes the channel.
func (s *session) exited() {
	s.fillExit()
	if s.ev.ExitStatus != nil {
		s.ch.SendRequest("exit-status", false, ssh.Marshal(&exitStatus{Status: uint32(*s.ev.ExitStatus)}))
	} else if s.ev.ExitSignal != "" {
		s.ch.SendRequest("exit-signal", false, ssh.Marshal(&exitSignal{Signal: s.ev.ExitSignal, CoreDumped: s.proc.state.Sys().(syscall.WaitStatus).CoreDump()}))
	}
	s.ch.CloseWrite()
	s.ch.Close()
}

// fillExit records the process's end in the event.
func (s *session) fillExit() {
	st := s.proc.state
	if st == nil {
		return
	}
	ws := st.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled():
		s.ev.ExitSignal = strings.TrimPrefix(unix.SignalName(ws.Signal()), "SIG")
		if s.ev.ExitSignal == "" {
			s.ev.ExitSignal = strconv.Itoa(int(ws.Signal()))
		}
		s.ev.Result = protocol.AuditFailed
		s.ev.Error = "killed by signal " + s.ev.ExitSignal
	default:
		code := ws.ExitStatus()
		s.ev.ExitStatus = &code
		s.ev.Result = protocol.AuditOK
		if code != 0 {
			s.ev.Result = protocol.AuditFailed
			s.ev.Error = fmt.Sprintf("exit status %d", code)
		}
	}
}

// handle serves one request; it reports whether it started a process.
func (s *session) handle(r *ssh.Request) bool {
	ok, started, notServed := false, false, s.notServed
	switch r.Type {
	case "env":
		var m envMsg
		if ssh.Unmarshal(r.Payload, &m) == nil && s.proc == nil && len(s.env) < maxEnvRequests && s.acceptEnv(m.Name) &&
			!strings.ContainsRune(m.Value, 0) {
			s.env[m.Name] = m.Value
			ok = true
		} else {
			s.c.log.Debug("ssh env request ignored", "channel", s.n, "name", protocol.Clip(m.Name))
		}
	case "pty-req":
		var m ptyReqMsg
		if ssh.Unmarshal(r.Payload, &m) == nil && s.proc == nil {
			s.pty = &m
			ok = true
		}
	case "window-change":
		var m windowChangeMsg
		if ssh.Unmarshal(r.Payload, &m) == nil && s.pty != nil {
			s.pty.Cols, s.pty.Rows = m.Cols, m.Rows
			if s.proc != nil && s.proc.ptm != nil {
				pty.Setsize(s.proc.ptm, winsize(m.Cols, m.Rows))
			}
			ok = true
		}
	case "signal":
		var m signalMsg
		if ssh.Unmarshal(r.Payload, &m) == nil && s.proc != nil {
			if sig := unix.SignalNum("SIG" + m.Name); sig != 0 {
				if err := syscall.Kill(-s.proc.pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
					s.c.log.Warn("ssh signal", "channel", s.n, "signal", m.Name, "err", err)
				}
				ok = true
			}
		}
	case "exec":
		var m execMsg
		if ssh.Unmarshal(r.Payload, &m) == nil && s.proc == nil {
			ok = s.startCommand(m.Command)
			started = ok
		}
	case "shell":
		if s.proc == nil {
			ok = s.startShell()
			started = ok
		}
	case "subsystem":
		var m subsysMsg
		if ssh.Unmarshal(r.Payload, &m) == nil && s.proc == nil {
			ok = s.startSubsystem(m.Name)
			started = ok
		}
	default:
		// x11-req, auth-agent-req@openssh.com, ...: not served.
		s.c.log.Debug("ssh channel request refused", "channel", s.n, "request", protocol.Clip(r.Type))
	}
	if s.notServed && !notServed {
		// The request is accepted and the channel ends with exit
		// status 255, as a command that failed: refused, OpenSSH exits
		// on the refusal ("exec request failed on channel 0") before it
		// prints the reason notStarted wrote to its stderr, or not.
		if r.WantReply {
			r.Reply(true, nil)
		}
		s.ch.SendRequest("exit-status", false, ssh.Marshal(&exitStatus{Status: notServedStatus}))
		s.ch.CloseWrite()
		s.ch.Close()
		return false
	}
	if r.WantReply {
		r.Reply(ok, nil)
	}
	return started
}

// notServedStatus is the exit status of a command, shell or subsystem
// the agent could not start or its local policy refused: ssh's own for a
// failure of its own (and tether exec's for Tether's).
const notServedStatus = 255

// acceptEnv reports whether an env request may set name.
func (s *session) acceptEnv(name string) bool {
	if name == "" || strings.ContainsAny(name, "=\x00") {
		return false
	}
	for _, pat := range slices.Concat(DefaultAcceptEnv, s.c.cfg.AcceptEnv) {
		if p, ok := strings.CutSuffix(pat, "*"); ok && strings.HasPrefix(name, p) || pat == name {
			return true
		}
	}
	return false
}

// envKeys are the names the client's env requests set, sorted.
func (s *session) envKeys() []string {
	if len(s.env) == 0 {
		return nil
	}
	keys := make([]string, 0, len(s.env))
	for k := range s.env {
		keys = append(keys, protocol.ClipUTF8(k, maxEventEnvKeyLen))
	}
	slices.Sort(keys)
	if len(keys) > maxEventEnvKeys {
		keys = append(keys[:maxEventEnvKeys], fmt.Sprintf("(%d more)", len(keys)-maxEventEnvKeys))
	}
	return keys
}

// maxEventEnvKeys and maxEventEnvKeyLen bound the env keys an event
// lists, so that it fits protocol.MaxControlFrameSize.
const (
	maxEventEnvKeys   = 16
	maxEventEnvKeyLen = 64
)

// procEnv is the environment of the session's process.
func (s *session) procEnv() []string {
	// As sshd's: a session's shell is a top-level one (SHLVL unset, as
	// the agent's own environment may have it), so that bash reads
	// ~/.bashrc for a command as it does under sshd.
	env := slices.DeleteFunc(slices.Clone(s.login.Env), func(kv string) bool { return strings.HasPrefix(kv, "SHLVL=") })
	env = append(env, "SSH_CLIENT="+s.c.sshClient, "SSH_CONNECTION="+s.c.sshConnection)
	for _, k := range slices.Sorted(maps.Keys(s.env)) {
		env = append(env, k+"="+s.env[k])
	}
	if s.pty != nil && s.pty.Term != "" && !strings.ContainsRune(s.pty.Term, 0) {
		env = append(env, "TERM="+s.pty.Term)
	}
	return env
}

// startCommand starts an exec request's command through the login's
// shell ($SHELL -c COMMAND, as sshd does).
func (s *session) startCommand(command string) bool {
	s.ev.Type = protocol.SSHChannelExec
	sum, size := protocol.CommandDigest("", []string{command})
	ac := &protocol.AuditCommand{Mode: "argv", SHA256: sum, Size: size, Count: 1, Stdin: true, EnvKeys: s.envKeys()}
	if f := strings.Fields(command); len(f) > 0 {
		ac.Program = protocol.ClipUTF8(f[0], protocol.MaxAuditProgramLen)
	}
	if s.pty != nil {
		ac.Program = "pty"
	}
	s.ev.Command = ac
	if err := s.login.ExecErr; err != nil {
		return s.refused("exec refused by the local policy", err)
	}
	if strings.ContainsRune(command, 0) {
		return s.failed("exec", errors.New("the command contains a NUL byte"))
	}
	cmd := exec.Command(s.login.Shell, "-c", command)
	return s.startProc(cmd)
}

// startShell starts the login shell (argv[0] "-NAME", as login does).
func (s *session) startShell() bool {
	s.ev.Type = protocol.SSHChannelShell
	s.ev.Command = &protocol.AuditCommand{Mode: "login-shell", EnvKeys: s.envKeys()}
	if s.pty != nil {
		s.ev.Command.Program = "pty"
	}
	if err := s.login.ShellErr; err != nil {
		return s.refused("shell refused by the local policy", err)
	}
	cmd := &exec.Cmd{Path: s.login.Shell, Args: []string{"-" + filepath.Base(s.login.Shell)}}
	return s.startProc(cmd)
}

// startSubsystem starts the sftp subsystem; there is no other.
func (s *session) startSubsystem(name string) bool {
	s.ev.Type = protocol.SSHChannelSubsystem
	s.ev.Subsystem = protocol.ClipUTF8(name, protocol.MaxAuditProgramLen)
	if name != "sftp" {
		return s.failed("subsystem", fmt.Errorf("subsystem %s is not served (only sftp)", protocol.Clip(name)))
	}
	if err := s.login.ExecErr; err != nil {
		return s.refused("sftp refused by the local policy", err)
	}
	s.pty = nil // sftp is binary: never through a terminal
	return s.startProc(sftpCommand())
}

// refused reports a request the local policy refused: the channel's
// result is AuditRefused, and the client is told why on its stderr.
func (s *session) refused(what string, err error) bool {
	return s.notStarted(protocol.AuditRefused, what, err)
}

// failed reports a request that could not start (a bad request, the
// exec limit, a fork failure): the channel's result is AuditFailed, and
// the client is told why on its stderr.
func (s *session) failed(what string, err error) bool {
	return s.notStarted(protocol.AuditFailed, what, err)
}

func (s *session) notStarted(result, what string, err error) bool {
	why := fmt.Sprintf("%s: %v", what, err)
	s.ev.Result = result
	s.ev.Error = why
	s.c.log.Warn("ssh channel request not served", "channel", s.n, "result", result, "what", what, "err", err)
	msg := fmt.Sprintf("tether: node %s: %s\r\n", s.c.cfg.NodeID, why)
	s.ch.Stderr().Write([]byte(msg))
	s.notServed = true
	return false
}

// startProc starts cmd as the login, in its home, with the session's
// environment, on a terminal when one was requested, else on pipes.
func (s *session) startProc(cmd *exec.Cmd) bool {
	cmd.Dir = s.login.Home
	env := s.procEnv()
	if cmd.Env == nil {
		cmd.Env = env
	} else {
		cmd.Env = append(env, cmd.Env...)
	}
	if acquire := s.c.cfg.Acquire; acquire != nil {
		release, err := acquire()
		if err != nil {
			return s.failed("start", err)
		}
		s.release = release
	}
	var p *process
	var err error
	if s.pty != nil {
		p, err = s.startPTY(cmd)
	} else {
		p, err = s.startPipes(cmd)
	}
	if err != nil {
		if s.release != nil {
			s.release()
			s.release = nil
		}
		return s.failed("start", fmt.Errorf("start %s as %s: %w", cmd.Path, s.login.Name, err))
	}
	s.proc = p
	s.ev.Result = ""
	s.c.log.Info("ssh channel started", "channel", s.n, "type", s.ev.Type, "pid", p.pgid, "pty", s.pty != nil)
	return true
}

// startPipes starts cmd in its own session (and so process group), with
// no controlling terminal, as sshd does, on pipes: stdin is the channel's
// data (its EOF closes the pipe), stdout its data, stderr its extended
// data, all binary-clean.
func (s *session) startPipes(cmd *exec.Cmd) (*process, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL, Credential: s.login.Credential}
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	inR, inW, err1 := pipe()
	outR, outW, err2 := pipe()
	errR, errW, err3 := pipe()
	if err := errors.Join(err1, err2, err3); err != nil {
		closeAll()
		return nil, err
	}
	// Bigger pipes: fewer wake-ups per MiB.
	countcopy.GrowPipe(inW, countcopy.BulkPipe)
	countcopy.GrowPipe(outR, countcopy.BulkPipe)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	if err := cmd.Start(); err != nil {
		closeAll()
		return nil, err
	}
	inR.Close()
	outW.Close()
	errW.Close()
	p := &process{cmd: cmd, pgid: cmd.Process.Pid, done: make(chan struct{}), leaderDone: make(chan struct{}), outputs: []*os.File{outR, errR}}
	var outputs sync.WaitGroup
	outputs.Add(2)
	p.wg.Add(4)
	go func() { // client → stdin; the client's EOF closes it
		defer p.wg.Done()
		defer s.c.cfg.Guard.Recover("ssh session relay", s.c.panicked)
		defer inW.Close()
		stdinCopy(inW, countReader{s.ch, &s.in})
	}()
	go func() {
		defer p.wg.Done()
		defer s.c.cfg.Guard.Recover("ssh session relay", s.c.panicked)
		defer outputs.Done()
		defer outR.Close()
		pipeCopy(countWriter{s.ch, &s.out}, outR)
	}()
	go func() {
		defer p.wg.Done()
		defer s.c.cfg.Guard.Recover("ssh session relay", s.c.panicked)
		defer outputs.Done()
		defer errR.Close()
		pipeCopy(countWriter{s.ch.Stderr(), &s.out}, errR)
	}()
	go func() { // not guarded: done must be closed, and nothing here panics
		defer p.wg.Done()
		cmd.Wait()
		p.state = cmd.ProcessState
		close(p.leaderDone)
		// Like sshd: the exit status goes after all the output, which
		// ends when every holder of the pipes (background children too)
		// closed them; unlike sshd, which waits for ever, at most a
		// grace later: a background job that kept them is left running.
		p.abandonAfter(s.c.cfg.KillGrace)
		outputs.Wait()
		close(p.done)
	}()
	return p, nil
}

// startPTY starts cmd on a new terminal, in its own session with the
// terminal as its controlling tty; for another account the terminal is
// given to it first (owner the login, group tty, mode 0620, as sshd does).
func (s *session) startPTY(cmd *exec.Cmd) (*process, error) {
	ptm, tty, err := pty.Open()
	if err != nil {
		return nil, err
	}
	defer tty.Close()
	if !s.login.Self {
		gid := int(s.login.GID)
		if g, err := user.LookupGroup("tty"); err == nil {
			if n, err := strconv.Atoi(g.Gid); err == nil {
				gid = n
			}
		}
		if err := errors.Join(tty.Chown(int(s.login.UID), gid), tty.Chmod(0o620)); err != nil {
			ptm.Close()
			return nil, fmt.Errorf("give the terminal to %s: %w", s.login.Name, err)
		}
	}
	if err := pty.Setsize(ptm, winsize(s.pty.Cols, s.pty.Rows)); err != nil {
		ptm.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.Env = append(cmd.Env, "SSH_TTY="+tty.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Pdeathsig: syscall.SIGKILL, Credential: s.login.Credential}
	if err := cmd.Start(); err != nil {
		ptm.Close()
		return nil, err
	}
	p := &process{cmd: cmd, pgid: cmd.Process.Pid, ptm: ptm, done: make(chan struct{}), leaderDone: make(chan struct{})}
	output := make(chan struct{})
	p.wg.Add(3)
	go func() { // client → terminal; the client's EOF is not a terminal's
		defer p.wg.Done()
		defer s.c.cfg.Guard.Recover("ssh session relay", s.c.panicked)
		io.Copy(ptm, countReader{s.ch, &s.in})
	}()
	go func() { // terminal → client, until every holder of the tty closed it (EIO)
		defer p.wg.Done()
		defer s.c.cfg.Guard.Recover("ssh session relay", s.c.panicked)
		defer close(output)
		io.Copy(countWriter{s.ch, &s.out}, ptm)
	}()
	go func() { // not guarded: done must be closed, and nothing here panics
		defer p.wg.Done()
		cmd.Wait()
		p.state = cmd.ProcessState
		close(p.leaderDone)
		// The session leader is gone: hang up what is left of its
		// group, as the kernel does for a terminal's foreground group,
		// so that the terminal closes and its output ends; what ignores
		// the hangup and still holds the terminal is left running, its
		// output no longer read a grace later.
		syscall.Kill(-p.pgid, syscall.SIGHUP)
		p.abandonAfter(s.c.cfg.KillGrace)
		<-output
		close(p.done)
	}()
	return p, nil
}

// kill ends the process's group: SIGHUP and SIGTERM, SIGKILL grace
// later, and another grace later it stops relaying the output that
// something outside the group (a setsid daemon) may still hold open, so
// that the channel ends whatever was started. It may be called more than
// once.
func (p *process) kill(grace time.Duration) {
	p.killOnce.Do(func() {
		syscall.Kill(-p.pgid, syscall.SIGHUP)
		syscall.Kill(-p.pgid, syscall.SIGTERM)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.killing = true
		if p.timer != nil {
			p.timer.Stop() // abandonAfter's: the kill's own abandon follows
		}
		p.timer = time.AfterFunc(grace, func() {
			syscall.Kill(-p.pgid, syscall.SIGKILL)
			p.mu.Lock()
			defer p.mu.Unlock()
			if !p.stopped {
				p.timer = time.AfterFunc(grace, p.abandon)
			}
		})
	})
}

// abandonAfter stops reading the process's output grace from now, unless
// it ended before (stopKill) or a kill is under way.
// What is still buffered in the pipes or terminal then (the leader's
// last output, not yet relayed to a slow client) is relayed first: the
// check repeats every grace until they are empty.
func (p *process) abandonAfter(grace time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || p.killing {
		return
	}
	p.timer = time.AfterFunc(grace, func() {
		if p.buffered() {
			p.abandonAfter(grace)
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.stopped && !p.killing {
			p.abandon()
		}
	})
}

// buffered reports whether any of the process's outputs has bytes not
// yet read (FIONREAD, TIOCINQ on Linux); an output it cannot ask counts as empty.
func (p *process) buffered() bool {
	files := p.outputs
	if p.ptm != nil {
		files = append(slices.Clone(files), p.ptm)
	}
	for _, f := range files {
		rc, err := f.SyscallConn()
		if err != nil {
			continue
		}
		n := 0
		rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
		if n > 0 {
			return true
		}
	}
	return false
}

// abandon stops reading the process's output (pipes or terminal).
func (p *process) abandon() {
	for _, f := range p.outputs {
		f.SetReadDeadline(time.Now())
	}
	if p.ptm != nil {
		p.ptm.SetReadDeadline(time.Now())
	}
}

// stopKill releases the kill timer and the terminal once the channel is
// done with them.
func (p *process) stopKill() {
	p.mu.Lock()
	p.stopped = true
	if p.timer != nil {
		p.timer.Stop()
	}
	p.mu.Unlock()
	if p.ptm != nil {
		p.ptm.Close()
	}
}

func winsize(cols, rows uint32) *pty.Winsize {
	clamp := func(v uint32) uint16 { return uint16(min(v, 0xffff)) }
	return &pty.Winsize{Cols: clamp(cols), Rows: clamp(rows)}
}

// pipeCopy copies src to dst until src's end or an error, where one of
// them is a command's pipe (an *os.File) and the other the channel, as
// countcopy.CopyPooled does: in reads of 32 KiB that grow to 256 KiB once
// one filled its buffer (bulk), and back when the traffic is interactive.
// io.Copy and io.CopyBuffer are not used here because they hand the copy
// to the pipe's ReadFrom or WriteTo, which for a peer that is not a file
// or a socket fall back to io.Copy with its own 32 KiB buffer (whatever
// buffer was passed): a bulk upload then cost a pipe write per 32 KiB and
// the channel a read, and a window adjust, per 128 KiB at most.
func pipeCopy(dst io.Writer, src io.Reader) {
	countcopy.CopyPooled(dst, src, nil)
}

// stdinCopy is pipeCopy from the channel to the command's stdin: under
// bulk it reads the channel up to 1 MiB at once (the pipe holds as much,
// countcopy.BulkPipe), so that the client gets a window adjust per MiB
// rather than per 256 KiB (countcopy.CopyFromChannel).
func stdinCopy(dst io.Writer, src io.Reader) {
	countcopy.CopyFromChannel(dst, src, nil)
}

// countReader and countWriter count the bytes through them in n.
type countReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

type countWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n.Add(int64(k))
	return k, err
}

// exitStatusAttr is an exit status for logs: the number, or "none".
func exitStatusAttr(p *int) any {
	if p == nil {
		return "none"
	}
	return *p
}
