package coordinator_test

import (
	"context"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestDirectExecWithStdin: an exec stream with stdin on the direct path
// carries stdin to the command and its output and exit status back.
func TestDirectExecWithStdin(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Logger: testLogger(t), Direct: true})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindExec, protocol.ExecParams{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Direct() {
		t.Fatal("stream not on the direct path")
	}
	if err := protocol.WriteFrame(st, protocol.FrameStdin, []byte("hello direct")); err != nil {
		t.Fatal(err)
	}
	if err := protocol.WriteFrame(st, protocol.FrameStdinClose, nil); err != nil {
		t.Fatal(err)
	}
	out, es := readExec(t, st)
	if out != "hello direct" || es.ExitCode != 0 {
		t.Fatalf("stdout %q, exit %+v", out, es)
	}
}

// TestDirectRelaySemantics runs the relay's tests on the direct path: what
// users depend on (Close aborts the operation on the agent, Cancel stops it
// while its answer still arrives, half-close, the tunnel's loss named, the
// default timeout, refusals and params checks, the drain's shutdown result
// at a frame boundary, the metrics) holds there too.
func TestDirectRelaySemantics(t *testing.T) {
	directRun = true
	defer func() { directRun = false }()
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"ExecWithStdin", TestRelayExecWithStdin},
		{"ExecDefaultTimeout", TestRelayExecDefaultTimeout},
		{"Refusals", TestRelayRefusals},
		{"ChecksParams", TestRelayChecksParams},
		{"ClientCloseKillsExec", TestRelayClientCloseKillsExec},
		{"TunnelLost", TestRelayTunnelLost},
		{"AbortSendsCancel", TestRelayAbortSendsCancel},
		{"MetricAndDrain", TestRelayMetricAndDrain},
		{"ExecStreamCancelReachesCommandIgnoringStdin", TestExecStreamCancelReachesCommandIgnoringStdin},
		{"StreamCloseReachesPTYIgnoringStdin", TestStreamCloseReachesPTYIgnoringStdin},
		{"SendsCancelStreamToAgentsThatTakeIt", TestRelaySendsCancelStreamToAgentsThatTakeIt},
		{"StreamedExecShutdownResult", TestStreamedExecShutdownResult},
		{"ShutdownMidFrame", TestRelayShutdownMidFrame},
	} {
		t.Run(tc.name, tc.test)
	}
}
