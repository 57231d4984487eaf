package client_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// TestExecConnectionClosed: an Exec waiting for a job's result fails at
// once when its NATS connection is closed (as when the server disconnects
// a revoked user and it cannot reconnect), with an error matching
// nats.ErrConnectionClosed that says so, instead of waiting for the
// keepalive and fate clocks; an Exec on the closed connection fails so
// too. Before, it waited for KeepAliveTimeout and failed as a silent
// coordinator.
func TestExecConnectionClosed(t *testing.T) {
	s := runServer(t)
	got := make(chan struct{}, 1)
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		got <- struct{}{} // a job that says nothing
	}, nil)
	nc := connect(t, s)
	c := &client.Client{NC: nc, KeepAliveTimeout: time.Minute, FateCheckAfter: time.Minute}
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(testCtx(t), echoReq(), nil)
		done <- err
	}()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no exec request")
	}
	time.Sleep(50 * time.Millisecond) // Exec waits for replies
	start := time.Now()
	nc.Close()
	select {
	case err := <-done:
		if !errors.Is(err, nats.ErrConnectionClosed) || !strings.Contains(err.Error(), "connection closed") {
			t.Errorf("Exec after the close: %v, want nats.ErrConnectionClosed", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Exec failed %v after the close", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Exec still waiting 10 s after its connection closed")
	}
	if _, err := c.Exec(testCtx(t), echoReq(), nil); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("Exec on the closed connection: %v, want nats.ErrConnectionClosed", err)
	}
}
