package cli

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/natsauth/natsauthtest"
)

func testCoordinatorOptions(t *testing.T, dir string) coordinatorOptions {
	o := defaultCoordinatorOptions()
	o.DataDir = dir
	o.Policy = writeTestPolicy(t, testAdminPolicy(t))
	o.Listen = "127.0.0.1:0"
	o.HTTPAddr = "127.0.0.1:0"
	o.NATSListen = "127.0.0.1:0"
	o.Sandbox.OpenShellListen = "127.0.0.1:0"
	o.Sandbox.OpenSandboxListen = "127.0.0.1:0"
	return o
}

func TestCoordinatorStartFailuresAreClean(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	t.Run("busy tunnel port", func(t *testing.T) {
		o := testCoordinatorOptions(t, t.TempDir())
		o.Listen = busy.Addr().String()
		_, err := startCoordinator(o, "tok", log, prometheus.NewRegistry())
		if err == nil || !strings.Contains(err.Error(), "tunnel listener") || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("err = %v, want the tunnel listener's bind error", err)
		}
	})
	t.Run("busy NATS port", func(t *testing.T) {
		o := testCoordinatorOptions(t, t.TempDir())
		o.NATSListen = busy.Addr().String()
		_, err := startCoordinator(o, "tok", log, prometheus.NewRegistry())
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("err = %v, want the NATS bind error", err)
		}
	})

	first, err := startCoordinator(testCoordinatorOptions(t, dir), "tok", log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer first.close()
	t.Run("shared data dir", func(t *testing.T) {
		_, err := startCoordinator(testCoordinatorOptions(t, dir), "tok", log, prometheus.NewRegistry())
		if err == nil || !strings.Contains(err.Error(), "in use by another tether process") {
			t.Fatalf("err = %v, want the data dir lock error", err)
		}
	})
	t.Run("second coordinator with the same id on the same NATS", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- first.serve(ctx) }()
		defer func() { cancel(); <-done }()
		// Wait until the first one serves the API.
		checkReady(t, first)
		o := testCoordinatorOptions(t, sharedLayoutDir(t, dir))
		o.NATSURL = first.info.NATSURL
		o.NATSCreds = natsauthtest.CredsFile(t, natsauthtest.CoordinatorCreds(t, first.layout, "second"))
		_, err := startCoordinator(o, "tok", log, prometheus.NewRegistry())
		if err == nil || !strings.Contains(err.Error(), "already uses the coordinator id") {
			t.Fatalf("err = %v, want a refusal naming the id in use", err)
		}
		// With its own id it starts and shares the fleet.
		o = testCoordinatorOptions(t, sharedLayoutDir(t, dir))
		o.NATSURL = first.info.NATSURL
		o.NATSCreds = natsauthtest.CredsFile(t, natsauthtest.CoordinatorCreds(t, first.layout, "second"))
		o.ID = "second"
		second, err := startCoordinator(o, "tok", log, prometheus.NewRegistry())
		if err != nil {
			t.Fatalf("second coordinator with its own id: %v", err)
		}
		second.close()
	})
}

// sharedLayoutDir returns a new data directory holding a copy of the NATS
// layout in the data directory from, as a fleet's further coordinators
// get it (README: "Several coordinators").
func sharedLayoutDir(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	src, dst := natsAuthDir(from), natsAuthDir(to)
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatalf("copy the NATS layout %s to %s: %v", src, dst, err)
	}
	// Keep the owner-only modes the layout insists on (os.CopyFS does not).
	err := filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Chmod(p, 0o700)
		}
		return os.Chmod(p, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return to
}

func checkReady(t *testing.T, cs *coordinatorServer) {
	t.Helper()
	deadline := time.Now().Add(defaultTestTimeout)
	for !cs.coord.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("coordinator not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// When a sandbox service fails (here a facade whose listener died), the
// coordinator drains and stops with its error instead of serving lease and
// sandbox endpoints against a closed ledger.
func TestCoordinatorStopsWhenSandboxServicesFail(t *testing.T) {
	cs, err := startCoordinator(testCoordinatorOptions(t, t.TempDir()), "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	cs.sbxLn.openShell.Close()
	done := make(chan error, 1)
	go func() { done <- cs.serve(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "openshell facade") {
			t.Fatalf("serve = %v, want the openshell facade's failure", err)
		}
	case <-time.After(defaultTestTimeout):
		t.Fatal("the coordinator kept serving after its sandbox services failed")
	}
}
