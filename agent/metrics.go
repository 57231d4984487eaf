package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/tetherfleet/tether/protocol"
)

// metrics are the agent's collectors, registered on Config.Registerer.
type metrics struct {
	reconnects   prometheus.Counter
	connected    prometheus.Gauge
	streams      *prometheus.CounterVec
	execsRunning prometheus.Gauge
	execDuration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		reconnects: f.NewCounter(prometheus.CounterOpts{
			Name: "tether_agent_tunnel_reconnects_total",
			Help: "Redials after a failed dial, a rejected hello or a lost tunnel session.",
		}),
		connected: f.NewGauge(prometheus.GaugeOpts{
			Name: "tether_agent_tunnel_connected",
			Help: "1 while a tunnel session is established and welcomed by a coordinator, else 0.",
		}),
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
	for _, k := range protocol.Kinds() {
		m.streams.WithLabelValues(k.String())
	}
	return m
}
