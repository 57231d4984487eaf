package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// syncBuffer is a bytes.Buffer safe for concurrent writers (logs).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testLogger logs to the test's output and to buf, if not nil.
func testLogger(t testing.TB, buf *syncBuffer) *slog.Logger {
	var w io.Writer = t.Output()
	if buf != nil {
		w = io.MultiWriter(w, buf)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testConfig is a valid config with short timings for tests.
func testConfig(t testing.TB) Config {
	return Config{
		NodeID:       "node-a",
		Coordinators: []string{"127.0.0.1:1"},
		Token:        "secret-token",
		SharedToken:  true,
		TLS:          &tls.Config{},
		DataDir:      t.TempDir(),
		KillGrace:    200 * time.Millisecond,
		PipeWait:     300 * time.Millisecond,
		Capacity:     &protocol.Capacity{CPUs: 4, MemoryBytes: 1 << 30},
		Backoff:      tunnel.Backoff{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Logger:       testLogger(t, nil),
	}
}

// harness serves an agent's streams on one side of a tunnel pair; the test
// plays the coordinator on the other side.
type harness struct {
	a      *Agent
	client *tunnel.Session // agent side
	srv    *tunnel.Session // coordinator side
	done   chan struct{}   // closed when serveStreams returned
}

func newHarness(t testing.TB, mutate func(*Config)) *harness {
	t.Helper()
	return newHarnessWith(t, mutate, nil)
}

// newHarnessWith is newHarness with prepare (if not nil) adjusting the
// Agent (its test hook) before it serves.
func newHarnessWith(t testing.TB, mutate func(*Config), prepare func(*Agent)) *harness {
	t.Helper()
	return newHarnessTunnel(t, mutate, prepare, nil)
}

// newHarnessTunnel is newHarnessWith over a tunnel pair whose config
// tunnelMutate (if not nil) adjusted (tunneltest.PairWith).
func newHarnessTunnel(t testing.TB, mutate func(*Config), prepare func(*Agent), tunnelMutate func(*tunnel.Config)) *harness {
	t.Helper()
	cfg := testConfig(t)
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(a)
	}
	client, srv := tunneltest.PairWith(t, tunnelMutate)
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{a: a, client: client, srv: srv, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		a.serveStreams(ctx, client)
	}()
	t.Cleanup(func() {
		cancel()
		client.Close()
		select {
		case <-h.done:
		case <-time.After(testWait):
			t.Error("serveStreams did not return")
		}
	})
	return h
}

// open opens a stream of kind k with params from the coordinator side.
func (h *harness) open(t testing.TB, k protocol.Kind, params any) *execStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := h.srv.Open(ctx, k, params)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// An upper bound on the whole stream, for a loaded machine.
	st.SetReadDeadline(time.Now().Add(time.Minute))
	return &execStream{st: st, fr: protocol.NewFrameReader(st)}
}

// execStream is the coordinator's view of one exec stream.
type execStream struct {
	st *yamux.Stream
	fr *protocol.FrameReader

	stdout, stderr bytes.Buffer
	order          []protocol.FrameType // data frame types, consecutive repeats merged
	exit           *protocol.ExitStatus
	errInfo        *protocol.ErrorInfo
	job            []byte // the payload of a job stream's FrameJob answer
}

func (e *execStream) send(t *testing.T, ft protocol.FrameType, payload []byte) {
	t.Helper()
	if err := protocol.WriteFrame(e.st, ft, payload); err != nil {
		t.Fatalf("send %s frame: %v", ft, err)
	}
}

// next reads one frame and records it; it returns false at EOF.
func (e *execStream) next(t testing.TB) bool {
	t.Helper()
	f, err := e.fr.Next()
	if errors.Is(err, io.EOF) {
		return false
	}
	if err != nil {
		t.Fatalf("read frame: %v", err)
	}
	if e.exit != nil || e.errInfo != nil || e.job != nil {
		t.Fatalf("%s frame after the final frame", f.Type)
	}
	switch f.Type {
	case protocol.FrameStdout, protocol.FrameStderr:
		if len(f.Payload) > protocol.ChunkSize {
			t.Errorf("%s frame of %d bytes, over ChunkSize", f.Type, len(f.Payload))
		}
		if n := len(e.order); n == 0 || e.order[n-1] != f.Type {
			e.order = append(e.order, f.Type)
		}
		if f.Type == protocol.FrameStdout {
			e.stdout.Write(f.Payload)
		} else {
			e.stderr.Write(f.Payload)
		}
	case protocol.FrameExit:
		e.exit = &protocol.ExitStatus{}
		if err := protocol.DecodeJSON(f.Payload, e.exit); err != nil {
			t.Fatal(err)
		}
	case protocol.FrameJob:
		e.job = bytes.Clone(f.Payload)
	case protocol.FrameError:
		e.errInfo = &protocol.ErrorInfo{}
		if err := protocol.DecodeJSON(f.Payload, e.errInfo); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unexpected %s frame from agent", f.Type)
	}
	return true
}

// until reads frames until cond holds.
func (e *execStream) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if !e.next(t) {
			t.Fatalf("stream ended before %s", what)
		}
	}
}

// finish reads frames to EOF and checks that exactly one final frame came.
func (e *execStream) finish(t testing.TB) {
	t.Helper()
	for e.next(t) {
	}
	if e.exit == nil && e.errInfo == nil && e.job == nil {
		t.Fatal("stream ended without an exit or error frame")
	}
}

// testWait bounds the tests' waits for something that must happen (a
// process to die, a stream to end, a metric to move): an upper bound for a
// machine at load 30, where a race build can stall for seconds. It is never
// a property: a wait that ends early proves nothing more.
const testWait = time.Minute

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupMembers lists the live (non-zombie) processes of process group pgid.
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	paths, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		// After the command name: state ppid pgrp ...
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// firstLinePID parses the first line of out as a pid.
func firstLinePID(t *testing.T, out string) int {
	t.Helper()
	line, _, _ := strings.Cut(out, "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 1 {
		t.Fatalf("first output line %q is not a pid", line)
	}
	return pid
}
