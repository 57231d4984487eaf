package cli

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDevShutdownReportsShutdown: stopping `tether dev` (Ctrl-C, SIGTERM)
// drains the coordinator while the agent still serves, so running jobs end
// with the coordinator's shutdown result ("coordinator dev is shutting down;
// job cancelled", error_code shutdown: exit 255 with --node, also with
// stdin streamed through the stream relay, a failed node with --all), not
// with a lost tunnel or a broken pipe; then dev's agent stops, without
// redialing.
func TestDevShutdownReportsShutdown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a full dev stack")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
	code := -1
	done := make(chan struct{})
	go func() {
		defer close(done)
		code = run(ctx, []string{"dev", "--data-dir", dir, "--nats-port", "0",
			"--listen", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--ssh-addr", "127.0.0.1:0", "--log-level", "warn",
			"--openshell-listen", "", "--opensandbox-listen", ""}, e)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(2 * defaultTestTimeout):
			t.Error("dev did not stop")
		}
	})
	urlRE := regexp.MustCompile(`NATS URL: +(nats://\S+)`)
	var url string
	checkFor(t, defaultTestTimeout, func() error {
		select {
		case <-done:
			t.Fatalf("dev exited early with %d; stderr:\n%s", code, stderr.String())
		default:
		}
		m := urlRE.FindStringSubmatch(stdout.String())
		if m == nil {
			return errorString("no ready banner yet")
		}
		url = m[1]
		return nil
	})
	node := devNodeID()

	type job struct {
		name string
		args []string
		code int
		want string
		out  syncBuffer
		errs syncBuffer
		done chan int
	}
	jobs := []*job{
		{name: "--node", args: []string{"exec", "--nats-url", url, "--node", node, "-n", "--", "sh", "-c", "echo started; exec sleep 300"},
			code: exitTether, want: "tether: node " + node + ": coordinator dev is shutting down; job cancelled"},
		{name: "--all", args: []string{"exec", "--nats-url", url, "--all", "-n", "--", "sh", "-c", "echo started; exec sleep 300"},
			code: exitFailure, want: "coordinator dev is shutting down; job cancelled"},
		// Piped stdin: streamed through tether.v1.stream, same result.
		{name: "--node, streamed stdin", args: []string{"exec", "--nats-url", url, "--node", node, "--", "sh", "-c", "echo started; exec sleep 300"},
			code: exitTether, want: "tether: node " + node + ": coordinator dev is shutting down; job cancelled"},
	}
	jctx := context.WithoutCancel(testCtx(t))
	for _, j := range jobs {
		j.done = make(chan int, 1)
		// Without a home directory dev writes its user's credentials into
		// its data dir.
		je := &env{stdin: strings.NewReader(""), stdout: &j.out, stderr: &j.errs, getenv: testGetenv(map[string]string{natsCredsEnv: filepath.Join(dir, "dev.creds")}), now: time.Now}
		go func() { j.done <- run(jctx, j.args, je) }()
	}
	for _, j := range jobs {
		checkFor(t, defaultTestTimeout, func() error {
			if !strings.Contains(j.out.String(), "started") {
				return errorString(j.name + ": job not started yet; stderr: " + j.errs.String())
			}
			return nil
		})
	}

	cancel() // Ctrl-C on tether dev
	for _, j := range jobs {
		select {
		case c := <-j.done:
			if c != j.code || !strings.Contains(j.errs.String(), j.want) || strings.Contains(j.errs.String(), "tunnel lost") {
				t.Errorf("%s: exit %d, stderr %q; want %d and %q", j.name, c, j.errs.String(), j.code, j.want)
			}
		case <-time.After(2 * defaultTestTimeout):
			t.Fatalf("%s: exec did not end after dev was stopped", j.name)
		}
	}
	select {
	case <-done:
		if code != 0 {
			t.Errorf("dev exit code %d; stderr:\n%s", code, stderr.String())
		}
		// Dev's agent stops with its coordinator: it does not redial the
		// listener its coordinator closed at the drain.
		if strings.Contains(stderr.String(), "redialing") {
			t.Errorf("dev's agent redialed its stopping coordinator; stderr:\n%s", stderr.String())
		}
	case <-time.After(2 * defaultTestTimeout):
		t.Fatal("dev did not stop")
	}
}
