package coordinator_test

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/coordinator"
)

func TestStartEmbeddedNATS(t *testing.T) {
	s, err := coordinator.StartEmbeddedNATS(coordinator.EmbeddedNATSConfig{
		Port:       server.RANDOM_PORT,
		StoreDir:   t.TempDir(),
		ServerName: "tether-test",
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
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("$JS.API.INFO", nil, defaultTestTimeout); err != nil {
		t.Errorf("JetStream API: %v", err)
	}
}

func TestStartEmbeddedNATSNeedsStoreDir(t *testing.T) {
	if _, err := coordinator.StartEmbeddedNATS(coordinator.EmbeddedNATSConfig{Port: server.RANDOM_PORT}); err == nil {
		t.Fatal("started without a StoreDir")
	}
}
