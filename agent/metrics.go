package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/tetherfleet/tether/internal/tunnelmetrics"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// metrics are the agent's collectors, registered on Config.Registerer.
type metrics struct {
	reconnects   prometheus.Counter
	connected    prometheus.Gauge
	transport    *prometheus.GaugeVec // by transport; 1 for the live session's
	streams      *prometheus.CounterVec
	execsRunning prometheus.Gauge
	execDuration prometheus.Histogram
	copies       *prometheus.CounterVec
	copyBytes    *prometheus.CounterVec
	dials        *prometheus.CounterVec
	dialsOpen    prometheus.Gauge
	dialBytes    *prometheus.CounterVec
	listings     *prometheus.CounterVec
	// localRefusals counts operations the local policy refused.
	localRefusals prometheus.Counter
	enrollments   *prometheus.CounterVec
	// tunnelRTT takes the round trip of each answered heartbeat ping
	// (heartbeat in agent.go).
	tunnelRTT prometheus.Histogram
}

// Label values of the dial and inventory metrics.
const (
	dialOK            = "ok"
	dialBusy          = "busy"
	dialBadRequest    = "bad_request"
	dialUnknownTarget = "unknown_target"
	dialFailed        = "dial_failed"
	dialForbidden     = "forbidden"

	toTarget   = "to_target"
	fromTarget = "from_target"

	listingComplete   = "complete"
	listingIncomplete = "incomplete"
)

// newMetrics builds the agent's collectors and registers them on reg,
// unless reg is nil; flow is its sessions' flow counters
// (Config.Tunnel.Flow), exported as tether_agent_tunnel_window_stalls_total,
// tether_agent_tunnel_window_stall_seconds_total and
// tether_agent_tunnel_send_queued_bytes.
func newMetrics(reg prometheus.Registerer, flow *tunnel.FlowCounters) *metrics {
	f := promauto.With(reg)
	if reg != nil {
		reg.MustRegister(tunnelmetrics.Collectors("tether_agent", flow)...)
	}
	m := &metrics{
		tunnelRTT: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "tether_agent_tunnel_rtt_seconds",
			Help:    "Round trips of the agent's heartbeat pings over its tunnel (a yamux ping of the coordinator, one per heartbeat interval).",
			Buckets: tunnelmetrics.RTTBuckets,
		}),
		reconnects: f.NewCounter(prometheus.CounterOpts{
			Name: "tether_agent_tunnel_reconnects_total",
			Help: "Redials after a failed dial, a rejected hello or a lost tunnel session.",
		}),
		connected: f.NewGauge(prometheus.GaugeOpts{
			Name: "tether_agent_tunnel_connected",
			Help: "1 while a tunnel session is established and welcomed by a coordinator, else 0.",
		}),
		transport: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tether_agent_tunnel_transport",
			Help: "1 for the transport of the live tunnel session (tls: raw TLS; wss: WebSocket, perhaps through an HTTP proxy), 0 for the others.",
		}, []string{"transport"}),
		streams: f.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_agent_streams_total",
			Help: "Streams opened by the coordinator, by kind.",
		}, []string{"kind"}),
		execsRunning: f.NewGauge(prometheus.GaugeOpts{
			Name: "tether_agent_execs_running",
			Help: "Exec operations in flight.",
		}),
		execDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "tether_agent_exec_duration_seconds",
			Help: "Wall time of exec processes, from start to exit.",
			// 1 ms to about 70 min.
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12),
		}),
	}
	m.enrollments = f.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_agent_enrollments_total",
		Help: "Node certificate enrollments and renewals, by result (enrolled, refused: for good, the agent stops; renewed, renew_failed).",
	}, []string{"result"})
	for _, r := range []string{"enrolled", "refused", "renewed", "renew_failed"} {
		m.enrollments.WithLabelValues(r)
	}
	m.copies = f.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_agent_copies_total",
		Help: "Copy streams served, by direction (push: to the node, pull: from it) and result (ok, error).",
	}, []string{"direction", "result"})
	m.copyBytes = f.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_agent_copy_bytes_total",
		Help: "File data bytes of committed copies, by direction (push: written on the node, pull: read from it).",
	}, []string{"direction"})
	m.localRefusals = f.NewCounter(prometheus.CounterOpts{
		Name: "tether_agent_local_policy_refusals_total",
		Help: "Operations (exec, shell, copy, dial, run-as user) the agent's local policy refused.",
	})
	m.dials = f.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_agent_dials_total",
		Help: "Dial streams served, by result (ok, busy, bad_request, unknown_target, dial_failed, forbidden: refused by the local policy).",
	}, []string{"result"})
	m.dialsOpen = f.NewGauge(prometheus.GaugeOpts{
		Name: "tether_agent_dials_open",
		Help: "Dial streams open: connecting to their target or carrying its bytes.",
	})
	m.dialBytes = f.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_agent_dial_bytes_total",
		Help: "Bytes carried by dial streams, by direction (to_target: from the coordinator to the target, from_target: back).",
	}, []string{"direction"})
	m.listings = f.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_agent_inventory_listings_total",
		Help: "Gateway listings done for inventory streams, by provider and result (complete, incomplete).",
	}, []string{"provider", "result"})
	for _, r := range []string{dialOK, dialBusy, dialBadRequest, dialUnknownTarget, dialFailed, dialForbidden} {
		m.dials.WithLabelValues(r)
	}
	for _, d := range []string{toTarget, fromTarget} {
		m.dialBytes.WithLabelValues(d)
	}
	for _, p := range []string{protocol.ProviderOpenShell, protocol.ProviderOpenSandbox} {
		for _, r := range []string{listingComplete, listingIncomplete} {
			m.listings.WithLabelValues(p, r)
		}
	}
	for _, d := range []string{protocol.CopyPush, protocol.CopyPull} {
		m.copyBytes.WithLabelValues(d)
		for _, r := range []string{"ok", "error"} {
			m.copies.WithLabelValues(d, r)
		}
	}
	for _, k := range protocol.Kinds() {
		m.streams.WithLabelValues(k.String())
	}
	for _, t := range knownTransports {
		m.transport.WithLabelValues(t)
	}
	return m
}
