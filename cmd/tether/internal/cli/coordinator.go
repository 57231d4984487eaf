//go:build !tetherclient

package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/audit"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/enroll"
	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/coordinator/sandboxes"
	"github.com/tetherfleet/tether/coordinator/sshgate"
	"github.com/tetherfleet/tether/internal/gcfloor"
	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// coordinatorOptions are the flags of `tether coordinator`.
type coordinatorOptions struct {
	// notify is systemd's notify socket (sdnotify.FromEnv); nil when not
	// run by systemd as Type=notify. Not a flag.
	notify *sdnotify.Notifier
	// DataDir holds the generated join token, the dev PKI and the embedded
	// NATS server's JetStream store. Created 0700 if missing. Default
	// /var/lib/tether as root, else ~/.local/state/tether/coordinator.
	DataDir string
	// Listen is the agent tunnel listener's address (TLS). Default ":7443".
	Listen string
	// DirectAddr is the tunnel listener's address as clients reach it for
	// the direct data path of their streams; empty (default) means
	// Listen's host and bound port; "off" (in any case) turns the direct
	// path off (streams are relayed over NATS). Else host:port with a
	// port number (coordinator.CheckDirectAddr); an empty host means the
	// host of the client's NATS server.
	DirectAddr string
	// HTTPAddr is the admin listener (/metrics, /healthz, /readyz). Default
	// "127.0.0.1:7080".
	HTTPAddr string
	// NATSURL names an external NATS server. Empty (default) starts an
	// embedded one with JetStream, storing under DataDir/nats.
	NATSURL string
	// NATSCreds is the coordinator's NATS credentials file (a user of the
	// layout's TETHER account) for NATSURL; required with it. The embedded
	// server's coordinator credentials are minted at each start.
	NATSCreds string
	// InsecureNATS lets the coordinator start against an external NATS
	// server that admits anonymous clients to tether.v1.>; without it that
	// is refused.
	InsecureNATS bool
	// NATSOperatorJWT and NATSClientsJWT, both or neither, are the
	// operator JWT and the CLIENTS account JWT of an external NATS whose
	// layout was built with nsc: the coordinator verifies callers against
	// them instead of the layout in DataDir/nats-auth.
	NATSOperatorJWT, NATSClientsJWT string
	// NATSListen is the embedded NATS server's client address, host:port;
	// port 0 picks a free port. Default "127.0.0.1:4222". Ignored with
	// NATSURL.
	NATSListen string
	// AllowSharedToken (deprecated) also admits agents by the fleet-wide
	// shared token of TokenFile, as before per-node identity: in their
	// Hello for a node id not enrolled, and as a join token of unlimited
	// uses. Off (default), agents enroll with join tokens (tether token
	// create) and authenticate by certificate only.
	AllowSharedToken bool
	// TokenFile holds the shared token; needs AllowSharedToken. Empty
	// means $TETHER_TOKEN, else DataDir/join-token, generated (0600) on
	// first start.
	TokenFile string
	// CertTTL is the lifetime of the node certificates the coordinator
	// issues (agents renew at two thirds of it). Zero means 24 h.
	CertTTL time.Duration
	// TLSCert and TLSKey are the tunnel listener's certificate and key
	// (PEM). Both empty (default) generates a development CA and
	// certificate under DataDir/pki, covering localhost and TLSHosts.
	TLSCert, TLSKey string
	// TLSHosts are extra DNS names or IPs the development certificate
	// covers (the names agents dial). Ignored with TLSCert.
	TLSHosts []string
	// ID names the coordinator. Default: the host name.
	ID string
	// Heartbeat is the agent heartbeat interval; a session from which
	// nothing arrives for three intervals is dropped. Zero means the
	// coordinator's default (5 s).
	Heartbeat time.Duration
	// ExecTimeout is the timeout of jobs whose request names none. Zero
	// (default) means none.
	ExecTimeout time.Duration
	// MaxHandshakesPerSource bounds the agent handshakes in progress from
	// one IPv4 address or IPv6 /64 (coordinator.Config). Zero means the
	// coordinator's default (8).
	MaxHandshakesPerSource int
	// AdmitRate is the agent TLS handshakes a second the coordinator
	// starts (coordinator.Config.AdmitRate): zero measures it, negative
	// turns pacing off. DrainSpread is the window a SIGTERM drain
	// staggers its agents' moves over (coordinator.Config.DrainSpread).
	AdmitRate   float64
	DrainSpread time.Duration
	// Policy is the authorization policy file (package policy), required:
	// everything it does not grant is refused. Reloaded on SIGHUP; a bad
	// file keeps the policy in force.
	Policy string
	// AuditMaxAge and AuditMaxBytes bound the audit log's stream: older
	// events, and the oldest past the size, are discarded. Zero means the
	// defaults (90 days, 1 GiB).
	AuditMaxAge   time.Duration
	AuditMaxBytes int64
	// JobRetention is how long the job store keeps job records; zero
	// means jobstore.DefaultRetention (7 days).
	JobRetention time.Duration
	// NATSSyncAlways makes the embedded NATS server fsync every write
	// (sync_interval: always), so that an accepted job survives a power
	// loss. Default on; ignored with --nats-url (configure that server).
	NATSSyncAlways bool
	// SSHAddr is the SSH jump host's listen address (ssh -J); empty
	// (default) runs none. Its host key and the fleet's SSH host CA live
	// in DATA-DIR/ssh (0700; keys 0600); the host CA exists without it
	// too, for tether ssh-proxy.
	SSHAddr string
	// SSHAuthorizedKeys is the OpenSSH authorized_keys file of the keys
	// the jump host accepts (identity ssh-key:SHA256:…), and SSHUserCAs
	// the files of user CA keys whose certificates it accepts (identity
	// ssh-principal:NAME). SSHAddr needs at least one; both are reloaded
	// on SIGHUP with the policy.
	SSHAuthorizedKeys string
	SSHUserCAs        []string
	// Sandbox configures the facades, the ledger and the reaper.
	Sandbox sandboxOptions
	// Console configures the web console on the admin address.
	Console consoleOptions
	// Log configures logging to stderr.
	Log logOptions
}

func defaultCoordinatorOptions() coordinatorOptions {
	return coordinatorOptions{
		DataDir:        defaultStateDir("/var/lib/tether", "coordinator"),
		Listen:         ":7443",
		HTTPAddr:       "127.0.0.1:7080",
		NATSListen:     "127.0.0.1:4222",
		NATSSyncAlways: true,
		Sandbox:        defaultSandboxOptions(),
		Log:            defaultLogOptions(),
	}
}

// defaultStateDir is rootDir when running as root, else
// $XDG_STATE_HOME/tether/name (~/.local/state/tether/name), falling back to
// the temporary directory when there is no home directory.
func defaultStateDir(rootDir, name string) string {
	if os.Geteuid() == 0 {
		return rootDir
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "tether", name)
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "tether", name)
	}
	return filepath.Join(os.TempDir(), "tether-"+name)
}

// Validate reports every invalid option.
func (o *coordinatorOptions) Validate() error {
	var errs []error
	if o.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is required"))
	}
	if err := checkHostPort(o.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen: %w", err))
	}
	if err := checkHostPort(o.HTTPAddr); err != nil {
		errs = append(errs, fmt.Errorf("--http-addr: %w", err))
	}
	if o.NATSURL == "" {
		if _, _, err := splitNATSListen(o.NATSListen); err != nil {
			errs = append(errs, fmt.Errorf("--nats-listen: %w", err))
		}
	}
	if err := checkNATSURL(o.NATSURL); err != nil {
		errs = append(errs, fmt.Errorf("--nats-url: %w", err))
	}
	if o.NATSURL != "" && o.NATSCreds == "" {
		errs = append(errs, errors.New("--nats-url needs --nats-creds: the coordinator's credentials (a TETHER account user; see `tether nats --help`)"))
	}
	if o.NATSURL == "" && (o.NATSCreds != "" || o.InsecureNATS || o.NATSOperatorJWT != "" || o.NATSClientsJWT != "") {
		errs = append(errs, errors.New("--nats-creds, --insecure-nats, --nats-operator-jwt and --nats-clients-jwt go with --nats-url (the embedded NATS uses the data dir's layout)"))
	}
	if (o.NATSOperatorJWT == "") != (o.NATSClientsJWT == "") {
		errs = append(errs, errors.New("--nats-operator-jwt and --nats-clients-jwt go together"))
	}
	if o.TokenFile != "" && !o.AllowSharedToken {
		errs = append(errs, errors.New("--token-file names the deprecated shared token and needs --allow-shared-token; agents enroll with join tokens from `tether token create`"))
	}
	if o.CertTTL < 0 || (o.CertTTL > 0 && o.CertTTL < 10*time.Second) {
		errs = append(errs, fmt.Errorf("--cert-ttl %s: want at least 10s (0: 24h)", humanDuration(o.CertTTL)))
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if o.Heartbeat < 0 {
		errs = append(errs, fmt.Errorf("--heartbeat %s is negative: want 0 (the default, 5s) or more", humanDuration(o.Heartbeat)))
	}
	if o.ExecTimeout < 0 {
		errs = append(errs, fmt.Errorf("--exec-timeout %s is negative: want 0 (no timeout) or more", humanDuration(o.ExecTimeout)))
	}
	if o.DirectAddr != "" && !o.directOff() {
		if err := coordinator.CheckDirectAddr(o.DirectAddr); err != nil {
			errs = append(errs, fmt.Errorf("--direct-addr: %w (want HOST:PORT as clients reach --listen, :PORT for their NATS server's host, or off)", err))
		}
	}
	if o.MaxHandshakesPerSource < 0 {
		errs = append(errs, fmt.Errorf("--max-handshakes-per-source %d is negative: want 0 or more (0: the default, %d)", o.MaxHandshakesPerSource, coordinator.DefaultMaxHandshakesPerSource))
	}
	if o.Policy == "" {
		errs = append(errs, errNoPolicy)
	}
	if o.SSHAddr != "" {
		if err := checkHostPort(o.SSHAddr); err != nil {
			errs = append(errs, fmt.Errorf("--ssh-addr: %w", err))
		}
		if o.SSHAuthorizedKeys == "" && len(o.SSHUserCAs) == 0 {
			errs = append(errs, errors.New("--ssh-addr needs --ssh-authorized-keys FILE or --ssh-user-ca FILE: the keys (or the CA of the certificates) the jump host accepts"))
		}
	} else if o.SSHAuthorizedKeys != "" || len(o.SSHUserCAs) != 0 {
		errs = append(errs, errors.New("--ssh-authorized-keys and --ssh-user-ca go with --ssh-addr (the jump host's listen address)"))
	}
	if o.JobRetention < 0 || o.JobRetention > 0 && o.JobRetention < time.Minute {
		errs = append(errs, fmt.Errorf("--job-retention %s: want at least 1m (0: 7 days)", humanDuration(o.JobRetention)))
	}
	if o.AuditMaxAge < 0 || o.AuditMaxAge > 0 && o.AuditMaxAge < time.Minute {
		errs = append(errs, fmt.Errorf("--audit-max-age %s: want at least 1m (0: 90 days)", humanDuration(o.AuditMaxAge)))
	}
	if o.AuditMaxBytes < 0 || o.AuditMaxBytes > 0 && o.AuditMaxBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("--audit-max-bytes %d: want at least 1048576 (0: 1 GiB)", o.AuditMaxBytes))
	}
	if err := o.Sandbox.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := o.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// directOff reports whether --direct-addr turns the direct data path off
// ("off", in any case).
func (o *coordinatorOptions) directOff() bool { return strings.EqualFold(o.DirectAddr, "off") }

// errNoPolicy: a coordinator refuses what its policy does not grant, so
// one without a policy could only refuse everything. Starting it anyway
// would look like a working coordinator whose every request fails; a
// warning and allowing everything would make anyone who reaches NATS root
// on every node. So it does not start.
var errNoPolicy = errors.New("--policy FILE is required: the coordinator refuses everything its policy does not grant (default deny), so without one it could only refuse every request; write one (README \"Policy\", deploy/policy.example.yaml) and check it with `tether policy check FILE`")

// reportedAddr is the address clients are told a listener configured as
// listen is at: its host as configured (empty or unspecified when it
// listens on every interface: a client then uses the host it reaches the
// coordinator by) and the port it bound.
func reportedAddr(listen string, bound net.Addr) string {
	host, _, _ := net.SplitHostPort(listen)
	_, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return bound.String()
	}
	return net.JoinHostPort(host, port)
}

// checkHostPort checks a listen or dial address.
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("%q: bad port", addr)
	}
	return nil
}

// splitNATSListen splits host:port for the embedded server; port 0 becomes
// server.RANDOM_PORT.
func splitNATSListen(addr string) (string, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%q is not host:port", addr)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: port must be 0-65535", addr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

func newCoordinatorCmd(e *env) *cobra.Command {
	o := defaultCoordinatorOptions()
	return coordinatorCommand(e, &o)
}

// coordinatorCommand is `tether coordinator` with its flags bound to o
// (config.go builds a second one to re-read the config file on SIGHUP).
func coordinatorCommand(e *env, o *coordinatorOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "coordinator",
		Short: "Run a coordinator: agent tunnel listener, NATS API, admin endpoints",
		Long: `Run a coordinator. Agents dial its tunnel listener (TLS); jobs arrive through
the NATS micro service "tether" (tether.v1.exec, tether.v1.nodes,
tether.v1.cancel). Without --nats-url it embeds a NATS server with JetStream.
Without --tls-cert it generates a development CA under the data directory:
give agents its ca.crt with --ca-file. Agents enroll with join tokens
(tether token create) and then authenticate by the certificate the
coordinator's node CA (DATA-DIR/pki) issues them; the fleet-wide shared
token of earlier releases works only with --allow-shared-token
(deprecated).

NATS admits no anonymous client. The NATS layout (operator, accounts, keys)
lives in DATA-DIR/nats-auth, created on first start; 'tether nats user
create' mints client credentials from it. With --nats-url the server must
enforce that layout ('tether nats server-config'), --nats-creds names the
coordinator's own credentials ('tether nats coordinator-creds'), and a server
that lets anonymous clients publish to tether.v1.> is refused unless
--insecure-nats.`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			src, err := loadDaemonConfig(cmd, e, coordinatorConfigRole, &o.Log)
			if err != nil {
				if src != nil { // every problem at once
					err = errors.Join(err, src.annotate(o.Validate()))
				}
				return usage(err)
			}
			if err := o.Validate(); err != nil {
				return usage(src.annotate(err))
			}
			keepServingOnBrokenPipe()
			// Read once and taken out of the environment (sdnotify.FromEnv).
			notify, err := sdnotify.FromEnv()
			if err != nil {
				return err
			}
			o.notify = notify
			log := o.Log.logger(e.stderr)
			reg := newRegistry()
			envToken := src.getenv(e, tokenEnv)
			if !o.AllowSharedToken && envToken != "" {
				log.Warn("ignoring $" + tokenEnv + ": the shared token is deprecated and needs --allow-shared-token; agents enroll with join tokens (tether token create)")
				envToken = ""
			}
			cs, err := startCoordinator(*o, envToken, log, reg)
			if err != nil {
				return err
			}
			cs.config = src
			return cs.serve(cmd.Context())
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", o.DataDir, "directory for the join token, dev PKI and embedded NATS store")
	f.StringVar(&o.Listen, "listen", o.Listen, "agent tunnel listen address (TLS; also WebSocket, GET "+tunnel.WebSocketPath+" with ALPN http/1.1)")
	f.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "admin listen address (/metrics, /healthz, /readyz, the web console under /console/)")
	f.StringVar(&o.DirectAddr, "direct-addr", o.DirectAddr, `the --listen address as clients reach it, for their streams' direct data path (HOST:PORT, the port a number; an empty HOST is the clients' NATS server's host; default: --listen's host and bound port; "off": streams are relayed over NATS)`)
	f.StringVar(&o.NATSURL, "nats-url", o.NATSURL, "external NATS server URL (default: embedded NATS with JetStream)")
	f.StringVar(&o.NATSCreds, "nats-creds", o.NATSCreds, "the coordinator's NATS credentials (TETHER account user) for --nats-url")
	f.BoolVar(&o.InsecureNATS, "insecure-nats", o.InsecureNATS, "start even if the --nats-url server lets anonymous clients publish to tether.v1.>")
	f.StringVar(&o.NATSOperatorJWT, "nats-operator-jwt", o.NATSOperatorJWT, "operator JWT file of an nsc-built layout of --nats-url (default: the layout in DATA-DIR/nats-auth)")
	f.StringVar(&o.NATSClientsJWT, "nats-clients-jwt", o.NATSClientsJWT, "CLIENTS account JWT file of an nsc-built layout of --nats-url")
	f.StringVar(&o.NATSListen, "nats-listen", o.NATSListen, "embedded NATS client listen address (port 0: any free port)")
	f.BoolVar(&o.AllowSharedToken, "allow-shared-token", o.AllowSharedToken, "deprecated: also admit agents by the fleet-wide shared token (--token-file, $TETHER_TOKEN, else DATA-DIR/join-token, generated)")
	f.StringVar(&o.TokenFile, "token-file", o.TokenFile, "file holding the deprecated shared token (needs --allow-shared-token)")
	durationVar(f, &o.CertTTL, "cert-ttl", o.CertTTL, "lifetime of the node certificates issued to agents; they renew at 2/3 of it (0: 24h)")
	f.StringVar(&o.TLSCert, "tls-cert", o.TLSCert, "tunnel TLS certificate (PEM); default: dev PKI in DATA-DIR/pki")
	f.StringVar(&o.TLSKey, "tls-key", o.TLSKey, "tunnel TLS key (PEM)")
	f.StringSliceVar(&o.TLSHosts, "tls-host", o.TLSHosts, "extra host name or IP for the dev certificate (repeatable)")
	f.StringVar(&o.Policy, "policy", o.Policy, "authorization policy file (required; reloaded on SIGHUP; check it with tether policy check)")
	f.StringVar(&o.ID, "id", o.ID, "coordinator id (default: host name)")
	durationVar(f, &o.Heartbeat, "heartbeat", o.Heartbeat, "agent heartbeat interval; an agent silent for 3 intervals is dropped (0: coordinator default, 5s)")
	durationVar(f, &o.ExecTimeout, "exec-timeout", o.ExecTimeout, "timeout of jobs that name none (0: none)")
	f.IntVar(&o.MaxHandshakesPerSource, "max-handshakes-per-source", o.MaxHandshakesPerSource,
		"agent handshakes in progress allowed from one IPv4 address or IPv6 /64; raise it for many agents behind one NAT address (0: default, 8)")
	f.Float64Var(&o.AdmitRate, "admit-rate", o.AdmitRate,
		"agent TLS handshakes started a second; past it agents are told when to come back; a restart's returning fleet is spread over 2.8 s at most this rate (0: measured, a quarter of the CPUs; negative: no pacing)")
	durationVar(f, &o.DrainSpread, "drain-spread", o.DrainSpread,
		"on SIGTERM, spread the agents' moves to other coordinators over this window (0: the time to admit them at --admit-rate, at least 2.8 s for more than a burst of them; negative: none)")
	durationVar(f, &o.AuditMaxAge, "audit-max-age", o.AuditMaxAge, "discard audit events older than this (0: 90 days)")
	durationVar(f, &o.JobRetention, "job-retention", o.JobRetention, "keep job records (tether job list/status/wait) this long (0: 7 days)")
	f.BoolVar(&o.NATSSyncAlways, "nats-sync-always", o.NATSSyncAlways, "embedded NATS: fsync every JetStream write, so accepted jobs survive a power loss")
	f.Int64Var(&o.AuditMaxBytes, "audit-max-bytes", o.AuditMaxBytes, "bound the audit log to this many bytes, oldest events discarded first (0: 1 GiB)")
	f.StringVar(&o.SSHAddr, "ssh-addr", o.SSHAddr, "SSH jump host listen address, for ssh -J and tether ssh-config (default: none; tether ssh-proxy works without)")
	f.StringVar(&o.SSHAuthorizedKeys, "ssh-authorized-keys", o.SSHAuthorizedKeys, "authorized_keys file of the keys the SSH jump host accepts (reloaded on SIGHUP)")
	f.StringArrayVar(&o.SSHUserCAs, "ssh-user-ca", o.SSHUserCAs, "file of SSH user CA keys whose certificates the jump host accepts (repeatable; reloaded on SIGHUP)")
	o.Sandbox.addFlags(cmd)
	o.Console.addFlags(f)
	o.Log.addFlags(cmd)
	addConfigFlag(cmd)
	return cmd
}

// storeOpenTimeout bounds the opening of each JetStream store at start-up
// (fleet registry, ledger, enrollment, audit, jobs). After a restart of a
// whole NATS cluster its replicated streams elect leaders before they
// answer, which took over 30 s on a loaded 2-core machine (e2e TestCluster's
// RestartEverything); a coordinator started with its NATS cluster should
// wait for it, not exit (jsreplicas retries each create meanwhile).
const storeOpenTimeout = 2 * time.Minute

// coordinatorInfo is where a started coordinator can be reached.
type coordinatorInfo struct {
	TunnelAddr string // the tunnel listener's bound address
	NATSURL    string // the NATS server the API is served on
	AdminAddr  string // the admin listener's bound address
	CAFile     string // the dev CA agents must trust; empty with --tls-cert
	NodeCAFile string // the node CA's certificate (DATA-DIR/pki/ca.crt)
	Token      string // the deprecated shared token; empty without --allow-shared-token
	TokenFrom  string // the shared token's file, or "$TETHER_TOKEN"
	// CredsFile and CredsUser: the client credentials `tether dev` wrote
	// for its user, and that user's name; empty for `tether coordinator`.
	CredsFile, CredsUser string
	// CredsElsewhere: CredsFile is not where client commands look by
	// themselves (a second dev beside another), so commands must name it.
	CredsElsewhere bool
	// OpenShellAddr and OpenSandboxAddr are the facades' bound addresses;
	// empty when off.
	OpenShellAddr, OpenSandboxAddr string
	// SSHAddr is the SSH jump host's bound address; empty when off.
	SSHAddr string
}

// coordinatorServer is a coordinator whose listeners are bound and whose
// NATS connection is up, ready to serve.
type coordinatorServer struct {
	info     coordinatorInfo
	log      *slog.Logger
	coord    *coordinator.Coordinator
	tunnelLn net.Listener
	adminLn  net.Listener
	admin    *http.Server
	nc       *nats.Conn
	sbx      *sandboxes.Service
	sbxLn    *sandboxListeners
	audit    *audit.Recorder
	ids      *enroll.Store      // join tokens and node identities
	fleet    jetstream.KeyValue // the fleet registry shared with the other coordinators
	ns       *server.Server     // nil with an external NATS
	layout   *natsauth.Layout
	unlock   func()             // releases the data dir lock
	policy   *policy.Store      // reloaded on SIGHUP (serve)
	gate     *sshgate.Gate      // the SSH jump host; nil without --ssh-addr
	sshLn    net.Listener       // its listener
	notify   *sdnotify.Notifier // systemd's notify socket; nil without one
	config   *configSource      // the config file SIGHUP re-reads; nil without --config
}

// metricsRegistry is what a daemon registers its metrics on and serves
// /metrics from: newRegistry's *prometheus.Registry, or in tests one that
// also records what was registered.
type metricsRegistry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// startCoordinator prepares a coordinator: token, TLS, NATS (embedded or
// external), listeners. On error it releases everything it acquired. The
// caller must call serve, which releases everything when it returns.
func startCoordinator(o coordinatorOptions, envToken string, log *slog.Logger, reg metricsRegistry) (cs *coordinatorServer, err error) {
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("coordinator: create data dir: %w", err)
	}
	unlock, err := lockDataDir(o.DataDir)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	undo = append(undo, unlock)
	cs = &coordinatorServer{log: log, unlock: unlock, notify: o.notify}
	// The policy first: a bad file is the operator's to fix before
	// anything binds or starts.
	if o.Policy == "" {
		return nil, fmt.Errorf("coordinator: %w", errNoPolicy)
	}
	pm, err := policy.NewMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	if cs.policy, err = policy.NewStore(o.Policy, pm); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	logPolicy(log, "policy loaded", cs.policy.Policy())
	// Bind the listeners before anything slow, so a busy port fails at once.
	rawLn, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return nil, fmt.Errorf("coordinator: tunnel listener: %w", err)
	}
	undo = append(undo, func() { rawLn.Close() })
	cs.adminLn, err = net.Listen("tcp", o.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("coordinator: admin listener: %w", err)
	}
	cs.adminLn = limitConns(cs.adminLn, adminLimits.MaxConns)
	adminLn := cs.adminLn
	undo = append(undo, func() { adminLn.Close() })
	if o.SSHAddr != "" {
		sshLn, err := net.Listen("tcp", o.SSHAddr)
		if err != nil {
			return nil, fmt.Errorf("coordinator: SSH jump host listener (--ssh-addr): %w", err)
		}
		undo = append(undo, func() { sshLn.Close() })
		cs.sshLn = sshLn
		cs.info.SSHAddr = sshLn.Addr().String()
	}
	// The SSH host CA certifies node host keys for the jump host and for
	// tether ssh-proxy alike.
	sshDir := filepath.Join(o.DataDir, "ssh")
	if err := os.MkdirAll(sshDir, 0o700); err != nil {
		return nil, fmt.Errorf("coordinator: create %s: %w", sshDir, err)
	}
	hostCA, err := sshgate.LoadHostCA(filepath.Join(sshDir, sshgate.HostCAFile), 0)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	sbxLn, err := o.Sandbox.bind()
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	undo = append(undo, sbxLn.close)
	cs.sbxLn = sbxLn
	if sbxLn.openShell != nil {
		cs.info.OpenShellAddr = sbxLn.openShell.Addr().String()
	}
	if sbxLn.openSandbox != nil {
		cs.info.OpenSandboxAddr = sbxLn.openSandbox.Addr().String()
	}
	if o.AllowSharedToken {
		cs.info.Token, cs.info.TokenFrom, err = resolveToken(o.TokenFile, envToken, o.DataDir)
		if err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		log.Warn("--allow-shared-token is deprecated: agents presenting the fleet-wide shared token are admitted without a certificate; enroll them with join tokens (tether token create) and drop the flag",
			"token_from", cs.info.TokenFrom)
	}
	nodeCA, err := tunnel.LoadNodeCA(filepath.Join(o.DataDir, "pki"))
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	cs.info.NodeCAFile = filepath.Join(o.DataDir, "pki", tunnel.CAFile)

	var tlsCfg *tls.Config
	if o.TLSCert != "" {
		tlsCfg, err = tunnel.LoadServerTLS(o.TLSCert, o.TLSKey)
	} else {
		hosts := append([]string(nil), o.TLSHosts...)
		if h, _, _ := net.SplitHostPort(o.Listen); h != "" && h != "0.0.0.0" && h != "::" {
			hosts = append(hosts, h)
		}
		if hn, herr := os.Hostname(); herr == nil && hn != "" {
			hosts = append(hosts, hn)
		}
		var pki tunnel.DevPKI
		pki, err = tunnel.EnsureDevPKI(filepath.Join(o.DataDir, "pki"), hosts)
		if err == nil {
			cs.info.CAFile = pki.CACert
			tlsCfg, err = tunnel.LoadServerTLS(pki.ServerCert, pki.ServerKey)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}

	id := o.ID
	if id == "" {
		id = coordinator.DefaultConfig().ID
	}
	// The NATS layout: the accounts and keys every connection to the
	// embedded server authenticates with, and what callers are verified
	// against (also with an external server given this layout).
	unlockNATS, err := lockNATSDir(natsAuthDir(o.DataDir))
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	cs.layout, err = natsauth.Load(natsAuthDir(o.DataDir), natsauth.Config{})
	unlockNATS()
	if err != nil {
		return nil, fmt.Errorf("coordinator: NATS layout: %w", err)
	}
	verifier := cs.layout.Verifier()
	// A connection that stops carrying traffic without closing (a
	// partition, a blackholed route) must be noticed within a few
	// heartbeats, not nats.go's default of minutes (2 min pings, 2 out):
	// the coordinator hands its agents to the others only once it sees
	// itself disconnected (coordinator: fleet.go shed).
	pingEvery := o.Heartbeat
	if pingEvery <= 0 {
		pingEvery = coordinator.DefaultConfig().HeartbeatInterval
	}
	natsOpts := []nats.Option{nats.Name("tether-coordinator " + id), nats.MaxReconnects(-1),
		nats.PingInterval(pingEvery), nats.MaxPingsOutstanding(2)}
	url := o.NATSURL
	if url == "" {
		host, port, _ := splitNATSListen(o.NATSListen)
		cs.ns, err = coordinator.StartEmbeddedNATS(coordinator.EmbeddedNATSConfig{
			Host:       host,
			Port:       port,
			StoreDir:   filepath.Join(o.DataDir, "nats"),
			ServerName: "tether-" + id,
			Auth:       cs.layout,
			Logger:     log,
			SyncAlways: o.NATSSyncAlways,
		})
		if err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		ns := cs.ns // cs is nil by the time undo runs on an error return
		undo = append(undo, func() { ns.Shutdown(); ns.WaitForShutdown() })
		url = cs.ns.ClientURL()
		creds, err := cs.layout.MintCoordinator(natsUserName("coordinator-" + id))
		if err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		natsOpts = append(natsOpts, nats.InProcessServer(cs.ns), nats.UserJWTAndSeed(creds.JWT, string(creds.Seed)))
	} else {
		creds, err := natsauth.ReadCreds(o.NATSCreds)
		if err != nil {
			return nil, fmt.Errorf("coordinator: %w", credsFileError(err, "--nats-creds"))
		}
		if o.NATSOperatorJWT == "" {
			// Callers are verified against this layout: credentials of
			// another one would let this coordinator join the fleet's queue
			// group and refuse the other layout's clients as unidentified.
			err := cs.layout.CheckCoordinatorCreds(creds)
			if errors.Is(err, natsauth.ErrClientCreds) {
				return nil, fmt.Errorf("coordinator: --nats-creds %s: %w; for this coordinator: `tether nats coordinator-creds %s --data-dir %s -o FILE`",
					o.NATSCreds, err, id, o.DataDir)
			}
			if err != nil {
				return nil, fmt.Errorf("coordinator: --nats-creds %s: %w; copy DATA-DIR/nats-auth from the coordinator whose layout the NATS server has (`tether nats server-config`) to %s, then mint this coordinator's credentials from it (`tether nats coordinator-creds %s --data-dir DATA-DIR`)",
					o.NATSCreds, err, cs.layout.Dir(), id)
			}
		}
		natsOpts = append(natsOpts, nats.UserJWTAndSeed(creds.JWT, string(creds.Seed)))
		if o.NATSOperatorJWT != "" {
			if verifier, err = externalVerifier(o.NATSOperatorJWT, o.NATSClientsJWT); err != nil {
				return nil, fmt.Errorf("coordinator: %w", err)
			}
			if err := verifier.CheckNotClient(creds); err != nil {
				return nil, fmt.Errorf("coordinator: --nats-creds %s: %w; for this coordinator: `tether nats coordinator-creds %s --data-dir DATA-DIR -o FILE` from the layout, or a user of the coordinators' account (nsc add user)",
					o.NATSCreds, err, id)
			}
		}
		if err := checkNoAnonymous(url); err != nil {
			if !o.InsecureNATS {
				return nil, fmt.Errorf("coordinator: %w; give the server Tether's layout (`tether nats server-config`), or pass --insecure-nats to start anyway", err)
			}
			log.Warn("NATS admits anonymous clients to the Tether API (--insecure-nats): anyone who reaches it can publish requests; they are refused unauthenticated, but nothing stops them reading what they may subscribe to", "nats_url", url, "err", err)
		}
	}
	cs.info.NATSURL = url
	cs.nc, err = nats.Connect(url, natsOpts...)
	if err != nil {
		return nil, fmt.Errorf("coordinator: connect to NATS at %s: %w", url, err)
	}
	undo = append(undo, cs.nc.Close)
	if o.NATSURL != "" {
		if err := checkNATSVersion(cs.nc.ConnectedServerVersion()); err != nil {
			return nil, fmt.Errorf("coordinator: NATS at %s: %w", cs.nc.ConnectedUrlRedacted(), err)
		}
	}
	if err := checkDistinctCoordinator(cs.nc, id); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	octx, ocancel := context.WithTimeout(context.Background(), storeOpenTimeout)
	cs.fleet, err = coordinator.OpenFleetBucket(octx, cs.nc, 0, log)
	ocancel()
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	octx, ocancel = context.WithTimeout(context.Background(), storeOpenTimeout)
	cs.sbx, err = o.Sandbox.open(octx, sbxLn, o.DataDir, id, cs.nc, log, reg)
	ocancel()
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	sbx := cs.sbx // cs is nil by the time undo runs on an error return
	undo = append(undo, func() { sbx.Ledger().Close() })
	octx, ocancel = context.WithTimeout(context.Background(), storeOpenTimeout)
	cs.ids, err = enroll.Open(octx, enroll.Config{NATS: cs.nc, Logger: log})
	ocancel()
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	ids := cs.ids
	undo = append(undo, ids.Close)

	actx, acancel := context.WithTimeout(context.Background(), storeOpenTimeout)
	cs.audit, err = audit.New(actx, audit.Config{
		NATS: cs.nc, Coordinator: id, MaxAge: o.AuditMaxAge, MaxBytes: o.AuditMaxBytes, Logger: log, Registerer: reg,
	})
	acancel()
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w (the audit log needs JetStream file storage for --audit-max-bytes, default 1 GiB)", err)
	}
	rec := cs.audit // cs is nil by the time undo runs on an error return
	undo = append(undo, func() { closeAudit(rec, log) })

	jctx, jcancel := context.WithTimeout(context.Background(), storeOpenTimeout)
	jobs, err := jobstore.Open(jctx, jobstore.Config{NATS: cs.nc, Coordinator: id, Retention: o.JobRetention, Logger: log})
	jcancel()
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w (the job store needs JetStream file storage)", err)
	}

	cfg := coordinator.DefaultConfig()
	cfg.ID = id
	cfg.Audit = cs.audit
	cfg.Jobs = jobs
	cfg.Token = cs.info.Token
	cfg.NodeCA = nodeCA
	cfg.Identities = cs.ids
	cfg.Fleet = cs.fleet
	cfg.CertTTL = o.CertTTL
	cfg.NATS = cs.nc
	cfg.Identify = caller.FromNATS(verifier)
	cfg.Version = version
	if o.Heartbeat > 0 {
		cfg.HeartbeatInterval = o.Heartbeat
	}
	cfg.DefaultTimeout = o.ExecTimeout
	if o.MaxHandshakesPerSource > 0 {
		cfg.MaxHandshakesPerSource = o.MaxHandshakesPerSource
	}
	cfg.AdmitRate, cfg.DrainSpread = o.AdmitRate, o.DrainSpread
	cfg.Logger = log
	cfg.Registerer = reg
	cfg.Notify = o.notify
	cfg.Endpoints = cs.sbx.Endpoints
	cfg.Policy = cs.policy
	cfg.SSH.HostCA = hostCA
	if !o.directOff() {
		// Clients verify the listener against this pin, which they get
		// over their authenticated NATS connection.
		leaf, err := x509.ParseCertificate(tlsCfg.Certificates[0].Certificate[0])
		if err != nil {
			return nil, fmt.Errorf("coordinator: tunnel listener certificate: %w", err)
		}
		cfg.Direct.Pin = tunnel.CertPin(leaf)
		cfg.Direct.Addr = o.DirectAddr
		if cfg.Direct.Addr == "" {
			cfg.Direct.Addr = reportedAddr(o.Listen, rawLn.Addr())
		}
	}
	var jumpAddr, jumpKey string // set below, before anything serves
	if cs.sshLn != nil {
		cfg.SSH.Jump = func() (string, string) { return jumpAddr, jumpKey }
	}
	cs.coord, err = coordinator.New(cfg)
	if err != nil {
		return nil, err
	}
	if cs.sshLn != nil {
		cs.gate, err = sshgate.New(sshgate.Config{
			StateDir:           sshDir,
			HostCA:             hostCA,
			AuthorizedKeysFile: o.SSHAuthorizedKeys,
			UserCAFiles:        o.SSHUserCAs,
			Nodes:              cs.coord.SSHNodes(),
			Policy:             cs.policy,
			Auditor:            cs.audit,
			Logger:             log,
			Registerer:         reg,
		})
		if err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		gate := cs.gate // cs is nil by the time undo runs on an error return
		undo = append(undo, func() { gate.Close() })
		jumpAddr = reportedAddr(o.SSHAddr, cs.sshLn.Addr())
		jumpKey = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cs.gate.HostKey())))
	}
	if err := cs.sbx.Attach(cs.coord); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}

	cs.info.TunnelAddr = rawLn.Addr().String()
	// Agents with a node certificate present it; the coordinator checks
	// it (coordinator/identity.go).
	// ALPN http/1.1 reaches the WebSocket transport on the same port, and
	// tether-client/1 clients' direct sessions (coordinator: dispatchClient).
	lnTLS := tunnel.ServeALPN(tlsCfg)
	lnTLS.NextProtos = append(lnTLS.NextProtos, protocol.ALPNClient)
	cs.tunnelLn = tunnel.NewListener(rawLn, tunnel.RequestClientCert(lnTLS))
	cs.info.AdminAddr = cs.adminLn.Addr().String()
	local := o.Sandbox.local
	if local == nil {
		local = loopbackIdentity
	}
	adminH, err := o.Console.adminHandler(cs.coord.AdminHandler(reg), cs.coord, cs, jobs, local, o.Sandbox.AllowedHosts, reg, log)
	if err != nil {
		return nil, err
	}
	cs.admin = newHTTPServer(adminH, adminLimits)
	// The console names loopback callers by their socket's uid.
	cs.admin.ConnContext = peeruid.ConnContext
	return cs, nil
}

// serve runs the coordinator until ctx is done, then drains it and stops the
// admin server, the NATS connection and the embedded NATS server, in that
// order. It returns nil after a drain caused by ctx.
func (cs *coordinatorServer) serve(ctx context.Context) error {
	gcfloor.Start(ctx, gcfloor.Default)
	cs.log.Info("coordinator started",
		"tunnel_addr", cs.info.TunnelAddr,
		"nats_url", cs.info.NATSURL,
		"admin_addr", cs.info.AdminAddr,
		"ca_file", cs.info.CAFile,
		"openshell_facade", cs.info.OpenShellAddr,
		"opensandbox_facade", cs.info.OpenSandboxAddr,
		"node_ca", cs.info.NodeCAFile,
		"ssh_addr", cs.info.SSHAddr,
		"shared_token_from", cs.info.TokenFrom)

	// SIGHUP reloads the config file, the policy and the SSH keys
	// (reload); registered before anything serves, so a
	// SIGHUP never kills a coordinator that is up.
	hup := make(chan os.Signal, 1)
	reloadsOnHangup()
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	hupDone := make(chan struct{})
	hupCtx, hupStop := context.WithCancel(ctx)
	go func() {
		defer close(hupDone)
		for {
			select {
			case <-hupCtx.Done():
				return
			case <-hup:
				// RELOADING=1 … READY=1 around it, once ready.
				if err := cs.notify.Reload(cs.reload); err != nil {
					cs.log.Warn("systemd notification failed", "err", err)
				}
			}
		}
	}()
	defer func() { hupStop(); <-hupDone }()

	adminDone := make(chan error, 1)
	go func() { adminDone <- cs.admin.Serve(cs.adminLn) }()
	wctx, wcancel := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); cs.watchRevocations(wctx, natsRevocationPoll) }()
	defer wcancel()
	// The sandbox services outlive the coordinator's drain (their
	// endpoints answer until the micro service stops); if they fail, the
	// coordinator drains and stops too rather than serve a closed ledger.
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	defer scancel()
	sbxDone := make(chan error, 1)
	go func() { sbxDone <- cs.sbx.Run(sctx) }()
	gateDone := make(chan error, 1)
	if cs.gate != nil {
		go func() { gateDone <- cs.gate.Serve(cs.sshLn) }()
	} else {
		gateDone <- sshgate.ErrClosed
	}
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	serveDone := make(chan error, 1)
	go func() { serveDone <- cs.coord.Serve(cctx, cs.tunnelLn) }()
	var err, sbxErr error
	select {
	case err = <-serveDone:
		scancel()
		sbxErr = <-sbxDone
	case sbxErr = <-sbxDone:
		ccancel()
		err = <-serveDone
	}
	if sbxErr != nil {
		cs.log.Error("sandbox services failed", "err", sbxErr)
		err = errors.Join(err, sbxErr)
	}
	if cs.gate != nil {
		// The coordinator drained: its tunnels, which every SSH connection
		// goes through, are closed.
		cs.gate.Close()
	}
	if gerr := <-gateDone; !errors.Is(gerr, sshgate.ErrClosed) {
		cs.log.Error("SSH jump host failed", "err", gerr)
	}

	shctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := cs.admin.Shutdown(shctx); serr != nil {
		cs.admin.Close()
	}
	if aerr := <-adminDone; !errors.Is(aerr, http.ErrServerClosed) {
		cs.log.Error("admin server failed", "err", aerr)
	}
	wcancel()
	<-watchDone
	closeAudit(cs.audit, cs.log)
	cs.ids.Close()
	cs.nc.Close()
	if cs.ns != nil {
		cs.ns.Shutdown()
		cs.ns.WaitForShutdown()
	}
	cs.unlock()
	cs.log.Info("coordinator stopped")
	return err
}

// logPolicy logs a loaded policy's counts and its warnings.
func logPolicy(log *slog.Logger, msg string, p *policy.Policy) {
	ids, roles, rules := p.Counts()
	log.Info(msg, "policy", p.Name(), "identities", ids, "roles", roles, "rules", rules)
	for _, w := range p.Warnings() {
		log.Warn("policy: "+w, "policy", p.Name())
	}
}

// natsRevocationPoll is how often a running coordinator looks for
// revocations `tether nats user revoke` recorded in its layout.
const natsRevocationPoll = 2 * time.Second

// watchRevocations applies, every interval until ctx ends, the revocations
// another process recorded in the layout's directory: the coordinator's
// verifier refuses the revoked users at once, their running attached jobs
// and open streams are cancelled (Coordinator.RecheckCallers), and the
// embedded server (if any) disconnects and refuses them (natsauth.Layout.UpdateServer). An
// external server needs the new layout from its operator (tether nats
// server-config), which the log says.
func (cs *coordinatorServer) watchRevocations(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		unlock, err := lockNATSDir(cs.layout.Dir())
		if err != nil {
			cs.log.Warn("NATS revocations not reloaded", "err", err)
			continue
		}
		changed, err := cs.layout.ReloadRevocations()
		unlock()
		if err != nil {
			cs.log.Warn("NATS revocations not reloaded", "err", err)
			continue
		}
		if !changed {
			continue
		}
		// The revoked users' attached jobs and open streams end now,
		// whatever the server does.
		cs.coord.RecheckCallers()
		if cs.ns == nil {
			cs.log.Warn("revoked NATS users are refused by this coordinator; give the external NATS server the new layout (tether nats server-config) so it disconnects them")
			continue
		}
		if err := cs.layout.UpdateServer(cs.ns); err != nil {
			cs.log.Error("revoked NATS users not cut off on the embedded server", "err", err)
		} else {
			cs.log.Info("revoked NATS users cut off")
		}
	}
}

// close releases a coordinatorServer that will not be served.
func (cs *coordinatorServer) close() {
	closeAudit(cs.audit, cs.log)
	cs.ids.Close()
	cs.sbx.Ledger().Close()
	cs.sbxLn.close()
	cs.tunnelLn.Close()
	cs.adminLn.Close()
	if cs.gate != nil {
		cs.gate.Close()
	}
	if cs.sshLn != nil {
		cs.sshLn.Close()
	}
	cs.nc.Close()
	if cs.ns != nil {
		cs.ns.Shutdown()
		cs.ns.WaitForShutdown()
	}
	cs.unlock()
}

// closeAudit stores the audit events still queued, for at most 5 s.
func closeAudit(rec *audit.Recorder, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rec.Close(ctx); err != nil {
		log.Warn("audit events still queued at exit were not stored (they are in this log)", "err", err)
	}
}

// lockDataDir takes an exclusive lock on dir/lock for the life of the
// process, so that two coordinators never share a NATS store, token or PKI.
// The lock is released by the returned func (or when the process exits).
func lockDataDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		owner, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another tether process (pid %s); give this one its own --data-dir", dir, strings.TrimSpace(string(owner)))
		}
		return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	var once sync.Once
	return func() { once.Do(func() { f.Close() }) }, nil
}

// checkDistinctCoordinator refuses to start a coordinator whose id another
// coordinator serving the API on the same NATS (the same account: the
// others are invisible, and could not share the fleet anyway) already uses.
// Several coordinators share one NATS (coordinator/fleet.go), but each one
// records the nodes it holds under its id: two with one id would take each
// other's nodes for their own.
func checkDistinctCoordinator(nc *nats.Conn, id string) error {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("ping the %q service on %s: %w", protocol.ServiceName, nc.ConnectedUrlRedacted(), err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.PING."+protocol.ServiceName, inbox, nil); err != nil {
		return fmt.Errorf("ping the %q service on %s: %w", protocol.ServiceName, nc.ConnectedUrlRedacted(), err)
	}
	// Every instance answers at once; gather for a short while.
	deadline := time.Now().Add(500 * time.Millisecond)
	for {
		msg, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			return nil // the window ended (or nobody serves the API)
		}
		var ping struct {
			ID       string            `json:"id"`
			Metadata map[string]string `json:"metadata"`
		}
		if json.Unmarshal(msg.Data, &ping) != nil {
			continue
		}
		if ping.Metadata["coordinator_id"] == id {
			return fmt.Errorf("another coordinator (service instance %s) on %s already uses the coordinator id %q; give each coordinator its own --id", ping.ID, nc.ConnectedUrlRedacted(), id)
		}
	}
}
