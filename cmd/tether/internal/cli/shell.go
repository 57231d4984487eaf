package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// shellExitWait bounds how long `tether shell` waits for the remote exit
// status after it hung up (interrupted, or its terminal went away).
const shellExitWait = 5 * time.Second

// shellOptions are the flags of `tether shell`.
type shellOptions struct {
	// Env are extra environment variables, "K=V" each.
	Env []string
	// Cwd is the remote working directory. Empty means the agent's data
	// directory; a relative path is taken relative to it.
	Cwd string
	// NATS says how to reach the API.
	NATS natsOptions
}

// Validate reports every invalid option; node is the first argument.
func (o *shellOptions) Validate(node string) error {
	var errs []error
	if err := checkNodeArg(node); err != nil {
		errs = append(errs, err)
	}
	for _, kv := range o.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("--env %q: want KEY=VALUE", kv))
		}
	}
	return errors.Join(errs...)
}

// execParams are the params of the pipe mode (standard input not a
// terminal): argv, default `bash -s`, with stdin streamed.
func (o *shellOptions) execParams(argv []string) *protocol.ExecParams {
	if len(argv) == 0 {
		argv = []string{"bash", "-s"}
	}
	return &protocol.ExecParams{Argv: argv, Env: o.envMap(), Cwd: o.Cwd, Stdin: true}
}

// ptyParams are the params of the terminal mode, without the window size;
// termName is the local $TERM.
func (o *shellOptions) ptyParams(argv []string, termName string) *protocol.PTYParams {
	return &protocol.PTYParams{Argv: argv, Env: o.envMap(), Cwd: o.Cwd, Term: termName}
}

// checkParams refuses, before anything is sent, the params the agent (or
// the coordinator) would refuse, with their own rules: the kind's Validate
// (an empty argv[0], NUL, too many arguments or variables), strings that
// are not valid UTF-8 (utf8Errs) and the stream
// header limit (protocol.CheckHeaderSize). terminal says which mode runs.
func (o *shellOptions) checkParams(argv []string, terminal bool, termName string) error {
	if len(argv) > 0 && argv[0] == "" {
		return errors.New("the command after -- is empty")
	}
	// JSON would send bytes that are not UTF-8 as U+FFFD: another command.
	if errs := utf8Errs(argv, o.Env, o.Cwd); len(errs) > 0 {
		return errors.Join(errs...)
	}
	if terminal {
		p := o.ptyParams(argv, termName)
		p.Rows, p.Cols = math.MaxUint16, math.MaxUint16 // the largest window
		if err := p.Validate(); err != nil {
			return err
		}
		return protocol.CheckHeaderSize("pty params (command, env, cwd)", p)
	}
	p := o.execParams(argv)
	if err := p.Validate(); err != nil {
		return err
	}
	return protocol.CheckHeaderSize("exec params (command, env, cwd)", p)
}

// terminalStdin returns r as a file when it is a terminal.
func terminalStdin(r io.Reader) (*os.File, bool) {
	f, ok := r.(*os.File)
	return f, ok && term.IsTerminal(int(f.Fd()))
}

// env returns the --env flags as a map, nil when there are none.
func (o *shellOptions) envMap() map[string]string {
	if len(o.Env) == 0 {
		return nil
	}
	m := make(map[string]string, len(o.Env))
	for _, kv := range o.Env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// shellStream is what `tether shell` needs of an open stream: the frames of
// its kind both ways, and an abort. *client.Stream is one.
type shellStream interface {
	io.Reader
	io.Writer
	Close() error
}

// streamOpener opens a stream of kind to node through the coordinator.
// clientOpener adapts *client.Client; tests substitute their own.
type streamOpener interface {
	OpenStream(ctx context.Context, node string, kind protocol.Kind, params any) (shellStream, error)
}

// clientOpener is a streamOpener over the NATS client.
type clientOpener struct{ c *client.Client }

func (o clientOpener) OpenStream(ctx context.Context, node string, kind protocol.Kind, params any) (shellStream, error) {
	st, err := o.c.OpenStream(ctx, node, kind, params)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// shellSignals are the signals `tether shell` catches while it runs: the
// window size change, and the ones it forwards to the remote terminal
// (catching them also keeps them from killing tether before it restored the
// local terminal).
var shellSignals = []os.Signal{
	syscall.SIGWINCH, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT,
	syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2,
}

func newShellCmd(e *env) *cobra.Command {
	var o shellOptions
	cmd := &cobra.Command{
		Use:   "shell NODE [flags] [-- CMD [ARGS...]]",
		Short: "Open an interactive terminal on a node",
		Long: `Open an interactive terminal on a node: the login shell of the agent's user,
or CMD, on a pseudo-terminal of the node. The local terminal is put in raw
mode (Ctrl-C, Ctrl-Z and Ctrl-D go to the remote terminal), window size
changes follow it, and the signals INT, TERM, QUIT, HUP, USR1 and USR2 sent
to tether are delivered to the remote terminal's foreground job. The local
terminal is restored on every exit, and the exit code is the remote one.

When standard input is not a terminal, CMD (default: 'bash -s', which reads
commands from standard input) runs without a pseudo-terminal: standard input
is streamed to it, and its stdout and stderr stay apart.

Interrupting tether itself (its context ends, as on SIGINT or SIGTERM to
tether) hangs up the remote terminal: its processes get SIGHUP, then
SIGKILL.

Exit codes, as for 'tether exec --node': the remote command's own (128+N
when signal N killed it), 126 or 127 when the node found CMD not executable
or not at all, 130/143 when tether was interrupted, 2 for a usage error, and
255 when Tether failed (no coordinator, node not connected, tunnel lost).`,
		Example: `  tether shell node-a
  tether shell node-a htop
  tether shell node-a -- ls -la /srv
  tether shell node-a --cwd /srv/app --env RAILS_ENV=production -- bin/console
  echo 'uname -a' | tether shell node-a`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usage(errors.New("a node is required"))
			}
			if d := cmd.ArgsLenAtDash(); d == 0 {
				return usage(errors.New("the node comes before --"))
			}
			return nil
		},
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(args[0]); err != nil {
				return usage(err)
			}
			_, tty := terminalStdin(e.stdin)
			if err := o.checkParams(args[1:], tty, e.getenv("TERM")); err != nil {
				return usage(err)
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			return runShell(cmd.Context(), &o, args[0], args[1:], e, clientOpener{c})
		}),
	}
	// Flags may follow the node; a command with flags of its own goes
	// after "--".
	f := cmd.Flags()
	f.StringArrayVar(&o.Env, "env", nil, "set an environment variable KEY=VALUE (repeatable)")
	f.StringVar(&o.Cwd, "cwd", "", "remote working directory")
	o.NATS.addFlags(cmd)
	return cmd
}

// runShell runs the shell on node with op: on a remote pseudo-terminal when
// e.stdin is a terminal, else as a plain exec with stdin streamed. o must be
// valid.
func runShell(ctx context.Context, o *shellOptions, node string, argv []string, e *env, op streamOpener) error {
	if f, ok := terminalStdin(e.stdin); ok {
		return runTerminal(ctx, o, node, argv, f, e, op)
	}
	if classifyStdin(e.stdin) == stdinNone {
		// Not open at all (a CI runner's closed fd 0): the command reads
		// an empty standard input rather than wait on one that never ends.
		ec := *e
		ec.stdin = strings.NewReader("")
		e = &ec
	}
	st, err := op.OpenStream(ctx, node, protocol.KindExec, o.execParams(argv))
	if err != nil {
		return openStreamError(node, "exec", err)
	}
	s := &shellSession{node: node, st: st, e: e, pipe: true}
	return s.run(ctx, nil)
}

// openStreamError is the error of a stream of kind that could not be
// opened to node. The coordinator's refusal (an API error) says what failed
// and names the node itself ("node N is not connected…"), so it stands as
// it is.
func openStreamError(node, kind string, err error) error {
	var ae *protocol.APIError
	if errors.As(err, &ae) {
		return err
	}
	return fmt.Errorf("node %s: open %s stream: %w", node, kind, err)
}

// runTerminal runs the pty mode: raw local terminal, remote pseudo-terminal.
func runTerminal(ctx context.Context, o *shellOptions, node string, argv []string, in *os.File, e *env, op streamOpener) (err error) {
	fd := int(in.Fd())
	// Catch the signals before the terminal is in raw mode, so that none
	// can kill tether without restoring it.
	sigCh := make(chan os.Signal, 8)
	signal.Notify(sigCh, shellSignals...)
	defer signal.Stop(sigCh)

	params := o.ptyParams(argv, e.getenv("TERM"))
	size, _ := windowSize(fd)
	params.Rows, params.Cols = size.Rows, size.Cols
	st, err := op.OpenStream(ctx, node, protocol.KindPTY, params)
	if err != nil {
		return openStreamError(node, "pty", err)
	}
	old, err := term.MakeRaw(fd)
	if err != nil {
		st.Close()
		return fmt.Errorf("put the local terminal in raw mode: %w", err)
	}
	// Restored on every return and on a panic.
	defer func() {
		if rerr := term.Restore(fd, old); rerr != nil && err == nil {
			err = fmt.Errorf("restore the local terminal: %w", rerr)
		}
	}()
	s := &shellSession{node: node, st: st, e: e, ttyFd: fd, size: size}
	return s.run(ctx, sigCh)
}

// windowSize returns the size of the terminal fd.
func windowSize(fd int) (protocol.WindowSize, error) {
	w, h, err := term.GetSize(fd)
	if err != nil {
		return protocol.WindowSize{}, err
	}
	return protocol.WindowSize{Rows: uint16(h), Cols: uint16(w)}, nil
}

// shellSession relays one shell stream between the local streams and the
// node.
type shellSession struct {
	node  string
	st    shellStream
	e     *env
	pipe  bool // exec stream without a terminal
	ttyFd int  // the local terminal (pty mode)
	size  protocol.WindowSize

	wmu sync.Mutex // one frame at a time on st
}

// send writes one frame to the node.
func (s *shellSession) send(t protocol.FrameType, payload []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return protocol.WriteFrame(s.st, t, payload)
}

// sendJSON writes one JSON frame to the node.
func (s *shellSession) sendJSON(t protocol.FrameType, v any) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return protocol.WriteJSONFrame(s.st, t, v)
}

// shellOutcome is how the stream ended, as the output reader saw it.
type shellOutcome struct {
	exit    *protocol.ExitStatus
	errInfo *protocol.ErrorInfo
	err     error // a broken stream or a failed local write
}

// run relays until the node reports the end, then maps it to the error Run
// turns into the exit code. It starts two goroutines (the output reader and
// the stdin forwarder) and returns after both ended (a stdin that is not an
// *os.File cannot be interrupted and is not waited for).
func (s *shellSession) run(ctx context.Context, sigCh <-chan os.Signal) error {
	var wg sync.WaitGroup
	outCh := make(chan shellOutcome, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		outCh <- s.readOutput()
	}()

	in, stopIn, err := newStdinReader(s.e.stdin)
	if err != nil {
		s.st.Close()
		wg.Wait()
		return err
	}
	inDone := make(chan error, 1) // nil: stdin at EOF
	waitIn := in.stoppable()
	if waitIn {
		wg.Add(1)
	}
	go func() {
		if waitIn {
			defer wg.Done()
		}
		defer in.close()
		inDone <- s.forwardStdin(in)
	}()

	var (
		out       shellOutcome
		hungUp    bool
		giveUpC   <-chan time.Time
		ctxDone   = ctx.Done()
		inDoneC   = (<-chan error)(inDone)
		finishing = false
	)
	hangup := func() {
		if hungUp {
			return
		}
		hungUp = true
		// Out of band first (client.Stream.Cancel): stdin the remote
		// command leaves unread can hold the in-band cancel up, and the
		// stdin forwarder's write with it; the cancel ends that write.
		if c, ok := s.st.(interface{ Cancel() error }); ok {
			c.Cancel()
		}
		s.send(protocol.FrameCancel, nil)
		giveUpC = time.After(shellExitWait)
	}
	for !finishing {
		select {
		case out = <-outCh:
			finishing = true
		case sig := <-sigCh:
			s.forwardSignal(sig)
		case err := <-inDoneC:
			inDoneC = nil
			if s.pipe {
				if err == nil {
					s.send(protocol.FrameStdinClose, nil)
				}
				continue
			}
			// The local terminal went away: hang up the remote one.
			hangup()
		case <-ctxDone:
			ctxDone = nil
			hangup()
		case <-giveUpC:
			out.err = fmt.Errorf("no exit status within %v of hanging up", shellExitWait)
			finishing = true
		}
	}
	stopIn()
	s.st.Close()
	wg.Wait()

	interrupted := ctx.Err() != nil
	switch {
	case out.exit != nil && interrupted:
		return &exitError{code: interruptCode(ctx)}
	case out.exit != nil:
		if out.exit.ExitCode == 0 {
			return nil
		}
		return &exitError{code: out.exit.ExitCode}
	case out.errInfo != nil:
		// As exec reports a node's error: its node once, then the
		// agent's message (whose own "node N: " is dropped), then the code.
		msg := strings.TrimPrefix(out.errInfo.Message, "node "+s.node+": ")
		return &exitError{code: errorInfoCode(out.errInfo.Code), err: fmt.Errorf("node %s: %s (%s)", s.node, msg, out.errInfo.Code)}
	case interrupted:
		return interruptedError(ctx)
	case out.err != nil:
		return onNode(s.node, out.err)
	default:
		return fmt.Errorf("node %s: the stream ended without an exit status", s.node)
	}
}

// readOutput copies the node's output frames to stdout and stderr until the
// final frame or the end of the stream.
func (s *shellSession) readOutput() shellOutcome {
	fr := protocol.NewFrameReader(s.st)
	for {
		f, err := fr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return shellOutcome{err: fmt.Errorf("read from the node: %w", err)}
		}
		switch f.Type {
		case protocol.FrameStdout, protocol.FrameStderr:
			w := s.e.stdout
			if f.Type == protocol.FrameStderr {
				w = s.e.stderr
			}
			if _, err := w.Write(f.Payload); err != nil {
				return shellOutcome{err: fmt.Errorf("write output: %w", err)}
			}
		case protocol.FrameExit:
			var st protocol.ExitStatus
			if err := protocol.DecodeJSON(f.Payload, &st); err != nil {
				return shellOutcome{err: err}
			}
			return shellOutcome{exit: &st}
		case protocol.FrameError:
			info := &protocol.ErrorInfo{}
			if err := protocol.DecodeJSON(f.Payload, info); err != nil {
				return shellOutcome{err: err}
			}
			return shellOutcome{errInfo: info}
		}
	}
}

// forwardStdin streams stdin to the node as FrameStdin until stdin ends
// (nil) or fails or is stopped (the error).
func (s *shellSession) forwardStdin(in *stdinReader) error {
	buf := make([]byte, protocol.ChunkSize)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if werr := s.send(protocol.FrameStdin, buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// forwardSignal sends a window size change as FrameResize and any other
// caught signal as FrameSignal. In pipe mode only the latter applies.
func (s *shellSession) forwardSignal(sig os.Signal) {
	ss, ok := sig.(syscall.Signal)
	if !ok {
		return
	}
	if ss == syscall.SIGWINCH {
		if s.pipe {
			return
		}
		size, err := windowSize(s.ttyFd)
		if err != nil || size == s.size {
			return
		}
		s.size = size
		s.sendJSON(protocol.FrameResize, size)
		return
	}
	s.sendJSON(protocol.FrameSignal, protocol.Signal{Name: strings.TrimPrefix(unix.SignalName(ss), "SIG")})
}

// stdinReader reads the local standard input. For an *os.File it waits in
// poll(2) on the descriptor and on a wake-up pipe, so that stop interrupts
// a pending read without changing the descriptor's blocking mode (which the
// terminal shares with other processes).
type stdinReader struct {
	r      io.Reader
	fd     int
	wakeR  *os.File
	wakeFd int
	stop   func()
}

var errStdinStopped = errors.New("stdin reader stopped")

// newStdinReader wraps r; stop interrupts it and releases what it holds.
func newStdinReader(r io.Reader) (*stdinReader, func(), error) {
	f, ok := r.(*os.File)
	if !ok {
		return &stdinReader{r: r, fd: -1}, func() {}, nil
	}
	wakeR, wakeW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("stdin wake-up pipe: %w", err)
	}
	sr := &stdinReader{r: r, fd: int(f.Fd()), wakeR: wakeR, wakeFd: int(wakeR.Fd())}
	var once sync.Once
	sr.stop = func() { once.Do(func() { wakeW.Close() }) }
	return sr, sr.stop, nil
}

// SetReadDeadline with a time that has passed stops the reader, as stop
// does: a pending Read and every later one return an error. Other
// deadlines are not supported (os.ErrNoDeadline), nor is any for a reader
// that is not an *os.File.
func (r *stdinReader) SetReadDeadline(t time.Time) error {
	if r.stop == nil || time.Until(t) > 0 {
		return os.ErrNoDeadline
	}
	r.stop()
	return nil
}

// close releases the reader's end of the wake-up pipe once Read returned
// for good.
func (r *stdinReader) close() {
	if r.wakeR != nil {
		r.wakeR.Close()
	}
}

// stoppable reports whether stop interrupts Read.
func (r *stdinReader) stoppable() bool { return r.fd >= 0 }

func (r *stdinReader) Read(p []byte) (int, error) {
	if r.fd < 0 {
		return r.r.Read(p)
	}
	for {
		fds := []unix.PollFd{{Fd: int32(r.fd), Events: unix.POLLIN}, {Fd: int32(r.wakeFd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, fmt.Errorf("poll stdin: %w", err)
		}
		if fds[1].Revents != 0 {
			return 0, errStdinStopped
		}
		if fds[0].Revents == 0 {
			continue
		}
		n, err := unix.Read(r.fd, p)
		switch {
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
			continue
		case errors.Is(err, unix.EIO):
			return 0, io.EOF // the terminal hung up
		case err != nil:
			return 0, fmt.Errorf("read stdin: %w", err)
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}
