//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// cliRun is a `tether` client command running in the background.
type cliRun struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	code           int
}

// startCLI starts the tether binary with args and stdin (nil: /dev/null).
func startCLI(t *testing.T, natsURL string, stdin io.Reader, args ...string) *cliRun {
	t.Helper()
	r := &cliRun{done: make(chan struct{})}
	r.cmd = exec.Command(*tetherBin, args...)
	r.cmd.Env = append(os.Environ(), natsEnv(natsURL)...)
	r.cmd.Stdin = stdin
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(r.done)
		err := r.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			r.code = ee.ExitCode()
		} else if err != nil {
			r.code = -1
		}
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			r.cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

// wait returns the exit code once the command exited.
func (r *cliRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-r.done:
		return r.code
	case <-time.After(defaultTestTimeout):
		t.Fatalf("tether %v did not exit; stderr %q", r.cmd.Args[1:], r.stderr.String())
		return -1
	}
}

// waitProcess waits until a process runs with these arguments (each a
// whole argument: `sh -c "sleep 1"` does not match "sleep", "1"). Such
// processes still running when the test ends are killed.
func waitProcess(t *testing.T, args ...string) {
	t.Helper()
	t.Cleanup(func() {
		for _, pid := range processesWith(args...) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	checkFor(t, defaultTestTimeout, func() error {
		if len(processesWith(args...)) == 0 {
			return fmt.Errorf("no process %v yet", args)
		}
		return nil
	})
}

// TestExecStdinEndToEnd: the real binary forwards a piped or redirected
// standard input of megabytes (checked on the node with sha256sum), and
// runs as usual from CI, with standard input at /dev/null or not open at
// all.
func TestExecStdinEndToEnd(t *testing.T) {
	f := startFleet(t)
	f.startAgent(t, "e2e-in", "role=in", f.tokenFile)
	f.waitNodes(t, "e2e-in")

	data := make([]byte, 8<<20)
	rand.Read(data)
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:]) + "  -\n"
	file := filepath.Join(t.TempDir(), "stdin")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("pipe", func(t *testing.T) {
		r := startCLI(t, f.natsURL, bytes.NewReader(data), "exec", "--node", "e2e-in", "--", "sha256sum")
		if code := r.wait(t); code != 0 || r.stdout.String() != want {
			t.Errorf("exit %d, stdout %q, want %q; stderr %q", code, r.stdout.String(), want, r.stderr.String())
		}
	})
	t.Run("file", func(t *testing.T) {
		in, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		r := startCLI(t, f.natsURL, in, "exec", "--node", "e2e-in", "--", "sha256sum")
		if code := r.wait(t); code != 0 || r.stdout.String() != want {
			t.Errorf("exit %d, stdout %q, want %q; stderr %q", code, r.stdout.String(), want, r.stderr.String())
		}
	})
	t.Run("dev null", func(t *testing.T) {
		r := startCLI(t, f.natsURL, nil, "exec", "--node", "e2e-in", "--", "wc", "-c")
		if code := r.wait(t); code != 0 || strings.TrimSpace(r.stdout.String()) != "0" || r.stderr.String() != "" {
			t.Errorf("exit %d, stdout %q, stderr %q", code, r.stdout.String(), r.stderr.String())
		}
	})
	t.Run("not open", func(t *testing.T) {
		// sh closes fd 0 before it runs tether.
		out, errOut, code := runSh(t, f.natsURL, `exec "$0" exec --node e2e-in -- echo ok <&-`)
		if code != 0 || out != "ok\n" || errOut != "" {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		out, errOut, code = runSh(t, f.natsURL, `exec "$0" exec --all -c 'echo ok' <&-`)
		if code != 0 || out != "e2e-in | ok\n" || !strings.Contains(errOut, "1 node: 1 succeeded") || strings.Contains(errOut, "warning") {
			t.Errorf("fan-out: exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
}

// runSh runs script with sh, $0 being the tether binary.
func runSh(t *testing.T, natsURL, script string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script, *tetherBin)
	cmd.Env = append(os.Environ(), natsEnv(natsURL)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("sh -c %q: %v", script, err)
	}
	return o.String(), e.String(), code
}

// TestExecExitCodesEndToEnd: a tunnel lost mid-command and a coordinator
// that shuts down mid-command are Tether's failures (255), never the
// command's exit 1, on the job path and on the streamed-stdin path.
func TestExecExitCodesEndToEnd(t *testing.T) {
	f := startFleet(t)
	lost := f.startAgent(t, "e2e-lost", "role=lost", f.tokenFile)
	lostIn := f.startAgent(t, "e2e-lost-in", "role=lost", f.tokenFile)
	f.startAgent(t, "e2e-stays", "role=stays", f.tokenFile)
	f.waitNodes(t, "e2e-lost", "e2e-lost-in", "e2e-stays")

	t.Run("tunnel lost", func(t *testing.T) {
		r := startCLI(t, f.natsURL, nil, "exec", "--node", "e2e-lost", "--", "sh", "-c", "exec sleep 3141")
		waitProcess(t, "sleep", "3141")
		lost.cmd.Process.Kill()
		if code := r.wait(t); code != 255 || !strings.Contains(r.stderr.String(), "tunnel lost") {
			t.Errorf("exit %d, stderr %q; want 255 naming the lost tunnel", code, r.stderr.String())
		}
	})
	t.Run("tunnel lost with streamed stdin", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		r := startCLI(t, f.natsURL, pr, "exec", "--node", "e2e-lost-in", "--", "sh", "-c", "cat; exec sleep 3142")
		io.WriteString(pw, "data")
		pw.Close()
		waitProcess(t, "sleep", "3142")
		lostIn.cmd.Process.Kill()
		if code := r.wait(t); code != 255 || !strings.Contains(r.stderr.String(), "lost") {
			t.Errorf("exit %d, stderr %q; want 255 naming the lost tunnel", code, r.stderr.String())
		}
	})
	t.Run("coordinator shut down", func(t *testing.T) {
		r := startCLI(t, f.natsURL, nil, "exec", "--node", "e2e-stays", "--", "sh", "-c", "exec sleep 3143")
		waitProcess(t, "sleep", "3143")
		// SIGTERM: the coordinator drains, then cancels what still runs.
		if err := f.coord.stop(t); err != nil {
			t.Fatalf("coordinator exit after SIGTERM: %v", err)
		}
		if code := r.wait(t); code != 255 || !strings.Contains(r.stderr.String(), "shutting down") {
			t.Errorf("exit %d, stderr %q; want 255 naming the shutdown", code, r.stderr.String())
		}
	})
}

// TestExecCancelWithStdinUnreadEndToEnd: `yes | tether exec --node n --
// sleep 1001`, then Ctrl-C: the command never reads its stdin and MiBs of
// it wait in the pipe, the coordinator and the tunnel, yet the cancel
// reaches the node at once (out of band): the process is killed and tether
// exits 130 with the cancelled result.
func TestExecCancelWithStdinUnreadEndToEnd(t *testing.T) {
	f := startFleet(t)
	f.startAgent(t, "e2e-yes", "role=yes", f.tokenFile)
	f.waitNodes(t, "e2e-yes")

	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var fed atomic.Int64
	feeding := make(chan struct{})
	go func() { // yes
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
	t.Cleanup(func() {
		pw.Close()
		<-feeding
	})
	r := startCLI(t, f.natsURL, pr, "exec", "--node", "e2e-yes", "--", "sleep", "1001")
	pr.Close() // the child has its copy
	waitProcess(t, "sleep", "1001")
	checkFor(t, defaultTestTimeout, func() error {
		if n := fed.Load(); n < 4<<20 {
			return fmt.Errorf("%d bytes of stdin fed, want 4 MiB queued", n)
		}
		return nil
	})
	if err := r.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t); code != 130 || !strings.Contains(r.stderr.String(), "node e2e-yes: cancelled") {
		t.Errorf("exit %d, want 130 and the cancel on stderr; stderr %q", code, r.stderr.String())
	}
	checkFor(t, defaultTestTimeout, func() error {
		if pids := processesWith("sleep", "1001"); len(pids) > 0 {
			return fmt.Errorf("sleep 1001 still running: %v", pids)
		}
		return nil
	})
}
