package tunnelmetrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/internal/tunnelmetrics"
	"github.com/tetherfleet/tether/tunnel"
)

// The names are a contract with the dashboards and alert rules: both roles
// export the same three series, unlabelled, lint-clean.
func TestCollectorsNames(t *testing.T) {
	for _, prefix := range []string{"tether_coordinator", "tether_agent"} {
		reg := prometheus.NewRegistry()
		reg.MustRegister(tunnelmetrics.Collectors(prefix, new(tunnel.FlowCounters))...)
		want := strings.NewReplacer("P_", prefix+"_").Replace(`
# HELP P_tunnel_send_queued_bytes Bytes of tunnel frames being written to the connection and not yet taken by it, summed over sessions: 0 while idle, above 0 while a link is slower than what is sent on it.
# TYPE P_tunnel_send_queued_bytes gauge
P_tunnel_send_queued_bytes 0
# HELP P_tunnel_window_stall_seconds_total Time tunnel streams waited for the peer's flow-control window, summed over sessions; a stall is added when it ends.
# TYPE P_tunnel_window_stall_seconds_total counter
P_tunnel_window_stall_seconds_total 0
# HELP P_tunnel_window_stalls_total Times a tunnel stream ran out of the peer's flow-control window (the peer read slower than this side wrote), summed over sessions.
# TYPE P_tunnel_window_stalls_total counter
P_tunnel_window_stalls_total 0
`)
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
			t.Errorf("%s: %v", prefix, err)
		}
		if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
			t.Errorf("%s: lint: %v %v", prefix, problems, err)
		}
	}
}
