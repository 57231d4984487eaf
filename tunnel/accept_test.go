package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// With AcceptRaw the header is read wherever the caller likes: a stream
// whose opener sends nothing does not hold up the next one.
func TestAcceptRawThenReadHeader(t *testing.T) {
	cfg := testConfig()
	cfg.HeaderTimeout = 300 * time.Millisecond
	c, s := net.Pipe()
	client, server := sessionPair(t, c, s, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	silent, err := client.y.OpenStream() // never sends a header
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if _, err := client.Open(ctx, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}

	first, err := server.AcceptRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := server.AcceptRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	h, err := server.ReadHeader(second)
	if err != nil || h.Kind != protocol.KindExec {
		t.Fatalf("ReadHeader(second) = %+v, %v", h, err)
	}
	if d := time.Since(start); d > cfg.HeaderTimeout/2 {
		t.Errorf("second header took %v", d)
	}
	if _, err := server.ReadHeader(first); err == nil {
		t.Fatal("ReadHeader of a silent stream succeeded")
	}
	// The silent opener is told why it was dropped.
	silent.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	f, err := protocol.NewFrameReader(silent).Next()
	if err != nil || f.Type != protocol.FrameError {
		t.Fatalf("silent stream got %v, %v; want an error frame", f.Type, err)
	}

	client.Close()
	if _, err := server.AcceptRaw(ctx); !errors.Is(err, io.EOF) {
		t.Errorf("AcceptRaw after close = %v, want io.EOF", err)
	}
}
