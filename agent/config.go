package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// Defaults used by DefaultConfig and for zero fields in New.
const (
	DefaultOutputLimit      = 64 << 20
	DefaultKillGrace        = 2 * time.Second
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultPipeWait         = 0
	DefaultJobRetention     = 24 * time.Hour
	DefaultMaxExecs         = 256
	// defaultHeartbeat is used when a Welcome carries no usable interval.
	defaultHeartbeat = 10 * time.Second
	// DefaultIdentityDirName is IdentityDir's default, under DataDir.
	DefaultIdentityDirName = "identity"
)

// Config configures an Agent. Zero fields mean their default (see each
// field); Coordinators and TLS are required, and Token unless IdentityDir
// holds a certificate (Run checks).
type Config struct {
	// NodeID names this node in the fleet (see protocol.ValidNodeID). Empty
	// means the host name, as os.Hostname returns it.
	NodeID string
	// Labels are the node's labels, matched by selectors. Optional.
	Labels map[string]string
	// Coordinators are the coordinators' tunnel addresses (host:port). At
	// least one is required. A host name with several addresses (A/AAAA
	// records, LookupHost) counts as that many coordinators. The agent
	// takes them in an order of its own, which its node id's hash picks, so
	// that a fleet spreads over its coordinators, and moves on to the next
	// when a session fails or ends, or the coordinator drains it
	// (tunnel.Redialer).
	Coordinators []string
	// CoordinatorsInOrder, if true, takes Coordinators in the order given
	// (the first one preferred, the others as fallbacks, e.g. a
	// coordinator in the node's own zone first) instead of spreading by
	// node id. Default false.
	CoordinatorsInOrder bool
	// Transports are how the agent reaches each coordinator address, in
	// the order tried: TransportTLS ("tls", raw TLS) and TransportWebSocket
	// ("wss": WebSocket over TLS to the same port, path WebSocketPath,
	// through the CONNECT proxy Proxy picks). Both present the same node
	// certificate and verify the coordinator's the same way. After a
	// failed dial the next transport is tried at once; the one that last
	// connected is tried first. Empty means ["tls"].
	Transports []string
	// Proxy picks the HTTP CONNECT proxy of "wss" dials, for the
	// coordinator's host:port. Nil means tunnel.ProxyFromEnvironment
	// (HTTPS_PROXY, NO_PROXY), read once by New.
	Proxy tunnel.ProxyFunc
	// WebSocketPath is the path "wss" dials upgrade. Empty means
	// tunnel.WebSocketPath, the coordinator's.
	WebSocketPath string
	// WebSocketPing is how long a "wss" connection may go without a write
	// before it sends a WebSocket ping (tunnel.WebSocketDialer
	// PingInterval): keep it below the proxy's idle timeout. With the
	// session's own keepalive on (Tunnel.KeepAliveInterval, every 5 s by
	// default) the pings are rarely needed. Zero means
	// tunnel.DefaultPingInterval (15 s); negative, none.
	WebSocketPing time.Duration
	// LookupHost resolves the host names of Coordinators into addresses,
	// again each time the agent went through them all. Nil means
	// net.DefaultResolver.LookupHost. Test hook.
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// RefusedMax caps the backoff window while dials are refused outright
	// (no coordinator listening: during its restart), so that agents find a
	// restarted coordinator within it; the coordinator then paces their
	// admission itself. The cap holds for tunnel.DefaultRefusedFor (30 s)
	// of refusals in a row, then the backoff grows as after any failure;
	// a refused HTTP proxy is backed off from at once. Zero means tunnel's
	// default (1 s); negative, no cap.
	RefusedMax time.Duration
	// SoleCoordinator says Coordinators is the only coordinator this agent
	// will ever have (tether dev's own agent): when it drains the session
	// there is no other to move to, so the agent serves the drained
	// session until its streams end and the coordinator closes it, then
	// stops (Run returns nil), instead of redialing a coordinator that is
	// shutting down. False: a drain moves the agent to another coordinator.
	SoleCoordinator bool
	// Token is the join token (tether token create) the agent enrolls
	// with when IdentityDir holds no valid certificate: then it is required.
	// With SharedToken it is instead the deprecated shared token, sent in
	// Hello. It is never logged.
	Token string
	// SharedToken (deprecated) sends Token in Hello, as agents did before
	// per-node identity, instead of enrolling; only a coordinator started
	// with --allow-shared-token admits such agents. A certificate in
	// IdentityDir is still preferred.
	SharedToken bool
	// IdentityDir holds the node certificate and key (tunnel.IdentityFile,
	// 0600) and the CA pinned at enrollment (tunnel.PinnedCAFile). Created
	// 0700. Empty means DataDir/identity. Copies never read or write it.
	IdentityDir string
	// TLS is the client TLS configuration (RootCAs, ServerName, client
	// certificate). Required unless Dial is set; it is cloned and tuned
	// with tunnel.TunedTLS.
	TLS *tls.Config
	// SSHHostKeyFile is the agent's SSH host key (ed25519, OpenSSH
	// format, 0600), created on the first start and reused: its public
	// half is Hello.SSHHostKey. A file that does not parse stops the
	// agent rather than being replaced. Copies never read or write it.
	// Empty means DataDir/ssh_host_ed25519_key.
	SSHHostKeyFile string
	// SSHAcceptEnv are the environment variables SSH clients may set
	// (env requests, ssh -o SendEnv) beyond LANG, LC_*, TERM, TZ and
	// COLORTERM, as sshd's AcceptEnv: names, or prefixes ending in "*".
	SSHAcceptEnv []string
	// DataDir is the working directory of execs that name no Cwd (a relative
	// Cwd is taken relative to it). It is
	// created (0700) if missing. Empty means DefaultDataDir().
	DataDir string
	// Tunnel tunes the yamux session. The zero value means
	// tunnel.DefaultConfig(): a ping 5 s after the last answer, 10 s to
	// answer it, so a dead or frozen coordinator is noticed within 15 s
	// (Tunnel.DeadPeerBound). A heartbeat that cannot be written within
	// WriteTimeout (the coordinator stopped reading and the buffers filled)
	// closes the session too, within the same bound.
	Tunnel tunnel.Config
	// Backoff paces redials after a failed dial, a rejected hello or a lost
	// session. The zero value means tunnel's defaults (500 ms base, 30 s cap,
	// full jitter).
	Backoff tunnel.Backoff
	// OutputLimit is the default cap, in bytes, on each of an exec's stdout
	// and stderr when its params name none; output past it is read and
	// dropped and the exit status says so. Zero means 64 MiB.
	OutputLimit int64
	// KillGrace is the wait between SIGTERM and SIGKILL when an exec's
	// process group is killed (timeout, cancel, lost session). Zero means
	// 2 s.
	KillGrace time.Duration
	// PipeWait bounds how long an exec whose main process exited waits for
	// its stdout and stderr pipes to close (a background child may still
	// hold them) before its process group is killed and the exit status
	// says output_cut. Zero (the default) waits until the pipes close, as
	// ssh does: a background child that keeps stdout open keeps the job
	// going until it exits or the job's timeout kills the group.
	PipeWait time.Duration
	// JobRetention is how long the files of a finished detached job are
	// kept under DataDir/jobs before they are deleted. Zero means 24 h.
	JobRetention time.Duration
	// HandshakeTimeout bounds opening the control stream and waiting for
	// Welcome or Reject after each dial. Zero means 10 s.
	HandshakeTimeout time.Duration
	// MaxExecs bounds the exec operations running at once; an exec stream
	// past it is answered with a busy error frame (protocol.CodeBusy). Zero
	// means 256.
	MaxExecs int
	// CopyRoots are the absolute directories under which copy streams may
	// write (push) and read (pull). A path is resolved one component at a
	// time on descriptors from the root that holds it; its symlinks are
	// followed (the last one too, as cp does) only while they stay inside
	// a copy root. Empty means the data directory only. With LocalPolicy
	// set, the policy's copy roots for the copy's account are used
	// instead (one file says what a node allows). Whatever the
	// roots, a copy never writes or reads the agent's own state (the
	// detached jobs' files under DataDir/jobs, the exec process group
	// records under DataDir/execs, IdentityDir, SSHHostKeyFile, so not
	// the data dir as a whole either, and SecretFiles).
	CopyRoots []string
	// LocalPolicy, if set, is the node's local policy (package
	// localpolicy, loaded with localpolicy.Load), enforced on every exec,
	// pty, copy and dial stream whatever the coordinator asks; with it the
	// copy roots are the policy's and CopyRoots is not used. Nil means no
	// local policy: jobs run only as the agent's own account, copies are
	// confined to CopyRoots, every configured target may be dialled.
	// Agent.SetLocalPolicy replaces it while the agent runs.
	LocalPolicy *localpolicy.Policy
	// RunAsHint, if set, is what a refusal to run as another user than the
	// agent's own (with no LocalPolicy) tells the caller to do instead,
	// e.g. tether dev's "set run_as to you in DATA-DIR/policy.yaml". Empty
	// means tether agent's advice: write a local policy (localpolicy.
	// DefaultPath) or pass --local-policy, and, for an agent not running
	// as root, that only root can run jobs as other users.
	RunAsHint string
	// SecretFiles are files holding the agent's secrets (its join token,
	// its gateways' credentials): no copy reads or writes them, whatever
	// CopyRoots allow, by whatever path or hard link. Optional.
	SecretFiles []string
	// OpenShell, if set, is the node's OpenShell gateway: dial target
	// "openshell" and a source of the inventory.
	OpenShell *OpenShellTarget
	// OpenSandbox, if set, is the node's OpenSandbox lifecycle server: dial
	// target "opensandbox" and a source of the inventory.
	OpenSandbox *OpenSandboxTarget
	// Targets are further dial targets, name → host:port (names per
	// protocol.ValidTargetName; "openshell" and "opensandbox" are taken by
	// the fields above). Dial streams reach only the configured targets:
	// the gateways' addresses and these. Optional.
	Targets map[string]string
	// MaxDials bounds the dial streams open at once; a dial past it is
	// answered with a busy error frame. Zero means 1024.
	MaxDials int
	// DialTimeout bounds connecting to a target for a dial stream. Zero
	// means 10 s.
	DialTimeout time.Duration
	// InventoryTimeout bounds listing every gateway's sandboxes for one
	// inventory stream; a gateway not done by then is reported incomplete.
	// Zero means 60 s.
	InventoryTimeout time.Duration
	// Version is the agent's version string, reported in Hello.
	Version string
	// Capacity, if set, is reported in Hello instead of what
	// DetectCapacity measures at the start of Run. Tests set it to skip
	// detection.
	Capacity *protocol.Capacity
	// Logger receives the agent's logs. Nil discards them.
	Logger *slog.Logger
	// Registerer receives the agent's metrics. Nil means a private registry
	// (never prometheus.DefaultRegisterer).
	Registerer prometheus.Registerer
	// Notify, if not nil, tells the service manager (a systemd unit of
	// Type=notify) how the agent is doing (notify.go): READY=1 once its
	// first session is welcomed, STATUS= lines (connected to which
	// coordinator over which transport, execs running; reconnecting and
	// why), STOPPING=1 when Run's ctx ends, and, with a watchdog interval,
	// WATCHDOG=1 at half of it but only after a ping round trip over the
	// current session answered in time: an agent whose tunnel is wedged or
	// partitioned stops petting, and systemd restarts it. Nil sends
	// nothing.
	Notify *sdnotify.Notifier
	// Dial opens a connection to a coordinator address. Nil means
	// Transports, with TLS. Test hook: tests may dial plain TCP or inject
	// failures.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
}

// DefaultConfig returns a Config with every default filled in. Coordinators,
// Token and TLS must still be set.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		NodeID:           host,
		DataDir:          DefaultDataDir(),
		Tunnel:           tunnel.DefaultConfig(),
		OutputLimit:      DefaultOutputLimit,
		KillGrace:        DefaultKillGrace,
		PipeWait:         DefaultPipeWait,
		JobRetention:     DefaultJobRetention,
		HandshakeTimeout: DefaultHandshakeTimeout,
		MaxExecs:         DefaultMaxExecs,
		MaxDials:         DefaultMaxDials,
		DialTimeout:      DefaultDialTimeout,
		InventoryTimeout: DefaultInventoryTimeout,
	}
}

// DefaultDataDir is /var/lib/tether/agent when running as root, else
// ~/.local/state/tether/agent (falling back to the temporary directory when
// there is no home directory).
func DefaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/tether/agent"
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "tether", "agent")
	}
	return filepath.Join(os.TempDir(), "tether-agent")
}

// withDefaults returns c with its zero fields replaced by defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.NodeID == "" {
		c.NodeID = d.NodeID
	}
	if c.DataDir == "" {
		c.DataDir = d.DataDir
	}
	if c.Tunnel == (tunnel.Config{}) {
		c.Tunnel = d.Tunnel
	}
	if c.OutputLimit == 0 {
		c.OutputLimit = d.OutputLimit
	}
	if c.KillGrace == 0 {
		c.KillGrace = d.KillGrace
	}
	if c.JobRetention == 0 {
		c.JobRetention = DefaultJobRetention
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.MaxExecs == 0 {
		c.MaxExecs = d.MaxExecs
	}
	if c.MaxDials == 0 {
		c.MaxDials = d.MaxDials
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = d.DialTimeout
	}
	if c.InventoryTimeout == 0 {
		c.InventoryTimeout = d.InventoryTimeout
	}
	// The gateways and targets are copied, so that the caller's values
	// are never changed or shared.
	if c.OpenShell != nil {
		o := *c.OpenShell
		o.Workspaces = slices.Clone(o.Workspaces)
		if len(o.Workspaces) == 0 {
			o.Workspaces = []string{DefaultOpenShellWorkspace}
		}
		c.OpenShell = &o
	}
	if c.OpenSandbox != nil {
		o := *c.OpenSandbox
		c.OpenSandbox = &o
	}
	c.Targets = maps.Clone(c.Targets)
	if len(c.CopyRoots) == 0 {
		if dir, err := filepath.Abs(c.DataDir); err == nil {
			c.CopyRoots = []string{dir}
		}
	}
	c.Transports = slices.Clone(c.Transports)
	if len(c.Transports) == 0 {
		c.Transports = []string{TransportTLS}
	}
	if c.Proxy == nil {
		c.Proxy = tunnel.ProxyFromEnvironment()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Tunnel.Logger == nil {
		c.Tunnel.Logger = c.Logger
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return c
}

// Validate reports every problem with c, joined. Zero fields that have a
// default are accepted.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeID != "" {
		if err := protocol.ValidNodeID(c.NodeID); err != nil {
			errs = append(errs, fmt.Errorf("agent config: NodeID: %w", err))
		}
	}
	if err := protocol.ValidateLabels(c.Labels); err != nil {
		errs = append(errs, fmt.Errorf("agent config: Labels: %w", err))
	}
	if len(c.Coordinators) == 0 {
		errs = append(errs, errors.New("agent config: Coordinators: at least one coordinator address is required"))
	}
	for _, addr := range c.Coordinators {
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("agent config: Coordinators: %q is not host:port", addr))
		}
	}
	for _, name := range c.SSHAcceptEnv {
		base := strings.TrimSuffix(name, "*")
		if base == "" || strings.ContainsAny(base, "=*\x00 ") {
			errs = append(errs, fmt.Errorf("agent config: SSHAcceptEnv: %q: want a variable name, or a prefix ending in *", name))
		}
	}
	if c.SharedToken && strings.TrimSpace(c.Token) == "" {
		errs = append(errs, errors.New("agent config: Token: SharedToken needs the shared token"))
	}
	errs = append(errs, validateTransports(c.Transports)...)
	if c.TLS == nil && c.Dial == nil {
		errs = append(errs, errors.New("agent config: TLS: a client TLS configuration is required"))
	}
	if c.Tunnel != (tunnel.Config{}) {
		if err := c.Tunnel.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("agent config: Tunnel: %w", err))
		}
	}
	if c.Backoff.Base < 0 || c.Backoff.Max < 0 {
		errs = append(errs, fmt.Errorf("agent config: Backoff: Base %v and Max %v must not be negative", c.Backoff.Base, c.Backoff.Max))
	}
	if c.OutputLimit < 0 {
		errs = append(errs, fmt.Errorf("agent config: OutputLimit %d is negative", c.OutputLimit))
	}
	if c.KillGrace < 0 {
		errs = append(errs, fmt.Errorf("agent config: KillGrace %v is negative", c.KillGrace))
	}
	if c.PipeWait < 0 {
		errs = append(errs, fmt.Errorf("agent config: PipeWait %v is negative", c.PipeWait))
	}
	if c.JobRetention < 0 {
		errs = append(errs, fmt.Errorf("agent config: JobRetention %v is negative", c.JobRetention))
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("agent config: HandshakeTimeout %v is negative", c.HandshakeTimeout))
	}
	if c.MaxExecs < 0 {
		errs = append(errs, fmt.Errorf("agent config: MaxExecs %d is negative", c.MaxExecs))
	}
	for _, r := range c.CopyRoots {
		if !filepath.IsAbs(r) {
			errs = append(errs, fmt.Errorf("agent config: CopyRoots: %q is not an absolute path", r))
		} else if slices.Contains(strings.Split(r, "/"), "..") {
			// As the policies: /srv/../etc would be /etc under another name.
			errs = append(errs, fmt.Errorf("agent config: CopyRoots: %q has a \"..\" component (it names %s; write that)", r, filepath.Clean(r)))
		}
	}
	errs = append(errs, c.validateTargets()...)
	return errors.Join(errs...)
}
