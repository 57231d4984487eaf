package coordinator

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator/audit"
	"github.com/tetherfleet/tether/coordinator/enroll"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// Config configures a Coordinator. Start from DefaultConfig; New also fills
// zero durations and limits with their defaults, so a partly filled Config
// works too.
type Config struct {
	// ID names this coordinator in Welcome messages, node listings and error
	// messages. Default: the host name.
	ID string
	// Token is the deprecated fleet-wide shared token: when set, an agent
	// without a certificate may still register by presenting it in its
	// Hello (for a node id that is not enrolled), and may enroll with it as
	// with a join token of unlimited uses. Each such use is logged as
	// deprecated. Empty (the default) takes agents by certificate only. It
	// is compared in constant time and never logged. Token or NodeCA with
	// Identities is required.
	Token string
	// NodeCA signs the certificates of enrolling and renewing agents and
	// verifies the client certificates agents present (the tunnel
	// listener must request them: tunnel.RequestClientCert). With
	// Identities it turns per-node identity on.
	NodeCA *tunnel.NodeCA
	// Identities holds join tokens, the accepted certificate serials of
	// each node and revocations (package enroll, in JetStream KV). The
	// caller owns it; the coordinator never closes it.
	Identities *enroll.Store
	// Fleet is the fleet registry bucket (OpenFleetBucket), shared by every
	// coordinator on the NATS cluster: with it, this coordinator records
	// the nodes it holds there, serves their node subjects, and forwards
	// requests for nodes other coordinators hold (fleet.go). Nil: the
	// coordinator runs alone and knows only its own nodes. The caller owns
	// it.
	Fleet jetstream.KeyValue
	// CertTTL is the lifetime of the node certificates the coordinator
	// issues; agents renew at two thirds of it. Default 24 h.
	CertTTL time.Duration
	// NATS is the connection the micro service runs on and replies are
	// published to. Required. The caller owns it: the coordinator never
	// closes it.
	NATS *nats.Conn
	// Identify names the sender of each NATS API request from what the
	// NATS server stamped on it (caller.FromNATS of the layout's
	// natsauth.Verifier); a request it fails for is refused with 401
	// unauthenticated before its handler runs, and handlers read the
	// identity with caller.Of. Required: no request goes unattributed.
	Identify func(nats.Header) (policy.Identity, error)
	// Policy decides what each identified caller may do (see package
	// policy); reloading the store changes decisions at once. Nil allows
	// everything: only tests of parts that do not authorize leave it nil.
	Policy *policy.Store
	// Audit, if set, records an audit event for every request the micro
	// service serves and every policy refusal (audit.go), and serves
	// SubjectAuditQuery from it. The caller owns it: it closes it after
	// Serve returned. Nil records nothing; SubjectAuditQuery then answers
	// 503 unavailable.
	Audit *audit.Recorder
	// Version is the coordinator's version, reported by the micro service
	// (which requires semver: a non-semver Version is reported as "0.1.0"
	// there, and kept verbatim in the service metadata).
	Version string
	// HeartbeatInterval is how often agents are told to send heartbeats. A
	// session from which nothing at all arrives (no heartbeat, ping or
	// stream data) for three intervals is dropped: with the default, a dead
	// or frozen agent is found within 15 s. Default 5 s.
	HeartbeatInterval time.Duration
	// HandshakeTimeout bounds an agent's TLS handshake plus its Hello, from
	// the connection's accept. Default 5 s.
	HandshakeTimeout time.Duration
	// FirstByteTimeout bounds the wait, from accept, for a connection's
	// first byte (the TLS ClientHello, which an agent sends at once); a
	// connection silent for that long is closed and counted with reason
	// "timeout". It applies to TCP connections (it peeks at the socket) and
	// is capped by HandshakeTimeout. Default 2 s.
	FirstByteTimeout time.Duration
	// MaxHandshakes bounds the agent connections in their handshake (TLS
	// and Hello) at once. When all are taken, a newcomer from a source with
	// at least two handshakes fewer than the busiest source takes the place
	// of that source's oldest handshake (which is cut); any other newcomer
	// is closed unread. Both count as reason "overload". With
	// MaxHandshakesPerSource it bounds what unauthenticated peers can make
	// the coordinator hold, without letting a flood from a few sources keep
	// agents from other sources out. Default 256.
	MaxHandshakes int
	// MaxHandshakesPerSource bounds the handshakes in progress from one
	// source: one IPv4 address, or one IPv6 /64. A connection past it is
	// closed unread and counted with reason "source_limit"; the agent
	// retries with backoff. Raise it when many agents reach the coordinator
	// through one NAT address and restart together. Default 8.
	MaxHandshakesPerSource int
	// Paced admission (admission.go). AdmitRate is how many agent TLS
	// handshakes a second the coordinator starts; a connection past it
	// gets, instead of a ServerHello, a busy refusal naming when to come
	// back (protocol.AppendBusyRefusal): the next free slot, so that after
	// a restart the fleet comes back at this rate instead of on its
	// backoff. Zero: AdmitCPUShare of the CPUs at the measured cost of a
	// handshake (admission.HandshakeCost); negative: no pacing, every
	// connection is handshaked at once (as before pacing). Whatever the
	// rate, a storm of more agents than AdmitBurst coming back at once
	// (after a restart: the agents the fleet registry says this
	// coordinator held; or seen as more newcomers in a second than the
	// burst) is spread over admission.StormWindow (2.8 s), at most this
	// rate: no one-second window holds more than about 36% of it, and
	// each agent is told its own point of the window
	// (admission.Pacer.Expect).
	AdmitRate float64
	// AdmitCPUShare is the share of GOMAXPROCS that a zero AdmitRate
	// gives to handshakes, in (0, 1]; the rest stays for the sessions,
	// jobs and NATS work of the agents already in, and for what each
	// admitted agent costs after its handshake (registration, inventory).
	// Default 0.25.
	AdmitCPUShare float64
	// AdmitBurst is how many handshakes may start at once before the rate
	// applies, and the size up to which agents coming back together are
	// admitted at once rather than spread as a storm. Default a tenth of
	// a second's worth, at least 16.
	AdmitBurst int
	// MaxRetryAfter bounds the wait a busy refusal asks for. Default 30 s
	// (agents bound an unauthenticated wait by their own backoff cap, 30 s
	// by default).
	MaxRetryAfter time.Duration
	// DrainSpread is the window over which a drain staggers its agents'
	// moves (protocol.Drain.RetryAfterMS, spread evenly in random order),
	// so that they do not all land on one peer at once. Zero: the time the
	// coordinator would take to admit them all at AdmitRate, and at
	// least admission.StormWindow for more agents than AdmitBurst (the
	// spread a restart gives them), at most half of DrainTimeout (none
	// without pacing); negative: no stagger.
	DrainSpread time.Duration
	// MaxJobs bounds the exec jobs in flight; an exec request past it gets
	// 503 unavailable. Default 1024.
	MaxJobs int
	// DefaultTimeout is the exec timeout used when a request has none. Zero
	// means no timeout.
	DefaultTimeout time.Duration
	// MaxParallel bounds how many nodes of one job run at once when the
	// request does not say. Default 64.
	MaxParallel int
	// DrainTimeout bounds how long Serve waits, once its ctx is done, for
	// jobs in flight to finish before it cancels them. Default 10 s.
	DrainTimeout time.Duration
	// KeepAliveInterval is how often a running exec job's client gets a
	// keepalive reply when the job is otherwise silent, and how often the
	// coordinator probes that the client still listens (two failed probes
	// in a row cancel the job). Default protocol.DefaultKeepAliveInterval
	// (5 s); clients give up after 3×15 s of silence.
	KeepAliveInterval time.Duration
	// CancelGrace bounds how long a node has to report its exit status after
	// it was sent a cancel (job cancelled, coordinator shutting down, or the
	// request's timeout overrun); past it the node's result is an error.
	// Default 5 s.
	CancelGrace time.Duration
	// Tunnel tunes the agent sessions. Default: tunnel.DefaultConfig() with
	// KeepAliveInterval 0 — agents ping, and the coordinator watches for
	// their silence instead (IdleTimeout), which saves a goroutine per
	// agent. A zero Tunnel is replaced by that default; a zero IdleTimeout
	// by three HeartbeatIntervals. AcceptBacklog is always set to 1: the
	// coordinator accepts only the control stream, and yamux resets any
	// stream an agent opens past the backlog instead of buffering up to a
	// receive window (256 KiB) for each. yamux sizes its semaphore of
	// the session's own opens not yet acknowledged by the peer from the
	// same number, so the coordinator has at most one open in flight per
	// agent: each waits for the previous one's acknowledgement (the
	// agent's accept, one round trip), and a stream an agent neither
	// accepts nor closes holds every later open to its node until that
	// open's deadline. Agents therefore accept every stream at once and
	// read its header in the stream's own goroutine (a stream closed
	// without one, a refused job's, is closed again: tunnel.ErrNoHeader).
	Tunnel tunnel.Config
	// Pipe tunes the NATS pipes of stream relays (tether.v1.stream): window,
	// message size and keepalive. The zero value selects natspipe's
	// defaults (8 MiB, 128 KiB, 5 s); clients must use the same KeepAlive.
	// Its Logger defaults to Logger.
	Pipe natspipe.Config
	// SSH configures what the coordinator tells and vouches to SSH
	// clients (ssh.go); the zero value serves ssh streams without host
	// certificates and reports no jump host.
	SSH SSHConfig
	// Jobs, if set, is the durable job store (package jobstore): every
	// exec job is recorded there before it runs and its state kept
	// current, tether.v1.job.get and .list answer from it, and Serve
	// reconciles the jobs a dead predecessor left (durable.go). Nil keeps
	// no records (job.get and .list answer 501). The coordinator does not
	// close it.
	Jobs *jobstore.Store
	// JobLostAfter bounds how long reconciliation waits for the node of an
	// orphaned detached job to reconnect before recording it lost. Zero
	// means DefaultJobLostAfter.
	JobLostAfter time.Duration
	// JobHolderDead, if set, also says a coordinator is gone, beside the
	// coordinators' own verdict (holders.go: its coordinator subject has
	// no subscriber on NATS, twice a second apart; with Config.Fleet
	// only), so that reconciliation takes over its jobs. Called from
	// reconciliation and job.get goroutines; it must not block long.
	JobHolderDead func(coordinatorID string) bool
	// Endpoints, if set, adds more endpoints to the micro service "tether"
	// when it starts (the sandbox ledger's lease and sandbox endpoints).
	Endpoints func(micro.Service) error
	// Direct is the direct data path for client streams (direct.go): the
	// zero value turns it off, and requests for it are answered 501
	// direct_unavailable (clients then relay over NATS).
	Direct DirectConfig
	// Logger receives the coordinator's logs. Nil discards them.
	Logger *slog.Logger
	// Notify, if not nil, tells the service manager (a systemd unit of
	// Type=notify) how the coordinator is doing (notify.go): READY=1 once
	// Serve accepts agents and serves the API, STATUS= lines ("serving N
	// agents, M jobs running"), STOPPING=1 when the drain starts, and,
	// with a watchdog interval, WATCHDOG=1 at half of it while the NATS
	// connection is up and answers a round trip and the coordinator's
	// registry lock is free within a quarter of it. Nil sends nothing.
	Notify *sdnotify.Notifier
	// Registerer receives the coordinator's metrics. Nil registers them in a
	// private registry (never prometheus.DefaultRegisterer). One Registerer
	// holds the metrics of one Coordinator.
	Registerer prometheus.Registerer
}

// DirectConfig is the direct data path for client streams: clients that
// reach the tunnel listener open their streams there (ALPN
// protocol.ALPNClient) instead of relaying them over NATS.
type DirectConfig struct {
	// Addr is the tunnel listener's address as clients reach it,
	// host:port; an empty host tells a client to use its NATS server's
	// host. Empty turns the direct path off. The listener's TLS config
	// must offer protocol.ALPNClient (and tunnel.ALPNTunnel) in its
	// NextProtos.
	Addr string
	// Pin is tunnel.CertPin of the tunnel listener's certificate, which
	// clients verify the TLS connection against. Required with Addr.
	Pin string
	// TicketTTL is how long a ticket may be redeemed after it was issued.
	// Zero means protocol.DefaultDirectTicketTTL.
	TicketTTL time.Duration
}

// Defaults of Config.
const (
	DefaultHeartbeatInterval      = 5 * time.Second
	DefaultHandshakeTimeout       = 5 * time.Second
	DefaultFirstByteTimeout       = 2 * time.Second
	DefaultMaxHandshakes          = 256
	DefaultMaxHandshakesPerSource = 8
	DefaultMaxJobs                = 1024
	DefaultJobLostAfter           = time.Minute
	DefaultMaxParallel            = protocol.DefaultMaxParallel
	DefaultDrainTimeout           = 10 * time.Second
	DefaultCancelGrace            = 5 * time.Second
	DefaultCertTTL                = 24 * time.Hour
)

// DefaultConfig returns a Config with every default filled in. NATS,
// Identify, and NodeCA with Identities (or the deprecated Token), must
// still be set.
func DefaultConfig() Config {
	id, err := os.Hostname()
	if err != nil || id == "" {
		id = "coordinator"
	}
	return Config{
		ID:                     id,
		HeartbeatInterval:      DefaultHeartbeatInterval,
		HandshakeTimeout:       DefaultHandshakeTimeout,
		FirstByteTimeout:       DefaultFirstByteTimeout,
		MaxHandshakes:          DefaultMaxHandshakes,
		MaxHandshakesPerSource: DefaultMaxHandshakesPerSource,
		MaxJobs:                DefaultMaxJobs,
		MaxParallel:            DefaultMaxParallel,
		DrainTimeout:           DefaultDrainTimeout,
		CancelGrace:            DefaultCancelGrace,
		KeepAliveInterval:      protocol.DefaultKeepAliveInterval,
		Tunnel:                 defaultTunnel(),
	}
}

func defaultTunnel() tunnel.Config {
	t := tunnel.DefaultConfig()
	t.KeepAliveInterval = 0
	// Agents open only their control stream, and the coordinator never
	// accepts another: a backlog of one makes yamux reset every further
	// stream an agent opens (see Config.Tunnel).
	t.AcceptBacklog = 1
	return t
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.ID == "" {
		c.ID = d.ID
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = d.HeartbeatInterval
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.FirstByteTimeout == 0 {
		c.FirstByteTimeout = d.FirstByteTimeout
	}
	if c.MaxHandshakes == 0 {
		c.MaxHandshakes = d.MaxHandshakes
	}
	if c.MaxHandshakesPerSource == 0 {
		c.MaxHandshakesPerSource = d.MaxHandshakesPerSource
	}
	if c.JobLostAfter <= 0 {
		c.JobLostAfter = DefaultJobLostAfter
	}
	if c.MaxJobs == 0 {
		c.MaxJobs = d.MaxJobs
	}
	if c.MaxParallel == 0 {
		c.MaxParallel = d.MaxParallel
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = d.DrainTimeout
	}
	if c.CancelGrace == 0 {
		c.CancelGrace = d.CancelGrace
	}
	if c.KeepAliveInterval == 0 {
		c.KeepAliveInterval = d.KeepAliveInterval
	}
	if c.CertTTL == 0 {
		c.CertTTL = DefaultCertTTL
	}
	if c.Direct.TicketTTL <= 0 {
		c.Direct.TicketTTL = protocol.DefaultDirectTicketTTL
	}
	if c.SSH.SessionGrace == 0 {
		c.SSH.SessionGrace = DefaultSSHSessionGrace
	}
	if c.Tunnel == (tunnel.Config{}) {
		c.Tunnel = d.Tunnel
	}
	if c.Tunnel.IdleTimeout == 0 {
		c.Tunnel.IdleTimeout = 3 * c.HeartbeatInterval
	}
	c.Tunnel.AcceptBacklog = 1
	return c
}

// Validate reports every problem with c, joined. It does not apply defaults:
// zero durations are accepted here because New replaces them.
func (c *Config) Validate() error {
	var errs []error
	if (c.NodeCA == nil) != (c.Identities == nil) {
		errs = append(errs, errors.New("coordinator config: NodeCA and Identities go together"))
	}
	if c.Token == "" && c.NodeCA == nil {
		errs = append(errs, errors.New("coordinator config: NodeCA and Identities (per-node identity) or the deprecated shared Token is required"))
	}
	if c.NATS == nil {
		errs = append(errs, errors.New("coordinator config: NATS connection is required"))
	}
	if c.Identify == nil {
		errs = append(errs, errors.New("coordinator config: Identify is required (caller.FromNATS of the NATS layout's verifier): every API request must be attributed"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"HeartbeatInterval", c.HeartbeatInterval},
		{"HandshakeTimeout", c.HandshakeTimeout},
		{"FirstByteTimeout", c.FirstByteTimeout},
		{"DefaultTimeout", c.DefaultTimeout},
		{"DrainTimeout", c.DrainTimeout},
		{"CancelGrace", c.CancelGrace},
		{"KeepAliveInterval", c.KeepAliveInterval},
		{"CertTTL", c.CertTTL},
		{"SSH.SessionGrace", c.SSH.SessionGrace},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("coordinator config: %s %v is negative", d.name, d.v))
		}
	}
	if c.HeartbeatInterval > 0 && c.HeartbeatInterval < time.Millisecond {
		errs = append(errs, fmt.Errorf("coordinator config: HeartbeatInterval %v is below 1ms", c.HeartbeatInterval))
	}
	if c.MaxParallel < 0 {
		errs = append(errs, fmt.Errorf("coordinator config: MaxParallel %d is negative", c.MaxParallel))
	}
	if c.MaxHandshakes < 0 {
		errs = append(errs, fmt.Errorf("coordinator config: MaxHandshakes %d is negative", c.MaxHandshakes))
	}
	if c.MaxHandshakesPerSource < 0 {
		errs = append(errs, fmt.Errorf("coordinator config: MaxHandshakesPerSource %d is negative", c.MaxHandshakesPerSource))
	}
	if c.MaxJobs < 0 {
		errs = append(errs, fmt.Errorf("coordinator config: MaxJobs %d is negative", c.MaxJobs))
	}
	errs = append(errs, c.validatePacing()...)
	if c.Direct.Addr != "" {
		if err := CheckDirectAddr(c.Direct.Addr); err != nil {
			errs = append(errs, fmt.Errorf("coordinator config: Direct.Addr: %w", err))
		}
		if c.Direct.Pin == "" {
			errs = append(errs, errors.New("coordinator config: Direct.Addr needs Direct.Pin (tunnel.CertPin of the tunnel listener's certificate), which clients verify the listener against"))
		}
	}
	if err := c.Pipe.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("coordinator config: Pipe: %w", err))
	}
	if c.Tunnel != (tunnel.Config{}) {
		if err := c.Tunnel.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("coordinator config: Tunnel: %w", err))
		}
	}
	return errors.Join(errs...)
}

// CheckDirectAddr reports whether addr may be DirectConfig.Addr, the
// protocol.DirectStreamReply Addr clients dial: host:port with a port
// number from 1 to 65535 (a number: a service name would depend on the
// client's /etc/services) and a host that is empty
// (the client's NATS host), an IP address or a DNS-style name (labels of
// letters, digits, '-' and '_', 1 to 63 bytes each, no label starting or
// ending with '-', at most 253 bytes in all). The error says which part
// is wrong and quotes addr.
func CheckDirectAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if port == "" {
		return fmt.Errorf("%q has no port", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 32); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q is not a number from 1 to 65535", addr, port)
	}
	if host == "" || net.ParseIP(host) != nil {
		return nil
	}
	if err := checkHostName(host); err != nil {
		return fmt.Errorf("%q: host %q is not an IP address or host name: %w", addr, host, err)
	}
	return nil
}

// checkHostName checks a DNS-style host name (CheckDirectAddr's rules).
func checkHostName(h string) error {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return errors.New("want 1 to 253 bytes")
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return errors.New("empty label or one longer than 63 bytes")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q starts or ends with '-'", label)
		}
		for _, c := range []byte(label) {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("byte %q is not a letter, digit, '-' or '_'", c)
			}
		}
	}
	return nil
}
