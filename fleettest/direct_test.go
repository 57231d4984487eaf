package fleettest_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestDirectStreamsReachTheHolder: with several coordinators, a stream
// request that lands on one that does not hold the node is forwarded, and
// the holder answers with its own listener: every stream is direct, to
// the coordinator that holds its node, and works.
func TestDirectStreamsReachTheHolder(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 4, HeartbeatInterval: time.Second, Direct: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 12 {
		node := fmt.Sprintf("node-%d", i%4)
		st, err := f.Client.OpenStream(ctx, node, protocol.KindExec, protocol.ExecParams{Argv: []string{"cat"}, Stdin: true})
		if err != nil {
			t.Fatalf("stream %d to %s: %v", i, node, err)
		}
		if !st.Direct() {
			t.Fatalf("stream %d to %s is not direct", i, node)
		}
		protocol.WriteFrame(st, protocol.FrameStdin, []byte("via "+node))
		protocol.WriteFrame(st, protocol.FrameStdinClose, nil)
		var out strings.Builder
		fr := protocol.NewFrameReader(st)
		for {
			fm, err := fr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("stream %d to %s: %v", i, node, err)
			}
			if fm.Type == protocol.FrameStdout {
				out.Write(fm.Payload)
			}
		}
		st.Close()
		if out.String() != "via "+node {
			t.Fatalf("stream %d to %s: stdout %q", i, node, out.String())
		}
	}
	if f.Forwarded(t) == 0 {
		t.Error("no request was forwarded between the coordinators")
	}
	if n := f.CounterSum(t, "tether_coordinator_direct_streams_total"); n != 12 {
		t.Errorf("direct streams = %v, want 12", n)
	}
}
