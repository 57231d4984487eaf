//go:build !tetherclient

package cli

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/console"
	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/policy"
)

// consoleOptions are the coordinator's web console flags.
type consoleOptions struct {
	// Off turns the console off (--no-console): the admin address then
	// serves /metrics, /healthz and /readyz only.
	Off bool
	// TokenFile holds the console's tokens, in --facade-token-file's
	// format (one bare token, named "facade", or NAME TOKEN lines); each
	// holder is identity token:NAME. Empty: no token login; loopback
	// callers are named by their uid only.
	TokenFile string
	// NoLoopback gives a loopback caller without credentials no identity
	// (--console-no-loopback): for a coordinator behind a proxy on its
	// host that does not add X-Forwarded-For, whose every caller then
	// arrives from loopback.
	NoLoopback bool
}

func (o *consoleOptions) addFlags(f interface {
	BoolVar(p *bool, name string, value bool, usage string)
	StringVar(p *string, name string, value string, usage string)
}) {
	f.BoolVar(&o.Off, "no-console", o.Off, "serve no web console under /console/ on the admin address")
	f.BoolVar(&o.NoLoopback, "console-no-loopback", o.NoLoopback, "give a loopback caller without credentials no console identity (its socket's local user otherwise); for a proxy on this host that adds no X-Forwarded-For")
	f.StringVar(&o.TokenFile, "console-token-file", o.TokenFile, "tokens of the web console (--facade-token-file's format; holders are token:NAME); default: none, loopback callers only")
}

// consoleTokens reads the token file; nil without one.
func (o *consoleOptions) tokens() (func(string) (string, bool), error) {
	if o.TokenFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("console token file: %w", err)
	}
	toks, err := parseFacadeTokens(o.TokenFile, data)
	if err != nil {
		return nil, fmt.Errorf("console token file: %w", err)
	}
	_, name := tokenChecker(toks)
	return func(tok string) (string, bool) {
		n := name(tok) // constant time over every token; names are never empty
		return n, n != ""
	}, nil
}

// adminHandler is the admin address's handler: the coordinator's admin
// endpoints, and the console under console.Prefix unless it is off. The
// server must use peeruid.ConnContext for the console's loopback callers.
// allowedHosts (--facade-allowed-hosts) are the further names a loopback
// caller without credentials may name in Host (console.Config); reg
// receives the console's metrics.
func (o *consoleOptions) adminHandler(admin http.Handler, coord *coordinator.Coordinator, cs *coordinatorServer, jobs *jobstore.Store, local func(uint32) policy.Identity, allowedHosts []string, reg prometheus.Registerer, log *slog.Logger) (http.Handler, error) {
	if o.Off {
		return admin, nil
	}
	tokens, err := o.tokens()
	if err != nil {
		return nil, err
	}
	cfg := console.Config{
		Policy:       cs.policy,
		Fleet:        coord,
		Jobs:         jobs,
		Tokens:       tokens,
		Logger:       log,
		Registerer:   reg,
		AllowedHosts: allowedHosts,
		Local: func(r *http.Request) (policy.Identity, bool) {
			uid, err := peeruid.FromContext(r.Context())
			if err != nil {
				return policy.Identity{}, false
			}
			id := local(uid)
			return id, id.Kind.Valid()
		},
	}
	if o.NoLoopback {
		cfg.Local = nil
	}
	if cs.sbx != nil {
		cfg.Ledger = cs.sbx.Ledger()
	}
	if cs.audit != nil {
		cfg.Audit, cfg.Auditor = cs.audit, cs.audit
	}
	con, err := console.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	// Paths under the prefix are the console's (its own mux cleans them);
	// the rest the admin endpoints'.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == strings.TrimSuffix(console.Prefix, "/") {
			http.Redirect(w, r, console.Prefix, http.StatusMovedPermanently)
			return
		}
		if strings.HasPrefix(r.URL.Path, console.Prefix) {
			con.ServeHTTP(w, r)
			return
		}
		admin.ServeHTTP(w, r)
	}), nil
}
