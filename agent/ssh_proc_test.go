package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/protocol"
)

// procStat is the part of /proc/PID/stat after the command name: state,
// ppid, pgrp, session, tty_nr, ...
func procStat(t testing.TB, stat string) []string {
	t.Helper()
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		t.Fatalf("stat %q: no command name", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 5 {
		t.Fatalf("stat %q: too short", stat)
	}
	return f
}

// checkAlive fails t unless pid is a live process with no signal pending
// that it does not ignore: a SIGTERM sent before the check is either
// pending or has killed it. An ignored signal can show as pending for a
// moment (the kernel queues a signal the process blocks even when it
// ignores it, as a shell does around a fork or an exec); it is discarded
// on delivery.
func checkAlive(t testing.TB, pid int, when string) {
	t.Helper()
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("%s: process %d is gone: %v", when, pid, err)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("%s: process %d: %v", when, pid, err)
	}
	var pending, ignored uint64
	for _, line := range strings.Split(string(st), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			// D is a live process too: under load a fresh exec can be
			// caught paging its binary in (CI saw "D (disk sleep)").
			if !strings.HasPrefix(v, "S") && !strings.HasPrefix(v, "R") && !strings.HasPrefix(v, "D") {
				t.Fatalf("%s: process %d is %s", when, pid, v)
			}
		case "SigPnd", "ShdPnd":
			m, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				t.Fatalf("%s: process %d: %s %q", when, pid, k, v)
			}
			pending |= m
		case "SigIgn":
			m, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				t.Fatalf("%s: process %d: %s %q", when, pid, k, v)
			}
			ignored = m
		}
	}
	// Signals whose default action is to ignore them (SIGCHLD, SIGURG,
	// SIGWINCH) harm no process that keeps the default: CI saw SIGCHLD
	// pending on the sh that had just exec'd sleep, its child's exit
	// queued while it blocked signals.
	for _, s := range []syscall.Signal{syscall.SIGCHLD, syscall.SIGURG, syscall.SIGWINCH} {
		ignored |= 1 << (s - 1)
	}
	if p := pending &^ ignored; p != 0 {
		t.Fatalf("%s: process %d has signals pending that it does not ignore (mask %x, ignored %x)", when, pid, p, ignored)
	}
}

// A command's background job outlives the command, as under sshd: the
// channel ends with the command, and nothing signals what it left.
func TestSSHBackgroundJobOutlivesTheCommand(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	out, err := run(t, c, "nohup sleep 300 >/dev/null 2>&1 & echo $!", "")
	if err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("output %q: want the background pid", out)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	ev := f.event(t, "of the command", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Result != protocol.AuditOK || ev.ExitStatus == nil || *ev.ExitStatus != 0 {
		t.Errorf("event %+v", ev)
	}
	checkAlive(t, pid, "after the channel ended")
	if out, err := run(t, c, "echo next", ""); err != nil || out != "next\n" {
		t.Fatalf("next command: %q %v", out, err)
	}
	checkAlive(t, pid, "after the next command")
	// Closing the connection does not reach it either.
	c.Close()
	f.event(t, "of the next command", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 2 })
	checkAlive(t, pid, "after the connection closed")
}

// A background job that keeps the command's output open does not hold the
// channel: a grace after the command exited the channel closes with the
// exit status, and the job is left running.
func TestSSHBackgroundJobHoldingOutputIsLeftRunning(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := c.NewSession()
		if err != nil {
			done <- result{"", err}
			return
		}
		defer s.Close()
		var out bytes.Buffer
		s.Stdout = &out
		err = s.Run("sleep 300 & echo $!; exit 3")
		done <- result{out.String(), err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(testWait):
		t.Fatal("the channel stayed open while a background job held its output")
	}
	if exitStatus(r.err) != 3 {
		t.Errorf("exit %v, want status 3", r.err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(r.out))
	if err != nil {
		t.Fatalf("output %q: want the background pid", r.out)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	ev := f.event(t, "of the command", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Result != protocol.AuditFailed || ev.ExitStatus == nil || *ev.ExitStatus != 3 {
		t.Errorf("event %+v", ev)
	}
	checkAlive(t, pid, "after the channel ended")
}

// Each session's process leads a session of its own, as under sshd: with
// no controlling terminal on pipes, with its pty as one on a terminal.
func TestSSHSessionProcessLeadsItsOwnSession(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	out, err := run(t, c, "exec cat /proc/self/stat", "")
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.Fields(out)[0]
	st := procStat(t, out)
	if st[2] != pid || st[3] != pid || st[4] != "0" {
		t.Errorf("on pipes: pid %s pgrp %s session %s tty %s: want its own session with no terminal", pid, st[2], st[3], st[4])
	}

	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	b, err := s.Output("exec cat /proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	pid = strings.Fields(string(b))[0]
	st = procStat(t, string(b))
	if st[2] != pid || st[3] != pid || st[4] == "0" {
		t.Errorf("on a pty: pid %s pgrp %s session %s tty %s: want its own session with the pty", pid, st[2], st[3], st[4])
	}
}

// A channel closed before any request was not refused: it failed, and
// says so.
func TestSSHChannelClosedBeforeAnyRequestFailed(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	ev := f.event(t, "of the closed channel", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Result != protocol.AuditFailed || ev.Error != "the channel was closed before any command was requested" {
		t.Errorf("event %+v: want failed, closed before any request", ev)
	}
}

// A command line longer than the kernel takes for one argument (128 KiB)
// fails to start: the client is told why (stderr, exit status 255), and
// the channel failed (nothing refused it).
func TestSSHCommandTooLongForExecFailed(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	cmd := "echo " + strings.Repeat("x", 200<<10)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out, errb bytes.Buffer
	s.Stdout, s.Stderr = &out, &errb
	var ee *ssh.ExitError
	if err := s.Run(cmd); !errors.As(err, &ee) || ee.ExitStatus() != 255 || out.Len() != 0 || !strings.Contains(errb.String(), "argument list too long") {
		t.Fatalf("a 200 KiB command line: %v, stdout %q, stderr %q; want exit status 255 and the reason", err, protocol.Clip(out.String()), errb.String())
	}
	s.Close()
	ev := f.event(t, "of the command", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Result != protocol.AuditFailed || !strings.Contains(ev.Error, "argument list too long") {
		t.Errorf("event %+v: want failed with the start error", ev)
	}
}

// A login the params do not grant is refused with reason
// login_not_granted, naming the login asked for.
func TestSSHLoginNotGrantedAuthEvent(t *testing.T) {
	f := newSSHFixture(t, nil)
	cc := f.clientConfig()
	cc.User = "daemon"
	if _, err := f.dial(t, f.params(nil), cc); err == nil {
		t.Fatal("a login not in Logins logged in")
	}
	ev := f.event(t, "auth", func(e *protocol.SSHChannelEvent) bool { return e.Type == protocol.SSHChannelAuth })
	if ev.Result != protocol.AuditRefused || ev.Reason != protocol.AuditReasonLoginNotGranted || ev.Login != "daemon" {
		t.Errorf("auth event %+v: want refused, login_not_granted, login daemon", ev)
	}
}

// A wrong key is a failed authentication: no reason (the coordinator
// audits it as unauthenticated).
func TestSSHWrongKeyAuthEventHasNoReason(t *testing.T) {
	f := newSSHFixture(t, nil)
	cc := f.clientConfig()
	cc.Auth = []ssh.AuthMethod{ssh.PublicKeys(newSigner(t))}
	if _, err := f.dial(t, f.params(nil), cc); err == nil {
		t.Fatal("a wrong key logged in")
	}
	ev := f.event(t, "auth", func(e *protocol.SSHChannelEvent) bool { return e.Type == protocol.SSHChannelAuth })
	if ev.Result != protocol.AuditRefused || ev.Reason != "" || ev.Login != f.user {
		t.Errorf("auth event %+v: want refused, no reason, login %s", ev, f.user)
	}
}

// OpenSSH sends a command line over 256 KiB, which no SSH server reads
// (the packet limit): the connection breaks, and the channel's event says
// so instead of a refusal.
func TestOpenSSHCommandOverThePacketLimit(t *testing.T) {
	f := newSSHFixture(t, nil)
	o := newOpenSSH(t, f, nil)
	// Three arguments, each under the kernel's 128 KiB per argument,
	// which ssh joins into one command line.
	x := strings.Repeat("x", 100000)
	_, stderr, code := o.run("", sshHost, "echo", x, x, x)
	t.Logf("ssh: exit %d, stderr %q", code, protocol.Clip(stderr))
	if code == 0 {
		t.Fatal("a 300 KB command line ran")
	}
	ev := f.event(t, "of the channel", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Result != protocol.AuditFailed || !strings.Contains(ev.Error, "the connection ended before any command was requested") ||
		!strings.Contains(ev.Error, "256 KiB") {
		t.Errorf("event %+v: want failed, the connection broken by the packet limit", ev)
	}
}

// On a pty, a background job that ignores the hangup (nohup) outlives the
// command too: the leader's exit hangs up its group, and nothing more.
func TestSSHPTYNohupJobOutlivesTheCommand(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	// The pid file is written once nohup ignores SIGHUP (inherited by the
	// sh it runs), so the leader's exit cannot race it.
	pidFile := t.TempDir() + "/pid"
	cmd := fmt.Sprintf("nohup sh -c 'echo $$ > %[1]s.tmp && mv %[1]s.tmp %[1]s; exec sleep 300' >/dev/null 2>&1 </dev/null & while [ ! -s %[1]s ]; do :; done", pidFile)
	if out, err := s.CombinedOutput(cmd); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file %q", b)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	ev := f.event(t, "of the command", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Result != protocol.AuditOK {
		t.Errorf("event %+v", ev)
	}
	checkAlive(t, pid, "after the pty channel ended")
}

// gateWriter blocks its first Write until open is closed.
type gateWriter struct {
	open <-chan struct{}
	buf  bytes.Buffer
}

func (g *gateWriter) Write(p []byte) (int, error) {
	<-g.open
	return g.buf.Write(p)
}

// The grace after the command exited never cuts the command's own output:
// what is still buffered for a slow client is relayed in full.
func TestSSHOutputBufferedAtExitIsRelayedInFull(t *testing.T) {
	f := newSSHFixture(t, func(c *Config) { c.KillGrace = time.Nanosecond })
	c := f.mustDial(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pidFile := t.TempDir() + "/pid"
	// Past the client's channel window (x/crypto's 2 MiB) and the relay's
	// 256 KiB buffer, within a pipe's (64 KiB or more): the last bytes are
	// still in the pipe when the command exits.
	const size = 2<<20 + 300<<10
	open := make(chan struct{})
	w := &gateWriter{open: open}
	s.Stdout = w
	if err := s.Start(fmt.Sprintf("echo $$ > %s; head -c %d /dev/zero", pidFile, size)); err != nil {
		t.Fatal(err)
	}
	var pid int
	waitFor(t, testWait, "the command's pid", func() bool {
		b, _ := os.ReadFile(pidFile)
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	// The leader is the agent's child: gone once reaped, which is when
	// the grace starts; the client has read nothing yet.
	waitFor(t, testWait, "the command to exit and be reaped", func() bool { return syscall.Kill(pid, 0) != nil })
	close(open)
	if err := s.Wait(); err != nil {
		t.Fatal(err)
	}
	if w.buf.Len() != size {
		t.Errorf("got %d bytes of the command's %d", w.buf.Len(), size)
	}
}

// The SSH connection's log lines name each attribute once: the session,
// the identity and the login were each written twice (by the agent's
// logger and again by the SSH server's), and a refused forward's
// destination was quoted twice ("\"web:1\"").
func TestSSHLogAttributesOnce(t *testing.T) {
	var logs syncBuffer
	f := newSSHFixture(t, func(c *Config) {
		c.Logger = testLogger(t, &logs)
		c.Targets = map[string]string{"web": "127.0.0.1:1"}
	})
	c := f.mustDial(t)
	if conn, err := c.Dial("tcp", "nope:1"); err == nil {
		conn.Close()
		t.Fatal("a forward to a target the params do not name was allowed")
	}
	if s, err := c.NewSession(); err == nil {
		s.Run("echo " + strings.Repeat("x", 200<<10))
		s.Close()
	}
	f.event(t, "of the command", func(e *protocol.SSHChannelEvent) bool { return e.Type == protocol.SSHChannelExec })
	c.Close()
	seen := 0
	for line := range strings.Lines(logs.String()) {
		if !strings.Contains(line, "ssh_session=") {
			continue
		}
		seen++
		for _, key := range []string{"ssh_session", "identity", "login"} {
			if n := strings.Count(line, " "+key+"="); n > 1 {
				t.Errorf("%s written %d times: %s", key, n, line)
			}
		}
		if strings.Contains(line, `destination="\"`) {
			t.Errorf("destination quoted twice: %s", line)
		}
	}
	if seen == 0 {
		t.Fatalf("no ssh log lines:\n%s", logs.String())
	}
}
