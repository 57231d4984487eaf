package fleettest_test

import (
	"bytes"
	"io"
	"net"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

// TestTwoHopRelayEchoes: the benchmarks' baseline relay (two RelayConn
// hops) carries bytes both ways and passes a half-close through, so the
// target's echo ends and the client reads every byte back then EOF.
func TestTwoHopRelayEchoes(t *testing.T) {
	addr := fleettest.TwoHopRelay(t, fleettest.BenchTarget(t))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte("relay "), 10000)
	go func() {
		c.Write([]byte{'E'})
		c.Write(msg)
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read through the relay: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("relay echoed %d bytes, want the %d sent", len(got), len(msg))
	}
}
