package policy

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the policy's Prometheus collectors. A nil *Metrics counts
// nothing. Identities are never labels (unbounded, and they name people):
// they are in the refusal's message and the log.
type Metrics struct {
	refusals *prometheus.CounterVec
	reloads  *prometheus.CounterVec
	// counters holds refusals' children, looked up once, so counting a
	// refusal is one atomic add. Index 0 of each dimension is "unknown".
	counters [numOps][numReasons]prometheus.Counter
}

// NewMetrics builds the collectors, registers them with reg and
// pre-initialises every label value to zero:
//
//	tether_policy_refusals_total{operation, reason}  refused requests; operation
//	    as policy files name it (or "unknown"), reason no_identity, no_rule,
//	    bad_request, rate_limit or job_limit
//	tether_policy_reloads_total{result}  reloads (Store.Reload, or Check then Apply
//	    or Keep), result ok or error (the policy in force was kept)
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_policy_refusals_total",
			Help: "Requests the policy refused, by operation and reason.",
		}, []string{"operation", "reason"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_policy_reloads_total",
			Help: "Policy reloads, by result (error: the old policy was kept).",
		}, []string{"result"}),
	}
	for o := Operation(0); o < numOps; o++ {
		name := "unknown"
		if o.Valid() {
			name = o.String()
		}
		for r := ReasonNoIdentity; r < numReasons; r++ {
			m.counters[o][r] = m.refusals.WithLabelValues(name, r.String())
		}
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	for _, c := range []prometheus.Collector{m.refusals, m.reloads} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("policy: register metrics: %w", err)
		}
	}
	return m, nil
}

// refused counts one refusal.
func (m *Metrics) refused(op Operation, r Reason) {
	if m == nil {
		return
	}
	if !op.Valid() {
		op = 0
	}
	if r < ReasonNoIdentity || r >= numReasons {
		return
	}
	m.counters[op][r].Inc()
}

func (m *Metrics) reloaded(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.reloads.WithLabelValues("ok").Inc()
	} else {
		m.reloads.WithLabelValues("error").Inc()
	}
}
