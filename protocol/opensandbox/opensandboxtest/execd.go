package opensandboxtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"github.com/tetherfleet/tether/protocol/opensandbox"
)

// Execd defaults (wire-facts §3.5).
const (
	DefaultPingInterval = 30 * time.Second
	DefaultReadTimeout  = 60 * time.Second
	DefaultWriteTimeout = 10 * time.Second
	// drainGrace bounds how long, after a process exited, its output pumps
	// may keep reading before the exit frame is sent anyway (a background
	// child may hold the terminal open forever).
	drainGrace = 500 * time.Millisecond
	// attachQueue is how many frames may wait for a slow PTY client before
	// it is dropped (execd drops a client whose write blocks for 10 s).
	attachQueue = 1024
)

// ExecdConfig configures an Execd. The zero value is ready to use.
type ExecdConfig struct {
	// Dir is where commands run and the default cwd of PTY sessions; ""
	// makes a temporary directory that Close removes.
	Dir string
	// PingInterval is the period of the RFC 6455 pings sent on PTY
	// sockets; 0 means DefaultPingInterval.
	PingInterval time.Duration
	// ReadTimeout drops a PTY socket that sent no frame and no pong for
	// that long; 0 means DefaultReadTimeout. The session keeps running.
	ReadTimeout time.Duration
	// WriteTimeout bounds one frame write; 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// Logger receives debug logs; nil discards them.
	Logger *slog.Logger
}

// Execd is a fake of OpenSandbox's in-sandbox daemon: GET /ping, POST
// /command (server-sent events; the command really runs, with `sh -c`) and
// the PTY API of wire-facts §3 (real processes: `bash --norc --noprofile`
// on a pseudo-terminal, or on pipes with pty=0). It is an http.Handler;
// it does not listen on its own.
//
// Goroutines: one per running /command (plus two output pumps), and per PTY
// session one waiter and one or two output pumps, and per attached socket a
// reader (the handler's), a writer and a pinger. Close ends them all.
//
// Locks: Execd.mu is never held while taking a session's mu.
type Execd struct {
	cfg      ExecdConfig
	dir      string
	ownDir   bool
	log      *slog.Logger
	upgrader websocket.Upgrader
	ctx      context.Context // canceled by Close: kills /command runs
	cancel   context.CancelFunc

	mu       sync.Mutex
	closed   bool
	sessions map[string]*ptySession
	requests []Request
	wg       sync.WaitGroup
}

// Request is one request a fake received, for assertions.
type Request struct {
	Method   string
	Path     string
	RawQuery string
	Header   http.Header
}

// NewExecd returns an execd; call Close when done.
func NewExecd(cfg ExecdConfig) (*Execd, error) {
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = DefaultPingInterval
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	e := &Execd{
		cfg:      cfg,
		dir:      cfg.Dir,
		log:      cfg.Logger,
		sessions: map[string]*ptySession{},
		upgrader: websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }},
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.log = e.log.With("component", "execd")
	if e.dir == "" {
		d, err := os.MkdirTemp("", "execd-")
		if err != nil {
			return nil, fmt.Errorf("execd: work dir: %w", err)
		}
		e.dir, e.ownDir = d, true
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	return e, nil
}

// Dir is the directory commands run in.
func (e *Execd) Dir() string { return e.dir }

// Requests returns a copy of the requests received so far.
func (e *Execd) Requests() []Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Request(nil), e.requests...)
}

// Close kills every process it started (commands and PTY sessions), closes
// every PTY socket, waits for its goroutines and removes its own work
// directory. Requests after Close fail with 503.
func (e *Execd) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	sessions := e.sessions
	e.sessions = map[string]*ptySession{}
	e.mu.Unlock()
	e.cancel()
	for _, s := range sessions {
		s.kill()
	}
	e.wg.Wait()
	if e.ownDir {
		return os.RemoveAll(e.dir)
	}
	return nil
}

// goTracked runs f in a goroutine Close waits for; false if closed.
func (e *Execd) goTracked(f func()) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		f()
	}()
	return true
}

// enter registers a request handler with the WaitGroup; false if closed.
func (e *Execd) enter(r *http.Request) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.requests = append(e.requests, Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone()})
	e.wg.Add(1)
	return true
}

// ServeHTTP serves execd's routes.
func (e *Execd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !e.enter(r) {
		writeJSON(w, http.StatusServiceUnavailable, opensandbox.ErrorBody{Code: opensandbox.CodeRuntimeError, Message: "execd is shutting down"})
		return
	}
	defer e.wg.Done()
	switch p := r.URL.Path; {
	case p == opensandbox.PingPath && r.Method == http.MethodGet:
		w.WriteHeader(http.StatusOK)
	case p == opensandbox.CommandPath && r.Method == http.MethodPost:
		e.serveCommand(w, r)
	case strings.HasPrefix(p, opensandbox.PTYPath):
		e.servePTY(w, r)
	default:
		writeJSON(w, http.StatusNotFound, opensandbox.ErrorBody{Code: opensandbox.CodeUnknown, Message: "no route " + r.Method + " " + p})
	}
}

// serveCommand runs POST /command in the foreground and streams its
// events (wire-facts §2.6, OSB-11/12): init, one stdout/stderr event per
// line, then execution_complete or error.
func (e *Execd) serveCommand(w http.ResponseWriter, r *http.Request) {
	var req opensandbox.CommandRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidRequest, Message: "invalid request body: " + err.Error()})
		return
	}
	if req.Command == "" {
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidRequest, Message: "command is required"})
		return
	}
	if req.Background {
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeNotSupported, Message: "the fake execd runs commands in the foreground only"})
		return
	}
	if req.GID != nil && req.UID == nil {
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidRequest, Message: "gid requires uid"})
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(e.ctx, cancel)
	defer stop()
	if req.Timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.Timeout)*time.Millisecond)
		defer cancel()
	}

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	ev := &eventWriter{w: w}
	ev.send(opensandbox.CommandEvent{Type: opensandbox.EventInit, Text: uuid.NewString()})

	started := time.Now()
	err := e.runCommand(ctx, req, ev)
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		ev.send(opensandbox.CommandEvent{Type: opensandbox.EventExecutionComplete, ExecutionTime: time.Since(started).Milliseconds()})
	case errors.As(err, &exitErr):
		ev.send(opensandbox.CommandEvent{Type: opensandbox.EventError, Error: &opensandbox.CommandError{
			EName: opensandbox.CommandExecErrorName, EValue: strconv.Itoa(exitErr.ExitCode()), Traceback: []string{err.Error()},
		}})
	default:
		ev.send(opensandbox.CommandEvent{Type: opensandbox.EventError, Error: &opensandbox.CommandError{
			EName: opensandbox.CommandExecErrorName, EValue: err.Error(), Traceback: []string{err.Error()},
		}})
	}
}

// runCommand runs req with `sh -c` in its own process group, sending its
// output lines to ev, and returns cmd.Wait's error (or the start error).
// ctx's end kills the group.
func (e *Execd) runCommand(ctx context.Context, req opensandbox.CommandRequest, ev *eventWriter) error {
	cmd := exec.Command("sh", "-c", req.Command)
	cmd.Dir = e.dir
	if req.Cwd != "" {
		cmd.Dir = req.Cwd
	}
	cmd.Env = os.Environ()
	for k, v := range req.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if req.UID != nil {
		cred := &syscall.Credential{Uid: uint32(*req.UID), Gid: uint32(os.Getgid())}
		if req.GID != nil {
			cred.Gid = uint32(*req.GID)
		}
		cmd.SysProcAttr.Credential = cred
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return err
	}
	pgid := cmd.Process.Pid
	stopKill := context.AfterFunc(ctx, func() { syscall.Kill(-pgid, syscall.SIGKILL) })
	defer stopKill()

	var pumps sync.WaitGroup
	for _, p := range []struct {
		f   *os.File
		typ string
	}{{outR, opensandbox.EventStdout}, {errR, opensandbox.EventStderr}} {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			defer p.f.Close()
			splitLines(p.f, func(line string) {
				ev.send(opensandbox.CommandEvent{Type: p.typ, Text: line})
			})
		}()
	}
	pumps.Wait()
	return cmd.Wait()
}

// splitLines reads r to its end and calls line for every line without its
// terminator ("\n", "\r" or "\r\n"); a last line without one is flushed at
// the end.
func splitLines(r io.Reader, line func(string)) {
	buf := make([]byte, 32<<10)
	var cur []byte
	pendingCR := false
	for {
		n, err := r.Read(buf)
		for _, c := range buf[:n] {
			if pendingCR {
				pendingCR = false
				if c == '\n' {
					continue
				}
			}
			switch c {
			case '\r':
				pendingCR = true
				fallthrough
			case '\n':
				line(string(cur))
				cur = cur[:0]
			default:
				cur = append(cur, c)
			}
		}
		if err != nil {
			if len(cur) > 0 {
				line(string(cur))
			}
			return
		}
	}
}

// eventWriter serialises command events onto one response.
type eventWriter struct {
	mu     sync.Mutex
	w      http.ResponseWriter
	failed bool
}

func (ev *eventWriter) send(e opensandbox.CommandEvent) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.failed {
		return
	}
	e.Timestamp = time.Now().UnixMilli()
	if err := opensandbox.WriteCommandEvent(ev.w, e); err != nil {
		ev.failed = true
		return
	}
	http.NewResponseController(ev.w).Flush()
}

// servePTY serves the PTY REST calls and the WebSocket attach.
func (e *Execd) servePTY(w http.ResponseWriter, r *http.Request) {
	id, ws, ok := opensandbox.ParsePTYPath(r.URL.Path)
	switch {
	case !ok:
		writeJSON(w, http.StatusNotFound, opensandbox.ErrorBody{Code: opensandbox.CodeUnknown, Message: "no route " + r.Method + " " + r.URL.Path})
	case id == "" && r.Method == http.MethodPost:
		e.createPTY(w, r)
	case id != "" && !ws && r.Method == http.MethodGet:
		s := e.session(id)
		if s == nil {
			writeSessionNotFound(w, id)
			return
		}
		writeJSON(w, http.StatusOK, s.status())
	case id != "" && !ws && r.Method == http.MethodDelete:
		e.mu.Lock()
		s := e.sessions[id]
		delete(e.sessions, id)
		e.mu.Unlock()
		if s == nil {
			writeSessionNotFound(w, id)
			return
		}
		s.kill()
		w.WriteHeader(http.StatusOK)
	case ws && r.Method == http.MethodGet:
		e.attach(w, r, id)
	default:
		writeJSON(w, http.StatusMethodNotAllowed, opensandbox.ErrorBody{Code: opensandbox.CodeUnknown, Message: "method " + r.Method + " not allowed on " + r.URL.Path})
	}
}

// createPTY serves POST /pty: 201 {"session_id"}; the process starts on
// the first attach.
func (e *Execd) createPTY(w http.ResponseWriter, r *http.Request) {
	var req opensandbox.CreatePTYRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil && len(bytes.TrimSpace(body)) > 0 {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidRequest, Message: "invalid request body: " + err.Error()})
		return
	}
	cwd := e.dir
	if req.Cwd != "" {
		cwd = expandHome(req.Cwd)
		if err := os.MkdirAll(cwd, 0o755); err != nil {
			writeJSON(w, http.StatusInternalServerError, opensandbox.ErrorBody{Code: opensandbox.CodeRuntimeError, Message: err.Error()})
			return
		}
	}
	s := &ptySession{e: e, id: uuid.NewString(), cwd: cwd, command: req.Command}
	e.mu.Lock()
	e.sessions[s.id] = s
	e.mu.Unlock()
	writeJSON(w, http.StatusCreated, opensandbox.CreatePTYResponse{SessionID: s.id})
}

func expandHome(p string) string {
	if p != "~" && !strings.HasPrefix(p, "~/") {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return p
	}
	return filepath.Join(home, p[1:])
}

func (e *Execd) session(id string) *ptySession {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sessions[id]
}

func writeSessionNotFound(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusNotFound, opensandbox.ErrorBody{Code: opensandbox.CodeContextNotFound, Message: "pty session " + id + " not found"})
}

// writeJSON writes v as a JSON response with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}
