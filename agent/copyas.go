package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// Copies as another account. A copy's file operations must have the
// account's rights, not the agent's: a root agent must not create, replace
// or read a file that the account could not. The copy therefore runs in a
// child process of the agent's own binary (/proc/self/exe, argv[1]
// copyHelperArg, copyHelperEnv set), started with the account's uid, gid
// and groups, which runs the ordinary mirror.Receive or mirror.Send on its
// standard input and output while the agent relays the copy stream's bytes
// to and from it unchanged. The kernel then checks every open, mkdir,
// rename, chmod and unlink against the account, and the helper keeps the
// copy-root confinement (mirror resolves the path on descriptors from the
// roots, openat2 RESOLVE_BENEATH where the kernel has it) and the
// protected files, which the agent hands it as O_PATH descriptors (the
// helper names them /proc/self/fd/N, so it identifies them by device and
// inode even where the account cannot reach their paths).
//
// Why a process rather than setfsuid/setfsgid on a locked OS thread:
// mirror runs a pool of goroutines (parallel file writes, a frame reader)
// that the Go scheduler puts on any thread, and fsuid/fsgid and the
// supplementary groups (setgroups is per thread in the kernel but the Go
// runtime applies it to every thread) cannot be confined to them; a
// missed thread would do a write with root's rights. A process has one
// set of credentials for all its threads, set by the kernel before the
// helper runs a line, and it cannot ask for more.
//
// The helper reads one request (4-byte big-endian length, then JSON
// copyHelperRequest) from standard input, then serves the copy stream on
// standard input and output, and writes one JSON copyHelperResult line to
// standard error before it exits. SIGTERM (the session's end, a cancel)
// aborts the copy as a cancelled context does in process: the destination
// is left as it was.

// copyHelperArg is argv[1] of the copy helper; copyHelperEnv must be "1"
// as well, so that no ordinary command line can start it by accident.
const (
	copyHelperArg = "__tether-agent-copy-helper"
	copyHelperEnv = "TETHER_AGENT_COPY_HELPER"
)

// relayPipeSize and relayBufSize size the pipes to and from the helper and
// the buffers the agent relays them with.
const (
	relayPipeSize = 1 << 20
	relayBufSize  = 256 << 10
)

// maxHelperStderr bounds what the agent keeps of a helper's standard error.
const maxHelperStderr = 64 << 10

// The helper runs before main (and before a test binary's TestMain): every
// binary that links the agent, the tether binary and the agent's test
// binaries, can be its own copy helper, with nothing to wire.
func init() {
	if len(os.Args) == 2 && os.Args[1] == copyHelperArg && os.Getenv(copyHelperEnv) == "1" {
		os.Exit(runCopyHelper())
	}
}

// copyHelperRequest is what the agent tells the helper.
type copyHelperRequest struct {
	Direction string   `json:"direction"`
	Path      []byte   `json:"path"` // bytes: a name need not be UTF-8
	Delete    bool     `json:"delete,omitempty"`
	Checksum  bool     `json:"checksum,omitempty"`
	Into      bool     `json:"into,omitempty"`
	Strict    bool     `json:"strict,omitempty"`
	Roots     []string `json:"roots"`
	// Within are the paths the coordinator's policy granted
	// (protocol.CopyParams.Roots), narrowing Roots (mirror.Options.Within).
	Within []string `json:"within,omitempty"`
	// Protected is the number of protected files passed as descriptors
	// 3, 4, ...
	Protected int `json:"protected,omitempty"`
}

// copyHelperResult is the helper's last word, on its standard error.
type copyHelperResult struct {
	Result *protocol.CopyResult `json:"result,omitempty"`
	Error  string               `json:"error,omitempty"`
}

// pipeConn is the helper's copy stream: standard input and output, with
// deadlines (mirror aborts a copy by setting them).
type pipeConn struct{ r, w *os.File }

func (c pipeConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c pipeConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c pipeConn) SetDeadline(t time.Time) error {
	return errors.Join(c.r.SetDeadline(t), c.w.SetDeadline(t))
}

// runCopyHelper is the helper's main; it returns the exit code: 0 when the
// copy ran (succeeded or failed: either way the peer was told on the
// stream), 2 when it could not start (the peer was sent an error frame).
func runCopyHelper() int {
	report := func(r copyHelperResult) {
		b, _ := json.Marshal(r)
		os.Stderr.Write(append(b, '\n'))
	}
	// Non-blocking descriptors go through the runtime's poller, which is
	// what makes deadlines work on them.
	for fd := 0; fd <= 1; fd++ {
		syscall.SetNonblock(fd, true)
	}
	conn := pipeConn{r: os.NewFile(0, "stdin"), w: os.NewFile(1, "stdout")}
	var req copyHelperRequest
	fail := func(err error) int {
		protocol.WriteJSONFrame(conn.w, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeCopyFailed, Message: err.Error()})
		report(copyHelperResult{Error: err.Error()})
		return 2
	}
	var n [4]byte
	if _, err := io.ReadFull(conn.r, n[:]); err != nil {
		return fail(fmt.Errorf("copy helper: read request: %w", err))
	}
	if size := binary.BigEndian.Uint32(n[:]); size > 1<<20 {
		return fail(fmt.Errorf("copy helper: request of %d bytes", size))
	}
	b := make([]byte, binary.BigEndian.Uint32(n[:]))
	if _, err := io.ReadFull(conn.r, b); err != nil {
		return fail(fmt.Errorf("copy helper: read request: %w", err))
	}
	if err := json.Unmarshal(b, &req); err != nil {
		return fail(fmt.Errorf("copy helper: request: %w", err))
	}
	if len(req.Roots) == 0 {
		// Never unconfined: an empty list would mean "resolve as the
		// kernel would" to mirror.
		return fail(errors.New("copy helper: no copy roots"))
	}
	var protected []string
	for i := range req.Protected {
		protected = append(protected, "/proc/self/fd/"+strconv.Itoa(3+i))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	opts := mirror.Options{
		Delete: req.Delete, Checksum: req.Checksum, Into: req.Into, Strict: req.Strict,
		Roots: req.Roots, Within: req.Within, Protected: protected,
	}
	var res *protocol.CopyResult
	var err error
	if req.Direction == protocol.CopyPush {
		res, err = mirror.Receive(ctx, string(req.Path), conn, opts)
	} else {
		res, err = mirror.Send(ctx, string(req.Path), conn, opts)
	}
	if err != nil {
		report(copyHelperResult{Error: err.Error()})
		return 0
	}
	report(copyHelperResult{Result: res})
	return 0
}

// copyAs runs the copy p as acct in a helper process, relaying st to and
// from it, and returns what the helper reported. It returns once the
// helper exited and every goroutine it started returned; ctx ending
// (session gone, cancel) sends the helper SIGTERM, and SIGKILL
// Config.KillGrace later.
func (a *Agent) copyAs(ctx context.Context, st *yamux.Stream, acct *account, p *protocol.CopyParams, roots, protected []string, log *slog.Logger) (*protocol.CopyResult, error) {
	req := copyHelperRequest{
		Direction: p.Direction, Path: []byte(p.Path), Delete: p.Delete, Checksum: p.Checksum,
		Into: p.Into, Strict: p.Strict, Roots: roots, Within: p.Roots,
	}
	var extra []*os.File
	defer func() {
		for _, f := range extra {
			f.Close()
		}
	}()
	for _, path := range protected {
		f, err := os.OpenFile(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // missing: nothing to protect (as mirror does)
		}
		extra = append(extra, f)
	}
	req.Protected = len(extra)
	body, err := json.Marshal(req)
	if err != nil {
		a.refuseCopyInfo(st, &protocol.ErrorInfo{Code: protocol.CodeInternal, Message: err.Error()})
		return nil, err
	}
	msg := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	msg = append(msg, body...)

	cmd := exec.Command("/proc/self/exe", copyHelperArg)
	// Nothing of the agent's environment but the race detector's options
	// (a race build's helper then exits as fast as the agent's tests ask).
	cmd.Env = []string{copyHelperEnv + "=1"}
	if v, ok := os.LookupEnv("GORACE"); ok {
		cmd.Env = append(cmd.Env, "GORACE="+v)
	}
	cmd.Dir = "/"
	cmd.ExtraFiles = extra
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: acct.credential()}
	inR, inW, err := os.Pipe()
	if err != nil {
		a.refuseCopyInfo(st, &protocol.ErrorInfo{Code: protocol.CodeInternal, Message: err.Error()})
		return nil, err
	}
	defer inW.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		a.refuseCopyInfo(st, &protocol.ErrorInfo{Code: protocol.CodeInternal, Message: err.Error()})
		return nil, err
	}
	defer outR.Close()
	// Bigger pipes and buffers than the defaults (64 KiB, 32 KiB): fewer
	// wake-ups per MiB relayed (BenchmarkCopyPushAsUser). Best effort: the
	// kernel may refuse past /proc/sys/fs/pipe-max-size. Through
	// SyscallConn, not Fd: Fd would put the pipe in blocking mode, taking
	// it off the runtime's poller (a blocked Write then holds an OS
	// thread, and deadlines stop working).
	for _, f := range []*os.File{inW, outR} {
		if rc, err := f.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, relayPipeSize) })
		}
	}
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, &limitedBuffer{b: &stderr, n: maxHelperStderr}
	err = cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		// Nothing was said on the stream yet: say why.
		err = fmt.Errorf("start the copy helper (%s) as %s: %w", cmd.Path, acct, err)
		a.refuseCopyInfo(st, &protocol.ErrorInfo{Code: protocol.CodeInternal, Message: err.Error()})
		return nil, err
	}
	log = log.With("helper_pid", cmd.Process.Pid)
	var (
		killOnce sync.Once
		timer    *time.Timer
	)
	terminate := func() {
		killOnce.Do(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			timer = time.AfterFunc(a.cfg.KillGrace, func() { cmd.Process.Kill() })
		})
	}
	stopWatch := context.AfterFunc(ctx, terminate)
	defer stopWatch()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // stream → helper
		defer wg.Done()
		defer a.guard.Recover("copy helper feeder", func(*panics.Error) { terminate() })
		defer inW.Close()
		if _, err := inW.Write(msg); err != nil {
			return
		}
		io.CopyBuffer(inW, st, make([]byte, relayBufSize))
	}()
	var relayErr error
	go func() { // helper → stream
		defer wg.Done()
		defer a.guard.Recover("copy helper relay", func(*panics.Error) { terminate() })
		// A stream that fails (the client is gone) ends the copy: the
		// helper is told to abort, and what it still writes is dropped.
		if _, err := io.CopyBuffer(st, outR, make([]byte, relayBufSize)); err != nil {
			relayErr = err
			terminate()
			io.Copy(io.Discard, outR)
		}
	}()
	waitErr := cmd.Wait() // returns once the helper exited and its stderr was read
	// The helper is gone; its stdout's write end with it. Stop reading
	// the stream for it.
	st.SetReadDeadline(time.Now())
	wg.Wait()
	killOnce.Do(func() {})
	if timer != nil {
		timer.Stop()
	}

	var res copyHelperResult
	lines := bytes.Split(bytes.TrimSpace(stderr.Bytes()), []byte("\n"))
	last := lines[len(lines)-1]
	if jerr := json.Unmarshal(last, &res); jerr != nil || (res.Result == nil && res.Error == "") {
		// The helper died without a word (killed, a crash): its peer may
		// not know, so say it, if the stream still takes frames.
		log.Error("copy helper failed", "err", waitErr, "stderr", protocol.Clip(stderr.String()))
		if relayErr == nil && ctx.Err() == nil {
			st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
			protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeInternal,
				Message: fmt.Sprintf("node %s: the copy as %s failed: %v", a.cfg.NodeID, acct, waitErr)})
		}
		return nil, fmt.Errorf("copy helper: %v", waitErr)
	}
	if res.Error != "" {
		return nil, errors.New(res.Error)
	}
	return res.Result, nil
}

// limitedBuffer keeps the first n bytes written to it and drops the rest.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
