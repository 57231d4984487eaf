//go:build !tetherclient

package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/internal/gcfloor"
	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// agentOptions are the flags of `tether agent`.
type agentOptions struct {
	// notify is systemd's notify socket (sdnotify.FromEnv); nil when not
	// run by systemd as Type=notify. Not a flag.
	notify *sdnotify.Notifier
	// Coordinators are the coordinators' tunnel addresses (host:port), tried
	// in turn. Required.
	Coordinators []string
	// CoordinatorsInOrder prefers Coordinators in the order given.
	CoordinatorsInOrder bool
	// Transports are how each coordinator address is dialed, in the order
	// tried: "tls" (raw TLS) and "wss" (WebSocket on the same port,
	// through $HTTPS_PROXY unless $NO_PROXY excludes the coordinator).
	// Empty means "tls".
	Transports []string
	// WebSocketPing is how long a wss connection may go without a write
	// before it sends a WebSocket ping: at least minWebSocketPing. Zero
	// means tunnel.DefaultPingInterval (15 s); negative, none. Given
	// (non-zero) only with "wss" in Transports.
	WebSocketPing time.Duration
	// TokenFile holds the join token (tether token create; whitespace is
	// trimmed) the agent enrolls with when IdentityDir holds no valid
	// certificate. Empty means $TETHER_TOKEN; one of them is required
	// until the agent has enrolled.
	TokenFile string
	// IdentityDir holds the node certificate and key and the pinned CA
	// (0600). Empty means DataDir/identity.
	IdentityDir string
	// SharedToken (deprecated) sends the token in Hello as the fleet-wide
	// shared token instead of enrolling; the coordinator must run with
	// --allow-shared-token.
	SharedToken bool
	// CAFile is the CA certificate (PEM) the coordinators' certificates
	// must chain to, e.g. a dev coordinator's DATA-DIR/pki/ca.crt. Empty
	// means the system roots.
	CAFile string
	// ServerName is the name to verify in the coordinator's certificate.
	// Empty means each address's host.
	ServerName string
	// NodeID names this node. Empty means the host name.
	NodeID string
	// Labels are the node's labels, "k=v,k2=v2". Optional.
	Labels string
	// DataDir is the working directory of jobs that name none. Default:
	// agent.DefaultDataDir() (/var/lib/tether/agent as root).
	DataDir string
	// MetricsAddr, if set, serves the agent's /metrics there. Default: off.
	MetricsAddr string
	// PipeWait, if positive, kills an exec's process group this long after
	// its main process exited when something still holds its output pipes
	// (agent.Config.PipeWait). Zero waits for the pipes, as ssh does.
	PipeWait time.Duration
	// CopyRoots are the absolute directories copies may write or read
	// under. Empty means the data directory only.
	CopyRoots []string
	// LocalPolicy is the node's local policy file (package
	// agent/localpolicy). Empty means localpolicy.DefaultPath when that
	// file exists, else none (jobs run as the agent's own user only).
	LocalPolicy string
	// JobRetention is how long finished detached jobs' files are kept.
	// Zero means agent.DefaultJobRetention.
	JobRetention time.Duration
	// OpenShell is the node's OpenShell gateway address (host:port): the
	// dial target "openshell" and a source of the sandbox inventory.
	// Optional.
	OpenShell string
	// OpenShellTokenFile holds the bearer token the agent sends to the
	// OpenShell gateway on its own calls: inventory listings and the
	// reaper's deletes (whitespace is trimmed). Empty means $TETHER_OPENSHELL_TOKEN, else none.
	OpenShellTokenFile string
	// OpenShellWorkspaces are the OpenShell workspaces the inventory lists.
	// Empty means "default".
	OpenShellWorkspaces []string
	// OpenSandbox is the node's OpenSandbox lifecycle server address
	// (host:port): the dial target "opensandbox" and a source of the
	// sandbox inventory. Optional.
	OpenSandbox string
	// OpenSandboxAPIKeyFile holds the API key the agent sends to the
	// OpenSandbox server on its own calls: inventory listings and the
	// reaper's deletes. Empty means
	// $TETHER_OPENSANDBOX_API_KEY, else none.
	OpenSandboxAPIKeyFile string
	// Targets are further dial targets, "NAME=HOST:PORT" each. Optional.
	Targets []string
	// Log configures logging to stderr.
	Log logOptions

	// transportGiven and pingGiven say that --transport and
	// --websocket-ping were on the command line (even as "" or 0).
	transportGiven, pingGiven bool

	labels  map[string]string // Labels, parsed by Validate
	targets map[string]string // Targets, parsed by Validate
	// config is the config file the options came from (with the flags);
	// nil without --config (config.go).
	config *configSource
}

// Environment variables holding the gateways' credentials, read (and then
// removed from the environment) when their file flags are not given.
const (
	openShellTokenEnv    = "TETHER_OPENSHELL_TOKEN"
	openSandboxAPIKeyEnv = "TETHER_OPENSANDBOX_API_KEY"
)

func defaultAgentOptions() agentOptions {
	return agentOptions{DataDir: agent.DefaultDataDir(), Log: defaultLogOptions()}
}

// minWebSocketPing is the shortest --websocket-ping: a ping every few
// milliseconds would be a flood of control frames (each one a TLS record
// and a pong back) that no proxy's idle timer needs.
const minWebSocketPing = time.Second

// joinTokenRequired starts the error of an agent that has neither a
// certificate nor a join token (a config file's errors name its key,
// configFile.missingKey).
const joinTokenRequired = "a join token is required"

// Validate reports every invalid option; envToken is $TETHER_TOKEN.
func (o *agentOptions) Validate(envToken string) error {
	var errs []error
	if len(o.Coordinators) == 0 {
		errs = append(errs, errors.New("--coordinator is required"))
	}
	for _, a := range o.Coordinators {
		if err := checkHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("--coordinator: %w", err))
		}
	}
	errs = append(errs, checkTransports(o.Transports, o.transportGiven, o.WebSocketPing, o.pingGiven)...)
	for _, r := range o.CopyRoots {
		if !filepath.IsAbs(r) {
			errs = append(errs, fmt.Errorf("--copy-root %q: must be an absolute path", r))
		}
	}
	if o.PipeWait < 0 || o.JobRetention < 0 {
		errs = append(errs, errors.New("--pipe-wait and --job-retention must not be negative"))
	}
	if o.LocalPolicy != "" {
		// Reported with the other problems, not only once they are fixed
		// (it is loaded again at start; this is the check).
		// (A missing file is said at start, where it is looked up.)
		if _, err := localpolicy.Load(o.LocalPolicy); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if o.TokenFile == "" && envToken == "" && !o.enrolled() {
		errs = append(errs, fmt.Errorf(joinTokenRequired+" until the agent has enrolled (no certificate in %s): create one with `tether token create`, then give --token-file or set %s", o.identityDir(), tokenEnv))
	}
	if o.SharedToken && o.TokenFile == "" && envToken == "" {
		errs = append(errs, fmt.Errorf("--shared-token needs the token: give --token-file or set %s", tokenEnv))
	}
	if o.NodeID != "" {
		if err := protocol.ValidNodeID(o.NodeID); err != nil {
			errs = append(errs, fmt.Errorf("--node-id: %w", err))
		}
	}
	labels, err := protocol.ParseLabels(o.Labels)
	if err != nil {
		errs = append(errs, fmt.Errorf("--labels: %w", err))
	}
	o.labels = labels
	if o.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is required"))
	}
	if o.MetricsAddr != "" {
		if err := checkHostPort(o.MetricsAddr); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-addr: %w", err))
		}
	}
	if err := o.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, o.validateTargets()...)
	return errors.Join(errs...)
}

// identityDir is IdentityDir or its default.
func (o *agentOptions) identityDir() string {
	if o.IdentityDir != "" {
		return o.IdentityDir
	}
	return filepath.Join(o.DataDir, agent.DefaultIdentityDirName)
}

// enrolled reports whether the identity directory holds a certificate
// (valid or not: the agent says which when it starts).
func (o *agentOptions) enrolled() bool {
	_, err := os.Stat(filepath.Join(o.identityDir(), tunnel.IdentityFile))
	return err == nil
}

// validateTargets checks the gateway and target flags and parses Targets.
func (o *agentOptions) validateTargets() []error {
	var errs []error
	if o.OpenShell != "" {
		if err := agent.CheckTargetAddr(o.OpenShell); err != nil {
			errs = append(errs, fmt.Errorf("--openshell: %w", err))
		}
	} else if o.OpenShellTokenFile != "" || len(o.OpenShellWorkspaces) > 0 {
		errs = append(errs, errors.New("--openshell-token-file and --openshell-workspace need --openshell"))
	}
	for _, w := range o.OpenShellWorkspaces {
		if strings.TrimSpace(w) == "" {
			errs = append(errs, errors.New("--openshell-workspace: empty workspace name"))
		}
	}
	if o.OpenSandbox != "" {
		if err := agent.CheckTargetAddr(o.OpenSandbox); err != nil {
			errs = append(errs, fmt.Errorf("--opensandbox: %w", err))
		}
	} else if o.OpenSandboxAPIKeyFile != "" {
		errs = append(errs, errors.New("--opensandbox-api-key-file needs --opensandbox"))
	}
	o.targets = nil
	for _, t := range o.Targets {
		name, addr, ok := strings.Cut(t, "=")
		if !ok {
			errs = append(errs, fmt.Errorf("--target %q: want NAME=HOST:PORT", t))
			continue
		}
		switch {
		case name == protocol.TargetOpenShell || name == protocol.TargetOpenSandbox:
			errs = append(errs, fmt.Errorf("--target %q: the name %s is reserved: give the gateway with --%s", t, name, name))
			continue
		case name == protocol.TargetOwnPorts:
			errs = append(errs, fmt.Errorf("--target %q: the name %s is reserved for SSH port forwards to a login's own loopback ports (a policy forward grant of target %s)", t, name, name))
			continue
		case o.targets[name] != "":
			errs = append(errs, fmt.Errorf("--target %q: target %s is given twice", t, name))
			continue
		}
		if err := protocol.ValidTargetName(name); err != nil {
			errs = append(errs, fmt.Errorf("--target: %w", err))
			continue
		}
		if err := agent.CheckTargetAddr(addr); err != nil {
			errs = append(errs, fmt.Errorf("--target %s: %w", name, err))
			continue
		}
		if o.targets == nil {
			o.targets = map[string]string{}
		}
		o.targets[name] = addr
	}
	return errs
}

// agentSecrets are the gateway credentials, read from their files or the
// environment.
type agentSecrets struct {
	openShellToken, openSandboxAPIKey string
}

// readAgentSecrets reads the gateway credentials o names: each from its
// file when given (whitespace trimmed; an empty file is an error), else
// from env (the values of TETHER_OPENSHELL_TOKEN and
// TETHER_OPENSANDBOX_API_KEY). Errors name the file, never the secret.
func readAgentSecrets(o *agentOptions, env agentSecrets) (agentSecrets, error) {
	s := agentSecrets{
		openShellToken:    strings.TrimSpace(env.openShellToken),
		openSandboxAPIKey: strings.TrimSpace(env.openSandboxAPIKey),
	}
	read := func(flag, path string) (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("%s: %w", flag, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return "", fmt.Errorf("%s: file %s is empty", flag, path)
		}
		return v, nil
	}
	var err error
	if o.OpenShellTokenFile != "" {
		if s.openShellToken, err = read("--openshell-token-file", o.OpenShellTokenFile); err != nil {
			return s, err
		}
	}
	if o.OpenSandboxAPIKeyFile != "" {
		if s.openSandboxAPIKey, err = read("--opensandbox-api-key-file", o.OpenSandboxAPIKeyFile); err != nil {
			return s, err
		}
	}
	return s, nil
}

func newAgentCmd(e *env) *cobra.Command {
	o := defaultAgentOptions()
	return agentCommand(e, &o)
}

// agentCommand is `tether agent` with its flags bound to o (config.go
// builds a second one to re-read the config file on SIGHUP).
func agentCommand(e *env, o *agentOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent --coordinator ADDR[,ADDR...] [--token-file FILE | TETHER_TOKEN=...]",
		Short: "Run a node agent: dial out to a coordinator and run its jobs",
		Args:  cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			// The config file first, while the environment it defers to
			// (flag > env > file) is still set.
			src, err := loadDaemonConfig(cmd, e, agentConfigRole, &o.Log)
			if err != nil {
				if src != nil { // every problem at once
					err = errors.Join(err, src.annotate(o.Validate(src.getenv(e, tokenEnv))))
				}
				return usage(err)
			}
			o.config = src
			envToken := src.getenv(e, tokenEnv)
			envSecrets := agentSecrets{openShellToken: src.getenv(e, openShellTokenEnv), openSandboxAPIKey: src.getenv(e, openSandboxAPIKeyEnv)}
			// Read once, then gone from the process environment, so that
			// nothing the agent starts can inherit them (the agent also
			// filters them out of every job's environment).
			for _, k := range append([]string{tokenEnv, openShellTokenEnv, openSandboxAPIKeyEnv}, src.envRefs()...) {
				os.Unsetenv(k)
			}
			o.transportGiven, o.pingGiven = cmd.Flags().Changed("transport"), cmd.Flags().Changed("websocket-ping")
			// The same for systemd's NOTIFY_SOCKET and WATCHDOG_*: a job
			// must not pet the agent's watchdog.
			notify, err := sdnotify.FromEnv()
			if err != nil {
				return err
			}
			o.notify = notify
			if err := o.Validate(envToken); err != nil {
				return usage(src.annotate(err))
			}
			keepServingOnBrokenPipe()
			secrets, err := readAgentSecrets(o, envSecrets)
			if err != nil {
				return err
			}
			log := o.Log.logger(e.stderr)
			return runAgent(cmd.Context(), o, envToken, secrets, log)
		}),
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.Coordinators, "coordinator", o.Coordinators, "coordinator tunnel address host:port (comma-separated or repeated; a name with several A/AAAA records counts as several); the agent spreads over them by node id and moves on when one fails or drains")
	f.StringSliceVar(&o.Transports, "transport", o.Transports, "how to reach each coordinator, in the order tried: tls (raw TLS), wss (WebSocket over TLS on the same port, path "+tunnel.WebSocketPath+", through the CONNECT proxy of $HTTPS_PROXY unless $NO_PROXY excludes the coordinator); the one that last connected is tried first (default tls; an empty list or entry is an error)")
	durationVar(f, &o.WebSocketPing, "websocket-ping", o.WebSocketPing, "with --transport wss only: send a WebSocket ping after this long without a write; keep it below the proxy's idle timeout (at least 1s; default and 0: 15s; negative: no pings)")
	f.BoolVar(&o.CoordinatorsInOrder, "coordinators-in-order", false, "take the --coordinator addresses in the order given (the first preferred, the rest as fallbacks) instead of spreading by node id")
	f.StringVar(&o.TokenFile, "token-file", o.TokenFile, "file holding the join token to enroll with until the agent has a certificate (default: $TETHER_TOKEN)")
	f.StringVar(&o.IdentityDir, "identity-dir", o.IdentityDir, "directory of the node certificate, key and pinned CA (default: DATA-DIR/identity)")
	f.BoolVar(&o.SharedToken, "shared-token", o.SharedToken, "deprecated: present the token as the fleet-wide shared token instead of enrolling (coordinator --allow-shared-token)")
	f.StringVar(&o.CAFile, "ca-file", o.CAFile, "CA certificate to trust for the coordinator (default: system roots)")
	f.StringVar(&o.ServerName, "server-name", o.ServerName, "name to verify in the coordinator's certificate (default: the address's host)")
	f.StringVar(&o.NodeID, "node-id", o.NodeID, "node id (default: host name)")
	f.StringVar(&o.Labels, "labels", o.Labels, "node labels k=v,k2=v2")
	f.StringVar(&o.DataDir, "data-dir", o.DataDir, "working directory of jobs that name none")
	f.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "serve /metrics on this address (default: off)")
	durationVar(f, &o.PipeWait, "pipe-wait", o.PipeWait, "after a job's main process exited, kill its process group if its output is still open this long later; the result is then output_cut and truncated (default 0: wait, like ssh)")
	durationVar(f, &o.JobRetention, "job-retention", o.JobRetention, "keep finished detached jobs' output this long (default 24h)")
	f.StringSliceVar(&o.CopyRoots, "copy-root", nil, "directory copies may write to and read from (repeatable or comma-separated; default: the data dir)")
	f.StringVar(&o.LocalPolicy, "local-policy", o.LocalPolicy, "the node's local policy file, enforced whatever the coordinator asks; reloaded on SIGHUP (default: "+localpolicy.DefaultPath+" when present, else none: jobs run as the agent's own user only)")
	f.StringVar(&o.OpenShell, "openshell", o.OpenShell, "the node's OpenShell gateway address host:port (dial target \"openshell\", listed in inventories)")
	f.StringVar(&o.OpenShellTokenFile, "openshell-token-file", o.OpenShellTokenFile, "file holding the bearer token for the agent's own OpenShell calls (inventory, reaper deletes) (default: $"+openShellTokenEnv+", else none)")
	f.StringArrayVar(&o.OpenShellWorkspaces, "openshell-workspace", nil, "OpenShell workspace to list in inventories (repeatable; default: default)")
	f.StringVar(&o.OpenSandbox, "opensandbox", o.OpenSandbox, "the node's OpenSandbox lifecycle server address host:port (dial target \"opensandbox\", listed in inventories)")
	f.StringVar(&o.OpenSandboxAPIKeyFile, "opensandbox-api-key-file", o.OpenSandboxAPIKeyFile, "file holding the API key for the agent's own OpenSandbox calls (inventory, reaper deletes) (default: $"+openSandboxAPIKeyEnv+", else none)")
	f.StringArrayVar(&o.Targets, "target", nil, "further dial target NAME=HOST:PORT (repeatable)")
	o.Log.addFlags(cmd)
	addConfigFlag(cmd)
	return cmd
}

// runAgent runs the agent until ctx is done. o must be valid.
func runAgent(ctx context.Context, o *agentOptions, envToken string, secrets agentSecrets, log *slog.Logger) error {
	gcfloor.Start(ctx, gcfloor.Default)
	var token string
	if o.TokenFile != "" || envToken != "" {
		t, _, err := resolveToken(o.TokenFile, envToken, "")
		switch {
		case errors.Is(err, os.ErrNotExist) && o.enrolled() && !o.SharedToken:
			// Enrolled: the join token was for once, and may be gone.
			log.Info("no join token file; using the node certificate", "token_file", o.TokenFile, "identity_dir", o.identityDir())
		case err != nil:
			return err
		}
		token = t
	}
	tlsCfg, err := tunnel.LoadClientTLS(o.CAFile)
	if err != nil {
		return err
	}
	tlsCfg.ServerName = o.ServerName
	reg := newRegistry()
	cfg := agent.DefaultConfig()
	if o.NodeID != "" {
		cfg.NodeID = o.NodeID
	}
	cfg.Labels = o.labels
	cfg.Coordinators = o.Coordinators
	cfg.CoordinatorsInOrder = o.CoordinatorsInOrder
	cfg.Transports = o.Transports
	cfg.WebSocketPing = o.WebSocketPing
	cfg.Token = token
	cfg.SharedToken = o.SharedToken
	cfg.IdentityDir = o.IdentityDir
	cfg.TLS = tlsCfg
	cfg.DataDir = o.DataDir
	cfg.PipeWait = o.PipeWait
	cfg.CopyRoots = o.CopyRoots
	lp, lpPath, err := loadLocalPolicy(o.LocalPolicy)
	if err != nil {
		return err
	}
	cfg.LocalPolicy = lp
	// Copies never read or write the files holding the agent's secrets.
	for _, f := range []string{o.TokenFile, o.OpenShellTokenFile, o.OpenSandboxAPIKeyFile} {
		if f != "" {
			cfg.SecretFiles = append(cfg.SecretFiles, f)
		}
	}
	if o.OpenShell != "" {
		cfg.OpenShell = &agent.OpenShellTarget{Addr: o.OpenShell, Token: secrets.openShellToken, Workspaces: o.OpenShellWorkspaces}
	}
	if o.OpenSandbox != "" {
		cfg.OpenSandbox = &agent.OpenSandboxTarget{Addr: o.OpenSandbox, APIKey: secrets.openSandboxAPIKey}
	}
	cfg.Targets = o.targets
	if o.JobRetention > 0 {
		cfg.JobRetention = o.JobRetention
	}
	cfg.Version = version
	cfg.Logger = log
	cfg.Registerer = reg
	cfg.Notify = o.notify
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	if lp != nil {
		log.Info("local policy loaded", "file", lpPath)
	}
	defer watchAgentReload(ctx, a, lpPath, o.LocalPolicy, o.config, o.notify, log)()
	if o.MetricsAddr != "" {
		_, stop, err := serveMetrics(o.MetricsAddr, reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return agentRunError(a.Run(ctx))
}

// agentRunError maps the agent's Run error to the command's: a refused
// enrollment ends tether agent with agent.ExitEnrollRefused (78), which
// the systemd unit does not restart (RestartPreventExitStatus), so that
// systemctl status shows the refusal instead of a loop of retries.
func agentRunError(err error) error {
	if errors.Is(err, agent.ErrEnrollRefused) {
		return &exitError{code: agent.ExitEnrollRefused, err: err}
	}
	return err
}

// serveMetrics serves g's /metrics on addr, with adminLimits, until stop
// is called; stop waits for the server goroutine. bound is the listener's
// address.
func serveMetrics(addr string, g prometheus.Gatherer, log *slog.Logger) (bound net.Addr, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	srv := newHTTPServer(mux, adminLimits)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(limitConns(ln, adminLimits.MaxConns)) }()
	log.Info("serving metrics", "addr", ln.Addr().String())
	return ln.Addr(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "err", err)
		}
	}, nil
}

// checkTransports reports what is wrong with --transport and
// --websocket-ping (of `tether agent` and `tether dev`): given and
// pingGiven say whether each flag was on the command line, so that an
// empty --transport is an error rather than the default.
func checkTransports(transports []string, given bool, ping time.Duration, pingGiven bool) []error {
	var errs []error
	if given && len(transports) == 0 {
		// pflag reads --transport '' as no entries, which would mean the
		// default; "wss," has an empty one, an error: both are a value
		// the user meant to write and did not.
		errs = append(errs, fmt.Errorf("--transport is empty: want %s, %s or both, comma-separated in the order to try (leave the flag out for %s)", agent.TransportTLS, agent.TransportWebSocket, agent.TransportTLS))
	}
	emptyEntry := false
	for i, t := range transports {
		switch {
		case strings.TrimSpace(t) == "":
			if !emptyEntry {
				errs = append(errs, fmt.Errorf("--transport %q has an empty entry (a stray comma?): want %s, %s or both, comma-separated", strings.Join(transports, ","), agent.TransportTLS, agent.TransportWebSocket))
			}
			emptyEntry = true
		case t != agent.TransportTLS && t != agent.TransportWebSocket:
			errs = append(errs, fmt.Errorf("--transport %q: want %s or %s", t, agent.TransportTLS, agent.TransportWebSocket))
		case slices.Index(transports, t) != i:
			errs = append(errs, fmt.Errorf("--transport %q is listed twice", t))
		}
	}
	switch {
	case (pingGiven || ping != 0) && !slices.Contains(transports, agent.TransportWebSocket):
		list := strings.Join(transports, ",")
		if len(transports) == 0 {
			list = agent.TransportTLS + " (the default)"
		}
		errs = append(errs, fmt.Errorf("--websocket-ping applies to the %s transport only, and --transport is %s: add it (--transport %s,%s) or leave --websocket-ping out", agent.TransportWebSocket, list, agent.TransportTLS, agent.TransportWebSocket))
	case ping > 0 && ping < minWebSocketPing:
		errs = append(errs, fmt.Errorf("--websocket-ping %s: want at least %s (0: the default, %s; negative: no pings)", humanDuration(ping), humanDuration(minWebSocketPing), humanDuration(tunnel.DefaultPingInterval)))
	}
	return errs
}
