package opensandboxtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tetherfleet/tether/protocol/opensandbox"
)

// Config configures a Server. The zero value is ready to use: no API key,
// expiry on, the real clock.
type Config struct {
	// APIKey, when set, is required in opensandbox.HeaderAPIKey on every
	// lifecycle call (the proxy route and /health are exempt).
	APIKey string
	// KeepExpired turns expiry off. By default a sandbox past its
	// expiresAt is removed (with its execd) before any request is served.
	KeepExpired bool
	// Now is the clock for createdAt, expiresAt and expiry; nil is
	// time.Now.
	Now func() time.Time
	// PendingFor is how long a new sandbox stays Pending before it reads
	// as Running; 0 makes every read after the create see Running (the
	// create response itself always says Pending).
	PendingFor time.Duration
	// Execd configures each sandbox's execd (Dir is ignored: each gets its
	// own temporary directory).
	Execd ExecdConfig
	// Intercept, when set, sees every request first (after it is
	// recorded); returning true means it wrote the response. Tests use it
	// to inject failures.
	Intercept func(w http.ResponseWriter, r *http.Request) bool
	// Logger receives debug logs; nil discards them.
	Logger *slog.Logger
}

// Server is a fake OpenSandbox lifecycle server (wire-facts §2) with one
// real Execd per sandbox, listening on loopback. It serves the lifecycle
// API at the root and under /v1, and the server proxy route
// /sandboxes/<id>/proxy/<port>/... (HTTP and WebSocket) into the sandbox's
// execd, which also listens on its own loopback port (the "direct"
// endpoint). Only port opensandbox.DefaultExecdPort has a backend.
//
// Goroutines: the HTTP server's, each execd's, and per proxied WebSocket
// one relay goroutine besides the handler. Close ends them all.
//
// Locks: Server.mu is never held while calling into an Execd.
type Server struct {
	// URL is the base URL, "http://127.0.0.1:<port>" (no /v1).
	URL string

	cfg       Config
	log       *slog.Logger
	ts        *httptest.Server
	transport *http.Transport // to the execds

	mu        sync.Mutex
	closed    bool
	sandboxes map[string]*sandbox
	requests  []Request
	wg        sync.WaitGroup // proxied WebSocket relays
}

// sandbox is one fake sandbox.
type sandbox struct {
	sb           opensandbox.Sandbox
	pendingUntil time.Time
	execd        *Execd
	ts           *httptest.Server // nil once stopped
	addr         string           // execd's host:port
}

// NewServer starts a fake server on 127.0.0.1; call Close when done.
func NewServer(cfg Config) *Server {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, log: cfg.Logger, sandboxes: map[string]*sandbox{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "opensandbox-fake")
	s.transport = &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	s.ts = httptest.NewServer(s)
	s.URL = s.ts.URL
	return s
}

// Start starts a fake server and closes it when t ends.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	s := NewServer(cfg)
	t.Cleanup(func() { s.Close() })
	return s
}

// Host is the server's "127.0.0.1:<port>".
func (s *Server) Host() string { return strings.TrimPrefix(s.URL, "http://") }

// Close stops every sandbox's execd (killing their processes), then the
// server, and waits for its goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	sbs := slices.Collect(maps.Values(s.sandboxes))
	s.sandboxes = map[string]*sandbox{}
	s.mu.Unlock()
	var errs []error
	for _, sb := range sbs {
		errs = append(errs, sb.stop())
	}
	s.ts.Close()
	s.wg.Wait()
	s.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

// Requests returns a copy of the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Sandbox returns sandbox id as a GET would, without expiring anything.
func (s *Server) Sandbox(id string) (opensandbox.Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return opensandbox.Sandbox{}, false
	}
	return s.viewLocked(sb), true
}

// SetState sets a sandbox's status state and reason (e.g. Stopping, to
// show a deletion in progress); false if there is no such sandbox.
func (s *Server) SetState(id, state, reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if ok {
		sb.pendingUntil = time.Time{}
		sb.sb.Status = opensandbox.SandboxStatus{State: state, Reason: reason, LastTransitionAt: s.cfg.Now().UTC()}
	}
	return ok
}

// Execd returns the execd of sandbox id and its base URL ("http://host:port").
func (s *Server) Execd(id string) (*Execd, string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return nil, "", false
	}
	return sb.execd, "http://" + sb.addr, true
}

// StopExecd stops sandbox id's execd, killing its processes and closing its
// listener, as if the daemon died: proxied HTTP calls then get 502 and
// proxied WebSockets close 1011 (OSB-10). The sandbox itself stays. False
// if there is no such sandbox.
func (s *Server) StopExecd(id string) bool {
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	s.mu.Unlock()
	if ok {
		sb.stop()
		// Forget pooled connections to the stopped execd now: the next
		// proxied request must dial (and fail: 502, OSB-10), not write
		// to a connection execd closed (a 500 broken pipe when the pool
		// had not yet noticed the close).
		s.transport.CloseIdleConnections()
	}
	return ok
}

func (sb *sandbox) stop() error {
	err := sb.execd.Close()
	if sb.ts != nil {
		sb.ts.Close()
	}
	return err
}

// ServeHTTP serves the lifecycle API and the proxy route.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone()})
	s.mu.Unlock()
	if s.cfg.Intercept != nil && s.cfg.Intercept(w, r) {
		return
	}
	w.Header().Set(opensandbox.HeaderRequestID, uuid.NewString())
	s.expire()
	if r.URL.Path == "/health" {
		writeJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
		return
	}
	route, ok := opensandbox.ParsePath(r.URL.Path)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	}
	if route.Kind == opensandbox.RouteProxy {
		s.proxy(w, r, route) // exempt from API-key auth
		return
	}
	if !s.authorized(w, r) {
		return
	}
	allow := func(methods ...string) bool {
		if slices.Contains(methods, r.Method) {
			return true
		}
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
		return false
	}
	switch route.Kind {
	case opensandbox.RouteSandboxes:
		if allow(http.MethodGet, http.MethodPost) {
			if r.Method == http.MethodPost {
				s.create(w, r, route)
			} else {
				s.list(w, r)
			}
		}
	case opensandbox.RouteSandbox:
		if allow(http.MethodGet, http.MethodDelete) {
			if r.Method == http.MethodGet {
				s.get(w, route.ID)
			} else {
				s.delete(w, route.ID)
			}
		}
	case opensandbox.RouteEndpoint:
		if allow(http.MethodGet) {
			s.endpoint(w, r, route)
		}
	case opensandbox.RouteRenewExpiration:
		if allow(http.MethodPost) {
			s.renew(w, r, route.ID)
		}
	case opensandbox.RouteMetadata:
		if allow(http.MethodPatch) {
			s.patchMetadata(w, r, route.ID)
		}
	case opensandbox.RoutePause, opensandbox.RouteResume:
		if allow(http.MethodPost) {
			s.pauseResume(w, route)
		}
	}
}

// authorized checks the API key: 401 MISSING_API_KEY / INVALID_API_KEY.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.cfg.APIKey == "" {
		return true
	}
	switch key := r.Header.Get(opensandbox.HeaderAPIKey); {
	case key == "":
		writeJSON(w, http.StatusUnauthorized, opensandbox.ErrorBody{Code: opensandbox.CodeMissingAPIKey, Message: "Authentication credentials were not provided. Please include " + opensandbox.HeaderAPIKey + " header."})
		return false
	case key != s.cfg.APIKey:
		writeJSON(w, http.StatusUnauthorized, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidAPIKey, Message: "Invalid API key."})
		return false
	}
	return true
}

// expire removes sandboxes whose expiresAt has passed.
func (s *Server) expire() {
	if s.cfg.KeepExpired {
		return
	}
	now := s.cfg.Now()
	var gone []*sandbox
	s.mu.Lock()
	for id, sb := range s.sandboxes {
		if !sb.sb.ExpiresAt.IsZero() && !now.Before(sb.sb.ExpiresAt) {
			delete(s.sandboxes, id)
			gone = append(gone, sb)
		}
	}
	s.mu.Unlock()
	for _, sb := range gone {
		s.log.Debug("sandbox expired", "id", sb.sb.ID)
		sb.stop()
	}
}

// viewLocked returns the sandbox as the API shows it now: a copy, with
// Pending turned Running once PendingFor passed.
func (s *Server) viewLocked(sb *sandbox) opensandbox.Sandbox {
	if sb.sb.Status.State == opensandbox.StatePending && !s.cfg.Now().Before(sb.pendingUntil) {
		sb.sb.Status = opensandbox.SandboxStatus{State: opensandbox.StateRunning, LastTransitionAt: s.cfg.Now().UTC()}
	}
	v := sb.sb
	v.Metadata = maps.Clone(sb.sb.Metadata)
	v.Entrypoint = slices.Clone(sb.sb.Entrypoint)
	return v
}

// lookup returns the current view of sandbox id, or writes a 404.
func (s *Server) lookup(w http.ResponseWriter, id string) (opensandbox.Sandbox, bool) {
	v, ok := s.Sandbox(id)
	if !ok {
		writeNotFound(w, id)
	}
	return v, ok
}

func writeNotFound(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusNotFound, opensandbox.ErrorBody{Code: opensandbox.CodeSandboxNotFound, Message: fmt.Sprintf("Sandbox '%s' not found", id)})
}

// validation writes FastAPI's 422 body with one issue.
func validation(w http.ResponseWriter, typ string, loc []any, msg string, input any, ctx map[string]any) {
	writeJSON(w, http.StatusUnprocessableEntity, opensandbox.ValidationErrorBody{Detail: []opensandbox.ValidationIssue{{Type: typ, Loc: loc, Msg: msg, Input: input, Ctx: ctx}}})
}

// create serves POST /sandboxes: 202, Location, state Pending (OSB-1,
// OSB-8, OSB-9).
func (s *Server) create(w http.ResponseWriter, r *http.Request, route opensandbox.Route) {
	var req opensandbox.CreateSandboxRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		validation(w, "json_invalid", []any{"body"}, "JSON decode error: "+err.Error(), nil, nil)
		return
	}
	switch {
	case req.Timeout != nil && *req.Timeout < opensandbox.MinTimeoutSeconds:
		validation(w, "greater_than_equal", []any{"body", "timeout"}, "Input should be greater than or equal to "+strconv.Itoa(opensandbox.MinTimeoutSeconds),
			*req.Timeout, map[string]any{"ge": opensandbox.MinTimeoutSeconds})
		return
	case (req.Image == nil) == (req.SnapshotID == "") && req.Extensions["poolRef"] == "":
		validation(w, "value_error", []any{"body"}, "Value error, exactly one of image or snapshotId must be provided", nil, nil)
		return
	case req.Image != nil && len(req.Entrypoint) == 0:
		validation(w, "missing", []any{"body", "entrypoint"}, "Field required", nil, nil)
		return
	}
	if err := opensandbox.ValidateMetadata(req.Metadata); err != nil {
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidMetadataLabel, Message: err.Error()})
		return
	}
	execd, err := NewExecd(ExecdConfig{PingInterval: s.cfg.Execd.PingInterval, ReadTimeout: s.cfg.Execd.ReadTimeout, WriteTimeout: s.cfg.Execd.WriteTimeout, Logger: s.log})
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, opensandbox.ErrorBody{Code: opensandbox.CodeRuntimeError, Message: err.Error()})
		return
	}
	now := s.cfg.Now().UTC()
	sb := &sandbox{
		sb: opensandbox.Sandbox{
			ID:         uuid.NewString(),
			Image:      req.Image,
			SnapshotID: req.SnapshotID,
			Platform:   req.Platform,
			Status:     opensandbox.SandboxStatus{State: opensandbox.StatePending, LastTransitionAt: now},
			Metadata:   maps.Clone(req.Metadata),
			Entrypoint: slices.Clone(req.Entrypoint),
			CreatedAt:  now,
		},
		pendingUntil: now.Add(s.cfg.PendingFor),
		execd:        execd,
	}
	if req.Timeout != nil {
		sb.sb.ExpiresAt = now.Add(time.Duration(*req.Timeout) * time.Second)
	}
	sb.ts = httptest.NewServer(execd)
	sb.addr = strings.TrimPrefix(sb.ts.URL, "http://")
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sb.stop()
		writeJSON(w, http.StatusServiceUnavailable, opensandbox.ErrorBody{Code: opensandbox.CodeRuntimeError, Message: "server is shutting down"})
		return
	}
	s.sandboxes[sb.sb.ID] = sb
	// Once listed, the sandbox is shared: list and get may turn it Running
	// (viewLocked), so the answer is built from a copy taken under the lock.
	v := sb.sb
	s.mu.Unlock()

	loc := opensandbox.SandboxPath(v.ID)
	if route.V1 {
		loc = opensandbox.VersionPrefix + loc
	}
	w.Header().Set("Location", "http://"+r.Host+loc)
	writeJSON(w, http.StatusAccepted, opensandbox.CreateSandboxResponse{
		ID: v.ID, Status: v.Status, Metadata: v.Metadata, Platform: v.Platform,
		ExpiresAt: v.ExpiresAt, CreatedAt: v.CreatedAt, Entrypoint: v.Entrypoint,
	})
}

// queryInt reads an integer query parameter with a default and bounds,
// writing FastAPI's 422 on failure (OSB-4).
func queryInt(w http.ResponseWriter, r *http.Request, name string, def, lo, hi int) (int, bool) {
	raw, ok := r.URL.Query()[name]
	if !ok || len(raw) == 0 {
		return def, true
	}
	n, err := strconv.Atoi(raw[0])
	switch {
	case err != nil:
		validation(w, "int_parsing", []any{"query", name}, "Input should be a valid integer, unable to parse string as an integer", raw[0], nil)
	case n < lo:
		validation(w, "greater_than_equal", []any{"query", name}, "Input should be greater than or equal to "+strconv.Itoa(lo), raw[0], map[string]any{"ge": lo})
	case hi > 0 && n > hi:
		validation(w, "less_than_equal", []any{"query", name}, "Input should be less than or equal to "+strconv.Itoa(hi), raw[0], map[string]any{"le": hi})
	default:
		return n, true
	}
	return 0, false
}

// list serves GET /sandboxes (wire-facts §2.2, §2.4; OSB-2..4).
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	page, ok := queryInt(w, r, "page", 1, 1, 0)
	if !ok {
		return
	}
	size, ok := queryInt(w, r, "pageSize", opensandbox.DefaultPageSize, 1, opensandbox.MaxPageSize)
	if !ok {
		return
	}
	q := r.URL.Query()
	filter, err := opensandbox.ParseMetadataFilter(q.Get("metadata"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidMetadataFormat, Message: "Invalid metadata format: " + err.Error()})
		return
	}
	states := q["state"]
	var items []opensandbox.Sandbox
	s.mu.Lock()
	for _, sb := range s.sandboxes {
		v := s.viewLocked(sb)
		if len(states) > 0 && !slices.ContainsFunc(states, func(st string) bool { return strings.EqualFold(st, v.Status.State) }) {
			continue
		}
		if opensandbox.MatchMetadata(v.Metadata, filter) {
			items = append(items, v)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(items, func(a, b opensandbox.Sandbox) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	total := len(items)
	pages := (total + size - 1) / size
	start := min(total, (page-1)*size)
	end := min(total, start+size)
	writeJSON(w, http.StatusOK, opensandbox.ListSandboxesResponse{
		Items:      append([]opensandbox.Sandbox{}, items[start:end]...),
		Pagination: opensandbox.Pagination{Page: page, PageSize: size, TotalItems: total, TotalPages: pages, HasNextPage: page < pages},
	})
}

func (s *Server) get(w http.ResponseWriter, id string) {
	if v, ok := s.lookup(w, id); ok {
		writeJSON(w, http.StatusOK, v)
	}
}

// delete serves DELETE /sandboxes/<id>: 204, or 404 (OSB-5).
func (s *Server) delete(w http.ResponseWriter, id string) {
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	delete(s.sandboxes, id)
	s.mu.Unlock()
	if !ok {
		writeNotFound(w, id)
		return
	}
	sb.stop()
	w.WriteHeader(http.StatusNoContent)
}

// endpoint serves GET /sandboxes/<id>/endpoints/<port> (OSB-6, OSB-7).
func (s *Server) endpoint(w http.ResponseWriter, r *http.Request, route opensandbox.Route) {
	q := r.URL.Query()
	useProxy := false
	if raw, ok := q["use_server_proxy"]; ok && len(raw) > 0 {
		b, ok := parseBool(raw[0])
		if !ok {
			validation(w, "bool_parsing", []any{"query", "use_server_proxy"}, "Input should be a valid boolean, unable to interpret input", raw[0], nil)
			return
		}
		useProxy = b
	}
	if raw, ok := q["expires"]; ok && len(raw) > 0 {
		if _, err := strconv.ParseInt(raw[0], 10, 64); err != nil {
			validation(w, "int_parsing", []any{"query", "expires"}, "Input should be a valid integer, unable to parse string as an integer", raw[0], nil)
			return
		}
		if useProxy {
			writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidParameter, Message: "expires cannot be combined with use_server_proxy=true"})
			return
		}
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[route.ID]
	var addr string
	if ok {
		addr = sb.addr
	}
	s.mu.Unlock()
	if !ok {
		writeNotFound(w, route.ID)
		return
	}
	var ep opensandbox.Endpoint
	switch {
	case useProxy:
		ep.Endpoint = opensandbox.ProxyEndpoint(r.Host, route.ID, route.Port)
	case route.Port == opensandbox.DefaultExecdPort:
		ep.Endpoint = addr
	default:
		// Like a runtime publishing sandbox ports on the host; nothing of
		// the fake listens there.
		host, _, _ := net.SplitHostPort(addr)
		ep.Endpoint = net.JoinHostPort(host, strconv.Itoa(route.Port))
	}
	writeJSON(w, http.StatusOK, ep)
}

// parseBool accepts what pydantic accepts for a bool query parameter.
func parseBool(s string) (bool, bool) {
	switch strings.ToLower(s) {
	case "1", "true", "t", "yes", "y", "on":
		return true, true
	case "0", "false", "f", "no", "n", "off":
		return false, true
	}
	return false, false
}

// renew serves POST /sandboxes/<id>/renew-expiration.
func (s *Server) renew(w http.ResponseWriter, r *http.Request, id string) {
	var req opensandbox.RenewExpirationRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ExpiresAt.IsZero() {
		msg := "Field required"
		if err != nil {
			msg = "JSON decode error: " + err.Error()
		}
		validation(w, "value_error", []any{"body", "expiresAt"}, msg, nil, nil)
		return
	}
	now := s.cfg.Now()
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	var cur time.Time
	if ok {
		cur = sb.sb.ExpiresAt
	}
	s.mu.Unlock()
	switch {
	case !ok:
		writeNotFound(w, id)
		return
	case !req.ExpiresAt.After(now):
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidParameter, Message: "expiresAt must be in the future"})
		return
	case !cur.IsZero() && !req.ExpiresAt.After(cur):
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidParameter, Message: "expiresAt must be later than the current expiration " + cur.UTC().Format(time.RFC3339)})
		return
	}
	at := req.ExpiresAt.UTC()
	s.mu.Lock()
	sb.sb.ExpiresAt = at
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, opensandbox.RenewExpirationResponse{ExpiresAt: at})
}

// patchMetadata serves PATCH /sandboxes/<id>/metadata: a JSON Merge Patch
// (null deletes a key).
func (s *Server) patchMetadata(w http.ResponseWriter, r *http.Request, id string) {
	var patch map[string]*string
	if err := json.NewDecoder(r.Body).Decode(&patch); err != nil {
		validation(w, "json_invalid", []any{"body"}, "JSON decode error: "+err.Error(), nil, nil)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		writeNotFound(w, id)
		return
	}
	next := maps.Clone(sb.sb.Metadata)
	if next == nil {
		next = map[string]string{}
	}
	for k, v := range patch {
		if strings.HasPrefix(k, opensandbox.ReservedMetadataPrefix) {
			writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidMetadataLabel, Message: fmt.Sprintf("metadata key %q: prefix %q is reserved", k, opensandbox.ReservedMetadataPrefix)})
			return
		}
		if v == nil {
			delete(next, k)
		} else {
			next[k] = *v
		}
	}
	if err := opensandbox.ValidateMetadata(next); err != nil {
		writeJSON(w, http.StatusBadRequest, opensandbox.ErrorBody{Code: opensandbox.CodeInvalidMetadataLabel, Message: err.Error()})
		return
	}
	sb.sb.Metadata = next
	writeJSON(w, http.StatusOK, s.viewLocked(sb))
}

// pauseResume serves POST /sandboxes/<id>/pause and /resume: 202, and the
// state moves to Paused or Running at once.
func (s *Server) pauseResume(w http.ResponseWriter, route opensandbox.Route) {
	state := opensandbox.StatePaused
	if route.Kind == opensandbox.RouteResume {
		state = opensandbox.StateRunning
	}
	if !s.SetState(route.ID, state, "") {
		writeNotFound(w, route.ID)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}
