package cli

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDevSurvivesClosedPipes runs `tether dev` as its own process (this
// test binary as tether, through Main) with stdout and stderr on pipes, as
// under `tether dev | tee`. Once a job runs, the pipes' readers go away
// (tee died with the Ctrl-C) and dev gets SIGTERM: it must not die of
// SIGPIPE on its next log line, and must shut down in the documented
// order, so the running job ends with the coordinator's shutdown result,
// not a lost tunnel or connection.
func TestDevSurvivesClosedPipes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a full dev stack")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	home := t.TempDir()
	cmd := exec.Command(exe, "dev", "--data-dir", dir, "--nats-port", "0",
		"--listen", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--ssh-addr", "",
		"--openshell-listen", "", "--opensandbox-listen", "", "--log-level", "debug")
	cmd.Env = append(os.Environ(), cliMainEnv+"=1", "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		waitErr = cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(defaultTestTimeout):
			t.Error("tether dev did not exit after SIGKILL")
		}
	})
	// stderr is read until the test closes it, so that dev's logs never
	// block on a full pipe before then.
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		io.Copy(io.Discard, stderr)
	}()
	urlRE := regexp.MustCompile(`NATS URL: +(nats://\S+)`)
	urlCh := make(chan string, 1)
	stdoutDone := make(chan struct{})
	go func() {
		defer close(stdoutDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := urlRE.FindStringSubmatch(sc.Text()); m != nil {
				urlCh <- m[1]
			}
		}
	}()
	var url string
	select {
	case url = <-urlCh:
	case <-time.After(2 * defaultTestTimeout):
		t.Fatal("no ready banner from tether dev")
	}

	vars := map[string]string{natsCredsEnv: filepath.Join(dir, "dev.creds")}
	ctx := testCtx(t)
	node := devNodeID()
	jobDone := make(chan result, 1)
	go func() {
		jobDone <- runCLI(ctx, vars, "", "exec", "--nats-url", url, "--node", node, "--", "sleep", "120")
	}()
	checkFor(t, defaultTestTimeout, func() error {
		r := runCLI(ctx, vars, "", "job", "list", "--nats-url", url, "--state", "running")
		if !strings.Contains(r.stdout, "sleep 120") {
			return errorString("the job is not running yet: " + r.stdout + r.stderr)
		}
		return nil
	})

	// tee is gone: nobody reads dev's stdout or stderr any more.
	stdout.Close()
	stderr.Close()
	<-stdoutDone
	<-stderrDone
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}

	select {
	case r := <-jobDone:
		if r.code != exitTether || !strings.Contains(r.stderr, "is shutting down") || strings.Contains(r.stderr, "tunnel lost") {
			t.Errorf("the running job: exit %d, stderr %q; want 255 and the coordinator's shutdown", r.code, r.stderr)
		}
	case <-time.After(2 * defaultTestTimeout):
		t.Fatal("the running job did not end")
	}
	select {
	case <-exited:
		err := waitErr
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				t.Fatalf("tether dev was killed by %v", ws.Signal())
			}
		}
		if err != nil {
			t.Errorf("tether dev: %v", err)
		}
	case <-time.After(2 * defaultTestTimeout):
		t.Fatal("tether dev did not stop")
	}
}
