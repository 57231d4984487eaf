package audit

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// metrics are the recorder's collectors.
type metrics struct {
	events        *prometheus.CounterVec
	dropped       prometheus.Counter
	publishErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_audit_events_total",
			Help: "Audit events recorded, by operation and result (ok, failed, refused, error).",
		}, []string{"operation", "result"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_audit_dropped_total",
			Help: "Audit events not queued for the audit stream because the queue was full or the recorder closed (they are in the log).",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_audit_publish_errors_total",
			Help: "Audit events JetStream did not acknowledge (they are in the log).",
		}),
	}
	for _, c := range []prometheus.Collector{m.events, m.dropped, m.publishErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("audit: register metrics: %w", err)
		}
	}
	// The operations and results are bounded: start them at zero.
	for _, op := range policy.Operations() {
		for _, res := range protocol.AuditResults() {
			m.events.WithLabelValues(op.String(), res)
		}
	}
	return m, nil
}
