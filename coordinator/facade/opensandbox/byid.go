package opensandbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
)

// passHeaders are the caller's headers the facade copies onto its own
// requests to nodes (id lookups, list pages): the server's credentials and
// the request id.
var passHeaders = []string{osb.HeaderAPIKey, "Authorization", osb.HeaderRequestID}

// byID routes a /sandboxes/{id}[/...] request to the node holding the
// sandbox and forwards it. The node is the ledger's (unless its record is
// deleted), else one a recent lookup found, else the one a lookup
// on every node finds now.
func (f *Facade) byID(w http.ResponseWriter, r *http.Request, st *reqState) {
	id := st.route.ID
	v := f.view()
	v.targets = f.reachable(st, v.targets)
	rec, ok := f.cfg.Ledger.ByID(protocol.ProviderOpenSandbox, id)
	op := policy.OpSandboxesList
	if st.route.Kind == osb.RouteSandbox && r.Method == http.MethodDelete {
		op = policy.OpSandboxesReap
	}
	if err := f.mayUse(st, op, rec, ok); err != nil {
		writeRefusal(w, err)
		return
	}
	switch {
	case ok && routable(rec.State):
		if p := v.nodeProblem(rec.Node); p != "" {
			writeError(w, http.StatusServiceUnavailable, CodeNodeUnavailable, fmt.Sprintf("sandbox %s is on node %s: %s", id, rec.Node, p))
			return
		}
		st.fromLedger = true
	default:
		if node, ok := f.found.get(id); ok && v.nodeProblem(node) == "" {
			rec = ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: node, ID: id}
			break
		}
		var done bool
		rec, done = f.find(w, r, id, st.class, v)
		if done {
			return
		}
	}
	if n, ok := v.all[rec.Node]; ok {
		if err := f.reach(st, n); err != nil {
			writeRefusal(w, err)
			return
		}
	}
	st.rec = rec
	st.node, st.session = rec.Node, v.all[rec.Node].SessionID

	switch st.route.Kind {
	case osb.RouteSandbox:
		st.decode = r.Method == http.MethodGet || r.Method == http.MethodDelete
		if r.Method == http.MethodDelete && st.fromLedger {
			ctx, cancel := ledgerCtx(r.Context())
			err := f.cfg.Ledger.Deleting(ctx, rec.Key())
			cancel()
			if err != nil {
				f.m.ledgerErrors.Inc()
				f.log.Error("ledger write failed", "node", rec.Node, "id", id, "op", "deleting", "err", err)
			}
		}
	case osb.RouteEndpoint, osb.RouteRenewExpiration, osb.RouteMetadata:
		st.decode = true
	}
	f.forward(w, r, st)
}

// routable reports whether a record in state s names the node to route
// to. A deleted record does not: the id is looked up again. A lost one
// does: its node went away and may come back with it, and until then the
// answer is 503, never a lookup's 404 that would make a client think it
// gone.
func routable(s ledger.State) bool { return s != ledger.StateDeleted }

// fanOut runs do(0..n-1), at most maxFanOut at once, and waits for all.
// A panic in do(i) is contained and handed to failed(i, err).
func (f *Facade) fanOut(n int, do func(i int), failed func(i int, err error)) {
	var g errgroup.Group
	g.SetLimit(maxFanOut)
	for i := range n {
		g.Go(func() error {
			defer f.guard.Recover("request on a node", func(e *panics.Error) { failed(i, e) })
			do(i)
			return nil
		})
	}
	g.Wait()
}

// foundCache remembers which node a lookup found an id on, for sandboxes
// the ledger does not hold (not created through a facade, not yet in an
// inventory), so that a client's next call does not ask every node again.
// It holds at most max ids and forgets them all when full; an entry goes
// when its sandbox answers 404 or is deleted.
type foundCache struct {
	mu  sync.Mutex
	max int
	m   map[string]string // sandbox id → node id
}

func newFoundCache(max int) *foundCache { return &foundCache{max: max, m: map[string]string{}} }

func (c *foundCache) get(id string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.m[id]
	return n, ok
}

func (c *foundCache) put(id, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		clear(c.m)
	}
	c.m[id] = node
}

func (c *foundCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

// lookup is one node's answer to GET /v1/sandboxes/{id}.
type lookup struct {
	node   protocol.NodeInfo
	status int // 0 on a transport error
	header http.Header
	body   []byte // at most maxDecodeBody bytes
	err    error
}

// find looks id up on every node with the target, in parallel, and waits
// for all of them. Exactly one node answering 200 → a record naming it
// (foundOn). Otherwise find answers the caller itself and
// returns done: several 200s → 409 TETHER::AMBIGUOUS_SANDBOX; a 4xx other
// than 404 (e.g. the server's 401 for a missing API key) → the first such
// answer verbatim; a node that failed → 502 TETHER::NODE_UNAVAILABLE (a
// 404 would let NeMo Gym treat a sandbox as gone while its node was merely
// unreachable); every node 404 (or no node) → the server's 404.
func (f *Facade) find(w http.ResponseWriter, r *http.Request, id, class string, v fleetView) (rec ledger.Record, done bool) {
	res := make([]lookup, len(v.targets))
	f.fanOut(len(v.targets), func(i int) { res[i] = f.lookupOn(r.Context(), r, v.targets[i], id, class) },
		func(i int, err error) { res[i] = lookup{node: v.targets[i], err: err} })

	var found, denied, failed []lookup
	for _, l := range res {
		switch {
		case l.err != nil && f.skippable(l.node, l.err):
			// Its server cannot be dialed and it holds nothing.
		case l.err != nil || l.status >= 500:
			failed = append(failed, l)
		case l.status == http.StatusOK:
			found = append(found, l)
		case l.status == http.StatusNotFound:
		default:
			denied = append(denied, l)
		}
	}
	switch {
	case len(found) > 1:
		var names []string
		for _, l := range found {
			names = append(names, l.node.ID)
		}
		writeError(w, http.StatusConflict, CodeAmbiguousSandbox, fmt.Sprintf("sandbox %s exists on several nodes (%s); the ledger names none of them", id, strings.Join(names, ", ")))
		return rec, true
	case len(found) == 1:
		return f.foundOn(found[0], id), false
	case len(denied) > 0:
		l := denied[0]
		for _, k := range []string{"Content-Type", osb.HeaderRequestID, "Www-Authenticate"} {
			if v := l.header.Values(k); len(v) > 0 {
				w.Header()[k] = v
			}
		}
		writeBody(w, l.status, l.header.Get("Content-Type"), l.body)
		return rec, true
	case len(failed) > 0:
		var msgs []string
		for _, l := range failed {
			msgs = append(msgs, l.describe())
		}
		writeError(w, http.StatusBadGateway, CodeNodeUnavailable, fmt.Sprintf("looking up sandbox %s: %s", id, strings.Join(msgs, "; ")))
		return rec, true
	}
	writeNotFound(w, id)
	return rec, true
}

// describe says why a lookup failed, naming the node and target.
func (l lookup) describe() string {
	if l.err != nil {
		return fmt.Sprintf("node %s, target %s: %v", l.node.ID, Target, l.err)
	}
	return fmt.Sprintf("node %s, target %s: answered %d %s", l.node.ID, Target, l.status, snippet(l.body))
}

// snippet is the start of a body for an error message.
func snippet(b []byte) string {
	const max = 200
	s := strings.TrimSpace(string(b))
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// lookupOn asks node for sandbox id.
func (f *Facade) lookupOn(ctx context.Context, r *http.Request, n protocol.NodeInfo, id, class string) lookup {
	l := lookup{node: n}
	resp, err := f.get(ctx, r, n, osb.VersionPrefix+osb.SandboxPath(url.PathEscape(id)), class)
	if err != nil {
		l.err = err
		return l
	}
	defer resp.Body.Close()
	l.status, l.header = resp.StatusCode, resp.Header
	l.body, err = io.ReadAll(io.LimitReader(resp.Body, maxDecodeBody))
	if err != nil {
		l.err = fmt.Errorf("read answer: %w", err)
	}
	return l
}

// get sends GET path (with query) to node n's lifecycle server, carrying
// the caller's passHeaders and Host; its latency counts toward class.
func (f *Facade) get(ctx context.Context, r *http.Request, n protocol.NodeInfo, pathQuery, class string) (*http.Response, error) {
	tr, err := f.tr.get(n.ID, n.SessionID)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+Target+pathQuery, nil)
	if err != nil {
		return nil, err
	}
	req.Host = r.Host
	for _, k := range passHeaders {
		if v := r.Header.Values(k); len(v) > 0 {
			req.Header[k] = slices.Clone(v)
		}
	}
	req.Header.Set("Accept", "application/json")
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	f.m.forwardLatency.WithLabelValues(class).Observe(time.Since(start).Seconds())
	return resp, err
}

// foundOn remembers that a lookup found id on l's node and returns a
// record to route by. It writes nothing to the ledger: Ledger.Created
// would make the sandbox managed (and so a candidate for the reaper)
// whatever its labels say, while the node's inventory applies the
// ledger's own rules and records it soon anyway.
func (f *Facade) foundOn(l lookup, id string) ledger.Record {
	f.found.put(id, l.node.ID)
	f.log.Info("sandbox found on node", "node", l.node.ID, "id", id)
	return ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: l.node.ID, ID: id}
}
