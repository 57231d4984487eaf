package ledger

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/protocol"
)

// metrics are the ledger's and reaper's Prometheus collectors.
type metrics struct {
	reaps         *prometheus.CounterVec
	reapFailures  prometheus.Counter
	leaked        prometheus.Counter
	disagreements *prometheus.CounterVec
}

// allStates are the record states, in gauge order.
var allStates = []State{StateLive, StateDeleting, StateDeleted, StateLost, StateLeaked}

// sandboxesDesc describes tether_sandboxes.
var sandboxesDesc = prometheus.NewDesc("tether_sandboxes",
	"Sandbox records in the ledger, by provider, node and state (every coordinator reports the whole shared ledger).",
	[]string{"provider", "node", "state"}, nil)

// leasesDesc describes tether_leases.
var leasesDesc = prometheus.NewDesc("tether_leases",
	"Run leases in the ledger, by state: open (renewed within its TTL), expired (its TTL passed unrenewed: the reaper deletes what it owns), closed (kept for the lease retention). Every coordinator reports the whole shared ledger.",
	[]string{"state"}, nil)

// Lease states of tether_leases.
const (
	leaseOpen    = "open"
	leaseExpired = "expired"
	leaseClosed  = "closed"
)

// gaugeCollector reports tether_sandboxes and tether_leases from the
// indexes at scrape time.
type gaugeCollector struct{ l *Ledger }

func (c gaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sandboxesDesc
	ch <- leasesDesc
}

// Collect reports every state of each provider and node that has records,
// and every lease state, zero included.
func (c gaugeCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.l.now()
	c.l.mu.RLock()
	leases := map[string]int{}
	for _, ls := range c.l.leaseIdx.byRun {
		switch {
		case ls.Closed:
			leases[leaseClosed]++
		case ls.Expired(now):
			leases[leaseExpired]++
		default:
			leases[leaseOpen]++
		}
	}
	pairs := map[[2]string]map[State]int{}
	for k, n := range c.l.idx.counts {
		p := [2]string{k.provider, k.node}
		if pairs[p] == nil {
			pairs[p] = map[State]int{}
		}
		pairs[p][k.state] = n
	}
	c.l.mu.RUnlock()
	for _, st := range []string{leaseOpen, leaseExpired, leaseClosed} {
		ch <- prometheus.MustNewConstMetric(leasesDesc, prometheus.GaugeValue, float64(leases[st]), st)
	}
	for p, counts := range pairs {
		for _, s := range allStates {
			ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(counts[s]), p[0], p[1], string(s))
		}
	}
}

// newMetrics builds the collectors, registers them with reg and
// pre-initialises every bounded label value to zero.
func newMetrics(reg prometheus.Registerer, l *Ledger) (*metrics, error) {
	m := &metrics{
		reaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_sandbox_reaps_total",
			Help: "Sandboxes the reaper deleted (or found already gone), by reason.",
		}, []string{"reason"}),
		reapFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_sandbox_reap_failures_total",
			Help: "Reaper delete attempts that failed.",
		}),
		leaked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_sandbox_leaked_total",
			Help: "Sandboxes the reaper gave up on after its maximum attempts (state leaked).",
		}),
		disagreements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_ledger_disagreements_total",
			Help: "Inventories that contradicted the ledger, by kind: gateway_missing (ledger live, gateway lacks it), gateway_has_deleted (ledger deleted, gateway lists it).",
		}, []string{"kind"}),
	}
	for _, r := range []string{protocol.ReasonLeaseExpired, protocol.ReasonTTLExpired, protocol.ReasonRunClosed, protocol.ReasonUnowned} {
		m.reaps.WithLabelValues(r)
	}
	for _, k := range []string{disagreeGatewayMissing, disagreeGatewayHasDeleted} {
		m.disagreements.WithLabelValues(k)
	}
	for _, c := range []prometheus.Collector{m.reaps, m.reapFailures, m.leaked, m.disagreements, gaugeCollector{l}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("ledger: register metrics: %w", err)
		}
	}
	return m, nil
}
