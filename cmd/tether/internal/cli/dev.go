//go:build !tetherclient

package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/enroll"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// devOptions are the flags of `tether dev`.
type devOptions struct {
	// DataDir holds the dev PKI, the join token, the NATS store and the
	// agent's working directory. Default $XDG_STATE_HOME/tether/dev, i.e.
	// ~/.local/state/tether/dev (as root too: dev mode is per user).
	// Instances running side by side need distinct data directories.
	DataDir string
	// NATSPort is the embedded NATS server's port on 127.0.0.1; 0 picks a
	// free port. Default 4222.
	NATSPort int
	// TunnelAddr is the tunnel listener, which the local agent dials.
	// Default "127.0.0.1:7443"; port 0 picks a free port.
	TunnelAddr string
	// HTTPAddr is the admin listener. Default "127.0.0.1:7080"; port 0 picks
	// a free port.
	HTTPAddr string
	// OpenShellListen and OpenSandboxListen are the facades' addresses on
	// loopback ("" turns one off). Defaults 127.0.0.1:7081 and :7082.
	OpenShellListen, OpenSandboxListen string
	// AllowedHosts are further names the facades, and the console to a
	// loopback caller, answer to (the coordinator's
	// --facade-allowed-hosts).
	AllowedHosts []string
	// OpenShell and OpenSandbox are the local agent's gateways (host:port),
	// reached through the facades; "" means none.
	OpenShell, OpenSandbox string
	// SandboxTTL, ReapGrace and InventoryInterval are the coordinator's
	// --sandbox-ttl, --reap-grace and --inventory-interval.
	SandboxTTL, ReapGrace, InventoryInterval time.Duration
	// CopyRoots are the local agent's copy roots (the agent's
	// --copy-root). Empty means devCopyRoots: "/" when dev does not run as
	// root, so that copies go anywhere the user can write (the kernel
	// checks the user's rights); as root, the agent's data dir, the
	// working directory and the temporary directory only.
	CopyRoots []string
	// SSHAddr is the SSH jump host's address. Default "127.0.0.1:7022";
	// "" turns it off (tether ssh-proxy works without it). It accepts the
	// invoking user's keys, ~/.ssh/*.pub.
	SSHAddr string
	// DirectAddr is the coordinator's --direct-addr: the tunnel listener
	// as clients reach it for their streams' direct data path. Default ""
	// (--listen's host and bound port); "off" relays streams over
	// NATS, as for a client that can reach only NATS.
	DirectAddr string
	// Transports and WebSocketPing are the local agent's --transport and
	// --websocket-ping (default tls; "wss" or "wss,tls" tries the
	// WebSocket transport the coordinator serves on --listen too).
	Transports    []string
	WebSocketPing time.Duration
	// transportGiven and pingGiven record whether --transport and
	// --websocket-ping were on the command line (even as "" or 0).
	transportGiven, pingGiven bool
	// Log configures logging to stderr.
	Log logOptions
}

// devCopyRoots are the local agent's copy roots when --copy-root is not
// given. A user's dev agent runs as that user, so "/" lets `tether cp` go
// wherever the user could write and nowhere else. Root could write
// anywhere, and a mistaken `tether cp --delete DIR dev:/etc` would then
// mirror over the system; so as root the default stays with the
// directories a dev session works in (dataDir, the working directory
// unless it is "/", the temporary directory), and --copy-root / opts in to
// the rest.
func devCopyRoots(euid int, dataDir string) []string {
	if euid != 0 {
		return []string{"/"}
	}
	roots := []string{dataDir}
	if wd, err := os.Getwd(); err == nil && wd != "/" {
		roots = append(roots, wd)
	}
	return append(roots, os.TempDir())
}

func defaultDevOptions() devOptions {
	dir := filepath.Join(os.TempDir(), "tether-dev")
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		dir = filepath.Join(d, "tether", "dev")
	} else if home, err := os.UserHomeDir(); err == nil {
		dir = filepath.Join(home, ".local", "state", "tether", "dev")
	}
	return devOptions{
		DataDir:    dir,
		NATSPort:   4222,
		TunnelAddr: "127.0.0.1:7443",
		HTTPAddr:   "127.0.0.1:7080",
		SSHAddr:    "127.0.0.1:7022",
		Log:        defaultLogOptions(),

		OpenShellListen:   defaultSandboxOptions().OpenShellListen,
		OpenSandboxListen: defaultSandboxOptions().OpenSandboxListen,
		ReapGrace:         defaultSandboxOptions().ReapGrace,
		InventoryInterval: defaultSandboxOptions().InventoryInterval,
	}
}

// Validate reports every invalid option.
func (o *devOptions) Validate() error {
	var errs []error
	if o.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is required"))
	}
	if o.NATSPort < 0 || o.NATSPort > 65535 {
		errs = append(errs, fmt.Errorf("--nats-port %d: want 0-65535", o.NATSPort))
	}
	if err := checkHostPort(o.TunnelAddr); err != nil {
		errs = append(errs, fmt.Errorf("--listen: %w", err))
	}
	if err := checkHostPort(o.HTTPAddr); err != nil {
		errs = append(errs, fmt.Errorf("--http-addr: %w", err))
	}
	if o.SSHAddr != "" {
		if err := checkHostPort(o.SSHAddr); err != nil {
			errs = append(errs, fmt.Errorf("--ssh-addr: %w", err))
		}
	}
	if o.DirectAddr != "" && !strings.EqualFold(o.DirectAddr, "off") {
		if err := coordinator.CheckDirectAddr(o.DirectAddr); err != nil {
			errs = append(errs, fmt.Errorf("--direct-addr: %w (want HOST:PORT as clients reach --listen, or off)", err))
		}
	}
	errs = append(errs, checkTransports(o.Transports, o.transportGiven, o.WebSocketPing, o.pingGiven)...)
	for _, a := range []struct{ flag, addr string }{{"--openshell-listen", o.OpenShellListen}, {"--opensandbox-listen", o.OpenSandboxListen}} {
		if a.addr == "" {
			continue
		}
		if err := checkHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.flag, err))
		} else if secureAddr(a.addr) {
			errs = append(errs, fmt.Errorf("%s %s: dev facades listen on loopback only; use `tether coordinator` with --facade-tls-cert to serve them on the network", a.flag, a.addr))
		}
	}
	for _, a := range []struct{ flag, addr string }{{"--openshell", o.OpenShell}, {"--opensandbox", o.OpenSandbox}} {
		if a.addr != "" {
			if err := checkHostPort(a.addr); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", a.flag, err))
			}
		}
	}
	if err := checkAllowedHosts(o.AllowedHosts); err != nil {
		errs = append(errs, err)
	}
	for _, r := range o.CopyRoots {
		if !filepath.IsAbs(r) {
			errs = append(errs, fmt.Errorf("--copy-root %q: must be an absolute path", r))
		}
	}
	if o.SandboxTTL < 0 {
		errs = append(errs, fmt.Errorf("--sandbox-ttl %s is negative", humanDuration(o.SandboxTTL)))
	}
	if o.InventoryInterval <= 0 {
		errs = append(errs, fmt.Errorf("--inventory-interval %s must be positive", humanDuration(o.InventoryInterval)))
	}
	if err := o.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func newDevCmd(e *env) *cobra.Command {
	o := defaultDevOptions()
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a coordinator, embedded NATS and one local agent, with zero config",
		Long: `Run a complete local Tether: a coordinator with its embedded NATS server
(JetStream on), and one agent on this machine connected to it through a real
TLS tunnel over loopback. The dev CA, join token, NATS layout and NATS store
live in the data directory. NATS admits no anonymous client: dev mints a
client user named after you and writes its credentials (0600) to
~/.config/tether/dev.creds ($XDG_CONFIG_HOME/tether/dev.creds), where the
client commands find them. Ctrl-C stops everything.

To run several side by side, give each its own --data-dir and ports.`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			o.transportGiven, o.pingGiven = cmd.Flags().Changed("transport"), cmd.Flags().Changed("websocket-ping")
			if cmd.Flags().Changed("tunnel-addr") {
				if cmd.Flags().Changed("listen") {
					return usage(errors.New("--tunnel-addr is --listen's old name: give only --listen"))
				}
				fmt.Fprintln(e.stderr, "tether: --tunnel-addr is deprecated: use --listen, as tether coordinator does")
			}
			if err := o.Validate(); err != nil {
				return usage(err)
			}
			keepServingOnBrokenPipe()
			return runDev(cmd.Context(), &o, e)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", o.DataDir, "directory for the dev PKI, token, NATS store and agent")
	f.IntVar(&o.NATSPort, "nats-port", o.NATSPort, "embedded NATS port on 127.0.0.1 (0: any free port)")
	f.StringVar(&o.TunnelAddr, "listen", o.TunnelAddr, "agent tunnel listen address (TLS; also WebSocket), as tether coordinator's --listen")
	// --tunnel-addr was this flag's name before it took the coordinator's;
	// kept, hidden, so that scripts written for it still run. Not
	// MarkDeprecated: cobra prints that notice on stdout.
	f.StringVar(&o.TunnelAddr, "tunnel-addr", o.TunnelAddr, "agent tunnel listen address")
	if err := f.MarkHidden("tunnel-addr"); err != nil {
		panic(err) // the flag is defined just above
	}
	f.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "admin listen address (/metrics, /healthz, /readyz, the web console under /console/)")
	f.StringVar(&o.OpenShellListen, "openshell-listen", o.OpenShellListen, `OpenShell gRPC facade address on loopback ("" turns it off)`)
	f.StringVar(&o.OpenSandboxListen, "opensandbox-listen", o.OpenSandboxListen, `OpenSandbox HTTP facade address on loopback ("" turns it off)`)
	addAllowedHostsFlag(cmd, &o.AllowedHosts)
	f.StringVar(&o.OpenShell, "openshell", o.OpenShell, "the local OpenShell gateway (host:port) the agent serves through the facade")
	f.StringVar(&o.OpenSandbox, "opensandbox", o.OpenSandbox, "the local OpenSandbox server (host:port) the agent serves through the facade")
	durationVar(f, &o.SandboxTTL, "sandbox-ttl", o.SandboxTTL, "TTL of OpenShell sandboxes created without tether-ttl (0: none)")
	durationVar(f, &o.ReapGrace, "reap-grace", o.ReapGrace, "how long an unowned NeMo Gym sandbox may live (negative: never reap unowned)")
	f.StringSliceVar(&o.CopyRoots, "copy-root", nil, "directory the local agent's copies may write to and read from (repeatable or comma-separated; default: / when not root, so anywhere you can write; as root: the data dir, the working directory and the temporary directory)")
	durationVar(f, &o.InventoryInterval, "inventory-interval", o.InventoryInterval, "how often the agent's gateways are listed")
	f.StringVar(&o.SSHAddr, "ssh-addr", o.SSHAddr, `SSH jump host address, accepting your ~/.ssh/*.pub keys ("" turns it off; tether ssh-proxy works without)`)
	f.StringVar(&o.DirectAddr, "direct-addr", o.DirectAddr, `the --listen address as clients reach it, for their streams' direct data path (HOST:PORT; default: --listen's host and bound port; "off": streams are relayed over NATS)`)
	f.StringSliceVar(&o.Transports, "transport", o.Transports, "how the local agent reaches the coordinator, in the order tried: tls (raw TLS), wss (WebSocket over TLS on --listen, path "+tunnel.WebSocketPath+"); default tls")
	durationVar(f, &o.WebSocketPing, "websocket-ping", o.WebSocketPing, "with --transport wss only: the local agent's WebSocket ping interval (at least 1s; default and 0: 15s; negative: no pings)")
	o.Log.addFlags(cmd)
	return cmd
}

// devNodeID is the local agent's node id: the host name when it is a valid
// node id, else "dev".
func devNodeID() string {
	if h, err := os.Hostname(); err == nil && protocol.ValidNodeID(h) == nil {
		return h
	}
	return "dev"
}

// runDev runs the dev stack until ctx is done. Shutdown order: the
// coordinator first (drain: running jobs finish, or once its drain timeout
// passed get the shutdown result, "coordinator dev is shutting down; job
// cancelled", which needs the agent still serving to report them; then its
// NATS connection and the embedded server), then the agent, which stops
// by itself once the drained session closed (agent.Config.SoleCoordinator,
// no redial). o must be valid.
func runDev(ctx context.Context, o *devOptions, e *env) (err error) {
	log := o.Log.logger(e.stderr)
	co := defaultCoordinatorOptions()
	co.DataDir = o.DataDir
	co.Listen = o.TunnelAddr
	co.HTTPAddr = o.HTTPAddr
	co.NATSListen = net.JoinHostPort("127.0.0.1", strconv.Itoa(o.NATSPort))
	co.ID = "dev"
	co.DirectAddr = o.DirectAddr
	co.Sandbox.OpenShellListen = o.OpenShellListen
	co.Sandbox.OpenSandboxListen = o.OpenSandboxListen
	co.Sandbox.AllowedHosts = o.AllowedHosts
	co.Sandbox.DefaultTTL = o.SandboxTTL
	co.Sandbox.ReapGrace = o.ReapGrace
	co.Sandbox.InventoryInterval = o.InventoryInterval
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("dev: create data dir: %w", err)
	}
	// The dev NATS user (writeDevCreds) may do everything; the loopback
	// facades' callers are that user too.
	devUser := devUserName(e.getenv)
	// The jump host takes the user's own SSH keys.
	var sshKeys []string
	var sshNote string
	if o.SSHAddr != "" {
		keysFile := filepath.Join(o.DataDir, "ssh", "authorized_keys")
		sshKeys, sshNote, err = writeDevAuthorizedKeys(keysFile, e.getenv)
		if err != nil {
			return fmt.Errorf("dev: %w", err)
		}
		if len(sshKeys) > 0 {
			co.SSHAddr, co.SSHAuthorizedKeys = o.SSHAddr, keysFile
		}
	}
	if co.Policy, err = writeDevPolicy(o.DataDir, "nats:"+devUser, devRunAs(e.getenv), sshKeys...); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	if note := devPolicySSHNote(co.Policy, sshKeys); note != "" {
		sshNote += note
	}
	co.Sandbox.local = devLocal(policy.Identity{Kind: policy.KindNATS, Name: devUser}, uint32(os.Geteuid()))
	// Dev ignores TETHER_TOKEN: its token lives in the data directory.
	reg := e.metricsRegistry()
	cs, err := startCoordinator(co, "", log, reg)
	if err != nil {
		return err
	}
	// The credentials live beside the instance's other state and, where
	// client commands look last, in the config home. That file is the
	// default instance's; another instance (--data-dir) writes it only when
	// it holds no other instance's live credentials, so one started side by
	// side does not lock the first one's shell out (its banner names its
	// own file instead).
	own := filepath.Join(o.DataDir, "dev.creds")
	path := devCredsFile(o, e.getenv)
	if path != own && o.DataDir != defaultDevOptions().DataDir && othersDevCreds(cs.layout, path) {
		path = own
	}
	dc, err := writeDevCreds(cs.layout, path, devUser)
	if err != nil {
		cs.close()
		return fmt.Errorf("dev: %w", err)
	}
	if own != dc.path {
		if err := natsauth.WriteCreds(own, dc.creds); err != nil {
			cs.close()
			return fmt.Errorf("dev: %w", err)
		}
	}
	cs.info.CredsFile, cs.info.CredsUser = dc.path, dc.creds.Name()
	// The URL beside each credentials file (credsURLFile): a client
	// command given only those credentials finds this instance, also on a
	// --nats-port 0 whose banner was lost.
	for _, p := range []string{own, dc.path} {
		if err := writeFileAtomic(credsURLFile(p), []byte(cs.info.NATSURL+"\n"), 0o600); err != nil {
			cs.close()
			return fmt.Errorf("dev: write the NATS URL beside %s: %w", p, err)
		}
	}
	cs.info.CredsElsewhere = dc.path != devCredsFile(o, e.getenv)

	acfg, err := devAgentConfig(o, cs.info, log, e.getenv, reg)
	if err == nil {
		acfg.Token, err = devJoinToken(ctx, cs.ids, acfg)
	}
	var a *agent.Agent
	if err == nil {
		a, err = agent.New(acfg)
	}
	if err != nil {
		cs.close()
		return fmt.Errorf("dev agent: %w", err)
	}

	// Neither stops when ctx does: the order below does (see above).
	coordCtx, stopCoord := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCoord()
	devCtx, stopDev := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDev()

	coordDone := make(chan error, 1)
	go func() { coordDone <- cs.serve(coordCtx) }()
	agentDone := make(chan error, 1)
	go func() { agentDone <- a.Run(devCtx) }()
	bannerDone := make(chan struct{})
	go func() {
		defer close(bannerDone)
		announceDev(devCtx, e.stdout, o, cs.info, dc.creds, acfg.NodeID, sshNote, log)
	}()

	var coordErr, agentErr error
	coordExited, agentExited := false, false
	select {
	case <-ctx.Done():
	case coordErr = <-coordDone:
		coordExited = true
	case agentErr = <-agentDone:
		agentExited = true
	}
	stopCoord()
	if !coordExited {
		coordErr = <-coordDone
	}
	stopDev()
	<-bannerDone
	if !agentExited {
		agentErr = <-agentDone
	}
	if coordErr == nil && agentErr == nil && ctx.Err() == nil {
		// Only ctx should stop the dev stack.
		return errors.New("dev: stopped unexpectedly")
	}
	return errors.Join(coordErr, agentErr)
}

// devAgentConfig configures the local agent to dial the dev coordinator. Its
// metrics go to reg, the dev coordinator's registry, so the admin endpoint
// serves both: their names do not collide (tether_agent_* beside
// tether_coordinator_*), and both guards count into one
// tether_panics_total vector, by component.
func devAgentConfig(o *devOptions, info coordinatorInfo, log *slog.Logger, getenv func(string) string, reg prometheus.Registerer) (agent.Config, error) {
	cfg := agent.DefaultConfig()
	tlsCfg, err := tunnel.LoadClientTLS(info.CAFile)
	if err != nil {
		return cfg, err
	}
	cfg.NodeID = devNodeID()
	cfg.Labels = map[string]string{"dev": "true"}
	cfg.Coordinators = []string{dialAddr(info.TunnelAddr)}
	// Dev's coordinator is its agent's only one: its drain at shutdown
	// stops the agent once the jobs' results are reported, instead of
	// redialing the closed listener until dev cancels it.
	cfg.SoleCoordinator = true
	cfg.TLS = tlsCfg
	if len(o.Transports) > 0 {
		cfg.Transports = o.Transports
	}
	if o.WebSocketPing != 0 {
		cfg.WebSocketPing = o.WebSocketPing
	}
	cfg.DataDir = filepath.Join(o.DataDir, "agent")
	cfg.CopyRoots = o.CopyRoots
	if len(cfg.CopyRoots) == 0 {
		dir, err := filepath.Abs(cfg.DataDir)
		if err != nil {
			return cfg, err
		}
		cfg.CopyRoots = devCopyRoots(os.Geteuid(), dir)
	}
	cfg.SecretFiles = devProtected(o.DataDir, cfg.DataDir, info.CredsFile)
	cfg.Version = version
	cfg.Logger = log
	cfg.RunAsHint = devRunAsHint(o.DataDir)
	if o.OpenShell != "" {
		cfg.OpenShell = &agent.OpenShellTarget{Addr: o.OpenShell, Token: getenv(openShellTokenEnv)}
	}
	if o.OpenSandbox != "" {
		cfg.OpenSandbox = &agent.OpenSandboxTarget{Addr: o.OpenSandbox, APIKey: getenv(openSandboxAPIKeyEnv)}
	}
	cfg.Registerer = reg
	return cfg, nil
}

// devCoordinatorState names the dev coordinator's state in its data dir
// (beside the agent's own directory): the NATS operator and account keys,
// the node PKI, the policy, the SSH jump host's keys, the NATS store (the
// audit log, the ledger), the dev user's credentials, the tokens and the
// lock.
var devCoordinatorState = []string{"nats-auth", "pki", devPolicyFile, "ssh", "nats", "dev.creds", joinTokenFile, facadeTokenFile, "lock"}

// devProtected returns what the dev agent's copies must never read or
// write (agent.Config.SecretFiles) besides the agent's own state: the dev
// coordinator's state in dataDir, which would hand a copy the fleet's
// keys: devCoordinatorState, every other entry dataDir holds now but the
// agent's directory agentDir (state a later version adds), and the dev
// user's credentials file credsFile (in the config home) if set. A path
// that does not exist when a copy starts protects nothing (the agent
// resolves them per copy).
func devProtected(dataDir, agentDir, credsFile string) []string {
	var out []string
	add := func(p string) {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	for _, n := range devCoordinatorState {
		add(filepath.Join(dataDir, n))
	}
	agentAbs, _ := filepath.Abs(agentDir)
	if ents, err := os.ReadDir(dataDir); err == nil {
		for _, e := range ents {
			if p, _ := filepath.Abs(filepath.Join(dataDir, e.Name())); p != agentAbs {
				add(p)
			}
		}
	}
	if credsFile != "" {
		add(credsFile)
	}
	return out
}

// devRunAsHint is what the dev agent's refusal to run a job as another
// user tells the dev user to do. The dev agent runs as the invoking user
// and reads no local policy (tether dev has no --local-policy): the way
// out is the run_as of the dev policy, which names that user unless
// edited.
func devRunAsHint(dataDir string) string {
	return fmt.Sprintf("in tether dev, which reads no local policy: set run_as back to your user name in %s and send tether dev SIGHUP; "+
		"to run jobs as other users, run tether agent as root with a local policy", filepath.Join(dataDir, devPolicyFile))
}

// devJoinToken returns the one-use join token dev's own agent enrolls
// with, or "" when the agent's identity directory already holds a valid
// certificate for its node id. Dev is one user's: a node id whose
// certificate was lost (the agent directory deleted) is revoked first, so
// that it can enroll again with no step from the user.
func devJoinToken(ctx context.Context, ids *enroll.Store, cfg agent.Config) (string, error) {
	dir := cfg.IdentityDir
	if dir == "" {
		dir = filepath.Join(cfg.DataDir, agent.DefaultIdentityDirName)
	}
	if id, err := tunnel.LoadIdentity(dir); err == nil && id.NodeID() == cfg.NodeID && time.Now().Before(id.Cert.NotAfter) &&
		ids.CheckCert(cfg.NodeID, tunnel.SerialHex(id.Cert)) == nil {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := ids.Revoke(ctx, cfg.NodeID); err != nil && !errors.Is(err, enroll.ErrNotEnrolled) {
		return "", err
	}
	tok, _, err := ids.CreateToken(ctx, 10*time.Minute, 1, nil, "tether dev")
	return tok, err
}

// dialAddr turns a listener's address into one to dial: an unspecified host
// (":7443", "[::]:7443") becomes loopback.
func dialAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// announceDev waits until the local agent is registered, as seen through the
// public NATS API, then prints where everything is and what to try.
func announceDev(ctx context.Context, w io.Writer, o *devOptions, info coordinatorInfo, creds *natsauth.Creds, nodeID, sshNote string, log *slog.Logger) {
	nc, err := nats.Connect(info.NATSURL, append([]nats.Option{nats.Name("tether-dev banner")}, creds.Options()...)...)
	if err != nil {
		log.Error("dev: connect to NATS to check the agent", "err", err)
		return
	}
	defer nc.Close()
	c := client.New(nc)
	warn := time.NewTimer(30 * time.Second)
	defer warn.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		nodes, err := c.Nodes(rctx, "")
		cancel()
		if err == nil && slices.ContainsFunc(nodes, func(n protocol.NodeInfo) bool { return n.ID == nodeID }) {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-warn.C:
			log.Warn("dev: the local agent has not registered yet", "node_id", nodeID, "last_err", err)
		case <-tick.C:
		}
	}
	fmt.Fprint(w, devBanner(o, info, creds.InboxPrefix(), nodeID, sshNote))
}

// devConsoleLine is the banner's console line for the admin listener at
// addr (host:port). Dev has no console tokens, so the console knows only
// loopback callers: a listener on a loopback or unspecified address is
// reached through loopback; one on another address cannot be from a
// browser on this machine either (its connection's source is that
// address), so the line says how to get a loopback view of it.
func devConsoleLine(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/console/"
	}
	ip := net.ParseIP(host)
	switch {
	case ip != nil && ip.IsLoopback():
		return "http://" + addr + "/console/ (a browser on this machine)"
	case host == "" || ip != nil && ip.IsUnspecified():
		return "http://" + net.JoinHostPort("127.0.0.1", port) + "/console/ (a browser on this machine; the console admits loopback callers only)"
	}
	return "http://" + addr + "/console/ admits loopback callers only and dev has no console tokens, so no browser gets in there, not even on this machine; " +
		"listen on loopback (--http-addr 127.0.0.1:" + port + ") and open it from afar through ssh -L " + port + ":127.0.0.1:" + port + " THIS-HOST"
}

// devBanner is what `tether dev` prints once it is ready.
func devBanner(o *devOptions, info coordinatorInfo, inboxPrefix, nodeID, sshNote string) string {
	var b strings.Builder
	tetherFlag, natsFlag := "", ""
	if info.NATSURL != defaultNATSURL {
		tetherFlag = " --nats-url " + info.NATSURL
		natsFlag = " -s " + info.NATSURL
	}
	if info.CredsElsewhere {
		tetherFlag += " --nats-creds " + info.CredsFile
	}
	natsFlag += " --creds " + info.CredsFile + " --inbox-prefix " + inboxPrefix
	fmt.Fprintf(&b, "\nTether dev is ready.\n\n")
	fmt.Fprintf(&b, "  NATS URL:    %s\n", info.NATSURL)
	fmt.Fprintf(&b, "  tunnel:      %s (CA %s)\n", info.TunnelAddr, info.CAFile)
	fmt.Fprintf(&b, "  admin:       http://%s/metrics\n", info.AdminAddr)
	fmt.Fprintf(&b, "  console:     %s\n", devConsoleLine(info.AdminAddr))
	if info.OpenShellAddr != "" {
		fmt.Fprintf(&b, "  openshell:   %s (gRPC facade; point OPENSHELL_GATEWAY_ENDPOINT here)\n", info.OpenShellAddr)
	}
	if info.OpenSandboxAddr != "" {
		fmt.Fprintf(&b, "  opensandbox: http://%s (facade; point OPENSANDBOX_DOMAIN here)\n", info.OpenSandboxAddr)
	}
	fmt.Fprintf(&b, "  node:        %s (labels dev=true; ssh %s%s)\n", nodeID, nodeID, protocol.SSHHostSuffix)
	if info.SSHAddr != "" {
		fmt.Fprintf(&b, "  ssh jump:    %s (your ~/.ssh/*.pub keys)\n", info.SSHAddr)
	}
	fmt.Fprintf(&b, "  data dir:    %s\n", o.DataDir)
	fmt.Fprintf(&b, "  node CA:     %s (enroll more agents: tether token create)\n", info.NodeCAFile)
	fmt.Fprintf(&b, "  policy:      %s (edit, then kill -HUP %d)\n", filepath.Join(o.DataDir, devPolicyFile), os.Getpid())
	fmt.Fprintf(&b, "  NATS user:   %s (credentials %s, 0600)\n\n", info.CredsUser, info.CredsFile)
	if info.CredsElsewhere {
		fmt.Fprintf(&b, "NATS admits no anonymous client. Another tether dev's credentials are where\n")
		fmt.Fprintf(&b, "client commands look by themselves, so name these (the file is yours, 0600):\n\n")
	} else {
		fmt.Fprintf(&b, "NATS admits no anonymous client. Client commands find these credentials\n")
		fmt.Fprintf(&b, "themselves (the file is yours, 0600); for other tools:\n\n")
	}
	fmt.Fprintf(&b, "  export %s=%s\n\n", natsCredsEnv, info.CredsFile)
	fmt.Fprintf(&b, "Try, in another terminal:\n\n")
	fmt.Fprintf(&b, "  tether exec%s --all -- uname -a\n", tetherFlag)
	fmt.Fprintf(&b, "  tether nodes%s\n", tetherFlag)
	fmt.Fprintf(&b, "  nats%s req %s ''\n", natsFlag, protocol.SubjectNodes)
	fmt.Fprintf(&b, "  nats%s req %s '{\"target\":{\"all\":true},\"argv\":[\"uname\",\"-a\"]}' --timeout 30s\n", natsFlag, protocol.SubjectExecOnce)
	fmt.Fprintf(&b, "  tether sandboxes%s\n\n", tetherFlag)
	fmt.Fprintf(&b, "SSH to the node (OpenSSH, rsync, sftp, VS Code Remote):\n\n")
	if info.SSHAddr != "" {
		fmt.Fprintf(&b, "  tether ssh-config%s >> ~/.ssh/config     # jump host %s\n", tetherFlag, info.SSHAddr)
	} else {
		fmt.Fprintf(&b, "  tether ssh-config%s --proxy-command >> ~/.ssh/config\n", tetherFlag)
	}
	fmt.Fprintf(&b, "  ssh %s%s\n\n", nodeID, protocol.SSHHostSuffix)
	if sshNote != "" {
		fmt.Fprintf(&b, "%s\n", sshNote)
	}
	fmt.Fprintf(&b, "Press Ctrl-C to stop.\n")
	return b.String()
}

// devPolicyFile is the dev policy's name in the data directory.
const devPolicyFile = "policy.yaml"

// devLocal names the loopback facades' callers under tether dev: a caller
// whose socket is owned by uid (the dev process's) is the dev user; any
// other local user is token:loopback-uid-UID, which the dev policy does
// not grant (so another account on the machine cannot act as the dev
// user).
func devLocal(dev policy.Identity, uid uint32) func(uint32) policy.Identity {
	return func(u uint32) policy.Identity {
		if u == uid {
			return dev
		}
		return loopbackIdentity(u)
	}
}

// writeDevPolicy writes DATA-DIR/policy.yaml granting identity (the dev
// NATS user's, "nats:" and devUserName) every operation, running commands
// as runAs, and sshKeys (ssh-key:SHA256:… identities) ssh and forward,
// unless the file exists (it is the user's to edit then; delete it to
// regenerate), and returns its path. One exception: a file byte for byte
// the one dev writes without keys (a first start before ~/.ssh had a key,
// unedited) is written again with sshKeys, so that the banner's advice
// ("ssh-keygen, then restart tether dev") lets the new key in.
func writeDevPolicy(dataDir, identity, runAs string, sshKeys ...string) (string, error) {
	path := filepath.Join(dataDir, devPolicyFile)
	data, err := devPolicy(identity, runAs, sshKeys...)
	if err != nil {
		return "", err
	}
	if fi, err := os.Lstat(path); err == nil {
		if len(sshKeys) == 0 || !fi.Mode().IsRegular() {
			return path, nil
		}
		keyless, err := devPolicy(identity, runAs)
		if err != nil {
			return "", err
		}
		if old, err := os.ReadFile(path); err != nil || !bytes.Equal(old, keyless) {
			return path, nil // edited, or unreadable: the user's
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("policy: %w", err)
	}
	if err := writeFileAtomic(path, data, 0o600); err != nil {
		return "", fmt.Errorf("policy: %w", err)
	}
	return path, nil
}

// devRunAs is the local user tether dev's commands run as: the invoking
// user (whom the dev agent runs as), else $USER.
func devRunAs(getenv func(string) string) string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return getenv("USER")
}

// devPolicy is the policy tether dev writes: role admin (every operation
// on every node, every path, the gateways' targets and own-ports (the
// login's own loopback ports, for VS Code Remote-SSH), everyone's jobs and
// runs, administration) for identity, running commands as runAs (the
// invoking user, whom the dev agent runs as), and role ssh (ssh as runAs
// and forward to the gateways' targets and own-ports, so VS Code
// Remote-SSH reaches its server, on every node) for each of
// sshKeys, the ssh-key:SHA256:… identities of the user's keys, which the
// jump host proves. identity is a policy identity (KIND:VALUE); the
// result is checked with policy.Parse.
func devPolicy(identity, runAs string, sshKeys ...string) ([]byte, error) {
	var role, keys strings.Builder
	if len(sshKeys) > 0 {
		fmt.Fprintf(&role, `  # Your SSH keys (~/.ssh/*.pub) through the jump host: ssh and ssh -L.
  ssh:
    - nodes: "*"
      operations: [ssh]
      run_as: %q
    - nodes: "*"
      operations: [forward]
      targets: [openshell, opensandbox, execd, own-ports]
`, runAs)
	}
	for _, k := range sshKeys {
		fmt.Fprintf(&keys, "  %q:\n    roles: [ssh]\n", k)
	}
	data := []byte(fmt.Sprintf(`# Written by tether dev: the local user may do everything, on every node.
# Edit it and send the dev process SIGHUP (kill -HUP PID) to reload it;
# delete it to have the next tether dev write it again.
version: 1
roles:
  admin:
    - nodes: "*"
      operations: [exec, shell, cp.read, cp.write]
      paths: [/]
      run_as: %[1]q
    - nodes: "*"
      operations: [ssh]
      run_as: %[1]q
    - nodes: "*"
      operations: [forward]
      targets: [openshell, opensandbox, execd, own-ports]
    - nodes: "*"
      operations: [nodes.list]
    - nodes: "*"
      operations: [job.status, job.logs, job.cancel, sandboxes.register]
      scope: any
    - operations: [sandboxes.list, sandboxes.lease, sandboxes.reap]
      scope: any
    - operations: [admin]
%[3]sidentities:
  %[2]q:
    roles: [admin]
%[4]s`, runAs, identity, role.String(), keys.String()))
	if _, err := policy.Parse("dev policy", data); err != nil {
		return nil, fmt.Errorf("dev policy for %s running as %q: %w", identity, runAs, err)
	}
	return data, nil
}
