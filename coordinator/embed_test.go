package coordinator_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
)

func TestStartEmbeddedNATS(t *testing.T) {
	l := natsauthtest.NewLayout(t)
	s, err := coordinator.StartEmbeddedNATS(coordinator.EmbeddedNATSConfig{
		Port:       server.RANDOM_PORT,
		StoreDir:   t.TempDir(),
		ServerName: "tether-test",
		Auth:       l,
		Logger:     testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.Shutdown()
		s.WaitForShutdown()
	}()
	if !s.JetStreamEnabled() {
		t.Error("JetStream is not enabled")
	}
	// No anonymous client, ever.
	if nc, err := nats.Connect(s.ClientURL()); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("anonymous connect: %v, want %v", err, nats.ErrAuthorization)
	}
	nc := natsauthtest.Connect(t, s.ClientURL(), natsauthtest.CoordinatorCreds(t, l, "c1"))
	if _, err := nc.Request("$JS.API.INFO", nil, defaultTestTimeout); err != nil {
		t.Errorf("JetStream API: %v", err)
	}
	nc.Close()
}

func TestStartEmbeddedNATSNeedsAuth(t *testing.T) {
	_, err := coordinator.StartEmbeddedNATS(coordinator.EmbeddedNATSConfig{Port: server.RANDOM_PORT, StoreDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "Auth") {
		t.Fatalf("started without a layout: %v", err)
	}
}

func TestStartEmbeddedNATSNeedsStoreDir(t *testing.T) {
	if _, err := coordinator.StartEmbeddedNATS(coordinator.EmbeddedNATSConfig{Port: server.RANDOM_PORT}); err == nil {
		t.Fatal("started without a StoreDir")
	}
}
