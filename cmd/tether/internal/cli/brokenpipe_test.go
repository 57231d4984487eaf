package cli

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// freeLoopbackAddr is a 127.0.0.1 address with a port free a moment ago.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// `tether dev 2>&1 | head -1`: once the reader of its logs is gone, dev
// keeps serving (its log lines are lost) instead of dying of SIGPIPE on
// the next line, which took the coordinator, NATS and the agent down at
// once, without a drain.
func TestDevSurvivesClosedLogPipe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole tether dev")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	httpAddr := freeLoopbackAddr(t)
	cmd := exec.Command(exe, "dev", "--data-dir", filepath.Join(dir, "dev"), "--nats-port", "0",
		"--listen", "127.0.0.1:0", "--http-addr", httpAddr,
		"--openshell-listen=", "--opensandbox-listen=", "--ssh-addr=")
	cmd.Env = append(os.Environ(), cliMainEnv+"=1", "HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	// Read the first line, then close the read end, as head -1 does.
	if _, err := bufio.NewReader(r).ReadString('\n'); err != nil {
		t.Fatalf("no first line from tether dev: %v", err)
	}
	r.Close()
	// dev keeps logging as it starts (and on every request); it must come
	// up and answer /healthz.
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					t.Fatalf("tether dev died of %v after its log pipe was closed", ws.Signal())
				}
			}
			t.Fatalf("tether dev exited after its log pipe was closed: %v", err)
		default:
		}
		resp, err := client.Get("http://" + httpAddr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("tether dev never answered /healthz on %s: %v", httpAddr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// More log lines (each request is audited), then still alive.
	for i := 0; i < 5; i++ {
		if resp, err := client.Get("http://" + httpAddr + "/console/nodes"); err == nil {
			resp.Body.Close()
		}
	}
	select {
	case err := <-exited:
		exited <- err
		t.Fatalf("tether dev exited while serving with its log pipe closed: %v", err)
	case <-time.After(time.Second):
	}
}
