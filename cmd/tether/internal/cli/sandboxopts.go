//go:build !tetherclient

package cli

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/coordinator/sandboxes"
	"github.com/tetherfleet/tether/policy"
)

// facadeTokenFile is the generated facade token in the data directory.
const facadeTokenFile = "facade-token"

// minFacadeToken is the shortest facade token accepted, in characters: the
// token is all that stands between the network and every node's gateways.
const minFacadeToken = 16

// loopbackIdentity names the callers of facades without an authentication
// boundary (loopback, no --facade-tls-cert), for policy: by the uid that
// owns the caller's socket, token:loopback-uid-UID (peeruid.Identity), so
// a policy grants local users one by one. A caller whose uid cannot be
// learnt is unidentified (refused). tether dev names its own uid the dev
// user instead (sandboxOptions.local).
func loopbackIdentity(uid uint32) policy.Identity { return peeruid.Identity(uid) }

// sandboxOptions are the coordinator's sandbox flags: facades, ledger,
// reaper.
type sandboxOptions struct {
	// local, if set, replaces loopbackIdentity (tether dev: the dev
	// user's identity for its own uid).
	local func(uid uint32) policy.Identity
	// OpenShellListen and OpenSandboxListen are the facades' addresses;
	// "" turns a facade off. Defaults 127.0.0.1:7081 and 127.0.0.1:7082.
	OpenShellListen, OpenSandboxListen string
	// TLSCert and TLSKey serve the facades over TLS; required for a facade
	// that listens on a non-loopback address.
	TLSCert, TLSKey string
	// ClientCA, if set, lets callers authenticate with a client
	// certificate signed by it instead of a token.
	ClientCA string
	// TokenFile holds the token facade callers present (gRPC metadata
	// tether-token, HTTP header Tether-Token) when the facades are an
	// authentication boundary. Default DATA-DIR/facade-token, generated.
	TokenFile string
	// ExternalHost is how OpenSandbox callers reach the facade, for the
	// endpoints it rewrites; default the request's Host.
	ExternalHost string
	// AllowedHosts are further names the facades answer to (Host,
	// :authority, Origin): host names, IP addresses, *.domain. A facade on
	// loopback otherwise answers to loopback names only; one on another
	// address to any name.
	AllowedHosts []string
	// DefaultTTL is the TTL of OpenShell sandboxes created through the
	// facade without a tether-ttl (OpenShell has none of its own).
	DefaultTTL time.Duration
	// InventoryInterval is how often every node's gateways are listed.
	InventoryInterval time.Duration
	// ReapGrace is how long an unowned managed sandbox lives; negative
	// never reaps unowned sandboxes.
	ReapGrace time.Duration
	// ReapRate bounds reaper deletes per second.
	ReapRate float64
	// DryRun makes the reaper log what it would delete, and delete nothing.
	DryRun bool
	// NoReaper turns the reaper off.
	NoReaper bool
}

func defaultSandboxOptions() sandboxOptions {
	return sandboxOptions{
		OpenShellListen:   "127.0.0.1:7081",
		OpenSandboxListen: "127.0.0.1:7082",
		InventoryInterval: 30 * time.Second,
		ReapGrace:         ledger.DefaultGrace,
		ReapRate:          20,
	}
}

func (o *sandboxOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.OpenShellListen, "openshell-listen", o.OpenShellListen, `OpenShell gRPC facade address ("" turns it off)`)
	f.StringVar(&o.OpenSandboxListen, "opensandbox-listen", o.OpenSandboxListen, `OpenSandbox HTTP facade address ("" turns it off)`)
	f.StringVar(&o.TLSCert, "facade-tls-cert", o.TLSCert, "facade TLS certificate (PEM); required for a non-loopback facade address")
	f.StringVar(&o.TLSKey, "facade-tls-key", o.TLSKey, "facade TLS key (PEM)")
	f.StringVar(&o.ClientCA, "facade-client-ca", o.ClientCA, "CA (PEM) whose client certificates authenticate facade callers")
	f.StringVar(&o.TokenFile, "facade-token-file", o.TokenFile, "token facade callers present as tether-token (default: DATA-DIR/facade-token, generated)")
	f.StringVar(&o.ExternalHost, "facade-external-host", o.ExternalHost, "host[:port] OpenSandbox callers reach the facade at (default: the request's Host)")
	addAllowedHostsFlag(cmd, &o.AllowedHosts)
	durationVar(f, &o.DefaultTTL, "sandbox-ttl", o.DefaultTTL, "TTL of OpenShell sandboxes created without tether-ttl (0: none)")
	durationVar(f, &o.InventoryInterval, "inventory-interval", o.InventoryInterval, "how often every node's gateways are listed")
	durationVar(f, &o.ReapGrace, "reap-grace", o.ReapGrace, "how long an unowned NeMo Gym sandbox may live (negative: never reap unowned)")
	f.Float64Var(&o.ReapRate, "reap-rate", o.ReapRate, "reaper deletes per second, fleet-wide")
	f.BoolVar(&o.DryRun, "reap-dry-run", o.DryRun, "log what the reaper would delete, delete nothing")
	f.BoolVar(&o.NoReaper, "no-reaper", o.NoReaper, "do not run the reaper")
}

// allowedHostsHint ends the facades' refusals of a foreign name.
const allowedHostsHint = "if callers really use that name, add it to --facade-allowed-hosts"

// addAllowedHostsFlag adds --facade-allowed-hosts to cmd.
func addAllowedHostsFlag(cmd *cobra.Command, hosts *[]string) {
	cmd.Flags().StringSliceVar(hosts, "facade-allowed-hosts", *hosts,
		"further names the facades answer to (Host, :authority, Origin), and the web console to a loopback caller without credentials (Host): host names, IPs, *.domain; comma-separated or repeated. "+
			"Default: on loopback only localhost, 127.0.0.0/8, ::1; on another address any name")
}

// checkAllowedHosts reports the entries of --facade-allowed-hosts that are
// not names.
func checkAllowedHosts(hosts []string) error {
	if _, err := hostcheck.New(hostcheck.Config{Allowed: hosts}); err != nil {
		return fmt.Errorf("--facade-allowed-hosts: %w", err)
	}
	return nil
}

// secure reports whether addr needs the authentication boundary: it is not
// a loopback address (the gateways behind the facades trust loopback).
func secureAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	switch {
	case err != nil:
		return true
	case host == "localhost":
		return false
	}
	ip := net.ParseIP(host) // nil for "" (every interface) and names
	return ip == nil || !ip.IsLoopback()
}

// Validate reports every invalid option.
func (o *sandboxOptions) Validate() error {
	var errs []error
	for _, a := range []struct{ flag, addr string }{{"--openshell-listen", o.OpenShellListen}, {"--opensandbox-listen", o.OpenSandboxListen}} {
		if a.addr == "" {
			continue
		}
		if err := checkHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.flag, err))
		} else if secureAddr(a.addr) && o.TLSCert == "" {
			errs = append(errs, fmt.Errorf("%s %s is not a loopback address: the gateways behind the facade trust loopback callers, so give --facade-tls-cert and --facade-tls-key (callers then need the facade token or a client certificate)", a.flag, a.addr))
		}
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		errs = append(errs, errors.New("--facade-tls-cert and --facade-tls-key go together"))
	}
	if o.ClientCA != "" && o.TLSCert == "" {
		errs = append(errs, errors.New("--facade-client-ca needs --facade-tls-cert"))
	}
	if o.TokenFile != "" && o.TLSCert == "" {
		errs = append(errs, errors.New("--facade-token-file needs --facade-tls-cert: facades on loopback check no token"))
	}
	if err := checkAllowedHosts(o.AllowedHosts); err != nil {
		errs = append(errs, err)
	}
	if o.DefaultTTL < 0 {
		errs = append(errs, fmt.Errorf("--sandbox-ttl %s is negative", humanDuration(o.DefaultTTL)))
	}
	if o.InventoryInterval <= 0 {
		errs = append(errs, fmt.Errorf("--inventory-interval %s must be positive", humanDuration(o.InventoryInterval)))
	}
	if !(o.ReapRate > 0) || math.IsInf(o.ReapRate, 1) { // NaN fails the comparison
		errs = append(errs, fmt.Errorf("--reap-rate %v must be a positive number", o.ReapRate))
	}
	return errors.Join(errs...)
}

// sandboxListeners are the facades' bound listeners.
type sandboxListeners struct {
	openShell, openSandbox net.Listener
}

func (l *sandboxListeners) close() {
	if l.openShell != nil {
		l.openShell.Close()
	}
	if l.openSandbox != nil {
		l.openSandbox.Close()
	}
}

// bind binds the facade listeners, so a busy port fails at start.
func (o *sandboxOptions) bind() (*sandboxListeners, error) {
	var ls sandboxListeners
	var err error
	if o.OpenShellListen != "" {
		if ls.openShell, err = net.Listen("tcp", o.OpenShellListen); err != nil {
			return nil, fmt.Errorf("openshell facade listener: %w", err)
		}
	}
	if o.OpenSandboxListen != "" {
		if ls.openSandbox, err = net.Listen("tcp", o.OpenSandboxListen); err != nil {
			ls.close()
			return nil, fmt.Errorf("opensandbox facade listener: %w", err)
		}
	}
	return &ls, nil
}

// open opens the ledger and prepares the facades' security. The result's
// Attach and Run are the caller's.
func (o *sandboxOptions) open(ctx context.Context, ls *sandboxListeners, dataDir, id string, nc *nats.Conn, log *slog.Logger, reg prometheus.Registerer) (*sandboxes.Service, error) {
	cfg := sandboxes.Config{
		NATS: nc, ID: id, Logger: log, Registerer: reg,
		NoReaper:          o.NoReaper,
		InventoryInterval: o.InventoryInterval,
		OpenShell:         ls.openShell,
		OpenSandbox:       ls.openSandbox,
		ExternalHost:      o.ExternalHost,
		DefaultTTL:        o.DefaultTTL,
		AllowedHosts:      o.AllowedHosts,
		AllowedHostsHint:  allowedHostsHint,
		Local:             o.local,
	}
	if cfg.Local == nil {
		cfg.Local = loopbackIdentity
	}
	cfg.Reaper.Grace = o.ReapGrace
	cfg.Reaper.Rate = o.ReapRate
	cfg.Reaper.DryRun = o.DryRun
	if o.TLSCert != "" {
		tlsCfg, err := o.tlsConfig()
		if err != nil {
			return nil, err
		}
		cfg.OpenShellTLS, cfg.OpenSandboxTLS = tlsCfg, tlsCfg.Clone()
		cfg.OpenSandboxTLS.NextProtos = []string{"http/1.1"} // WebSocket upgrades need HTTP/1.1
		path := o.TokenFile
		var toks []namedToken
		if path != "" {
			// A file the operator named must exist: creating it would
			// lock out the callers that hold the intended token.
			var data []byte
			if data, err = os.ReadFile(path); err == nil {
				toks, err = parseFacadeTokens(path, data)
			}
		} else {
			path = filepath.Join(dataDir, facadeTokenFile)
			var tok string
			if tok, err = loadOrCreateSecret(path); err == nil {
				toks, err = parseFacadeTokens(path, []byte(tok))
			}
		}
		if err != nil {
			return nil, fmt.Errorf("facade token: %w", err)
		}
		cfg.CheckToken, cfg.TokenName = tokenChecker(toks)
		log.Info("facades require a tether-token or a client certificate", "token_file", path)
	}
	return sandboxes.Open(ctx, cfg)
}

// tlsConfig loads the facades' certificate and, if given, the client CA.
func (o *sandboxOptions) tlsConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("facade TLS: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if o.ClientCA != "" {
		pem, err := os.ReadFile(o.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("facade client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("facade client CA %s: no PEM certificate in it", o.ClientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// namedToken is one facade token and the name policy knows its holder by
// (identity token:NAME).
type namedToken struct{ name, token string }

// defaultTokenName names the token of a file that holds one bare token.
const defaultTokenName = "facade"

// parseFacadeTokens reads a facade token file: either one bare token
// (named "facade": identity token:facade), or one "NAME TOKEN" per line
// (blank lines and lines starting with # ignored), each NAME 1-64 of
// [A-Za-z0-9._-] starting with a letter or digit, each TOKEN at least
// minFacadeToken characters; names and tokens are unique. Errors name
// FILE:LINE and never the token.
func parseFacadeTokens(path string, data []byte) ([]namedToken, error) {
	text := strings.TrimSpace(string(data))
	if text == "" {
		return nil, fmt.Errorf("token file %s is empty", path)
	}
	if !strings.ContainsAny(text, " \t\n#") {
		if len(text) < minFacadeToken {
			return nil, fmt.Errorf("facade token in %s is %d characters; use at least %d random ones (e.g. openssl rand -hex 32)", path, len(text), minFacadeToken)
		}
		return []namedToken{{defaultTokenName, text}}, nil
	}
	var out []namedToken
	names, tokens := map[string]int{}, map[string]int{}
	var errs []error
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		at := fmt.Sprintf("%s:%d", path, i+1)
		f := strings.Fields(line)
		switch {
		case len(f) != 2:
			errs = append(errs, fmt.Errorf("%s: want NAME TOKEN (a name, then the token), got %d fields", at, len(f)))
			continue
		case !validTokenName(f[0]):
			errs = append(errs, fmt.Errorf("%s: token name %q: want 1-64 of [A-Za-z0-9._-], starting with a letter or digit", at, f[0]))
		case strings.HasPrefix(f[0], peeruid.IdentityPrefix):
			errs = append(errs, fmt.Errorf("%s: token name %s: names starting with %s are local users' (token:%sUID)", at, f[0], peeruid.IdentityPrefix, peeruid.IdentityPrefix))
		case len(f[1]) < minFacadeToken:
			errs = append(errs, fmt.Errorf("%s: the token of %s is %d characters; use at least %d random ones (e.g. openssl rand -hex 32)", at, f[0], len(f[1]), minFacadeToken))
		}
		if prev, dup := names[f[0]]; dup {
			errs = append(errs, fmt.Errorf("%s: token name %s is used on line %d too", at, f[0], prev))
		}
		if prev, dup := tokens[f[1]]; dup {
			errs = append(errs, fmt.Errorf("%s: the token of %s is also line %d's: each holder needs its own", at, f[0], prev))
		}
		names[f[0]], tokens[f[1]] = i+1, i+1
		out = append(out, namedToken{f[0], f[1]})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("token file %s holds no token", path)
	}
	return out, nil
}

// validTokenName reports whether s is a token name as policy's token:NAME
// identities take it.
func validTokenName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || !strings.ContainsRune("._-", rune(c))) {
			return false
		}
	}
	return true
}

// tokenChecker returns the facades' CheckToken (does a token match one of
// toks, compared in constant time against every one) and TokenName (the
// name of a token CheckToken accepted).
func tokenChecker(toks []namedToken) (check func(string) bool, name func(string) string) {
	sums := make([][sha256.Size]byte, len(toks))
	for i, t := range toks {
		sums[i] = sha256.Sum256([]byte(t.token))
	}
	find := func(got string) int {
		g := sha256.Sum256([]byte(got))
		found := -1
		for i := range sums {
			if subtle.ConstantTimeCompare(g[:], sums[i][:]) == 1 {
				found = i
			}
		}
		return found
	}
	return func(got string) bool { return find(got) >= 0 },
		func(got string) string {
			if i := find(got); i >= 0 {
				return toks[i].name
			}
			return ""
		}
}
