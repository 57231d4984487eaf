package opensandbox

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Route classes, the "route" label of the facade's metrics.
const (
	classCreate   = "create"           // POST /sandboxes
	classList     = "list"             // GET /sandboxes
	classSandbox  = "sandbox"          // /sandboxes/{id}: GET, DELETE
	classEndpoint = "endpoint"         // /sandboxes/{id}/endpoints/{port}
	classRenew    = "renew-expiration" // /sandboxes/{id}/renew-expiration
	classMetadata = "metadata"         // /sandboxes/{id}/metadata
	classPause    = "pause"            // /sandboxes/{id}/pause
	classResume   = "resume"           // /sandboxes/{id}/resume
	classProxy    = "proxy"            // /sandboxes/{id}/proxy/{port}/...
	classOther    = "other"            // health, unknown paths
)

var routeClasses = []string{classCreate, classList, classSandbox, classEndpoint, classRenew, classMetadata, classPause, classResume, classProxy, classOther}

// statusCut is the "status" label of an answer whose status line went out
// but whose body the node's connection ended early: an error, whatever
// the status said.
const statusCut = "cut"

// Status classes, the "status" label of requests_total: the answer's HTTP
// status class, "none" when the caller went away before one was written,
// or "cut" (statusCut).
var statusClasses = []string{"1xx", "2xx", "3xx", "4xx", "5xx", "none", statusCut}

// Reasons of refused_total.
var refusedReasons = []string{"host", "origin"}

// metrics are the facade's Prometheus collectors.
type metrics struct {
	requests       *prometheus.CounterVec
	wsActive       prometheus.Gauge
	wsTotal        prometheus.Counter
	forwardLatency *prometheus.HistogramVec
	ledgerErrors   prometheus.Counter
	authFailures   prometheus.Counter
	refused        *prometheus.CounterVec
}

// newMetrics builds the collectors, registers them with reg and
// pre-initialises every label value to zero.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_opensandbox_facade_requests_total",
			Help: "Requests answered by the OpenSandbox facade, by route class and HTTP status class; status \"cut\" is an answer whose body the node's connection ended early (the caller's stream was broken off).",
		}, []string{"route", "status"}),
		wsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_opensandbox_facade_websocket_sessions",
			Help: "WebSocket sessions currently spliced through the OpenSandbox facade.",
		}),
		wsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_opensandbox_facade_websocket_sessions_total",
			Help: "WebSocket sessions the OpenSandbox facade spliced (a node answered 101).",
		}),
		forwardLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_opensandbox_facade_forward_duration_seconds",
			Help:    "Time from forwarding a request to a node's lifecycle server until its response headers arrived (tunnel dial included), by route class.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"route"}),
		ledgerErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_opensandbox_facade_ledger_errors_total",
			Help: "Ledger writes of the OpenSandbox facade that failed (the caller's request still succeeded).",
		}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_opensandbox_facade_auth_failures_total",
			Help: "Requests the OpenSandbox facade refused with 401: no accepted Tether-Token and no verified client certificate.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_opensandbox_facade_refused_total",
			Help: "Requests the OpenSandbox facade refused for the names they carry: reason host (421, the Host header names none of the facade's names) or origin (403, the Origin of a page of another site).",
		}, []string{"reason"}),
	}
	for _, r := range refusedReasons {
		m.refused.WithLabelValues(r)
	}
	for _, c := range routeClasses {
		for _, s := range statusClasses {
			m.requests.WithLabelValues(c, s)
		}
		m.forwardLatency.WithLabelValues(c)
	}
	for _, c := range []prometheus.Collector{m.requests, m.wsActive, m.wsTotal, m.forwardLatency, m.ledgerErrors, m.authFailures, m.refused} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("opensandbox facade: register metrics: %w", err)
		}
	}
	return m, nil
}

// statusClass maps an HTTP status to its "status" label; 0 is "none".
func statusClass(code int) string {
	if code < 100 || code > 599 {
		return "none"
	}
	return strconv.Itoa(code/100) + "xx"
}
