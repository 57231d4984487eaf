package sshgate

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/internal/admission"
)

// Results of tether_ssh_connections_total: how each accepted connection's
// handshake ended.
const (
	connOK          = "ok"          // authenticated
	connAuthFailed  = "auth_failed" // the client gave up or ran out of tries: no key was accepted
	connHandshake   = "handshake"   // a transport or protocol failure before authentication
	connTimeout     = "timeout"     // not authenticated within HandshakeTimeout
	connEvicted     = "evicted"     // cut to make room for another source's handshake
	connLimit       = "limit"       // MaxConnections connections were open: closed unread
	connInternalErr = "internal"    // the handshake's permissions were inconsistent (a bug)
	// Refused before the handshake by the pre-auth admission.
	connSourceLimit = admission.SourceLimit // MaxHandshakesPerSource handshakes of its source in progress
	connOverload    = admission.Overload    // MaxHandshakes handshakes in progress, none to cut
)

var connResults = []string{connOK, connAuthFailed, connHandshake, connTimeout, connEvicted, connLimit, connSourceLimit, connOverload, connInternalErr}

// Results of tether_ssh_channels_total, one per channel the client asked
// to open.
const (
	chanOK          = "ok"          // a direct-tcpip joined to a node, counted when it ended
	chanError       = "error"       // unknown node, the node failed, or the splice failed
	chanRefused     = "refused"     // the policy (or the node's local policy) refused
	chanBadTarget   = "bad_target"  // a direct-tcpip to something else than NODE:22
	chanSession     = "session"     // a session channel (ssh to the gate itself), rejected
	chanUnsupported = "unsupported" // any other channel type, rejected
	chanLimit       = "limit"       // MaxChannelsPerConn channels were open
	chanRevoked     = "revoked"     // closed while open: its key, certificate or grant went away (Recheck)
)

var chanResults = []string{chanOK, chanError, chanRefused, chanBadTarget, chanSession, chanUnsupported, chanLimit, chanRevoked}

// Reasons of tether_ssh_connections_revoked_total: why a live connection's
// key stopped being trusted (the auth failure reasons of stillTrusted).
var revokeReasons = []string{reasonUnknownKey, reasonUnknownCA, reasonExpired}

// metrics are the gate's Prometheus collectors, named tether_ssh_*.
type metrics struct {
	connections  *prometheus.CounterVec
	open         prometheus.Gauge
	authFailures *prometheus.CounterVec
	channels     *prometheus.CounterVec
	bytes        *prometheus.CounterVec
	globalReqs   prometheus.Counter
	revoked      *prometheus.CounterVec
}

// newMetrics builds the collectors, registers them with reg (nil: not
// registered) and pre-initialises every label value at zero.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_ssh_connections_total",
			Help: "Connections accepted by the SSH jump host, by how their handshake ended (ok: authenticated).",
		}, []string{"result"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_ssh_connections_open",
			Help: "Connections to the SSH jump host now open, in their handshake or authenticated.",
		}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_ssh_auth_failures_total",
			Help: "Public keys and certificates the SSH jump host refused, once per key and connection, by reason.",
		}, []string{"reason"}),
		channels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_ssh_channels_total",
			Help: "Channels clients asked the SSH jump host to open, by result.",
		}, []string{"result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_ssh_bytes_total",
			Help: "Bytes the SSH jump host relayed between clients and nodes: in is client to node, out node to client.",
		}, []string{"direction"}),
		globalReqs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_ssh_global_requests_refused_total",
			Help: "Global requests (tcpip-forward, keepalives...) the SSH jump host answered with a failure.",
		}),
		revoked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_ssh_connections_revoked_total",
			Help: "Authenticated connections the SSH jump host closed because their key or certificate was no longer trusted (a reload removed it or its CA, or the certificate expired), by reason.",
		}, []string{"reason"}),
	}
	for _, r := range connResults {
		m.connections.WithLabelValues(r)
	}
	for _, r := range authReasons {
		m.authFailures.WithLabelValues(r)
	}
	for _, r := range chanResults {
		m.channels.WithLabelValues(r)
	}
	for _, r := range revokeReasons {
		m.revoked.WithLabelValues(r)
	}
	m.bytes.WithLabelValues("in")
	m.bytes.WithLabelValues("out")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.connections, m.open, m.authFailures, m.channels, m.bytes, m.globalReqs, m.revoked} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("ssh gate: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}
