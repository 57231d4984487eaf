package cli

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/internal/sdnotify/sdnotifytest"
)

// tether coordinator under systemd (Type=notify): READY=1 once it serves,
// RELOADING=1 and READY=1 with the outcome around each SIGHUP policy
// reload (a bad file says so and keeps the policy), STOPPING=1 when it
// drains.
func TestCoordinatorNotifiesReloads(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	o := testCoordinatorOptions(t, t.TempDir())
	o.notify = sdnotify.New(sock.Path, 0)
	cs, err := startCoordinator(o, "", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cs.serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	is := func(kv string) func(sdnotifytest.Message) bool {
		return func(m sdnotifytest.Message) bool { return m.Has(kv) }
	}
	readyWith := func(prefix string) func(sdnotifytest.Message) bool {
		return func(m sdnotifytest.Message) bool {
			v, _ := m.Value("STATUS")
			return m.Has("READY=1") && strings.HasPrefix(v, prefix)
		}
	}
	sock.Wait(t, defaultTestTimeout, "READY=1", readyWith("serving 0 agents"))

	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	sock.Wait(t, defaultTestTimeout, "RELOADING=1", is("RELOADING=1"))
	sock.Wait(t, defaultTestTimeout, "READY=1 after the reload", readyWith("policy reloaded from "+o.Policy))

	replaceFile(t, o.Policy, "version: 1\nbogus: true\n")
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	sock.Wait(t, defaultTestTimeout, "READY=1 after the refused reload", readyWith("reload failed (nothing changed: the settings, the policy and the SSH keys in force stay): "+o.Policy+":"))

	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
	done <- nil
	sock.Wait(t, defaultTestTimeout, "STOPPING=1", is("STOPPING=1"))
}

// `tether coordinator` started by systemd (NOTIFY_SOCKET, WATCHDOG_USEC in
// its environment) says READY=1, pets the watchdog, has taken the
// variables out of its environment (nothing it starts inherits them), and
// says STOPPING=1 when it is stopped.
func TestCoordinatorCommandUnderSystemd(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	t.Setenv(sdnotify.EnvSocket, sock.Path)
	t.Setenv(sdnotify.EnvWatchdogUSec, "2000000")
	t.Setenv(sdnotify.EnvWatchdogPID, strconv.Itoa(os.Getpid()))
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	done := make(chan result, 1)
	go func() {
		done <- runCLI(ctx, nil, "", "coordinator", "--data-dir", t.TempDir(), "--policy", writeTestPolicy(t, testAdminPolicy(t)),
			"--listen", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
			"--openshell-listen", "127.0.0.1:0", "--opensandbox-listen", "127.0.0.1:0")
	}()
	has := func(kv string) func(sdnotifytest.Message) bool {
		return func(m sdnotifytest.Message) bool { return m.Has(kv) }
	}
	sock.Wait(t, defaultTestTimeout, "READY=1", has("READY=1"))
	sock.Wait(t, defaultTestTimeout, "WATCHDOG=1", has("WATCHDOG=1"))
	for _, k := range []string{sdnotify.EnvSocket, sdnotify.EnvWatchdogUSec, sdnotify.EnvWatchdogPID} {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("$%s=%q still in the environment of a running coordinator", k, v)
		}
	}
	cancel()
	if r := <-done; r.code != 0 {
		t.Errorf("tether coordinator: exit %d, stderr %s", r.code, r.stderr)
	}
	sock.Wait(t, defaultTestTimeout, "STOPPING=1", has("STOPPING=1"))
}
