package opensandbox

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator/authlimit"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
)

// Headers the facade reads. Every header starting with "Tether-" is removed
// before a request reaches a node.
const (
	// HeaderToken carries a coordinator-issued token when Config.CheckToken
	// is set. It is distinct from the server's own OPEN-SANDBOX-API-KEY and
	// Authorization headers, which pass through untouched.
	HeaderToken = "Tether-Token"
	// HeaderNode places a create on the node with exactly this id.
	HeaderNode = "Tether-Node"
	// HeaderNodeSelector places a create on the least loaded node whose
	// labels match this selector (protocol.ParseSelector syntax).
	HeaderNodeSelector = "Tether-Node-Selector"
	// HeaderRun names the lease (run id) that owns a sandbox created with
	// it; the ledger records it as the sandbox's Owner. It must be a valid
	// run id (protocol.ValidRunID).
	HeaderRun = "Tether-Run"
)

// tetherHeaderPrefix is the canonical prefix of the facade's own headers.
const tetherHeaderPrefix = "Tether-"

// Limits of what the facade reads into memory.
const (
	// maxDecodeBody bounds a response body the facade decodes or rewrites
	// (create, get, renew, endpoint, id lookups); a larger one passes
	// through unread.
	maxDecodeBody = 1 << 20
	// maxListPageBody bounds one list page from a node (200 sandboxes).
	maxListPageBody = 32 << 20
	// maxListPages bounds how many pages of 200 the facade reads from one
	// node for a list (200,000 sandboxes).
	maxListPages = 1000
	// maxFanOut bounds the nodes one list or lookup asks at once.
	maxFanOut = 64
	// maxFound bounds the ids remembered from lookups (foundCache).
	maxFound = 16384
	// ledgerTimeout bounds one ledger write. Writes run even when the
	// caller has gone: a create the server accepted must be recorded.
	ledgerTimeout = 5 * time.Second
)

// Fleet is what the facade needs of the coordinator's node registry;
// *coordinator.Coordinator satisfies it.
type Fleet interface {
	// Nodes lists connected nodes matching sel (zero Selector = all);
	// NodeInfo.Targets lists their targets and NodeInfo.SessionID their
	// current tunnel session.
	Nodes(sel protocol.Selector) []protocol.NodeInfo
	// DialTarget opens a dial stream to target on node; the returned conn
	// carries raw bytes. Errors name the node and target.
	DialTarget(ctx context.Context, node, target string) (net.Conn, error)
}

// Ledger is what the facade needs of the sandbox ledger; *ledger.Ledger
// satisfies it.
type Ledger interface {
	// Created records a sandbox created through the facade (or a NeMo Gym
	// one the facade found): the record becomes live and managed, and
	// owned by r.Owner when set.
	Created(ctx context.Context, r ledger.Record) error
	// SetExpiry records a sandbox's new expiresAt; unknown keys are
	// ignored.
	SetExpiry(ctx context.Context, k ledger.Key, expiresAt time.Time) error
	// Deleting records that a delete was forwarded to the node.
	Deleting(ctx context.Context, k ledger.Key) error
	// Deleted records that the node confirmed the sandbox gone.
	Deleted(ctx context.Context, k ledger.Key) error
	// ByID finds a sandbox by provider and id.
	ByID(provider, id string) (ledger.Record, bool)
	// List lists records (the facade asks for live OpenSandbox ones).
	List(f ledger.Filter) []ledger.Record
	// LiveOn counts the live sandboxes on node (placement).
	LiveOn(node string) int
	// RunClosed reports whether run's lease was closed (a create for it is
	// refused).
	RunClosed(run string) bool
}

var _ Ledger = (*ledger.Ledger)(nil)

// Config configures New.
type Config struct {
	// Fleet reaches the nodes. Required.
	Fleet Fleet
	// Ledger records creates and deletes and routes ids. Required.
	Ledger Ledger
	// Logger receives the facade's logs. Nil discards them.
	Logger *slog.Logger
	// Registerer receives the facade's metrics, among them
	// tether_auth_throttled_total{listener="opensandbox"} (authlimit). Nil
	// registers them in a private registry (never
	// prometheus.DefaultRegisterer).
	Registerer prometheus.Registerer
	// ExternalHost is the "host[:port]" (no scheme, no path) callers reach
	// the facade at, used in rewritten endpoints and Location headers
	// (like the server's server.eip). Empty: the request's Host header.
	ExternalHost string
	// CheckToken, when set, makes the facade an authentication boundary:
	// every request needs a Tether-Token header it accepts, or a TLS
	// connection with a verified client certificate. Nil: no check (the
	// facade is bound to loopback). Failed tokens are throttled per source
	// IP (authlimit; the connection's remote address, never
	// X-Forwarded-For): past the burst, every request of that IP with a
	// Tether-Token is answered 429 CodeAuthThrottled with Retry-After,
	// its token unchecked. A verified client certificate is never
	// throttled.
	CheckToken func(token string) bool
	// TokenName names the caller of a request whose Tether-Token
	// CheckToken accepted, for policy (identity token:NAME). Nil names
	// every token "facade".
	TokenName func(token string) string
	// Local names the caller of a request on a facade that checks
	// neither token nor certificate (CheckToken nil: loopback) by the uid
	// owning the caller's socket (coordinator/facade/peeruid, looked up
	// once per connection: serve the facade with HTTPServer, whose
	// ConnContext records it), e.g. the dev user's identity for the dev
	// process's uid and peeruid.Identity for any other. A zero Identity, a
	// caller whose uid cannot be learnt (not Linux, not loopback), a
	// request carrying a header proxies add (hostcheck.Proxied:
	// Forwarded, X-Forwarded-For, ...; a proxy on this host connects over
	// loopback for every caller) and a nil Local leave the caller
	// unidentified (refused once a policy is in force).
	Local func(uid uint32) policy.Identity
	// Authorizer decides every request by policy (authz.go); its zero
	// value allows everything.
	Authorizer caller.Authorizer
	// Audit, if set, records one event per request answered (audit.go);
	// a refusal by policy is the Authorizer's to record.
	Audit Auditor
	// Hosts decides which Host headers and Origins the facade accepts
	// (hostcheck: built from the listen address and the configured extra
	// names). Nil: hostcheck.Loopback(), the names of a facade on
	// loopback.
	Hosts *hostcheck.Policy
	// authNow is the clock of the failed-authentication limiter (tests);
	// nil means time.Now.
	authNow func() time.Time
}

// Validate reports every problem of c.
func (c Config) Validate() error {
	var errs []error
	if c.Fleet == nil {
		errs = append(errs, errors.New("Fleet is required"))
	}
	if c.Ledger == nil {
		errs = append(errs, errors.New("Ledger is required"))
	}
	if h := c.ExternalHost; h != "" && (strings.ContainsAny(h, "/?#@ ") || strings.Contains(h, "://")) {
		errs = append(errs, fmt.Errorf("ExternalHost %q: want host[:port] without scheme or path", h))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("opensandbox facade config: %w", err)
	}
	return nil
}

// Facade is the OpenSandbox facade, an http.Handler. It does not listen on
// its own: the caller serves it (TLS and client certificates are the
// caller's listener's business; the facade only reads r.TLS). Safe for
// concurrent use.
type Facade struct {
	cfg    Config
	log    *slog.Logger
	m      *metrics
	tr     *transports
	found  *foundCache
	proxy  *httputil.ReverseProxy
	hosts  *hostcheck.Policy
	closed atomic.Bool
	now    func() time.Time
	// guard contains a panic of one request's goroutines (ServeHTTP,
	// fanOut): the caller gets a 500 or a cut connection, and the facade
	// goes on.
	guard *panics.Guard
	// cutLog and refusedLog rate-limit the warnings about cut answers and
	// refused names.
	cutLog, refusedLog logEvery
	// limit throttles failed Tether-Tokens per source IP (authlimit;
	// authenticate).
	limit *authlimit.Limiter
}

var _ http.Handler = (*Facade)(nil)

// New returns a facade for cfg. It fails if cfg is invalid or its metrics
// cannot be registered.
func New(cfg Config) (*Facade, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Facade{cfg: cfg, log: cfg.Logger, hosts: cfg.Hosts, now: time.Now}
	if f.hosts == nil {
		f.hosts = hostcheck.Loopback()
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	f.log = f.log.With("component", "opensandbox-facade")
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	f.m = m
	f.limit = authlimit.New(authlimit.Config{Listener: "opensandbox", Logger: f.log, Now: cfg.authNow})
	if err := f.limit.Register(reg); err != nil {
		return nil, fmt.Errorf("opensandbox facade: registering tether_auth_throttled_total: %w", err)
	}
	f.guard = panics.New(reg, f.log, "facade_opensandbox")
	f.tr = newTransports(cfg.Fleet)
	f.tr.guard = f.guard
	f.found = newFoundCache(maxFound)
	f.proxy = &httputil.ReverseProxy{
		Rewrite:        f.rewrite,
		Transport:      nodeRoundTripper{f},
		FlushInterval:  -1,
		ModifyResponse: f.modifyResponse,
		ErrorHandler:   f.proxyError,
		ErrorLog:       slog.NewLogLogger(f.log.Handler(), slog.LevelDebug),
	}
	return f, nil
}

// Limits of the HTTP server that HTTPServer returns.
const (
	// ReadHeaderTimeout bounds reading a request's headers, from the
	// connection's first byte (or the end of the previous request).
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout closes a keep-alive connection that carries no request
	// for this long. Common clients drop idle ones sooner (httpx after
	// 5 s, aiohttp after 15 s) and all reconnect on their own.
	IdleTimeout = 2 * time.Minute
	// MaxHeaderBytes bounds a request's line and headers (NeMo Gym's
	// requests carry well under 4 KiB); more is answered 431.
	MaxHeaderBytes = 64 << 10
)

// HTTPServer returns the http.Server that serves f, with tlsCfg (nil:
// plaintext; for TLS, serve with ServeTLS(ln, "", "") and keep
// NextProtos to http/1.1, which WebSocket upgrades need) and the limits
// above. It sets no ReadTimeout or WriteTimeout: those bound a whole
// request or answer, and would cut a long upload, execd's event stream of
// a long command, or a spliced WebSocket (which IdleTimeout does not
// touch either: it applies between requests only). The caller serves it
// and shuts it down.
func (f *Facade) HTTPServer(tlsCfg *tls.Config) *http.Server {
	return &http.Server{
		Handler:           f,
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(f.log.Handler(), slog.LevelDebug),
		ConnContext:       peeruid.ConnContext, // Config.Local: the caller's uid, per connection
	}
}

// Close refuses further requests (503 TETHER::SHUTTING_DOWN) and closes
// every tunnel conn, which ends forwarded requests and spliced WebSockets.
// It does not wait for handlers to return; the caller's http.Server does.
func (f *Facade) Close() error {
	f.closed.Store(true)
	f.tr.close()
	return nil
}

// stateKey is the context key of a request's *reqState.
type stateKey struct{}

// reqState is what the facade knows about one request while it is
// forwarded. It is written by the handler before forwarding and by
// modifyResponse, both on the request's goroutine.
type reqState struct {
	route osb.Route
	class string
	// node and session are where the request goes.
	node, session string
	// rec is the sandbox's record (id routes): the ledger's own when
	// fromLedger, else one naming the node a lookup found it on.
	rec        ledger.Record
	fromLedger bool
	// owner is the Tether-Run header of a create.
	owner string
	// who is the caller, identified false when it has none (authz.go).
	who        policy.Identity
	identified bool
	// source is the TCP peer (http.Request.RemoteAddr), for the audit.
	source string
	// cands are the nodes a create placed by load may move to when the
	// dial to node fails (nil: it may not; see nextNode), and tried the
	// nodes it was tried on.
	cands []protocol.NodeInfo
	tried []string
	// host and scheme are how the caller addressed the facade.
	host, scheme string
	// decode is set when the facade reads the response body, so the
	// request must not ask the node for a compressed one.
	decode bool
	// upgraded is set once a node answered 101.
	upgraded bool
	// sent counts the answer's body bytes read from the node, and readErr
	// is the error that ended them early (nil: EOF or not read); see
	// cutDetector.
	sent    int64
	readErr error
	// note is what the request's audit event learns (audit.go).
	note auditNote
}

func stateOf(ctx context.Context) *reqState {
	st, _ := ctx.Value(stateKey{}).(*reqState)
	return st
}

// ServeHTTP serves one request of the lifecycle API (wire-facts §2.2) or
// its server proxy. See the package doc for the routes.
func (f *Facade) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	w := &statusWriter{ResponseWriter: rw}
	route, ok := osb.ParsePath(r.URL.Path)
	st := &reqState{route: route, class: routeClass(route, ok, r.Method), host: f.externalHost(r), scheme: "http", source: r.RemoteAddr}
	if r.TLS != nil {
		st.scheme = "https"
	}
	// This runs while the reverse proxy's http.ErrAbortHandler panic
	// unwinds too (an answer cut mid-body), which must go on to the server
	// so that it drops the caller's connection: ending the answer cleanly
	// would make a cut answer look whole.
	defer func() {
		status := statusClass(w.status)
		switch {
		case w.status == 0 && st.upgraded:
			status = statusClass(http.StatusSwitchingProtocols)
		case st.readErr != nil && r.Context().Err() == nil:
			status = statusCut
			f.answerCut(r, st)
		}
		f.m.requests.WithLabelValues(st.class, status).Inc()
		code := w.status
		switch {
		case st.upgraded:
			code = http.StatusSwitchingProtocols
		case code == 0:
			code = http.StatusOK
		}
		f.audit(r, st, code, start)
	}()
	defer f.guard.Recover("request "+st.class, func(*panics.Error) {
		if w.status != 0 || st.upgraded {
			// Too late for a status: cut the connection, as net/http
			// does for this value without logging it again.
			panic(http.ErrAbortHandler)
		}
		writeError(w, http.StatusInternalServerError, CodeInternal, "internal error in the Tether OpenSandbox facade")
	})

	if err := f.hosts.Host("Host", r.Host); err != nil {
		f.refused(r, "host", err)
		st.note.reason = "host"
		writeError(w, http.StatusMisdirectedRequest, CodeMisdirected, err.Error())
		return
	}
	if err := f.hosts.Origin(r.Header.Values("Origin"), r.Host); err != nil {
		f.refused(r, "origin", err)
		st.note.reason = "origin"
		writeError(w, http.StatusForbidden, CodeForbiddenOrigin, err.Error())
		return
	}
	if f.closed.Load() {
		writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "the OpenSandbox facade is shutting down")
		return
	}
	if wait, ok := f.authenticate(r); !ok {
		if wait > 0 {
			st.note.reason = reasonThrottled
			w.Header().Set("Retry-After", strconv.FormatInt(int64(wait/time.Second), 10))
			writeError(w, http.StatusTooManyRequests, CodeAuthThrottled, throttledMessage(wait))
			return
		}
		f.m.authFailures.Inc()
		st.note.reason = "unauthenticated"
		writeError(w, http.StatusUnauthorized, CodeUnauthenticated, "the Tether OpenSandbox facade needs a Tether-Token header or a verified client certificate")
		return
	}
	st.who, st.identified = f.identify(r)
	st.note.sandbox = route.ID
	if !ok {
		if r.URL.Path == "/health" && r.Method == http.MethodGet {
			writeJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
			return
		}
		writeRouteNotFound(w)
		return
	}
	switch route.Kind {
	case osb.RouteSandboxes:
		switch r.Method {
		case http.MethodPost:
			f.create(w, r, st)
		case http.MethodGet:
			f.list(w, r, st)
		default:
			writeMethodNotAllowed(w, "GET, POST")
		}
	default:
		f.byID(w, r, st)
	}
}

// routeClass names a request's route for metrics.
func routeClass(rt osb.Route, ok bool, method string) string {
	if !ok {
		return classOther
	}
	switch rt.Kind {
	case osb.RouteSandboxes:
		if method == http.MethodPost {
			return classCreate
		}
		return classList
	case osb.RouteSandbox:
		return classSandbox
	case osb.RouteEndpoint:
		return classEndpoint
	case osb.RouteRenewExpiration:
		return classRenew
	case osb.RouteMetadata:
		return classMetadata
	case osb.RoutePause:
		return classPause
	case osb.RouteResume:
		return classResume
	case osb.RouteProxy:
		return classProxy
	}
	return classOther
}

// reasonThrottled is the audit reason of a request whose Tether-Token
// was refused unchecked because its source IP failed too often.
const reasonThrottled = "throttled"

// authenticate reports whether r passes the authentication boundary. When
// it does not, wait > 0 says its source IP is throttled (authlimit) and
// for how long (whole seconds, the Retry-After): its token was not
// checked, since refusing a correct token alike is what keeps the answer
// from telling a hit from a miss. A wrong token counts a failure; a
// verified client certificate is never throttled (it cannot be guessed),
// nor is a request without a token (it guesses nothing).
func (f *Facade) authenticate(r *http.Request) (wait time.Duration, ok bool) {
	if f.cfg.CheckToken == nil {
		return 0, true
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return 0, true
	}
	tok := r.Header.Get(HeaderToken)
	if tok == "" {
		return 0, false
	}
	// The TCP peer, never X-Forwarded-For: a guesser could name any
	// address there. Callers behind one proxy share its bucket.
	src := authlimit.Key(r.RemoteAddr)
	if wait, ok := f.limit.Check(src); !ok {
		return wait, false
	}
	if f.cfg.CheckToken(tok) {
		return 0, true
	}
	f.limit.Fail(src)
	return 0, false
}

// throttledMessage is the message of a CodeAuthThrottled answer.
func throttledMessage(wait time.Duration) string {
	return fmt.Sprintf("too many failed Tether-Tokens from this address: its tokens are refused unchecked for %d s (Retry-After); at most %d failures at once, then one a second", int64(wait/time.Second), authlimit.DefaultBurst)
}

// externalHost is the host[:port] callers reach the facade at.
func (f *Facade) externalHost(r *http.Request) string {
	if f.cfg.ExternalHost != "" {
		return f.cfg.ExternalHost
	}
	return r.Host
}

// fleetView is one snapshot of the connected nodes.
type fleetView struct {
	all     map[string]protocol.NodeInfo // every connected node, by id
	targets []protocol.NodeInfo          // nodes with the opensandbox target, by id
}

// view snapshots the fleet and drops the transports of nodes that left or
// reconnected.
func (f *Facade) view() fleetView {
	nodes := f.cfg.Fleet.Nodes(protocol.Selector{})
	v := fleetView{all: make(map[string]protocol.NodeInfo, len(nodes))}
	live := make(map[string]string, len(nodes))
	for _, n := range nodes {
		v.all[n.ID] = n
		live[n.ID] = n.SessionID
		if hasTarget(n) {
			v.targets = append(v.targets, n)
		}
	}
	slices.SortFunc(v.targets, func(a, b protocol.NodeInfo) int { return strings.Compare(a.ID, b.ID) })
	f.tr.prune(live)
	return v
}

func hasTarget(n protocol.NodeInfo) bool { return slices.Contains(n.Targets, Target) }

// nodeProblem explains why node (from v) cannot take requests for the
// opensandbox target, or returns "" when it can.
func (v fleetView) nodeProblem(node string) string {
	n, ok := v.all[node]
	if !ok {
		return fmt.Sprintf("node %s is not connected (target %s)", node, Target)
	}
	if !hasTarget(n) {
		return fmt.Sprintf("node %s has no %s target (it serves: %s)", node, Target, strings.Join(n.Targets, ", "))
	}
	return ""
}

// nodeReason is nodeProblem as a predicate of the node ("is not
// connected"), or "".
func (v fleetView) nodeReason(node string) string {
	n, ok := v.all[node]
	if !ok {
		return "is not connected"
	}
	if !hasTarget(n) {
		return fmt.Sprintf("has no %s target (it serves: %s)", Target, strings.Join(n.Targets, ", "))
	}
	return ""
}

// forward sends r to st.node through the reverse proxy.
//
// The request is served full duplex: the reverse proxy's transport may
// still be reading the caller's body (it reads once more past the end, to
// check that the body ended) when the node's answer headers go out.
// Without it the HTTP/1 server closes the body at that moment, that last
// read fails, and the transport drops the node connection mid-answer
// (golang/go#40747): streamed answers (execd's event stream) were cut
// short for about 1% of requests that carry a body.
func (f *Facade) forward(w http.ResponseWriter, r *http.Request, st *reqState) {
	r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
	// HTTP/2 has no such limit, and its writer says so (ErrNotSupported).
	_ = http.NewResponseController(w).EnableFullDuplex()
	f.proxy.ServeHTTP(w, r)
	if st.upgraded {
		f.m.wsActive.Dec()
		return
	}
	// Full duplex has a price: the transport's goroutine may still be
	// inside a Read of the caller's body when the proxy returns (the
	// node answered before it read everything). That Read's EOF starts
	// the server's background read of the connection after the server
	// stopped the pending one, and the next request's read then panics
	// ("invalid concurrent Body.Read call", golang/go#68560): the
	// server drops the caller's keep-alive connection. Close waits for
	// the Read in flight (both hold the body's lock) and ends the body
	// here, before the server resumes reading the connection. A caller
	// that sent its whole body is not held up; one that holds back the
	// rest of a body until the answer ends waits, the answer's last
	// chunk going out once the body is read or the caller gives up.
	r.Body.Close()
}

// nodeRoundTripper sends a forwarded request over its node's transport.
type nodeRoundTripper struct{ f *Facade }

// RoundTrip sends req to st.node. A create placed by load whose dial
// failed (nothing of it was sent) goes to the next least loaded node
// instead (Facade.nextNode).
func (t nodeRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	st := stateOf(req.Context())
	for {
		tr, err := t.f.tr.get(st.node, st.session)
		if err != nil {
			return nil, err
		}
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		t.f.m.forwardLatency.WithLabelValues(st.class).Observe(time.Since(start).Seconds())
		var de *dialError
		if err == nil || st.cands == nil || !errors.As(err, &de) || errors.Is(err, errClosed) || req.Context().Err() != nil {
			return resp, err
		}
		hasBody := req.Body != nil && req.Body != http.NoBody
		if hasBody && req.GetBody == nil || !t.f.nextNode(st) {
			return resp, err
		}
		next := req.Clone(req.Context())
		if hasBody {
			b, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			next.Body = b
		}
		req = next
	}
}

// forwardedHeaders are set on a forwarded request when the caller did not
// set them, as the lifecycle server's own proxy does (wire-facts §2.5).
const (
	hdrXFF   = "X-Forwarded-For"
	hdrXFH   = "X-Forwarded-Host"
	hdrXFP   = "X-Forwarded-Proto"
	hdrAccEn = "Accept-Encoding"
)

// rewrite prepares the outbound request: the node's transport dials the
// tunnel whatever the URL's host, so the URL names no address; the
// caller's Host header is kept (the node's server then names the facade in
// what it builds from it); X-Forwarded-Host and -Proto are kept if the
// caller sent them, else set; the caller's address is appended to
// X-Forwarded-For; every Tether-* header is removed.
func (f *Facade) rewrite(pr *httputil.ProxyRequest) {
	st := stateOf(pr.In.Context())
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = Target
	pr.Out.Host = pr.In.Host

	h := pr.Out.Header
	for _, k := range []string{hdrXFH, hdrXFP} {
		if v := pr.In.Header.Values(k); len(v) > 0 {
			h[k] = slices.Clone(v)
		}
	}
	if h.Get(hdrXFH) == "" && pr.In.Host != "" {
		h.Set(hdrXFH, pr.In.Host)
	}
	if h.Get(hdrXFP) == "" {
		h.Set(hdrXFP, st.scheme)
	}
	if ip, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
		if prior := pr.In.Header.Values(hdrXFF); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		h.Set(hdrXFF, ip)
	}
	for k := range h {
		if strings.HasPrefix(k, tetherHeaderPrefix) {
			delete(h, k)
		}
	}
	if st.decode {
		h.Del(hdrAccEn)
	}
}

// proxyError answers a request the reverse proxy could not forward.
func (f *Facade) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	st := stateOf(r.Context())
	if r.Context().Err() != nil {
		// The caller went away; nobody reads an answer.
		f.log.Debug("caller gone while forwarding", "node", st.node, "path", r.URL.Path, "err", err)
		return
	}
	if st.upgraded {
		// The 101 went out and the conn is hijacked: nothing can be written.
		f.log.Debug("websocket splice ended with an error", "node", st.node, "path", r.URL.Path, "err", err)
		return
	}
	if errors.Is(err, errClosed) {
		writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "the OpenSandbox facade is shutting down")
		return
	}
	f.log.Warn("forward failed", "node", st.node, "target", Target, "route", st.class, "err", err)
	writeError(w, http.StatusBadGateway, CodeNodeUnavailable, fmt.Sprintf("forwarding to node %s, target %s: %v", st.node, Target, err))
}

// answerCut reports an answer whose body the node's connection ended
// early: the caller got a broken stream (the server drops its connection),
// never a short one that looks whole. Warned at most once per logInterval.
func (f *Facade) answerCut(r *http.Request, st *reqState) {
	if ok, dropped := f.cutLog.allow(f.now()); ok {
		f.log.Warn("streamed answer cut short by the node connection; the caller's stream was broken off", "route", st.class,
			"sandbox", st.route.ID, "node", st.node, "method", r.Method, "path", r.URL.Path, "bytes", st.sent, "err", st.readErr,
			"suppressed", dropped)
	}
}

// refused reports a request refused for its Host or Origin (reason);
// warned at most once per logInterval.
func (f *Facade) refused(r *http.Request, reason string, err error) {
	f.m.refused.WithLabelValues(reason).Inc()
	if ok, dropped := f.refusedLog.allow(f.now()); ok {
		f.log.Warn("request refused: foreign name", "reason", reason, "remote", r.RemoteAddr, "err", err, "suppressed", dropped)
	}
}

// cutDetector is a forwarded answer's body: it counts the bytes read and
// keeps the error that ended them early, so that ServeHTTP can tell a cut
// answer from a whole one (the reverse proxy reports neither).
type cutDetector struct {
	io.ReadCloser
	st *reqState
}

func (c *cutDetector) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.st.sent += int64(n)
	if err != nil && err != io.EOF && c.st.readErr == nil {
		c.st.readErr = err
	}
	return n, err
}

// ledgerCtx returns a context for a ledger write that outlives the caller
// (a create the server accepted must be recorded even if the caller left).
func ledgerCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), ledgerTimeout)
}

// statusWriter records the final status written (101 is never seen: the
// reverse proxy writes it to the hijacked conn). It unwraps for
// http.ResponseController, so Flush and Hijack reach the real writer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// readLimited reads resp's body if it is at most limit bytes and not
// content-encoded, restoring it for the caller either way; ok is false
// when it was not read whole (too large, encoded, or a read error, which
// then reaches the caller).
func readLimited(resp *http.Response, limit int64) (b []byte, ok bool) {
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && ce != "identity" {
		return nil, false
	}
	if resp.ContentLength > limit {
		return nil, false
	}
	body := resp.Body
	b, err := io.ReadAll(io.LimitReader(body, limit+1))
	switch {
	case err != nil:
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(b), errReader{err}), body}
		return nil, false
	case int64(len(b)) > limit:
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(b), body), body}
		return nil, false
	}
	body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return b, true
}

// replaceBody makes b resp's body, with a matching Content-Length.
func replaceBody(resp *http.Response, b []byte) {
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	resp.Header.Del("Transfer-Encoding")
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// errReader always fails with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
