package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/protocol"
)

// fuzzShims are the only programs a fuzzed stream can start: PATH holds
// nothing else. "bash", which the agent itself runs for scripts and
// commands (and $SHELL, which a pty runs for a login shell), is cat: it
// prints the script it was fed, or fails on bash -c's option, so no fuzzed
// text is ever run as shell.
var fuzzShims = map[string]string{"true": "/bin/true", "false": "/bin/false", "echo": "/bin/echo", "cat": "/bin/cat", "bash": "/bin/cat"}

// fuzzSafe reports whether a fuzzed stream may be sent to the agent: the
// programs it can start are fuzzShims found through PATH (no argv[0]
// with a slash), cat (and the bash shim) without arguments (so it reads
// only its stdin, never /dev/zero), and no dynamic-loader variables. Params
// that do not decode leniently cannot decode strictly either (the agent's
// DecodeParams), so they start nothing.
func fuzzSafe(kind protocol.Kind, params []byte) bool {
	var argv []string
	var env map[string]string
	switch kind {
	case protocol.KindExec:
		var p protocol.ExecParams
		if json.Unmarshal(params, &p) != nil {
			return true
		}
		argv, env = p.Argv, p.Env
	case protocol.KindPTY:
		var p protocol.PTYParams
		if json.Unmarshal(params, &p) != nil {
			return true
		}
		argv, env = p.Argv, p.Env
	default:
		return true
	}
	if len(argv) > 0 && (strings.ContainsRune(argv[0], '/') || (argv[0] == "cat" || argv[0] == "bash") && len(argv) > 1) {
		return false
	}
	for k := range env {
		if strings.HasPrefix(strings.ToUpper(k), "LD_") {
			return false
		}
	}
	return true
}

// finalFrames are the frames that end a stream's answer, by kind; exec,
// pty, job, inventory and sandbox streams (and refused ones) end with
// exactly one of them, last.
var finalFrames = map[protocol.FrameType]bool{
	protocol.FrameExit: true, protocol.FrameError: true, protocol.FrameJob: true,
	protocol.FrameInventoryEnd: true, protocol.FrameSandboxOp: true,
}

// FuzzAgentStream drives one stream of a fuzzed kind, with fuzzed params
// and fuzzed bytes from the coordinator's side, through a real Agent (its
// own decoding, validation and handlers, on a temp data dir, over an
// in-memory tunnel session), and checks that the agent answers with
// well-formed frames ending in a final frame, closes its side once ours is
// closed, never panics (a contained panic counts as a failure too) and
// leaves nothing running. "@DATA@" in params stands for the agent's data
// dir (its copy root). Processes are confined to fuzzSafe's shims.
func FuzzAgentStream(f *testing.F) {
	shims := f.TempDir()
	for name, target := range fuzzShims {
		if err := os.Symlink(target, filepath.Join(shims, name)); err != nil {
			f.Fatal(err)
		}
	}
	f.Setenv("PATH", shims)
	f.Setenv("SHELL", filepath.Join(shims, "bash"))
	echo := startEcho(f)

	f.Fuzz(func(t *testing.T, kindByte byte, params, frames []byte) {
		kind := protocol.Kind(kindByte)
		if len(params) > 8<<10 || len(frames) > 64<<10 || !json.Valid(params) || !fuzzSafe(kind, params) {
			return
		}
		reg := prometheus.NewRegistry()
		logs := &syncBuffer{}
		var dataDir string
		h := newHarnessWith(t, func(c *Config) {
			dataDir = c.DataDir
			c.Registerer = reg
			c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			c.Targets = map[string]string{"echo": echo}
		}, nil)
		t.Cleanup(func() {
			done := make(chan struct{})
			go func() { h.a.jobs.wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Errorf("a detached job still runs 20s after its stream ended\n%s", logs.String())
			}
		})
		params = bytes.ReplaceAll(params, []byte("@DATA@"), []byte(dataDir))

		st := h.open(t, kind, json.RawMessage(params)).st
		st.SetReadDeadline(time.Now().Add(30 * time.Second))
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			st.Write(frames) // may fail once the agent closed: fine
			st.Close()       // half-close: the agent reads EOF
		}()
		out, err := io.ReadAll(st)
		wg.Wait()
		if err != nil {
			t.Fatalf("kind %s, params %s: reading the agent's answer: %v (after %d bytes)\n%s", kind, params, err, len(out), logs.String())
		}
		checkAnswer(t, kind, out, logs)
		if n := panicsCount(t, reg); n != 0 {
			t.Fatalf("kind %s, params %s: %v panics contained\n%s", kind, params, n, logs.String())
		}
	})
}

// checkAnswer checks the agent's bytes on a stream of kind.
func checkAnswer(t *testing.T, kind protocol.Kind, out []byte, logs *syncBuffer) {
	t.Helper()
	fr := protocol.NewFrameReader(bytes.NewReader(out))
	var types []protocol.FrameType
	for {
		f, err := fr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("kind %s: malformed answer after frames %v: %v\n%s", kind, types, err, logs.String())
		}
		types = append(types, f.Type)
		if kind == protocol.KindDial && f.Type == protocol.FrameDialOK {
			return // raw bytes follow
		}
	}
	if len(types) == 0 {
		// mirror.Send ends without a frame when the receiver broke the
		// protocol (a truncated or malformed manifest): the fuzzer, as
		// the receiver, knows what it sent.
		if kind == protocol.KindCopy {
			return
		}
		// Inventory and sandbox streams take the end of the
		// coordinator's side (the fuzzer's half-close) as a cancel,
		// which needs no answer.
		if kind == protocol.KindInventory || kind == protocol.KindSandbox {
			return
		}
		t.Fatalf("kind %s: the agent closed without a frame\n%s", kind, logs.String())
	}
	t.Logf("kind %s: frames %v; tail %q", kind, types, out[max(0, len(out)-200):]) // shown with -v
	last := types[len(types)-1]
	switch kind {
	case protocol.KindCopy:
		// The copy protocol has no single final frame: a refusal or
		// failure is an error frame, a push ends with copy-done, and a
		// pull with what the sender sent when the receiver (the fuzzer)
		// went away.
		for i, ft := range types {
			if (ft == protocol.FrameError || ft == protocol.FrameCopyDone) && i != len(types)-1 {
				t.Fatalf("copy: frames after %s: %v\n%s", ft, types, logs.String())
			}
		}
	case protocol.KindDial:
		if last != protocol.FrameError || len(types) != 1 {
			t.Fatalf("dial: answer %v, want dial-ok or one error\n%s", types, logs.String())
		}
	default:
		if !finalFrames[last] {
			t.Fatalf("kind %s: answer %v does not end with a final frame\n%s", kind, types, logs.String())
		}
		for _, ft := range types[:len(types)-1] {
			if finalFrames[ft] {
				t.Fatalf("kind %s: answer %v has a frame after the final one\n%s", kind, types, logs.String())
			}
		}
	}
}

// startEcho serves a TCP echo (a dial target) until the fuzz target ends.
func startEcho(f *testing.F) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				io.Copy(c, c)
			}()
		}
	}()
	f.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}
