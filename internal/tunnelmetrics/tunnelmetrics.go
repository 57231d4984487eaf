// Package tunnelmetrics exports the tunnel's flow-control telemetry
// (tunnel.FlowCounters) as Prometheus collectors, under the same names for
// the coordinator (its agents' sessions, summed) and the agent (its own
// tunnel): <prefix>_tunnel_window_stalls_total,
// <prefix>_tunnel_window_stall_seconds_total and
// <prefix>_tunnel_send_queued_bytes. The RTT histograms,
// <prefix>_tunnel_rtt_seconds, are observed by their owners (the agent's
// heartbeat pinger, the coordinator's heartbeat reader) with RTTBuckets.
// No collector has labels: a fleet's sessions are summed, per node values
// are in the node listing (protocol.NodeInfo).
package tunnelmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/tunnel"
)

// RTTBuckets are the buckets of the tunnel RTT histograms, in seconds: from
// a loopback's 100 µs to a congested intercontinental link's seconds.
var RTTBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// Collectors returns the counters and gauge that read f at each scrape;
// prefix is "tether_coordinator" or "tether_agent". The caller registers
// them.
func Collectors(prefix string, f *tunnel.FlowCounters) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: prefix + "_tunnel_window_stalls_total",
			Help: "Times a tunnel stream ran out of the peer's flow-control window (the peer read slower than this side wrote), summed over sessions.",
		}, func() float64 { return float64(f.Stalls()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: prefix + "_tunnel_window_stall_seconds_total",
			Help: "Time tunnel streams waited for the peer's flow-control window, summed over sessions; a stall is added when it ends.",
		}, func() float64 { return f.StallTime().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: prefix + "_tunnel_send_queued_bytes",
			Help: "Bytes of tunnel frames being written to the connection and not yet taken by it, summed over sessions: 0 while idle, above 0 while a link is slower than what is sent on it.",
		}, func() float64 { return float64(f.QueuedBytes()) }),
	}
}
