package openshell

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/coordinator/authlimit"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// gRPC metadata keys and the label the facade reads. Every metadata key
// starting with "tether-" is the facade's own: it is stripped before a call
// goes to a gateway.
const (
	// MetaToken carries the caller's Tether credential (checked by
	// Config.CheckToken). It is distinct from the gateway's own
	// "authorization" header, which passes through untouched.
	MetaToken = "tether-token"
	// MetaNode names a node by id: where CreateSandbox places the sandbox,
	// and where a call is sent instead of where the facade would route it
	// (required for methods the facade does not route when more than one
	// node has an OpenShell gateway).
	MetaNode = "tether-node"
	// MetaNodeSelector is a node label selector (protocol.ParseSelector)
	// restricting where CreateSandbox places the sandbox. It cannot be
	// combined with MetaNode or LabelNode.
	MetaNodeSelector = "tether-node-selector"
	// MetaRun is the run id (lease id) that owns a sandbox CreateSandbox
	// makes; the reaper deletes it when that lease expires. It must be a
	// valid run id (protocol.ValidRunID).
	MetaRun = "tether-run"
	// MetaTTL is the Tether-enforced time to live of a sandbox CreateSandbox
	// makes, as a non-negative Go duration ("90m") or whole seconds
	// ("5400"); "0" means no TTL. Default: Config.DefaultTTL. OpenShell itself never expires a
	// sandbox (wire-facts §6.12).
	MetaTTL = "tether-ttl"
	// LabelNode, as a CreateSandbox label, names the node to place the
	// sandbox on. It is forwarded like every label (wire-facts §8.3: never
	// rename what passes through); it is a valid OpenShell label.
	LabelNode = "tether.node"
)

// ledgerTimeout bounds one ledger write after a gateway answered. The write
// is detached from the caller's context: a caller that hangs up right after
// its answer must not leave the ledger without the record.
const ledgerTimeout = 5 * time.Second

// maxCallerRecv bounds one message from a caller, in bytes. Messages above
// openshell.MaxMessageSize but below this get the facade's own
// RESOURCE_EXHAUSTED message; above it, grpc's.
const maxCallerRecv = 4 << 20

// Defaults of the limits on caller connections (Config).
const (
	// DefaultMaxConcurrentStreams is Config.MaxConcurrentStreams' default:
	// calls in flight on one caller connection. NeMo Gym runs one channel
	// for all its rollouts; a caller with more calls queues them (gRPC
	// clients wait for a free stream), it does not fail them.
	DefaultMaxConcurrentStreams = 1000
	// DefaultHandshakeTimeout is Config.HandshakeTimeout's default.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxConnectionIdle is Config.MaxConnectionIdle's default.
	DefaultMaxConnectionIdle = 5 * time.Minute
	// DefaultMinPingInterval is Config.MinPingInterval's default.
	DefaultMinPingInterval = 5 * time.Second
)

// The facade's own keepalive toward callers: a connection silent for
// keepaliveTime gets a ping, and is closed when the ping is not answered
// within keepaliveTimeout (a dead peer under a long exec stream). gRPC
// clients answer pings in their transport; none polices the pings it
// receives.
const (
	keepaliveTime    = 2 * time.Minute
	keepaliveTimeout = 20 * time.Second
)

// Fleet is what the facade needs of the coordinator's registry of connected
// nodes; *coordinator.Coordinator satisfies it.
type Fleet interface {
	// Nodes lists connected nodes matching sel (zero Selector = all);
	// NodeInfo.Targets lists their targets.
	Nodes(sel protocol.Selector) []protocol.NodeInfo
	// DialTarget opens a dial stream to target on node; the returned conn
	// carries raw bytes. Errors name node and target.
	DialTarget(ctx context.Context, node, target string) (net.Conn, error)
}

// Ledger is what the facade needs of the sandbox ledger; *ledger.Ledger
// satisfies it.
type Ledger interface {
	// Created records a sandbox a CreateSandbox through the facade made.
	Created(ctx context.Context, r ledger.Record) error
	// Deleting records a delete the gateway accepted (deleted=true).
	Deleting(ctx context.Context, k ledger.Key) error
	// Deleted records a sandbox its gateway confirmed gone.
	Deleted(ctx context.Context, k ledger.Key) error
	// ByID finds a record by provider and gateway id.
	ByID(provider, id string) (ledger.Record, bool)
	// ByName finds a record by provider, workspace and name.
	ByName(provider, workspace, name string) (ledger.Record, bool)
	// LiveOn counts the live sandboxes on node.
	LiveOn(node string) int
	// List lists records matching f.
	List(f ledger.Filter) []ledger.Record
	// RunClosed reports whether run's lease was closed (a create for it is
	// refused).
	RunClosed(run string) bool
}

// Config configures a Server.
type Config struct {
	// Fleet is the registry of connected nodes. Required.
	Fleet Fleet
	// Ledger records creates and deletes and routes calls by name or id.
	// Nil means no accounting: calls are routed by the facade's own index
	// and by asking every node.
	Ledger Ledger
	// Logger receives the facade's logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the facade's metrics, among them
	// tether_auth_throttled_total{listener="openshell"} (authlimit); nil
	// means a private registry nobody scrapes.
	Registerer prometheus.Registerer
	// DefaultTTL is the TTL recorded for a sandbox created without
	// metadata tether-ttl. 0 means none.
	DefaultTTL time.Duration
	// CheckToken, when set, makes the facade an authentication boundary:
	// every call must carry metadata tether-token that CheckToken accepts,
	// or arrive over TLS with a verified client certificate; anything else
	// gets UNAUTHENTICATED. Nil accepts every call (loopback binding).
	// It runs on every call, concurrently; it should compare in constant
	// time. Failed tokens are throttled per source IP (authlimit; the TCP
	// peer, never x-forwarded-for): past the burst, every call of that IP
	// with a tether-token gets RESOURCE_EXHAUSTED with a retry-after
	// trailer, its token unchecked. A verified client certificate is never
	// throttled.
	CheckToken func(token string) bool
	// TokenName names the caller of a call whose tether-token CheckToken
	// accepted, for policy (identity token:NAME). Nil names every token
	// "facade".
	TokenName func(token string) string
	// Local names the caller of a call on a facade that checks neither
	// token nor certificate (CheckToken nil: loopback) by the uid owning
	// the caller's socket (coordinator/facade/peeruid, looked up once per
	// connection), e.g. the dev user's identity for the dev process's uid
	// and peeruid.Identity for any other. A zero Identity, a caller whose
	// uid cannot be learnt (not Linux, not loopback), a call whose
	// metadata carries a header proxies add (hostcheck.Proxied:
	// forwarded, x-forwarded-for, ...; a gRPC proxy on this host connects
	// over loopback for every caller) and a nil Local leave the caller
	// unidentified (refused once a policy is in force).
	Local func(uid uint32) policy.Identity
	// Authorizer decides every call by policy (authz.go); its zero value
	// allows everything.
	Authorizer caller.Authorizer
	// Audit, if set, records one event per call answered (audit.go);
	// a refusal by policy is the Authorizer's to record.
	Audit Auditor
	// TLS, when set, serves TLS with this config. For "client certificate
	// or token", set ClientAuth to tls.VerifyClientCertIfGiven and ClientCAs.
	TLS *tls.Config
	// Hosts decides which :authority values the facade accepts (see
	// hostcheck; a call naming another host gets PERMISSION_DENIED). Nil:
	// hostcheck.Loopback(), the names of a facade on loopback.
	Hosts *hostcheck.Policy

	// MaxConcurrentStreams bounds the calls in flight on one caller
	// connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): callers queue
	// the rest. Zero means DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface and settings; a connection that has not completed them by
	// then is closed. Zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxConnectionIdle closes a caller connection that has had no call in
	// flight for this long (GOAWAY first; gRPC clients reconnect on their
	// next call). Pings do not count as activity. Zero means
	// DefaultMaxConnectionIdle.
	MaxConnectionIdle time.Duration
	// MinPingInterval is the shortest interval between a caller's
	// keepalive pings that the facade tolerates, with or without calls in
	// flight; a caller that pings faster three times gets GOAWAY
	// too_many_pings. Zero means DefaultMinPingInterval. NeMo Gym's SDK
	// sets no keepalive (its transport's BDP pings ride on data, which
	// resets the count); callers behind load balancers often ping every
	// 10-30 s.
	MinPingInterval time.Duration

	// authNow is the clock of the failed-authentication limiter (tests);
	// nil means time.Now.
	authNow func() time.Time
}

// Server is the OpenShell facade: a gRPC server that looks like one
// OpenShell gateway and forwards every call to a node's gateway through the
// tunnel. Create with New, run with Serve, end with GracefulStop or Stop.
type Server struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	gs    *grpc.Server
	pool  *pool
	idx   *index
	hosts *hostcheck.Policy
	// guard contains a panic of one call's goroutines: the caller gets
	// INTERNAL (recoverStream, recoverUnary) and the server goes on.
	guard *panics.Guard

	// refusedLog rate-limits the warnings about refused :authority values.
	refusedLog logEvery
	// limit throttles failed tether-tokens per source IP (authlimit;
	// authorize).
	limit *authlimit.Limiter

	// wg tracks the goroutines that relay a caller's messages to a
	// gateway; they end when their stream ends (see relay).
	wg sync.WaitGroup

	mu       sync.Mutex
	inflight map[string]int // creates in flight, by node (placement load)

	stopOnce sync.Once
}

// New builds a Server from cfg. It does not listen: call Serve.
func New(cfg Config) (*Server, error) {
	if cfg.Fleet == nil {
		return nil, errors.New("openshell facade: Config.Fleet is required")
	}
	if cfg.DefaultTTL < 0 {
		return nil, fmt.Errorf("openshell facade: Config.DefaultTTL %v is negative", cfg.DefaultTTL)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"HandshakeTimeout", cfg.HandshakeTimeout}, {"MaxConnectionIdle", cfg.MaxConnectionIdle}, {"MinPingInterval", cfg.MinPingInterval}} {
		if d.v < 0 {
			return nil, fmt.Errorf("openshell facade: Config.%s %v is negative", d.name, d.v)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		log:      log.With("component", "openshell-facade"),
		m:        m,
		pool:     newPool(cfg.Fleet),
		idx:      newIndex(),
		hosts:    cfg.Hosts,
		inflight: make(map[string]int),
		guard:    panics.New(reg, log, "facade_openshell"),
	}
	s.pool.guard = s.guard
	s.limit = authlimit.New(authlimit.Config{Listener: "openshell", Logger: s.log, Now: cfg.authNow})
	if err := s.limit.Register(reg); err != nil {
		return nil, fmt.Errorf("openshell facade: registering tether_auth_throttled_total: %w", err)
	}
	if s.hosts == nil {
		s.hosts = hostcheck.Loopback()
	}
	s.gs = grpc.NewServer(s.serverOptions()...)
	return s, nil
}

// serverOptions are the grpc server's options: the raw forwarding, the
// limits on caller connections (Config), TLS. Interceptors go here too
// (grpc.ChainStreamInterceptor: every call is a stream of the unknown
// service handler).
func (s *Server) serverOptions() []grpc.ServerOption {
	cfg := s.cfg
	opts := []grpc.ServerOption{
		grpc.ChainStreamInterceptor(s.recoverStream),
		grpc.ChainUnaryInterceptor(s.recoverUnary),
		grpc.UnknownServiceHandler(s.handle),
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.MaxRecvMsgSize(maxCallerRecv),
		grpc.WaitForHandlers(true),
		grpc.MaxConcurrentStreams(cmp.Or(cfg.MaxConcurrentStreams, DefaultMaxConcurrentStreams)),
		grpc.ConnectionTimeout(cmp.Or(cfg.HandshakeTimeout, DefaultHandshakeTimeout)),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: cmp.Or(cfg.MaxConnectionIdle, DefaultMaxConnectionIdle),
			Time:              keepaliveTime,
			Timeout:           keepaliveTimeout,
		}),
		// Lenient: a caller's pings (load balancers, client keepalive)
		// must not earn GOAWAY too_many_pings (wire-facts §7, DESIGN §6).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             cmp.Or(cfg.MinPingInterval, DefaultMinPingInterval),
			PermitWithoutStream: true,
		}),
	}
	var creds credentials.TransportCredentials
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	if cfg.CheckToken == nil && cfg.Local != nil {
		creds = newPeerCreds(creds) // Local needs each caller's uid
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	return opts
}

// Serve accepts gRPC connections on ln until GracefulStop or Stop, and
// closes ln. It returns nil after a stop, else the accept error.
func (s *Server) Serve(ln net.Listener) error {
	err := s.gs.Serve(ln)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// GracefulStop stops accepting calls, waits for the calls in flight to end
// (streams included: bound it by calling Stop from another goroutine), then
// closes the connections to the gateways.
func (s *Server) GracefulStop() {
	s.gs.GracefulStop()
	s.shutdown()
}

// Stop cancels every call in flight, waits for their handlers, and closes
// the connections to the gateways.
func (s *Server) Stop() {
	s.gs.Stop()
	s.shutdown()
}

func (s *Server) shutdown() {
	s.stopOnce.Do(func() {
		s.wg.Wait()
		s.pool.close()
	})
}

// recoverStream contains a panic of a call's handler: the caller gets
// INTERNAL. (Every call goes through it: the server's one handler is the
// unknown-service stream handler.)
func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer s.guard.Recover("call "+methodLabel(info.FullMethod), func(e *panics.Error) { err = internal(e) })
	return h(srv, ss)
}

// recoverUnary is recoverStream for unary handlers, should one be
// registered.
func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer s.guard.Recover("call "+methodLabel(info.FullMethod), func(e *panics.Error) { resp, err = nil, internal(e) })
	return h(ctx, req)
}

// internal is the status of a call that hit a contained panic.
func internal(e *panics.Error) error {
	return status.Errorf(codes.Internal, "tether: OpenShell facade: %v", e)
}

// handle serves every call (the server has no registered services).
func (s *Server) handle(_ any, ss grpc.ServerStream) error {
	start := time.Now()
	full, _ := grpc.MethodFromServerStream(ss)
	label := methodLabel(full)
	c := &call{s: s, ss: ss, ctx: ss.Context(), method: full, source: peerAddr(ss.Context())}
	err := s.serve(c)
	s.m.calls.WithLabelValues(label, status.Code(err).String()).Inc()
	s.m.duration.WithLabelValues(label).Observe(time.Since(start).Seconds())
	s.audit(c, start, err)
	return err
}

// methodLabel returns the metric label of a full method path.
func methodLabel(full string) string {
	name, ok := strings.CutPrefix(full, "/"+openshell.ServiceName+"/")
	if ok && slices.Contains(routedMethods, name) {
		return name
	}
	return methodOther
}

// serve checks the call's :authority, authorizes it and routes it by
// method.
func (s *Server) serve(c *call) error {
	ctx, full := c.ctx, c.method
	md, _ := metadata.FromIncomingContext(ctx)
	if err := s.checkAuthority(ctx, md); err != nil {
		c.note.reason = "host"
		return err
	}
	if err := s.authorize(c, md); err != nil {
		c.note.reason = "unauthenticated"
		if status.Code(err) == codes.ResourceExhausted {
			c.note.reason = reasonThrottled
		}
		return err
	}
	c.who, c.identified = s.identify(ctx, md)
	if !strings.HasPrefix(full, "/"+openshell.ServiceName+"/") {
		svc, _, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
		return status.Errorf(codes.Unimplemented, "unknown service %s (the Tether OpenShell facade serves %s)", svc, openshell.ServiceName)
	}
	c.md, c.out = md, cleanMD(md)
	switch full {
	case openshell.MethodCreateSandbox:
		return c.create()
	case openshell.MethodGetSandbox, openshell.MethodDeleteSandbox, openshell.MethodStopSandbox, openshell.MethodStartSandbox:
		return c.byName()
	case openshell.MethodExecSandbox, openshell.MethodWatchSandbox, openshell.MethodExecSandboxInteractive:
		return c.byID()
	case openshell.MethodListSandboxes:
		return c.list()
	case openshell.MethodHealth:
		return c.health()
	}
	return c.other()
}

// checkAuthority enforces Config.Hosts on the call's :authority.
func (s *Server) checkAuthority(ctx context.Context, md metadata.MD) error {
	err := s.hosts.Host(":authority", mdFirst(md, ":authority"))
	if err == nil {
		return nil
	}
	s.m.refused.Inc()
	if ok, dropped := s.refusedLog.allow(time.Now()); ok {
		remote := ""
		if p, ok := peer.FromContext(ctx); ok {
			remote = p.Addr.String()
		}
		s.log.Warn("call refused: foreign :authority", "remote", remote, "err", err, "suppressed", dropped)
	}
	return status.Error(codes.PermissionDenied, "tether: "+err.Error())
}

// reasonThrottled is the audit reason of a call whose tether-token was
// refused unchecked because its source IP failed too often.
const reasonThrottled = "throttled"

// authorize enforces Config.CheckToken (see there): UNAUTHENTICATED for a
// missing or wrong token, RESOURCE_EXHAUSTED with a retry-after trailer
// (whole seconds) while the call's source IP is throttled (authlimit). A
// throttled call's token is not checked: refusing a correct one alike is
// what keeps the answer from telling a hit from a miss. A wrong token
// counts a failure; a verified client certificate is never throttled (it
// cannot be guessed), nor is a call without a token (it guesses nothing).
func (s *Server) authorize(c *call, md metadata.MD) error {
	if s.cfg.CheckToken == nil {
		return nil
	}
	// The TCP peer, never x-forwarded-for: a guesser could name any
	// address there. Callers behind one proxy share its bucket.
	src := ""
	if p, ok := peer.FromContext(c.ctx); ok {
		if ti, ok := tlsInfo(p.AuthInfo); ok && len(ti.State.VerifiedChains) > 0 {
			return nil
		}
		if p.Addr != nil {
			src = authlimit.Key(p.Addr.String())
		}
	}
	v := md.Get(MetaToken)
	if !slices.ContainsFunc(v, func(t string) bool { return t != "" }) {
		s.m.authFailures.Inc()
		return errBadToken
	}
	if wait, ok := s.limit.Check(src); !ok {
		secs := int64(wait / time.Second)
		// The trailer goes out with the status, trailers-only when
		// nothing was sent: grpc-go clients read it with grpc.Trailer.
		c.ss.SetTrailer(metadata.Pairs("retry-after", strconv.FormatInt(secs, 10)))
		return status.Errorf(codes.ResourceExhausted, "tether: too many failed tether-tokens from this address: its tokens are refused unchecked for %d s (retry-after); at most %d failures at once, then one a second", secs, authlimit.DefaultBurst)
	}
	if len(v) == 1 && s.cfg.CheckToken(v[0]) {
		return nil
	}
	s.limit.Fail(src)
	s.m.authFailures.Inc()
	return errBadToken
}

// errBadToken is the status of a call without an accepted tether-token.
var errBadToken = status.Error(codes.Unauthenticated, "tether: missing or invalid tether-token")

// cleanMD returns md without the keys that must not cross the facade: the
// facade's own tether-* keys, HTTP/2 pseudo-headers and the transport's
// headers (content-type, user-agent, te, grpc-*), which each side's gRPC
// stack writes itself. grpc-status-details-bin is among them: the status a
// handler returns carries the details already. Everything else, including
// "authorization", passes verbatim.
func cleanMD(md metadata.MD) metadata.MD {
	out := make(metadata.MD, len(md))
	for k, v := range md {
		switch {
		case strings.HasPrefix(k, "tether-"), strings.HasPrefix(k, ":"), strings.HasPrefix(k, "grpc-"),
			k == "content-type", k == "user-agent", k == "te":
			continue
		}
		out[k] = v
	}
	return out
}

// mdFirst returns md's first value of key, or "".
func mdFirst(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// gatewayNodes returns the connected nodes matching sel that have an
// OpenShell gateway, sorted by id. With the zero selector it also lets the
// pool drop the conns of nodes that left.
func (s *Server) gatewayNodes(sel protocol.Selector) []protocol.NodeInfo {
	all := s.cfg.Fleet.Nodes(sel)
	if sel.Empty() {
		s.pool.prune(all)
	}
	out := make([]protocol.NodeInfo, 0, len(all))
	for _, n := range all {
		if slices.Contains(n.Targets, protocol.TargetOpenShell) {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b protocol.NodeInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// findNode returns the node of nodes with id.
func findNode(nodes []protocol.NodeInfo, id string) (protocol.NodeInfo, bool) {
	for _, n := range nodes {
		if n.ID == id {
			return n, true
		}
	}
	return protocol.NodeInfo{}, false
}

// leastLoaded picks the node of nodes (non-empty) with the fewest live
// sandboxes (ledger, plus creates in flight through this facade), ties
// broken by fewer running execs, then by id, and counts a create in flight
// on it until release is called. Nodes whose gateway could not be dialed
// lately (pool.failing) are passed over unless every node is failing.
// Choosing and counting happen under one lock, so concurrent creates see
// each other and spread out.
func (s *Server) leastLoaded(nodes []protocol.NodeInfo) (best protocol.NodeInfo, release func()) {
	healthy := make([]protocol.NodeInfo, 0, len(nodes))
	for _, n := range nodes {
		if !s.pool.failing(n) {
			healthy = append(healthy, n)
		}
	}
	if len(healthy) > 0 {
		nodes = healthy
	}
	live := make([]int, len(nodes))
	if s.cfg.Ledger != nil {
		for i, n := range nodes {
			live[i] = s.cfg.Ledger.LiveOn(n.ID)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	bestLoad := -1
	for i, n := range nodes {
		load := live[i] + s.inflight[n.ID]
		switch {
		case bestLoad < 0, load < bestLoad,
			load == bestLoad && n.RunningExecs < best.RunningExecs,
			load == bestLoad && n.RunningExecs == best.RunningExecs && n.ID < best.ID:
			best, bestLoad = n, load
		}
	}
	return best, s.startCreateLocked(best.ID)
}

// skippable reports whether a fan-out may leave out node n, which failed
// with err: its gateway cannot be dialed (a recent dial failed and err is
// UNAVAILABLE) and the ledger holds no live OpenShell sandbox on it, so it
// has nothing to contribute. Without a ledger nothing is skippable.
func (s *Server) skippable(n protocol.NodeInfo, err error) bool {
	if s.cfg.Ledger == nil || status.Code(err) != codes.Unavailable || !s.pool.failing(n) {
		return false
	}
	return len(s.cfg.Ledger.List(ledger.Filter{Provider: protocol.ProviderOpenShell, Node: n.ID, State: string(ledger.StateLive)})) == 0
}

// startCreate counts a create in flight on node until release is called.
func (s *Server) startCreate(node string) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startCreateLocked(node)
}

func (s *Server) startCreateLocked(node string) func() {
	s.inflight[node]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.inflight[node]--; s.inflight[node] <= 0 {
				delete(s.inflight, node)
			}
			s.mu.Unlock()
		})
	}
}

// recordByName returns the ledger's record of (ws, name) if it still stands
// for a sandbox on a gateway (not deleted or lost).
func (s *Server) recordByName(k wsName) (ledger.Record, bool) {
	if s.cfg.Ledger == nil || k.name == "" {
		return ledger.Record{}, false
	}
	r, ok := s.cfg.Ledger.ByName(protocol.ProviderOpenShell, k.ws, k.name)
	if !ok || r.State == ledger.StateDeleted || r.State == ledger.StateLost {
		return ledger.Record{}, false
	}
	return r, true
}

// recordByID is recordByName by gateway id.
func (s *Server) recordByID(id string) (ledger.Record, bool) {
	if s.cfg.Ledger == nil || id == "" {
		return ledger.Record{}, false
	}
	r, ok := s.cfg.Ledger.ByID(protocol.ProviderOpenShell, id)
	if !ok || r.State == ledger.StateDeleted || r.State == ledger.StateLost {
		return ledger.Record{}, false
	}
	return r, true
}

// ledgerWrite runs one ledger write detached from the caller (bounded by
// ledgerTimeout); a failure is logged and counted, never returned: the
// inventory repairs the record.
func (s *Server) ledgerWrite(ctx context.Context, op string, k ledger.Key, f func(context.Context) error) {
	if s.cfg.Ledger == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerTimeout)
	defer cancel()
	if err := f(ctx); err != nil {
		s.m.ledgerErrors.WithLabelValues(op).Inc()
		s.log.Warn("ledger write failed", "op", op, "node", k.Node, "sandbox", k.ID, "err", err)
	}
}
