package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator/authlimit"
	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is the path the console is served under; Handler serves only
// paths below it.
const Prefix = "/console/"

// Fleet is what the console reads of the coordinator's node registry and
// tunnels; *coordinator.Coordinator has it.
type Fleet interface {
	// FleetNodes lists the nodes matching sel across coordinators.
	FleetNodes(sel protocol.Selector) []protocol.NodeInfo
	// JobPolicyNodes returns node ids as policy sees them (labels when
	// known).
	JobPolicyNodes(ids []string) []policy.Node
	// JobOutput reads a detached job's output through the node's tunnel.
	JobOutput(ctx context.Context, nodeID, id, stream string, offset, limit int64) ([]byte, protocol.JobOutputEnd, error)
}

// Jobs is the job store's read side; *jobstore.Store has it.
type Jobs interface {
	List(ctx context.Context, f jobstore.Filter, keep func(*jobstore.Record) bool, limit int) ([]*jobstore.Job, error)
	Get(ctx context.Context, id string) (*jobstore.Job, error)
}

// Ledger is the sandbox ledger's read side; *ledger.Ledger has it.
type Ledger interface {
	List(f ledger.Filter) []ledger.Record
	Leases() []ledger.Lease
	OwnerOf(r ledger.Record) string
	Ready() bool
}

// Audit is the audit log's read side; *audit.Recorder has it.
type Audit interface {
	Query(ctx context.Context, q protocol.AuditQueryRequest, maxBytes int) (*protocol.AuditQueryResponse, error)
}

// Config configures a Handler. Policy and Fleet are required; a nil Jobs,
// Ledger or Audit leaves its page saying that the coordinator runs
// without it.
type Config struct {
	// Policy is the policy in force (reloaded by its owner); every read
	// is decided by it.
	Policy *policy.Store
	Fleet  Fleet
	Jobs   Jobs
	Ledger Ledger
	Audit  Audit
	// Auditor records the console's own audit events (audit.go); nil
	// records none. *audit.Recorder is both Audit and Auditor.
	Auditor Auditor
	// Tokens returns the name of a console token (identity token:NAME)
	// and whether tok is one; it must compare in constant time. Nil turns
	// bearer tokens and the login exchange off.
	Tokens func(tok string) (name string, ok bool)
	// Local names a loopback caller without credentials by the uid owning
	// its socket (the connection must be served with
	// peeruid.ConnContext); nil leaves such callers unidentified.
	Local func(r *http.Request) (policy.Identity, bool)
	// AllowedHosts are further names (host names, IPs, *.domain; as
	// --facade-allowed-hosts) a caller given the Local identity may name
	// in Host, besides localhost, 127.0.0.0/8, ::1 and the connection's
	// local IP (package doc, DNS rebinding). An entry that is no name is
	// New's error.
	AllowedHosts []string
	// SessionTTL is how long a login cookie lasts; zero means 8 hours.
	SessionTTL time.Duration
	// Logger receives the console's errors; nil discards.
	Logger *slog.Logger
	// Registerer receives tether_auth_throttled_total{listener="console"}
	// (authlimit); nil registers it in a private registry.
	Registerer prometheus.Registerer
	// now is the clock (tests); nil means time.Now.
	now func() time.Time
}

// DefaultSessionTTL is Config.SessionTTL's default.
const DefaultSessionTTL = 8 * time.Hour

// Handler serves the console (New).
type Handler struct {
	cfg  Config
	log  *slog.Logger
	sess sessions // the session cookies' key and what logout ended (auth.go)
	// hosts are the names a caller given the Local identity may name in
	// Host (auth.go, loopbackHost): localhost, 127.0.0.0/8, ::1 and
	// Config.AllowedHosts; always checking.
	hosts *hostcheck.Policy
	pages map[string]*template.Template
	mux   *http.ServeMux
	// limit throttles failed bearer tokens and login tokens per source
	// IP (authlimit; auth.go).
	limit *authlimit.Limiter
}

var _ http.Handler = (*Handler)(nil)

// New returns the console's handler, for paths under Prefix. Errors name
// a missing collaborator or a template that does not parse.
func New(cfg Config) (*Handler, error) {
	if cfg.Policy == nil {
		return nil, errors.New("console: Config.Policy is required (the console decides every read by it)")
	}
	if cfg.Fleet == nil {
		return nil, errors.New("console: Config.Fleet is required")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	// Listen 127.0.0.1: the policy checks whatever address the admin
	// listener has, since the identity it guards is a loopback one.
	hosts, err := hostcheck.New(hostcheck.Config{Listen: "127.0.0.1", Allowed: cfg.AllowedHosts, Hint: hostsHint})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, sess: sessions{key: newKey()}, hosts: hosts}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.limit = authlimit.New(authlimit.Config{Listener: "console", Logger: h.log, Now: cfg.now})
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if err := h.limit.Register(reg); err != nil {
		return nil, fmt.Errorf("console: registering tether_auth_throttled_total: %w", err)
	}
	h.log = h.log.With("component", "console")
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("console: static files: %w", err)
	}
	// Literal patterns: the attack-surface test (cli TestSurface) finds
	// every route by scanning for them.
	m := http.NewServeMux()
	m.Handle("GET /console/static/", http.StripPrefix(Prefix+"static/", http.FileServerFS(static)))
	m.HandleFunc("GET /console/login", h.login)
	m.HandleFunc("POST /console/login", h.login)
	m.HandleFunc("GET /console/logout", h.logout)
	m.HandleFunc("GET /console/{$}", h.authed("console", "index", h.index))
	m.HandleFunc("GET /console/nodes", h.authed(policy.OpNodesList.String(), "nodes", h.nodes))
	m.HandleFunc("GET /console/jobs", h.authed(policy.OpJobStatus.String(), "jobs", h.jobs))
	m.HandleFunc("GET /console/jobs/{id}", h.authed(policy.OpJobStatus.String(), "job", h.job))
	m.HandleFunc("GET /console/jobs/{id}/output/{node}/{stream}", h.authed(policy.OpJobLogs.String(), "job output", h.output))
	m.HandleFunc("GET /console/sandboxes", h.authed(policy.OpSandboxesList.String(), "sandboxes", h.sandboxes))
	m.HandleFunc("GET /console/audit", h.authed(policy.OpAdmin.String(), "audit", h.audit))
	h.mux = m
	return h, nil
}

// ServeHTTP serves r with the console's security headers on every answer.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// Only this origin's stylesheet and script; no framing (clickjacking);
	// no form posts elsewhere.
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer") // a login URL's token never leaves in a Referer
	hd.Set("Cache-Control", "no-store")
	h.mux.ServeHTTP(w, r)
}

// parsePages parses each page template with the layout.
func parsePages() (map[string]*template.Template, error) {
	names := []string{"index", "nodes", "jobs", "job", "sandboxes", "audit", "login", "error"}
	out := make(map[string]*template.Template, len(names))
	for _, n := range names {
		t, err := template.New(n).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		out[n] = t
	}
	return out, nil
}

// newKey returns a random session MAC key (crypto/rand never fails).
func newKey() []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}
