package ledger

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// Defaults of ReaperConfig.
const (
	DefaultReapInterval   = 5 * time.Second
	DefaultGrace          = time.Hour
	DefaultExpirySlack    = time.Minute
	DefaultReapRate       = 20
	DefaultReapParallel   = 8
	DefaultReapBatch      = 32
	DefaultMaxAttempts    = 5
	DefaultBackoff        = time.Second
	DefaultMaxBackoff     = 5 * time.Minute
	DefaultLostAfter      = 5 * time.Minute
	DefaultDeleteTimeout  = 30 * time.Second
	DefaultLockTTL        = 30 * time.Second
	deleteMarkerRetention = time.Hour
)

// lockKey is the reaper's key in BucketLocks.
const lockKey = "reaper"

// ReaperConfig configures NewReaper. Zero values mean the documented
// default.
type ReaperConfig struct {
	// Deleter deletes sandboxes through their node's tunnel (required).
	Deleter Deleter
	// Fleet says which nodes the reaper may act on (required). If it also
	// has a method ConnectedSince(node string) (time.Time, bool), the
	// reaper requires an inventory listed after the node's current session
	// began.
	Fleet FleetView
	// Interval is the longest time between passes; a pass also runs when
	// a lease closes and when the next lease, TTL or grace expires.
	// Default 5 s.
	Interval time.Duration
	// Grace is how long a managed sandbox with no lease may live after the
	// ledger first saw it (reason unowned); default 1 h; negative disables
	// reaping unowned sandboxes.
	Grace time.Duration
	// ExpirySlack is how long after a gateway's own expiry (OpenSandbox
	// expiresAt) a sandbox still there is reaped (reason ttl_expired);
	// default 1 min.
	ExpirySlack time.Duration
	// Rate bounds deletes per second across the fleet; default 20.
	Rate float64
	// Concurrency bounds the deletes in flight; default 8.
	Concurrency int
	// BatchSize is how many deletes run between two checks of the lock's
	// fencing token; default 32.
	BatchSize int
	// MaxAttempts is how many failed deletes make a record leaked;
	// default 5.
	MaxAttempts int
	// Backoff is the wait after a sandbox's first failed delete, doubled
	// after each further failure up to MaxBackoff; defaults 1 s and 5 min.
	Backoff, MaxBackoff time.Duration
	// LostAfter is how long a node may be unreachable, with no inventory
	// from any coordinator, before its live records become lost;
	// default 5 min.
	LostAfter time.Duration
	// DeleteTimeout bounds one Deleter call; default 30 s.
	DeleteTimeout time.Duration
	// LockTTL is how long the reaper's lock lives without a renewal;
	// default 30 s. A pass renews it; it must exceed Interval.
	LockTTL time.Duration
	// DryRun plans and logs, and deletes and changes nothing.
	DryRun bool
	// Logger receives logs; nil uses the ledger's.
	Logger *slog.Logger
}

func (c *ReaperConfig) setDefaults(l *Ledger) {
	c.Interval = cmp.Or(c.Interval, DefaultReapInterval)
	c.Grace = cmp.Or(c.Grace, DefaultGrace)
	c.ExpirySlack = cmp.Or(c.ExpirySlack, DefaultExpirySlack)
	c.Backoff = cmp.Or(c.Backoff, DefaultBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	c.LostAfter = cmp.Or(c.LostAfter, DefaultLostAfter)
	c.DeleteTimeout = cmp.Or(c.DeleteTimeout, DefaultDeleteTimeout)
	c.LockTTL = cmp.Or(c.LockTTL, DefaultLockTTL)
	c.Rate = cmp.Or(c.Rate, DefaultReapRate)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultReapParallel)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultReapBatch)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	if c.Logger == nil {
		c.Logger = l.cfg.Logger
	}
}

func (c *ReaperConfig) validate() error {
	var errs []error
	if c.Deleter == nil {
		errs = append(errs, errors.New("deleter is required"))
	}
	if c.Fleet == nil {
		errs = append(errs, errors.New("fleet view is required"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"interval", c.Interval}, {"expiry slack", c.ExpirySlack}, {"backoff", c.Backoff}, {"max backoff", c.MaxBackoff},
		{"lost after", c.LostAfter}, {"delete timeout", c.DeleteTimeout}, {"lock TTL", c.LockTTL}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", d.name, d.v))
		}
	}
	if c.LockTTL <= c.Interval {
		errs = append(errs, fmt.Errorf("lock TTL %v must exceed the interval %v", c.LockTTL, c.Interval))
	}
	if c.Rate < 0 || c.Concurrency < 1 || c.BatchSize < 1 || c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("rate %v, concurrency %d, batch size %d, max attempts %d: want rate >= 0 and the others >= 1",
			c.Rate, c.Concurrency, c.BatchSize, c.MaxAttempts))
	}
	return errors.Join(errs...)
}

// Candidate is a sandbox the reaper deletes, or would.
type Candidate struct {
	Record Record
	// Reason is one of protocol.Reason*.
	Reason string
	// Blocked, when set, says why the reaper waits instead of deleting it
	// now (partial knowledge of its node, or a retry backoff).
	Blocked string
}

// Pass says what one ReapOnce did.
type Pass struct {
	// Leader: this reaper held the lock for the pass.
	Leader bool
	// Fenced: it lost the lock during the pass and stopped deleting.
	Fenced bool
	// Candidates and Blocked count the plan; Reaped, Failed and Leaked
	// the deletes; Lost the records marked lost; Purged the records and
	// leases purged after their retention.
	Candidates, Blocked, Reaped, Failed, Leaked, Lost, Purged int
}

// Reaper deletes sandboxes whose run's lease expired or closed, whose TTL
// passed, or that sat managed and unowned past the grace period; only
// while it holds the reaper lock, and never on partial knowledge. Run
// drives it; Plan and ReapOnce are safe to call concurrently with Run.
type Reaper struct {
	l       *Ledger
	cfg     ReaperConfig
	log     *slog.Logger
	limiter *rate.Limiter
	holder  string

	// passMu serialises passes (Run's and ReapOnce's).
	passMu sync.Mutex
	// mu guards the fields below. Lock order: passMu, then mu, then the
	// Ledger's mu.
	mu          sync.Mutex
	token       uint64               // the lock's revision this reaper wrote last (fencing token); 0 = not held
	downAt      map[string]time.Time // nodes seen unreachable, since when
	retryAt     map[string]time.Time // KV key -> earliest next delete attempt
	lastMarkers time.Time            // when delete markers were last purged
	running     atomic.Bool
}

// NewReaper returns a reaper over l. It starts nothing: call Run.
func NewReaper(l *Ledger, cfg ReaperConfig) (*Reaper, error) {
	cfg.setDefaults(l)
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ledger: reaper config: %w", err)
	}
	lim := rate.NewLimiter(rate.Limit(cfg.Rate), max(1, int(cfg.Rate)))
	if cfg.Rate == 0 {
		lim = rate.NewLimiter(rate.Inf, 1)
	}
	return &Reaper{
		l: l, cfg: cfg, limiter: lim,
		log:     cfg.Logger.With("component", "reaper"),
		holder:  l.cfg.ID,
		downAt:  map[string]time.Time{},
		retryAt: map[string]time.Time{},
	}, nil
}

// Run runs passes until ctx ends: every Interval, when a lease closes, and
// when the next lease, TTL or grace period expires. It then releases the
// lock (if held) and returns nil. Only one Run per Reaper.
func (r *Reaper) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("ledger: reaper is already running")
	}
	defer r.running.Store(false)
	defer r.release()
	for {
		if _, err := r.ReapOnce(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("reaper pass failed", "err", err)
		}
		wait := r.cfg.Interval
		if next := r.nextDue(); !next.IsZero() {
			// A little after the expiry, so the pass sees it expired.
			wait = min(wait, max(next.Sub(r.l.now())+10*time.Millisecond, 10*time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-r.l.wake:
			t.Stop()
		}
	}
}

// Leader reports whether the reaper held the lock at its last pass.
func (r *Reaper) Leader() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.token != 0
}

// Plan returns what the reaper would delete now, sorted by key: each
// candidate with its reason, and Blocked set when the reaper must wait
// (the ledger is loading, the node is unreachable or lost, its inventory is
// missing, incomplete or older than its reconnect, or a retry backoff). It
// changes nothing.
func (r *Reaper) Plan() []Candidate { return r.PlanRun("") }

// PlanRun is Plan restricted to one run's sandboxes ("" for all): those
// naming it as Run or Owner, and those its lease owns under the label form
// of a long run id.
func (r *Reaper) PlanRun(run string) []Candidate {
	cands, _ := r.plan(run, false, r.l.now())
	return cands
}

// PlanReap is what reaping run (closing its lease) would delete: PlanRun
// as if run's lease were closed, so each live sandbox it owns is a
// candidate with reason run_closed (Blocked as usual). It changes nothing.
func (r *Reaper) PlanReap(run string) []Candidate {
	cands, _ := r.plan(run, run != "", r.l.now())
	return cands
}

// nextDue returns the earliest future time a record becomes a candidate.
func (r *Reaper) nextDue() time.Time {
	_, next := r.plan("", false, r.l.now())
	return next
}

// plan lists the candidates among run's records (every record for ""),
// with run's lease taken as closed if closing, and the earliest future
// time another record becomes one.
func (r *Reaper) plan(run string, closing bool, now time.Time) ([]Candidate, time.Time) {
	var out []Candidate
	var next time.Time
	recs := r.l.List(Filter{})
	closed := ""
	if run != "" {
		recs = r.l.runRecords(run)
		if closing {
			closed = run
		}
	}
	for _, rec := range recs {
		reason, due := r.reason(rec, closed, now)
		if reason == "" {
			if !due.IsZero() && (next.IsZero() || due.Before(next)) {
				next = due
			}
			continue
		}
		c := Candidate{Record: rec, Reason: reason, Blocked: r.knowledgeGap(rec)}
		if c.Blocked == "" {
			c.Blocked = r.backingOff(rec, now)
		}
		out = append(out, c)
	}
	return out, next
}

// reason says why rec should go now, or else when it next might (zero:
// never by itself). With closed set, that run's lease is taken as closed.
func (r *Reaper) reason(rec Record, closed string, now time.Time) (string, time.Time) {
	switch rec.State {
	case StateLive, StateDeleting, StateLost:
	default:
		return "", time.Time{}
	}
	var due time.Time
	later := func(t time.Time) {
		if due.IsZero() || t.Before(due) {
			due = t
		}
	}
	owned := false
	if id := rec.OwnerLease(); id != "" {
		if closed != "" && r.l.ownedBy(id, closed) {
			return protocol.ReasonRunClosed, time.Time{}
		}
		if ls, ok := r.l.LeaseOf(id); ok {
			switch {
			case ls.Closed:
				return protocol.ReasonRunClosed, time.Time{}
			case now.After(ls.ExpiresAt):
				return protocol.ReasonLeaseExpired, time.Time{}
			}
			owned = true
			later(ls.ExpiresAt)
		}
	}
	if rec.TTL > 0 {
		t := rec.CreatedAt.Add(rec.TTL)
		if now.After(t) {
			return protocol.ReasonTTLExpired, time.Time{}
		}
		later(t)
	}
	if !rec.ExpiresAt.IsZero() {
		t := rec.ExpiresAt.Add(r.cfg.ExpirySlack)
		if now.After(t) {
			return protocol.ReasonTTLExpired, time.Time{}
		}
		later(t)
	}
	if !owned && rec.Managed && r.cfg.Grace >= 0 {
		t := rec.FirstSeen.Add(r.cfg.Grace)
		if now.After(t) {
			return protocol.ReasonUnowned, time.Time{}
		}
		later(t)
	}
	return "", due
}

// connectedSincer is the optional part of a FleetView.
type connectedSincer interface {
	ConnectedSince(node string) (time.Time, bool)
}

// knowledgeGap says why the reaper does not know enough about rec's node
// to delete anything there; "" when it does.
func (r *Reaper) knowledgeGap(rec Record) string {
	if !r.l.Ready() {
		return "ledger is loading"
	}
	if rec.State == StateLost {
		return "node was lost; waiting for its next complete inventory"
	}
	if !r.cfg.Fleet.Reachable(rec.Node) {
		return "node is unreachable"
	}
	inv, ok := r.l.inventoryOf(rec.Node)
	if !ok {
		return "no inventory of the node yet"
	}
	if ok, why := inv.complete(rec.Provider); !ok {
		return why
	}
	r.mu.Lock()
	down, wasDown := r.downAt[rec.Node]
	r.mu.Unlock()
	if wasDown && !inv.ListedAt.After(down) {
		return "no inventory since the node was last unreachable"
	}
	if cs, ok := r.cfg.Fleet.(connectedSincer); ok {
		if since, ok := cs.ConnectedSince(rec.Node); ok && inv.ListedAt.Before(since) {
			return "no inventory since the node reconnected"
		}
	}
	return ""
}

// backingOff says when rec's next delete attempt is due, if later.
func (r *Reaper) backingOff(rec Record, now time.Time) string {
	r.mu.Lock()
	t, ok := r.retryAt[rec.Key().kvKey()]
	r.mu.Unlock()
	if ok && now.Before(t) {
		return "retrying after " + t.Format(time.RFC3339)
	}
	return ""
}

// observe notes the nodes with records that are unreachable now, and
// forgets those that have an inventory listed since.
func (r *Reaper) observe(now time.Time) {
	for _, n := range r.l.nodes() {
		reachable := r.cfg.Fleet.Reachable(n)
		inv, hasInv := r.l.inventoryOf(n)
		r.mu.Lock()
		down, wasDown := r.downAt[n]
		switch {
		case !reachable && !wasDown:
			r.downAt[n] = now
		case reachable && wasDown && hasInv && inv.ListedAt.After(down):
			delete(r.downAt, n)
		}
		r.mu.Unlock()
	}
}

// ReapOnce runs one pass: if the ledger is ready and this reaper holds (or
// takes) the lock, it marks lost nodes' records, purges records and leases
// past their retention, and deletes every candidate not blocked, in
// batches, checking its fencing token before each batch. A dry run only
// logs the plan.
func (r *Reaper) ReapOnce(ctx context.Context) (Pass, error) {
	r.passMu.Lock()
	defer r.passMu.Unlock()
	var p Pass
	if !r.l.Ready() {
		return p, nil
	}
	now := r.l.now()
	r.observe(now)
	leader, err := r.acquire(ctx, now)
	p.Leader = leader
	if err != nil {
		return p, fmt.Errorf("reaper lock: %w", err)
	}
	if !leader {
		return p, nil
	}
	if !r.cfg.DryRun {
		p.Lost, p.Purged = r.maintain(ctx, now)
	}
	cands, _ := r.plan("", false, now)
	p.Candidates = len(cands)
	due := cands[:0:0]
	for _, c := range cands {
		if c.Blocked != "" {
			p.Blocked++
		} else {
			due = append(due, c)
		}
	}
	if r.cfg.DryRun {
		for _, c := range due {
			r.log.Info("dry run: would reap sandbox", "reason", c.Reason, "provider", c.Record.Provider, "node_id", c.Record.Node, "sandbox_id", c.Record.ID, "run", c.Record.Run)
		}
		return p, nil
	}
	var mu sync.Mutex
	for batch := range slices.Chunk(due, r.cfg.BatchSize) {
		if ctx.Err() != nil {
			break
		}
		if !r.fence(ctx) {
			p.Fenced = true
			r.log.Warn("reaper lost its lock during a pass; stopping", "left", len(due))
			break
		}
		work := make(chan Candidate)
		var wg sync.WaitGroup
		for range min(r.cfg.Concurrency, len(batch)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := range work {
					o := r.reapOneGuarded(ctx, c)
					mu.Lock()
					switch o {
					case outcomeReaped:
						p.Reaped++
					case outcomeLeaked:
						p.Leaked++
						p.Failed++
					case outcomeFailed:
						p.Failed++
					}
					mu.Unlock()
				}
			}()
		}
		for _, c := range batch {
			work <- c
		}
		close(work)
		wg.Wait()
	}
	return p, ctx.Err()
}

type outcome int

const (
	outcomeSkipped outcome = iota
	outcomeReaped
	outcomeFailed
	outcomeLeaked
)

// reapOneGuarded is reapOne with a panic in it contained: the candidate
// then counts as failed (and is retried on a later pass) and the worker
// goes on with the next.
func (r *Reaper) reapOneGuarded(ctx context.Context, c Candidate) (o outcome) {
	defer r.l.guard.Recover("reap", func(*panics.Error) { o = outcomeFailed })
	return r.reapOne(ctx, c)
}

// reapOne deletes one candidate: it waits for the rate limiter, marks the
// record deleting after checking (with CAS) that it still is a candidate
// and nothing blocks it, calls the Deleter, and records the result.
func (r *Reaper) reapOne(ctx context.Context, c Candidate) outcome {
	if err := r.limiter.Wait(ctx); err != nil {
		return outcomeSkipped
	}
	k := c.Record.Key()
	now := r.l.now()
	var reason string
	rec, _, err := r.l.mutate(ctx, k, func(cur Record, exists bool) (Record, bool) {
		reason = ""
		if !exists {
			return cur, false
		}
		if reason, _ = r.reason(cur, "", now); reason == "" || r.knowledgeGap(cur) != "" {
			reason = ""
			return cur, false
		}
		if cur.State == StateDeleting {
			return cur, false
		}
		cur.State, cur.StateSince = StateDeleting, now
		return cur, true
	})
	if err != nil {
		r.log.Warn("reaper could not mark a sandbox deleting", "key", k.String(), "err", err)
		return outcomeSkipped
	}
	if reason == "" {
		return outcomeSkipped
	}
	log := r.log.With("reason", reason, "provider", k.Provider, "node_id", k.Node, "sandbox_id", k.ID, "run", rec.Run)
	dctx, cancel := context.WithTimeout(ctx, r.cfg.DeleteTimeout)
	derr := r.cfg.Deleter.Delete(dctx, rec)
	cancel()
	if derr == nil || errors.Is(derr, gateway.ErrNotFound) {
		done, _, err := r.l.mutate(ctx, k, func(cur Record, exists bool) (Record, bool) {
			if !exists || cur.State == StateDeleted {
				return cur, false
			}
			cur.State, cur.StateSince, cur.LastError = StateDeleted, r.l.now(), ""
			return cur, true
		})
		if err != nil {
			log.Warn("sandbox reaped but its record not updated; the next inventory will", "err", err)
			done = rec
		}
		r.mu.Lock()
		delete(r.retryAt, k.kvKey())
		r.mu.Unlock()
		r.l.m.reaps.WithLabelValues(reason).Inc()
		r.l.event(protocol.EventReaped, done, reason, "")
		log.Info("sandbox reaped", "already_gone", derr != nil)
		return outcomeReaped
	}
	if ctx.Err() != nil { // shutting down: not the sandbox's failure
		return outcomeSkipped
	}
	r.l.m.reapFailures.Inc()
	msg := derr.Error()
	if len(msg) > 512 {
		msg = msg[:512] + "…"
	}
	leaked := false
	failed, _, err := r.l.mutate(ctx, k, func(cur Record, exists bool) (Record, bool) {
		leaked = false
		if !exists || cur.State == StateDeleted {
			return cur, false
		}
		cur.Attempts++
		cur.LastError = msg
		if cur.Attempts >= r.cfg.MaxAttempts {
			leaked = true
			cur.State, cur.StateSince = StateLeaked, r.l.now()
		}
		return cur, true
	})
	if err != nil {
		log.Warn("reaper could not record a failed delete", "err", err)
		failed = rec
	}
	r.l.event(protocol.EventReapFailed, failed, reason, msg)
	if leaked {
		r.l.m.leaked.Inc()
		log.Error("reaper gave up on a sandbox: it is leaked", "attempts", failed.Attempts, "err", derr)
		return outcomeLeaked
	}
	wait := r.cfg.Backoff << min(max(failed.Attempts-1, 0), 30)
	if wait <= 0 || wait > r.cfg.MaxBackoff {
		wait = r.cfg.MaxBackoff
	}
	r.mu.Lock()
	r.retryAt[k.kvKey()] = now.Add(wait)
	r.mu.Unlock()
	log.Warn("reaper delete failed; will retry", "attempts", failed.Attempts, "retry_in", wait, "err", derr)
	return outcomeFailed
}

// maintain marks the records of long-unreachable nodes lost and purges
// deleted records and finished leases past their retention. It returns how
// many records it marked lost and how many keys it purged.
//
// A node is known last at its last inventory or the last time a record of
// it was seen; a node with no inventory at all (one that never connected,
// named only by registrations) is known last when its newest record was
// first seen, since a registration is no sign of the node.
func (r *Reaper) maintain(ctx context.Context, now time.Time) (lost, purged int) {
	for _, n := range r.l.nodes() {
		if r.cfg.Fleet.Reachable(n) {
			continue
		}
		var last time.Time
		inv, hasInv := r.l.inventoryOf(n)
		if hasInv {
			last = inv.At
		}
		active := false
		for _, rec := range r.l.List(Filter{Node: n}) {
			if rec.State == StateLive || rec.State == StateDeleting {
				active = true
				seen := rec.LastSeen
				if !hasInv {
					seen = rec.FirstSeen
				}
				if seen.After(last) {
					last = seen
				}
			}
		}
		if !active || now.Sub(last) <= r.cfg.LostAfter {
			continue
		}
		k, err := r.l.NodeLost(ctx, n)
		lost += k
		if err != nil {
			r.log.Warn("could not mark a lost node's records", "node_id", n, "err", err)
		}
		if k > 0 {
			r.log.Warn("node unreachable too long: its records are lost until it returns", "node_id", n, "records", k, "last_known", last)
		}
	}
	for _, rec := range r.l.List(Filter{State: string(StateDeleted)}) {
		if now.Sub(rec.StateSince) <= r.l.cfg.Retention {
			continue
		}
		err := r.l.sandboxes.Purge(ctx, rec.Key().kvKey(), jetstream.LastRevision(rec.Revision))
		if err == nil {
			purged++
		} else if !isConflict(err) {
			r.log.Warn("could not purge a deleted record", "key", rec.Key().String(), "err", err)
		}
	}
	for _, ls := range r.l.Leases() {
		end := ls.ExpiresAt
		if ls.Closed {
			end = ls.ClosedAt
		}
		if !ls.Closed && !now.After(ls.ExpiresAt) || now.Sub(end) <= r.l.cfg.LeaseRetention || r.l.owns(ls.Run) {
			continue
		}
		err := r.l.leases.Purge(ctx, encodeToken(ls.Run), jetstream.LastRevision(ls.Revision))
		if err == nil {
			purged++
		} else if !isConflict(err) {
			r.log.Warn("could not purge a finished lease", "run", ls.Run, "err", err)
		}
	}
	r.mu.Lock()
	markers := now.Sub(r.lastMarkers) > deleteMarkerRetention
	if markers {
		r.lastMarkers = now
	}
	r.mu.Unlock()
	if markers {
		for _, kv := range []jetstream.KeyValue{r.l.sandboxes, r.l.leases} {
			if err := kv.PurgeDeletes(ctx, jetstream.DeleteMarkersOlderThan(deleteMarkerRetention)); err != nil {
				r.log.Warn("could not purge delete markers", "bucket", kv.Bucket(), "err", err)
			}
		}
	}
	return lost, purged
}

// owns reports whether run's lease owns a record not yet deleted.
func (l *Ledger) owns(run string) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, set := range []keySet{l.idx.byOwner[run], l.idx.byOwner[sanitizeValue(run)]} {
		for k := range set {
			if l.idx.recs[k].State != StateDeleted {
				return true
			}
		}
	}
	return false
}

// lockValue is the value of the reaper's lock.
type lockValue struct {
	Holder    string    `json:"holder"`
	ExpiresAt time.Time `json:"expires_at"`
}

// acquire renews the lock this reaper holds, or takes it if it is free or
// expired. The revision it writes is its fencing token.
func (r *Reaper) acquire(ctx context.Context, now time.Time) (bool, error) {
	data, _ := json.Marshal(lockValue{Holder: r.holder, ExpiresAt: now.Add(r.cfg.LockTTL)})
	r.mu.Lock()
	token := r.token
	r.mu.Unlock()
	if token != 0 {
		rev, err := r.l.locks.Update(ctx, lockKey, data, token)
		if err == nil {
			r.setToken(rev)
			return true, nil
		}
		if !isConflict(err) {
			return false, err // keep the token: the next pass retries the renewal
		}
		r.setToken(0)
		r.log.Warn("reaper lock was taken over", "holder", r.holder)
	}
	e, err := r.l.locks.Get(ctx, lockKey)
	var rev uint64
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		rev, err = r.l.locks.Create(ctx, lockKey, data)
	case err != nil:
		return false, err
	default:
		var cur lockValue
		if json.Unmarshal(e.Value(), &cur) == nil && cur.Holder != r.holder && !now.After(cur.ExpiresAt) {
			return false, nil
		}
		rev, err = r.l.locks.Update(ctx, lockKey, data, e.Revision())
	}
	if isConflict(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	r.setToken(rev)
	r.log.Info("reaper lock taken; this reaper is active", "holder", r.holder, "token", rev)
	return true, nil
}

func (r *Reaper) setToken(t uint64) {
	r.mu.Lock()
	r.token = t
	r.mu.Unlock()
}

// fence renews the lock with compare-and-set on the fencing token: it
// fails if anyone else wrote the lock since this reaper's last write.
func (r *Reaper) fence(ctx context.Context) bool {
	r.mu.Lock()
	token := r.token
	r.mu.Unlock()
	if token == 0 {
		return false
	}
	data, _ := json.Marshal(lockValue{Holder: r.holder, ExpiresAt: r.l.now().Add(r.cfg.LockTTL)})
	rev, err := r.l.locks.Update(ctx, lockKey, data, token)
	if err != nil {
		if isConflict(err) {
			r.setToken(0)
		}
		return false
	}
	r.setToken(rev)
	return true
}

// release deletes the lock if this reaper still holds it.
func (r *Reaper) release() {
	r.mu.Lock()
	token := r.token
	r.token = 0
	r.mu.Unlock()
	if token == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.l.locks.Delete(ctx, lockKey, jetstream.LastRevision(token)); err != nil && !isConflict(err) {
		r.log.Debug("reaper lock not released; it expires", "err", err)
	}
}

// String describes c for logs.
func (c Candidate) String() string {
	s := c.Record.Key().String() + ": " + c.Reason
	if c.Blocked != "" {
		s += " (blocked: " + c.Blocked + ")"
	}
	return strings.TrimSpace(s)
}
