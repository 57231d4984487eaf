package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// agentLink is a streamOpener without NATS or a coordinator: it plays the
// coordinator's side of one tunnel to a real agent, so the shell's relay
// logic is tested against the real pty and exec streams.
type agentLink struct {
	sess *tunnel.Session
}

func startAgentLink(t *testing.T) *agentLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := agent.New(agent.Config{
		NodeID:       "node-a",
		Coordinators: []string{ln.Addr().String()},
		Token:        "token",
		SharedToken:  true,
		DataDir:      t.TempDir(),
		KillGrace:    200 * time.Millisecond,
		Capacity:     &protocol.Capacity{CPUs: 1},
		Backoff:      tunnel.Backoff{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sess, err := tunnel.Server(conn, tunnel.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	actx, acancel := context.WithTimeout(ctx, defaultTestTimeout)
	defer acancel()
	ctl, _, err := sess.Accept(actx)
	if err != nil {
		t.Fatal(err)
	}
	fr := protocol.NewFrameReader(ctl)
	if f, err := fr.Next(); err != nil || f.Type != protocol.FrameHello {
		t.Fatalf("hello: %v %v", f.Type, err)
	}
	if err := protocol.WriteJSONFrame(ctl, protocol.FrameWelcome, &protocol.Welcome{
		SessionID: "s", CoordinatorID: "link", HeartbeatIntervalMS: 1000,
	}); err != nil {
		t.Fatal(err)
	}
	// Read heartbeats until the session ends.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if _, err := fr.Next(); err != nil {
				return
			}
		}
	}()
	return &agentLink{sess: sess}
}

func (l *agentLink) OpenStream(ctx context.Context, _ string, kind protocol.Kind, params any) (shellStream, error) {
	st, err := l.sess.Open(ctx, kind, params)
	if err != nil {
		return nil, err
	}
	return abortStream{st}, nil
}

// abortStream gives a yamux stream the Close of client.Stream: nothing more
// is sent or read.
type abortStream struct{ *yamux.Stream }

func (s abortStream) Close() error {
	s.Stream.SetReadDeadline(time.Now())
	return s.Stream.Close()
}

// terminal is a pseudo-terminal standing in for the user's: the CLI gets
// the slave as stdin, stdout and stderr; the test types on the master and
// reads the screen from it.
type terminal struct {
	master, slave *os.File
	mu            sync.Mutex
	screen        strings.Builder
	done          chan struct{}
}

func newTerminal(t *testing.T, rows, cols uint16) *terminal {
	t.Helper()
	master, slave, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	if err := pty.Setsize(master, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		t.Fatal(err)
	}
	tm := &terminal{master: master, slave: slave, done: make(chan struct{})}
	go func() {
		defer close(tm.done)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			tm.mu.Lock()
			tm.screen.Write(buf[:n])
			tm.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		slave.Close()
		master.Close()
		<-tm.done
	})
	return tm
}

func (tm *terminal) String() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.screen.String()
}

func (tm *terminal) typ(t *testing.T, s string) {
	t.Helper()
	if _, err := tm.master.Write([]byte(s)); err != nil {
		t.Fatalf("type %q: %v", s, err)
	}
}

// waitScreen waits until the screen matches re.
func (tm *terminal) waitScreen(t *testing.T, re string) {
	t.Helper()
	rx := regexp.MustCompile(re)
	checkFor(t, defaultTestTimeout, func() error {
		if rx.MatchString(tm.String()) {
			return nil
		}
		return errors.New("screen " + strconvQuote(tm.String()) + " does not match " + re)
	})
}

func strconvQuote(s string) string {
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	return `"` + strings.ReplaceAll(s, "\r", `\r`) + `"`
}

func (tm *terminal) termios(t *testing.T) *unix.Termios {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(tm.slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	return tio
}

func (tm *terminal) env() *env {
	return &env{stdin: tm.slave, stdout: tm.slave, stderr: tm.slave, now: time.Now,
		getenv: testGetenv(map[string]string{"TERM": "vt220"})}
}

// interactiveShell is the remote command of the terminal tests: bash
// without startup files and with a plain prompt.
var interactiveShell = []string{"bash", "--norc", "--noprofile", "-i"}

// shellRun is one run of the shell in the background.
type shellRun struct {
	code chan int
}

func (r *shellRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case c := <-r.code:
		return c
	case <-time.After(defaultTestTimeout):
		t.Fatal("tether shell did not return")
		return 0
	}
}

// startShell runs the shell on tm with op (nil: through run and NATS at
// natsURL), the way Run would, and returns its exit code on the channel.
func startShell(ctx context.Context, t *testing.T, tm *terminal, op streamOpener, natsURL string, argv ...string) *shellRun {
	t.Helper()
	r := &shellRun{code: make(chan int, 1)}
	e := tm.env()
	go func() {
		if op == nil {
			args := append([]string{"shell", "node-0", "--nats-url", natsURL, "--env", "PS1=prompt> ", "--"}, argv...)
			r.code <- run(ctx, args, e)
			return
		}
		o := &shellOptions{Env: []string{"PS1=prompt> "}}
		err := runShell(ctx, o, "node-a", argv, e, op)
		r.code <- exitCodeOf(err)
	}()
	return r
}

// exitCodeOf maps runShell's error to Run's exit code.
func exitCodeOf(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	default:
		return exitFailure
	}
}

// driveTerminal runs the terminal scenario of the issue: stty size, resize,
// stty size, exit 3, and checks the exit code and the terminal's restored
// mode.
func driveTerminal(ctx context.Context, t *testing.T, op streamOpener, natsURL string) {
	tm := newTerminal(t, 30, 100)
	before := tm.termios(t)
	r := startShell(ctx, t, tm, op, natsURL, interactiveShell...)
	tm.waitScreen(t, `prompt> `)
	if tio := tm.termios(t); tio.Lflag&unix.ECHO != 0 || tio.Lflag&unix.ICANON != 0 {
		t.Errorf("local terminal not in raw mode while the shell runs: lflag %#x", tio.Lflag)
	}
	tm.typ(t, "echo $TERM; stty size\r")
	tm.waitScreen(t, `vt220\r\n30 100\r\n`)

	if err := pty.Setsize(tm.master, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	// The terminal is not our controlling terminal, so the kernel signals
	// nobody: deliver SIGWINCH ourselves, as it would.
	if err := syscall.Kill(os.Getpid(), syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	// The resize and the next keystrokes travel separately: ask until the
	// remote terminal has the new size.
	checkFor(t, defaultTestTimeout, func() error {
		tm.typ(t, "stty size\r")
		time.Sleep(100 * time.Millisecond)
		if strings.Contains(tm.String(), "40 120\r\n") {
			return nil
		}
		return errors.New("remote terminal not resized")
	})
	tm.typ(t, "exit 3\r")
	if code := r.wait(t); code != 3 {
		t.Errorf("exit code %d, want 3; screen %s", code, strconvQuote(tm.String()))
	}
	if diff := cmp.Diff(before, tm.termios(t)); diff != "" {
		t.Errorf("terminal mode not restored (-before +after):\n%s", diff)
	}
}

func TestShellTerminal(t *testing.T) {
	link := startAgentLink(t)
	driveTerminal(testCtx(t), t, link, "")
}

func TestShellTerminalForwardsSignals(t *testing.T) {
	link := startAgentLink(t)
	tm := newTerminal(t, 24, 80)
	r := startShell(testCtx(t), t, tm, link, "",
		"bash", "-c", `trap 'echo got-usr1; exit 9' USR1; echo ready; while :; do sleep 0.05; done`)
	// The shell catches its signals before it prints anything remote.
	tm.waitScreen(t, `ready`)
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t); code != 9 {
		t.Errorf("exit code %d, want 9; screen %s", code, strconvQuote(tm.String()))
	}
	tm.waitScreen(t, `got-usr1`)
}

func TestShellTerminalInterrupted(t *testing.T) {
	driveInterrupt(t, startAgentLink(t), "")
}

// driveInterrupt interrupts a running shell (as SIGINT to tether would) and
// checks the exit code, the terminal and that the remote session was hung
// up.
func driveInterrupt(t *testing.T, op streamOpener, natsURL string) {
	tm := newTerminal(t, 24, 80)
	before := tm.termios(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	r := startShell(ctx, t, tm, op, natsURL, "bash", "-c", `echo "sid=$$"; sleep 300`)
	tm.waitScreen(t, `sid=[0-9]+`)
	sid := regexp.MustCompile(`sid=([0-9]+)`).FindStringSubmatch(tm.String())[1]
	cancel()
	if code := r.wait(t); code != exitInterrupted {
		t.Errorf("exit code %d, want %d", code, exitInterrupted)
	}
	if diff := cmp.Diff(before, tm.termios(t)); diff != "" {
		t.Errorf("terminal mode not restored (-before +after):\n%s", diff)
	}
	// The remote session was hung up: nothing of it is left.
	checkFor(t, defaultTestTimeout, func() error {
		if err := syscall.Kill(-atoi(t, sid), 0); err == nil {
			return errors.New("remote process group still alive")
		}
		return nil
	})
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestShellPipeMode(t *testing.T) {
	link := startAgentLink(t)
	tests := []struct {
		name       string
		argv       []string
		stdin      string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"bash -s reads the commands", nil, "echo out; echo err >&2; exit 5\n", 5, "out\n", "err\n"},
		{"command gets stdin", []string{"tr", "a-z", "A-Z"}, "hello", 0, "HELLO", ""},
		{"empty stdin", []string{"wc", "-c"}, "", 0, "0\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr syncBuffer
			e := &env{stdin: strings.NewReader(tt.stdin), stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
			err := runShell(testCtx(t), &shellOptions{}, "node-a", tt.argv, e, link)
			if code := exitCodeOf(err); code != tt.wantCode {
				t.Errorf("exit code %d (%v), want %d", code, err, tt.wantCode)
			}
			if stdout.String() != tt.wantStdout || stderr.String() != tt.wantStderr {
				t.Errorf("stdout %q stderr %q, want %q and %q", stdout.String(), stderr.String(), tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

func TestShellPipeModeFileStdin(t *testing.T) {
	link := startAgentLink(t)
	f, err := os.CreateTemp(t.TempDir(), "stdin")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("echo from-file\n")
	f.Seek(0, 0)
	var stdout, stderr syncBuffer
	e := &env{stdin: f, stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
	if err := runShell(testCtx(t), &shellOptions{}, "node-a", nil, e, link); err != nil {
		t.Fatal(err)
	}
	if got := stdout.String(); got != "from-file\n" {
		t.Errorf("stdout %q", got)
	}
	// A stdin that never ends does not keep the shell waiting once the
	// command exited.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	e.stdin = pr
	done := make(chan error, 1)
	go func() { done <- runShell(testCtx(t), &shellOptions{}, "node-a", []string{"true"}, e, link) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(defaultTestTimeout):
		t.Fatal("shell waited for stdin after the command exited")
	}
}

func TestShellUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no node", []string{"shell"}, "a node is required"},
		{"command without node", []string{"shell", "--", "ls"}, "the node comes before --"},
		{"bad env", []string{"shell", "node-a", "--env", "NOEQUALS"}, `--env "NOEQUALS"`},
		{"bad node", []string{"shell", "no/such"}, `NODE "no/such": must be`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(testCtx(t), nil, "", tt.args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("code %d stderr %q, want %d and %q", r.code, r.stderr, exitUsage, tt.want)
			}
		})
	}
}

// TestShellFleet drives `tether shell` end to end: a real coordinator,
// NATS and agent (fleettest), the relay of tether.v1.stream, and the CLI
// through Run's command line.
func TestShellFleet(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	t.Run("terminal", func(t *testing.T) {
		driveTerminal(testCtx(t), t, nil, url)
	})
	t.Run("interrupted", func(t *testing.T) {
		driveInterrupt(t, nil, url)
	})
	t.Run("interrupted with stdin unread", func(t *testing.T) {
		// yes | tether shell node-0 -- sleep, then Ctrl-C: the hang-up
		// is not held up behind the MiBs of stdin the command leaves
		// unread, and the command is killed.
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Close()
		var fed atomic.Int64
		feeding := make(chan struct{})
		go func() {
			defer close(feeding)
			chunk := bytes.Repeat([]byte("y\n"), 32<<10)
			for {
				n, err := pw.Write(chunk)
				fed.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
		defer func() {
			pw.Close()
			<-feeding
		}()
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		var stdout, stderr syncBuffer
		e := &env{stdin: pr, stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"shell", "node-0", "--nats-url", url, "--", "sh", "-c", "echo $$; exec sleep 1000"}, e)
		}()
		var pid int
		checkFor(t, defaultTestTimeout, func() error {
			line, _, ok := strings.Cut(stdout.String(), "\n")
			if !ok {
				return fmt.Errorf("no pid yet; stderr %q", stderr.String())
			}
			pid, err = strconv.Atoi(strings.TrimSpace(line))
			return err
		})
		checkFor(t, defaultTestTimeout, func() error {
			if n := fed.Load(); n < 4<<20 {
				return fmt.Errorf("%d bytes of stdin fed, want 4 MiB queued", n)
			}
			return nil
		})
		cancel()
		select {
		case code := <-done:
			if code != exitInterrupted {
				t.Errorf("exit %d, want %d; stderr %q", code, exitInterrupted, stderr.String())
			}
		case <-time.After(defaultTestTimeout):
			t.Fatal("interrupted shell did not return")
		}
		checkFor(t, defaultTestTimeout, func() error {
			if syscall.Kill(pid, 0) == nil {
				return fmt.Errorf("process %d still running on the node", pid)
			}
			return nil
		})
	})
	t.Run("pipe", func(t *testing.T) {
		r := runCLI(testCtx(t), nil, "echo out; echo err >&2; exit 6\n", "shell", "node-0", "--nats-url", url)
		if r.code != 6 || r.stdout != "out\n" || r.stderr != "err\n" {
			t.Errorf("got code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		}
	})
}
