package openshell

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// methodOther labels calls of methods the facade does not route by name or
// id (it forwards them to the node metadata tether-node names, or the only
// node), and calls of other services, so the label stays bounded.
const methodOther = "other"

// Values of the "via" label of tether_openshell_facade_lookups_total: how a
// call's sandbox was found.
const (
	viaLedger = "ledger" // the ledger's record
	viaIndex  = "index"  // the facade's own index of ids and names it saw pass
	viaProbe  = "probe"  // GetSandbox on every node
	viaScan   = "scan"   // ListSandboxes on every node (by id)
	viaNone   = "none"   // not found anywhere
)

// Values of the "by" label of tether_openshell_facade_placements_total.
const (
	placeExisting    = "existing"     // (workspace, name) already known on a node
	placeLabel       = "label"        // the tether.node label
	placeNode        = "node"         // metadata tether-node
	placeSelector    = "selector"     // metadata tether-node-selector
	placeLeastLoaded = "least_loaded" // fewest live sandboxes
)

// Ledger operations, the "op" label of tether_openshell_facade_ledger_errors_total.
const (
	opCreated  = "created"
	opDeleting = "deleting"
	opDeleted  = "deleted"
)

// metrics are the facade's Prometheus collectors.
type metrics struct {
	calls        *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	authFailures prometheus.Counter
	lookups      *prometheus.CounterVec
	placements   *prometheus.CounterVec
	ledgerErrors *prometheus.CounterVec
	refused      prometheus.Counter
}

// routedMethods are the method label values besides methodOther.
var routedMethods = []string{"Health", "CreateSandbox", "GetSandbox", "ListSandboxes", "DeleteSandbox",
	"ExecSandbox", "WatchSandbox", "ExecSandboxInteractive", "StopSandbox", "StartSandbox"}

// newMetrics builds the collectors, registers them with reg and
// pre-initialises the bounded label values to zero.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_openshell_facade_calls_total",
			Help: "Calls the OpenShell facade answered, by method (\"other\" for methods it does not route) and gRPC status code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_openshell_facade_call_duration_seconds",
			Help:    "Wall time of a call through the OpenShell facade, from arrival to status (streams: their whole life), by method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
		}, []string{"method"}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_openshell_facade_auth_failures_total",
			Help: "Calls refused with UNAUTHENTICATED because they carried no valid tether-token and no verified client certificate.",
		}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_openshell_facade_lookups_total",
			Help: "Sandbox lookups for routing by name or id, by how the sandbox was found (ledger, index, probe, scan, none).",
		}, []string{"via"}),
		placements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_openshell_facade_placements_total",
			Help: "CreateSandbox placements, by what chose the node (existing, label, node, selector, least_loaded).",
		}, []string{"by"}),
		ledgerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_openshell_facade_ledger_errors_total",
			Help: "Ledger writes that failed after a gateway answered (the caller's call still succeeds; inventory repairs the record), by operation.",
		}, []string{"op"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_openshell_facade_refused_total",
			Help: "Calls refused with PERMISSION_DENIED because their :authority names none of the facade's names (Config.Hosts).",
		}),
	}
	for _, meth := range slices.Concat(routedMethods, []string{methodOther}) {
		m.duration.WithLabelValues(meth)
		for c := codes.OK; c <= codes.Unauthenticated; c++ {
			m.calls.WithLabelValues(meth, c.String())
		}
	}
	for _, v := range []string{viaLedger, viaIndex, viaProbe, viaScan, viaNone} {
		m.lookups.WithLabelValues(v)
	}
	for _, v := range []string{placeExisting, placeLabel, placeNode, placeSelector, placeLeastLoaded} {
		m.placements.WithLabelValues(v)
	}
	for _, v := range []string{opCreated, opDeleting, opDeleted} {
		m.ledgerErrors.WithLabelValues(v)
	}
	for _, c := range []prometheus.Collector{m.calls, m.duration, m.authFailures, m.lookups, m.placements, m.ledgerErrors, m.refused} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("openshell facade: register metrics: %w", err)
		}
	}
	return m, nil
}
