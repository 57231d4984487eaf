package coordinator

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/internal/admission"
	"github.com/tetherfleet/tether/internal/tunnelmetrics"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// Reasons of tether_coordinator_auth_failures_total: why an agent's
// handshake was refused.
const (
	reasonBadToken  = "bad_token"        // the Hello's token is wrong
	reasonNoToken   = "no_token"         // the Hello has no token
	reasonVersion   = "version"          // protocol versions differ
	reasonBadHello  = "bad_hello"        // the Hello failed validation
	reasonTimeout   = "timeout"          // TLS handshake or Hello not done in time
	reasonProtocol  = "protocol"         // anything else: TLS failure, wrong first stream or frame
	reasonOverload  = admission.Overload // MaxHandshakes handshakes were in progress: closed unread, or cut to make room for another source
	reasonDuplicate = "duplicate"        // another live agent instance holds the node id
	// reasonSourceLimit: MaxHandshakesPerSource handshakes from the same
	// source (IPv4 address or IPv6 /64) were in progress: closed unread.
	reasonSourceLimit = admission.SourceLimit
	// Certificate refusals (identity.go).
	reasonCertRequired = "cert_required" // no client certificate, and no shared token allowed, or the node id is enrolled
	reasonForeignCA    = "foreign_ca"    // the certificate does not chain to the node CA
	reasonCertExpired  = "expired_cert"  // the certificate expired (or is not yet valid)
	reasonBadCert      = "bad_cert"      // the certificate names no node id
	reasonWrongNode    = "wrong_node"    // the Hello's node id is not the certificate's
	reasonRevoked      = "revoked"       // the certificate's serial was revoked
	reasonUnknownCert  = "unknown_cert"  // the serial is not listed for its node (superseded, or another coordinator's state)
)

// Results of tether_coordinator_enrollments_total (identity.go).
const (
	enrollOK              = "ok"
	enrollBadToken        = "bad_token"
	enrollTokenExpired    = "token_expired"
	enrollTokenUsed       = "token_used"
	enrollAlreadyEnrolled = "already_enrolled"
	enrollRevokedNode     = "revoked_node"
	enrollBadRequest      = "bad_request" // bad message or CSR
	enrollError           = "error"       // the identity store failed
	enrollRenewed         = "renewed"
	enrollRenewRefused    = "renew_refused"
)

// Outcomes of tether_coordinator_exec_results_total, one per node run.
const (
	outcomeSuccess   = "success"   // exited 0
	outcomeFailure   = "failure"   // exited non-zero
	outcomeTimeout   = "timeout"   // the exec timeout killed it
	outcomeCancelled = "cancelled" // cancelled by a client or by shutdown
	outcomeError     = "error"     // could not run or the result is unknown
)

// metrics are the coordinator's Prometheus collectors.
type metrics struct {
	agentsConnected prometheus.Gauge
	reconnects      prometheus.Counter
	authFailures    *prometheus.CounterVec
	streamsOpened   *prometheus.CounterVec
	execDuration    prometheus.Histogram
	execResults     *prometheus.CounterVec
	// outputBytes counts the exec output relayed to clients, by stream
	// (job.go).
	outputBytes *prometheus.CounterVec
	enrollments *prometheus.CounterVec
	// sshEvents counts the agents' SSH channel events (ssh.go), by
	// outcome: audited, or why one was dropped.
	sshEvents *prometheus.CounterVec
	// forwarded counts requests handed to the coordinator holding their
	// node (fleet.go).
	forwarded prometheus.Counter
	// takenOver counts the jobs this coordinator took over from a gone
	// holder (holders.go).
	takenOver prometheus.Counter
	// reruns counts the lost idempotent jobs this coordinator ran again
	// (rerun.go).
	reruns prometheus.Counter
	// jobReports counts the agents' job exit reports (jobexit.go), by
	// result.
	jobReports *prometheus.CounterVec
	// directRefusals counts the direct data path's refusals (direct.go),
	// by reason.
	directRefusals *prometheus.CounterVec
	// directStreams counts the streams opened on the direct data path.
	directStreams prometheus.Counter
	// tunnelRTT takes the tunnel round trip each agent heartbeat reports
	// (the agent's last ping), across all agents.
	tunnelRTT prometheus.Histogram
	// flow reads the agents' sessions' flow counters at each scrape.
	flow []prometheus.Collector
}

// newMetrics builds the collectors, registers them with reg and
// pre-initialises every bounded label value to zero. flow is the agents'
// sessions' counters (Config.Tunnel.Flow).
func newMetrics(reg prometheus.Registerer, flow *tunnel.FlowCounters) (*metrics, error) {
	m := &metrics{
		tunnelRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tether_coordinator_tunnel_rtt_seconds",
			Help:    "Tunnel round trips the agents reported in their heartbeats (each agent's last ping of the coordinator), one sample per heartbeat, across all agents.",
			Buckets: tunnelmetrics.RTTBuckets,
		}),
		flow: tunnelmetrics.Collectors("tether_coordinator", flow),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_coordinator_forwarded_requests_total",
			Help: "API requests (and fan-out node runs) forwarded to the coordinator holding their node or job.",
		}),
		takenOver: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_coordinator_jobs_taken_over_total",
			Help: "Jobs taken over (claimed, then settled) from a coordinator that was gone, or from this coordinator's predecessor.",
		}),
		reruns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_coordinator_job_reruns_total",
			Help: "Lost idempotent detached jobs this coordinator ran again (claimed and submitted as their owner).",
		}),
		agentsConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_coordinator_agents_connected",
			Help: "Agents with an established tunnel session.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_coordinator_tunnel_reconnects_total",
			Help: "Sessions registered by an agent that had a session before (its hello's reconnects is above 0), or replacing a live session of the same node id.",
		}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_coordinator_auth_failures_total",
			Help: "Agent connections refused or cut before they registered, by reason.",
		}, []string{"reason"}),
		streamsOpened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_coordinator_streams_opened_total",
			Help: "Tunnel streams opened or accepted by the coordinator, by kind.",
		}, []string{"kind"}),
		execDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tether_coordinator_exec_duration_seconds",
			Help:    "Wall time of one node's exec, from stream open to final frame.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
		}),
		execResults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_coordinator_exec_results_total",
			Help: "Node exec results, by outcome.",
		}, []string{"outcome"}),
		outputBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_coordinator_exec_output_bytes_total",
			Help: "Bytes of exec output relayed from the nodes to the clients, by stream (stdout, stderr).",
		}, []string{"stream"}),
		enrollments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_coordinator_enrollments_total",
			Help: "Agent enrollments (join token and CSR) and certificate renewals, by result.",
		}, []string{"result"}),
		sshEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_coordinator_ssh_channel_events_total",
			Help: "SSH channel events agents reported on their control streams, by outcome: audited, or dropped (malformed, unknown_session: no SSH connection of this node has that session).",
		}, []string{"outcome"}),
		jobReports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_coordinator_job_exit_reports_total",
			Help: "Detached jobs' exit reports agents sent on their control streams, by result: settled (the job's record ended), unchanged (already ended), or not applied (malformed, foreign: not a detached job of the reporting node, unknown: no record, dropped: queue full or draining, error: the job store failed).",
		}, []string{"result"}),
		directRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_coordinator_direct_refusals_total",
			Help: "Connections and streams refused on the direct data path for clients (ALPN tether-client/1 on the tunnel listener), by reason: direct_off (no direct listener configured), bad_preamble (a first frame that is not the direct protocol's, e.g. an agent's hello, or a malformed control frame), no_control_stream (a connection that opened no control stream within the handshake timeout: idle), no_redemption (a session that redeemed no ticket within the handshake timeout), bad_ticket (missing or malformed), unknown_ticket, expired_ticket, reused_ticket.",
		}, []string{"reason"}),
		directStreams: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_coordinator_direct_streams_total",
			Help: "Client streams opened on the direct data path (a redeemed ticket whose tunnel stream opened).",
		}),
	}
	for _, r := range directRefusalReasons {
		m.directRefusals.WithLabelValues(r)
	}
	for _, r := range jobReportResults {
		m.jobReports.WithLabelValues(r)
	}
	for _, o := range []string{sshEventAudited, sshEventMalformed, sshEventUnknownSession} {
		m.sshEvents.WithLabelValues(o)
	}
	for _, r := range []string{reasonBadToken, reasonNoToken, reasonVersion, reasonBadHello, reasonTimeout, reasonProtocol, reasonOverload, reasonDuplicate, reasonSourceLimit,
		reasonCertRequired, reasonForeignCA, reasonCertExpired, reasonBadCert, reasonWrongNode, reasonRevoked, reasonUnknownCert} {
		m.authFailures.WithLabelValues(r)
	}
	for _, k := range protocol.Kinds() {
		m.streamsOpened.WithLabelValues(k.String())
	}
	for _, o := range []string{outcomeSuccess, outcomeFailure, outcomeTimeout, outcomeCancelled, outcomeError} {
		m.execResults.WithLabelValues(o)
	}
	for _, st := range []string{"stdout", "stderr"} {
		m.outputBytes.WithLabelValues(st)
	}
	for _, r := range []string{enrollOK, enrollBadToken, enrollTokenExpired, enrollTokenUsed, enrollAlreadyEnrolled, enrollRevokedNode, enrollBadRequest, enrollError, enrollRenewed, enrollRenewRefused} {
		m.enrollments.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.forwarded, m.takenOver, m.reruns, m.agentsConnected, m.reconnects, m.authFailures, m.streamsOpened, m.execDuration, m.execResults, m.outputBytes, m.enrollments, m.sshEvents, m.jobReports, m.directRefusals, m.directStreams} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("coordinator: register metrics: %w", err)
		}
	}
	for _, c := range append(m.flow, m.tunnelRTT) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("coordinator: register metrics: %w", err)
		}
	}
	return m, nil
}
