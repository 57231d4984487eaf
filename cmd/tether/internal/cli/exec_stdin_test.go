package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/fleettest"
)

// randomStdin returns n random bytes and the line sha256sum prints for
// them read from standard input.
func randomStdin(t *testing.T, n int) ([]byte, string) {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:]) + "  -\n"
}

// TestExecForwardsPipedStdin: as with ssh, a standard input that is not a
// terminal reaches the remote command, streamed with no size limit; the
// node checks what it received with sha256sum.
func TestExecForwardsPipedStdin(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 2})
	url := f.NATS.ClientURL()
	data, sum := randomStdin(t, 6<<20) // well over the 512 KiB of the buffered path

	t.Run("reader", func(t *testing.T) {
		r := runCLIWith(testCtx(t), nil, bytes.NewReader(data), "exec", "--nats-url", url, "--node", "node-0", "--", "sha256sum")
		if r.code != 0 || r.stdout != sum {
			t.Errorf("exit %d, stdout %q, want %q; stderr %q", r.code, r.stdout, sum, r.stderr)
		}
	})
	t.Run("pipe", func(t *testing.T) {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Close()
		go func() {
			pw.Write(data)
			pw.Close()
		}()
		r := runCLIWith(testCtx(t), nil, pr, "exec", "--nats-url", url, "--node", "node-0", "--", "sha256sum")
		if r.code != 0 || r.stdout != sum {
			t.Errorf("exit %d, stdout %q, want %q; stderr %q", r.code, r.stdout, sum, r.stderr)
		}
	})
	t.Run("explicit --stdin", func(t *testing.T) {
		r := runCLIWith(testCtx(t), nil, bytes.NewReader(data), "exec", "--nats-url", url, "--node", "node-0", "--stdin", "--", "sha256sum")
		if r.code != 0 || r.stdout != sum {
			t.Errorf("exit %d, stdout %q, want %q; stderr %q", r.code, r.stdout, sum, r.stderr)
		}
	})
	t.Run("remote exit code and failure", func(t *testing.T) {
		r := runCLI(testCtx(t), nil, "in", "exec", "--nats-url", url, "--node", "node-0", "--", "sh", "-c", "cat; echo err >&2; exit 7")
		want := "err\nCommand failed (exec on node-0) with exit code 7:\n  sh -c cat; echo err >&2; exit 7\n"
		if r.code != 7 || r.stdout != "in" || r.stderr != want {
			t.Errorf("exit %d, stdout %q, stderr %q; want 7, %q, %q", r.code, r.stdout, r.stderr, "in", want)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		r := runCLI(testCtx(t), nil, "x", "exec", "--nats-url", url, "--node", "node-0", "--timeout", "1", "--", "sleep", "10")
		if r.code != exitTimedOut || !strings.Contains(r.stderr, "timed out after 1s") {
			t.Errorf("exit %d, stderr %q", r.code, r.stderr)
		}
	})
	t.Run("json", func(t *testing.T) {
		r := runCLI(testCtx(t), nil, "abc", "exec", "--nats-url", url, "--node", "node-0", "--json", "--", "cat")
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		var chunk outputLine
		var res struct {
			ID      string `json:"id"`
			Nodes   int    `json:"nodes"`
			Results []struct {
				Node string `json:"node"`
			} `json:"results"`
		}
		if r.code != 0 || len(lines) != 3 || json.Unmarshal([]byte(lines[0]), &chunk) != nil || chunk.Data == nil || *chunk.Data != "abc" ||
			json.Unmarshal([]byte(lines[2]), &res) != nil || res.ID == "" || res.Nodes != 1 || len(res.Results) != 1 || res.Results[0].Node != "node-0" {
			t.Errorf("exit %d, stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("no-stdin", func(t *testing.T) {
		for _, flag := range []string{"-n", "--no-stdin"} {
			r := runCLI(testCtx(t), nil, "dropped", "exec", "--nats-url", url, "--node", "node-0", flag, "--", "cat")
			if r.code != 0 || r.stdout != "" || r.stderr != "" {
				t.Errorf("%s: exit %d, stdout %q, stderr %q", flag, r.code, r.stdout, r.stderr)
			}
		}
	})
	t.Run("dev null", func(t *testing.T) {
		r := runCLI(testCtx(t), nil, "", "exec", "--nats-url", url, "--node", "node-0", "--", "cat")
		if r.code != 0 || r.stdout != "" || r.stderr != "" {
			t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("closed", func(t *testing.T) {
		// A standard input that is not open at all (fd 0 closed), as
		// some CI runners start commands.
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		pw.Close()
		pr.Close()
		r := runCLIWith(testCtx(t), nil, pr, "exec", "--nats-url", url, "--node", "node-0", "--", "echo", "ok")
		if r.code != 0 || r.stdout != "ok\n" || r.stderr != "" {
			t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("script from stdin", func(t *testing.T) {
		r := runCLI(testCtx(t), nil, "echo from-script", "exec", "--nats-url", url, "--node", "node-0", "--script", "-")
		if r.code != 0 || r.stdout != "from-script\n" || r.stderr != "" {
			t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("commands cannot take it", func(t *testing.T) {
		r := runCLI(testCtx(t), nil, "dropped", "exec", "--nats-url", url, "--node", "node-0", "-c", "cat")
		if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "standard input is not forwarded") || !strings.Contains(r.stderr, "-n") {
			t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		r = runCLI(testCtx(t), nil, "dropped", "exec", "--nats-url", url, "--node", "node-0", "--stdin", "-c", "cat")
		if r.code != exitUsage || !strings.Contains(r.stderr, "--stdin") {
			t.Errorf("--stdin with -c: exit %d, stderr %q", r.code, r.stderr)
		}
	})
	t.Run("fan-out", func(t *testing.T) {
		// Like pdsh, not forwarded to several nodes unless asked...
		r := runCLI(testCtx(t), nil, "data", "exec", "--nats-url", url, "--all", "--", "cat")
		if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "standard input is not forwarded") || !strings.Contains(r.stderr, "--stdin") {
			t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		// ...and then every node gets the same bytes...
		r = runCLI(testCtx(t), nil, "data\n", "exec", "--nats-url", url, "--all", "--stdin", "--", "cat")
		if r.code != 0 || r.stdout != "node-0 | data\nnode-1 | data\n" && r.stdout != "node-1 | data\nnode-0 | data\n" {
			t.Errorf("--stdin: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		// ...up to the buffered path's limit, which the error names: a
		// usage error (2), since nothing was sent.
		big, _ := randomStdin(t, 600<<10)
		r = runCLIWith(testCtx(t), nil, bytes.NewReader(big), "exec", "--nats-url", url, "--all", "--stdin", "--", "wc", "-c")
		if r.code != exitUsage || r.stdout != "" || !strings.Contains(r.stderr, "524288 byte (512 KiB) limit") || !strings.Contains(r.stderr, "--node") {
			t.Errorf("--stdin over the limit: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("command exits before stdin ends", func(t *testing.T) {
		r := runCLIWith(testCtx(t), nil, bytes.NewReader(data), "exec", "--nats-url", url, "--node", "node-0", "--", "head", "-c", "10")
		if r.code != 0 || r.stdout != string(data[:10]) {
			t.Errorf("exit %d, %d bytes of stdout, stderr %q", r.code, len(r.stdout), r.stderr)
		}
	})
	t.Run("stdin never ends", func(t *testing.T) {
		// An open pipe nobody writes to (a CI runner's, say) does not keep
		// tether waiting once the command exited.
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Close()
		defer pw.Close()
		r := runCLIWith(testCtx(t), nil, pr, "exec", "--nats-url", url, "--node", "node-0", "--", "echo", "done")
		if r.code != 0 || r.stdout != "done\n" {
			t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("interrupted", func(t *testing.T) {
		// cat waits on a pipe that stays open; the interrupt cancels it on
		// the node.
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Close()
		defer pw.Close()
		ctx, cancel := context.WithCancelCause(testCtx(t))
		go func() {
			pw.Write([]byte("first\n"))
		}()
		var stdout, stderr syncBuffer
		e := &env{stdin: pr, stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"exec", "--nats-url", url, "--node", "node-0", "--", "cat"}, e) }()
		checkFor(t, defaultTestTimeout, func() error {
			if stdout.String() != "first\n" {
				return fmt.Errorf("stdout %q", stdout.String())
			}
			return nil
		})
		cancel(SignalCause(syscall.SIGINT))
		if code := <-done; code != exitInterrupted {
			t.Errorf("exit %d, want %d; stderr %q", code, exitInterrupted, stderr.String())
		}
	})
	t.Run("interrupted with stdin unread", func(t *testing.T) {
		// yes | tether exec --node node-0 -- sleep 1000, then Ctrl-C:
		// MiBs of stdin wait unread in front of any in-band cancel; the
		// cancel still reaches the node at once, the process is killed,
		// and the cancelled result exits 130.
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
		ctx, cancel := context.WithCancelCause(testCtx(t))
		var stdout, stderr syncBuffer
		e := &env{stdin: pr, stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"exec", "--nats-url", url, "--node", "node-0", "--", "sh", "-c", "echo $$; exec sleep 1000"}, e)
		}()
		var pid int
		checkFor(t, defaultTestTimeout, func() error {
			line, _, ok := strings.Cut(stdout.String(), "\n")
			if !ok {
				return fmt.Errorf("no pid yet; stderr %q", stderr.String())
			}
			pid, err = strconv.Atoi(line)
			return err
		})
		checkFor(t, defaultTestTimeout, func() error {
			if n := fed.Load(); n < 4<<20 {
				return fmt.Errorf("%d bytes of stdin fed, want 4 MiB queued", n)
			}
			return nil
		})
		cancel(SignalCause(syscall.SIGINT))
		select {
		case code := <-done:
			if code != exitInterrupted || !strings.Contains(stderr.String(), "node node-0: cancelled") {
				t.Errorf("exit %d, want %d and the cancel on stderr; stderr %q", code, exitInterrupted, stderr.String())
			}
		case <-time.After(defaultTestTimeout):
			t.Fatal("interrupted exec did not return")
		}
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("process %d still running on the node", pid)
		}
	})
	t.Run("detach", func(t *testing.T) {
		r := runCLI(testCtx(t), nil, "data", "exec", "--nats-url", url, "--node", "node-0", "--detach", "--", "cat")
		if r.code != 0 || !strings.Contains(r.stderr, "standard input is not forwarded") {
			t.Errorf("exit %d, stderr %q", r.code, r.stderr)
		}
	})
}

// TestStdinMode: what exec does with its standard input, by target,
// source of the commands, flags and kind of standard input.
func TestStdinMode(t *testing.T) {
	tests := []struct {
		name string
		o    execOptions
		kind stdinKind
		want stdinMode
		warn string // part of the warning; "" for none
	}{
		{"piped to one node", execOptions{Node: "n"}, stdinPiped, stdinStream, ""},
		{"terminal to one node", execOptions{Node: "n"}, stdinTerminal, stdinUnused, ""},
		{"none to one node", execOptions{Node: "n"}, stdinNone, stdinUnused, ""},
		{"--stdin from a terminal", execOptions{Node: "n", Stdin: true}, stdinTerminal, stdinStream, ""},
		{"-n", execOptions{Node: "n", NoStdin: true}, stdinPiped, stdinUnused, ""},
		{"script from stdin", execOptions{Node: "n", Script: "-"}, stdinPiped, stdinScript, ""},
		{"script file", execOptions{Node: "n", Script: "f.sh"}, stdinPiped, stdinUnused, "bash -s"},
		{"commands", execOptions{Node: "n", Commands: []string{"cat"}}, stdinPiped, stdinUnused, "bash -s"},
		{"commands, -n", execOptions{Node: "n", Commands: []string{"cat"}, NoStdin: true}, stdinPiped, stdinUnused, ""},
		{"commands, terminal", execOptions{Node: "n", Commands: []string{"cat"}}, stdinTerminal, stdinUnused, ""},
		{"detached", execOptions{Node: "n", Detach: true}, stdinPiped, stdinUnused, "detached"},
		{"fan-out", execOptions{All: true}, stdinPiped, stdinUnused, "--stdin"},
		{"fan-out, selector", execOptions{Selector: "a=b"}, stdinPiped, stdinUnused, "several nodes"},
		{"fan-out, none", execOptions{All: true}, stdinNone, stdinUnused, ""},
		{"fan-out --stdin", execOptions{All: true, Stdin: true}, stdinPiped, stdinBuffered, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, warn := tt.o.stdinMode(tt.kind)
			if got != tt.want || (tt.warn == "") != (warn == "") || !strings.Contains(warn, tt.warn) {
				t.Errorf("stdinMode = %v, %q; want %v and a warning containing %q", got, warn, tt.want, tt.warn)
			}
		})
	}
}

// TestClassifyStdin: /dev/null and a closed descriptor are no standard
// input; a terminal is one; pipes, files and readers are piped.
func TestClassifyStdin(t *testing.T) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	closed, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	file, err := os.CreateTemp(t.TempDir(), "stdin")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	zero, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	defer zero.Close()
	tm := newTerminal(t, 24, 80)
	for _, tt := range []struct {
		name string
		r    io.Reader
		want stdinKind
	}{
		{"nil", nil, stdinNone},
		{"/dev/null", null, stdinNone},
		{"closed", closed, stdinNone},
		{"pipe", pr, stdinPiped},
		{"file", file, stdinPiped},
		{"/dev/zero", zero, stdinPiped},
		{"reader", strings.NewReader("x"), stdinPiped},
		{"terminal", tm.env().stdin, stdinTerminal},
	} {
		if got := classifyStdin(tt.r); got != tt.want {
			t.Errorf("%s: classifyStdin = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestClassifyStdinNullOfAnotherMount: a null device that is not this
// process's /dev/null inode (docker exec hands a container the host's
// /dev/null as fd 0) is still no standard input: the device number 1:3
// decides, not the inode.
func TestClassifyStdinNullOfAnotherMount(t *testing.T) {
	path := filepath.Join(t.TempDir(), "null")
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("cannot make a char device 1:3 here (needs root and a mount without nodev): %v", err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("cannot open the char device (nodev mount?): %v", err)
	}
	defer f.Close()
	if got := classifyStdin(f); got != stdinNone {
		t.Errorf("classifyStdin(char device 1:3 at %s) = %v, want stdinNone", path, got)
	}
}
