package cli

import (
	"context"
	"log/slog"
	"os"
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
	sock.Wait(t, defaultTestTimeout, "READY=1 after the refused reload", readyWith("policy reload failed (the policy loaded before stays in force): "))

	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
	done <- nil
	sock.Wait(t, defaultTestTimeout, "STOPPING=1", is("STOPPING=1"))
}
