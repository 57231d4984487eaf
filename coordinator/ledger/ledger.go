package ledger

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator/internal/jsreplicas"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// KV buckets of the ledger. Each has history 1; coordinators sharing a NATS
// system share them.
const (
	// BucketSandboxes holds one protocol.SandboxInfo per sandbox, keyed
	// <provider>.<node>.<id> (node and id encoded so any string is a valid
	// key: kept as is when made of [A-Za-z0-9_-], else "=" and base32hex).
	BucketSandboxes = "tether_sandboxes"
	// BucketLeases holds one protocol.LeaseInfo per run, keyed by run id
	// (encoded like a record key's tokens when it holds a '.').
	BucketLeases = "tether_leases"
	// BucketInventory holds the last inventory status of each node
	// (inventoryStatus), keyed by encoded node id. The reaper reads it to
	// know whether a node's records are complete.
	BucketInventory = "tether_inventory"
	// BucketLocks holds the reaper's lock (key "reaper").
	BucketLocks = "tether_locks"
)

// Defaults of Config.
const (
	DefaultRetention        = time.Hour
	DefaultLeaseRetention   = 24 * time.Hour
	DefaultTouchInterval    = time.Minute
	DefaultListingSlack     = 30 * time.Second
	DefaultWriteConcurrency = 16
	DefaultMarkerLabel      = "nemo-gym.sandbox"
	DefaultMarkerValue      = "1"
)

// Errors callers branch on.
var (
	// ErrLeaseNotFound: the run has no lease.
	ErrLeaseNotFound = errors.New("ledger: lease not found")
	// ErrLeaseClosed: the run's lease was closed.
	ErrLeaseClosed = errors.New("ledger: lease closed")
	// ErrLeaseHeld: another holder holds the run's live lease.
	ErrLeaseHeld = errors.New("ledger: lease held by another holder")
	// ErrClosed: the ledger was closed.
	ErrClosed = errors.New("ledger: closed")
)

// Config configures Open. Zero values mean the documented default.
type Config struct {
	// NATS is the connection to use, owned by the caller (required; its
	// server must have JetStream).
	NATS *nats.Conn
	// ID names this coordinator in events and in the reaper's lock;
	// default a random id.
	ID string
	// Replicas of each bucket, 1 to 5; zero (default) means min(3,
	// cluster size), tried from 3 down (package jsreplicas).
	Replicas int
	// Attribution says which labels carry team, user, workload and run.
	Attribution Attribution
	// MarkerLabel and MarkerValue make a sandbox managed (NeMo Gym's
	// marker, wire-facts §4.4); defaults "nemo-gym.sandbox" and "1".
	MarkerLabel, MarkerValue string
	// Retention is how long a deleted record is kept before it is purged;
	// default 1 h.
	Retention time.Duration
	// LeaseRetention is how long a closed or expired lease is kept once no
	// record it owns is left undeleted; default 24 h.
	LeaseRetention time.Duration
	// TouchInterval is how stale LastSeen may get before an inventory that
	// changes nothing else rewrites a record; default 1 min.
	TouchInterval time.Duration
	// ListingSlack is how long before Reconcile's call its inventory is
	// assumed to have started listing (ReconcileAt takes the real time);
	// default 30 s.
	ListingSlack time.Duration
	// WriteConcurrency bounds the KV writes in flight during a Reconcile;
	// default 16.
	WriteConcurrency int
	// Publish sends a sandbox event (subject, JSON body); nil publishes on
	// NATS. Failures are logged and otherwise ignored.
	Publish func(subject string, data []byte) error
	// Now is the clock; nil means time.Now. Tests inject one.
	Now func() time.Time
	// Logger receives logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the ledger's and reaper's metrics; nil uses a
	// private registry.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() {
	if c.ID == "" {
		var b [6]byte
		rand.Read(b[:])
		c.ID = "ledger-" + hex.EncodeToString(b[:])
	}
	c.Attribution = c.Attribution.withDefaults()
	c.MarkerLabel = cmp.Or(c.MarkerLabel, DefaultMarkerLabel)
	c.MarkerValue = cmp.Or(c.MarkerValue, DefaultMarkerValue)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.LeaseRetention = cmp.Or(c.LeaseRetention, DefaultLeaseRetention)
	c.TouchInterval = cmp.Or(c.TouchInterval, DefaultTouchInterval)
	c.ListingSlack = cmp.Or(c.ListingSlack, DefaultListingSlack)
	c.WriteConcurrency = cmp.Or(c.WriteConcurrency, DefaultWriteConcurrency)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

// validate reports every problem of c (after defaults).
func (c *Config) validate() error {
	var errs []error
	if c.NATS == nil {
		errs = append(errs, errors.New("NATS connection is required"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"retention", c.Retention}, {"lease retention", c.LeaseRetention}, {"touch interval", c.TouchInterval}, {"listing slack", c.ListingSlack}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", d.name, d.v))
		}
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas %d: want 0 (auto) to 5", c.Replicas))
	}
	if c.WriteConcurrency < 1 {
		errs = append(errs, fmt.Errorf("write concurrency %d: want at least 1", c.WriteConcurrency))
	}
	return errors.Join(errs...)
}

// Ledger is the sandbox ledger: an in-memory index of the KV buckets, kept
// current by watchers, and CAS writes to them. Its methods are safe for
// concurrent use.
type Ledger struct {
	cfg Config
	log *slog.Logger
	m   *metrics
	// guard contains a panic of one write or one reap (its worker goes
	// on with the next), counted as tether_panics_total{component="ledger"}.
	guard *panics.Guard
	// keep are the label keys a bounded copy of labels keeps first: the
	// marker, then every attribution key.
	keep []string

	sandboxes, leases, inventory, locks jetstream.KeyValue

	mu       sync.RWMutex // guards idx, leaseIdx, invIdx, seq
	idx      index
	leaseIdx leaseIndex
	invIdx   map[string]inventoryStatus // by node
	// seq is the last revision each watcher applied, per bucket: a
	// write's own result is applied at once only when its watcher has not
	// gone past it.
	seq [3]uint64

	ready   atomic.Bool
	readyCh chan struct{}
	// wake gets a value (without blocking) when a lease closes, so a
	// reaper acts at once.
	wake chan struct{}

	watchers []jetstream.KeyWatcher
	stop     context.CancelFunc
	done     chan struct{}
	closed   atomic.Bool
}

// Buckets indexes for Ledger.seq.
const (
	bSandboxes = iota
	bLeases
	bInventory
)

// Open creates (or binds to) the ledger's buckets, starts watching them and
// returns without waiting for the initial load: Ready reports when it is
// done, WaitReady waits for it. Close stops the watchers. Errors name the
// bucket that failed.
func Open(ctx context.Context, cfg Config) (*Ledger, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ledger: config: %w", err)
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("ledger: jetstream: %w", err)
	}
	l := &Ledger{
		cfg:      cfg,
		keep:     append([]string{cfg.MarkerLabel}, cfg.Attribution.keys()...),
		log:      cfg.Logger.With("component", "ledger"),
		idx:      newIndex(),
		leaseIdx: newLeaseIndex(),
		invIdx:   map[string]inventoryStatus{},
		readyCh:  make(chan struct{}),
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	if l.m, err = newMetrics(cfg.Registerer, l); err != nil {
		return nil, err
	}
	l.guard = panics.New(cfg.Registerer, l.log, "ledger")
	for _, b := range []struct {
		kv   *jetstream.KeyValue
		name string
		desc string
	}{
		{&l.sandboxes, BucketSandboxes, "Tether sandbox ledger: one record per sandbox"},
		{&l.leases, BucketLeases, "Tether run leases"},
		{&l.inventory, BucketInventory, "Tether node inventory status"},
		{&l.locks, BucketLocks, "Tether locks (reaper)"},
	} {
		var kv jetstream.KeyValue
		_, err := jsreplicas.Create(ctx, jsreplicas.Store{Name: "ledger bucket " + b.name, Replicas: cfg.Replicas, Log: l.log, Exists: jsreplicas.BucketExists(js, b.name, &kv)}, func(ctx context.Context, r int) error {
			var err error
			kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket: b.name, Description: b.desc, History: 1, Replicas: r,
			})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("ledger: bucket %s: %w", b.name, err)
		}
		*b.kv = kv
	}
	wctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	for _, kv := range []jetstream.KeyValue{l.sandboxes, l.leases, l.inventory} {
		w, err := kv.WatchAll(wctx)
		if err != nil {
			stop()
			for _, w := range l.watchers {
				w.Stop()
			}
			return nil, fmt.Errorf("ledger: watch bucket %s: %w", kv.Bucket(), err)
		}
		l.watchers = append(l.watchers, w)
	}
	go l.watch(wctx)
	return l, nil
}

// Close stops the watchers and waits for the goroutine applying them,
// which drains what they still deliver. Writes after Close fail with
// ErrClosed. It does not close the NATS connection.
func (l *Ledger) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	for _, w := range l.watchers {
		w.Stop()
	}
	// Stopping a watcher closes its channel once its delivery goroutine
	// ends; the loop drains until then. Should that never happen, give up
	// waiting after a while.
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-l.done:
	case <-t.C:
		l.stop()
		<-l.done
	}
	l.stop()
	return nil
}

// Ready reports whether the initial load of every bucket finished. Until
// then lookups may miss records and the reaper deletes nothing.
func (l *Ledger) Ready() bool { return l.ready.Load() }

// WaitReady blocks until Ready or ctx ends.
func (l *Ledger) WaitReady(ctx context.Context) error {
	select {
	case <-l.readyCh:
		return nil
	case <-l.done:
		return ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("ledger: wait for initial load: %w", ctx.Err())
	}
}

// ID is the ledger's (coordinator's) id.
func (l *Ledger) ID() string { return l.cfg.ID }

func (l *Ledger) now() time.Time { return l.cfg.Now().UTC() }

// watch applies the watchers' entries to the indexes until ctx ends. It is
// the only goroutine Open starts.
func (l *Ledger) watch(ctx context.Context) {
	defer close(l.done)
	chans := make([]<-chan jetstream.KeyValueEntry, len(l.watchers))
	for i, w := range l.watchers {
		chans[i] = w.Updates()
	}
	loaded := make([]bool, len(chans))
	for {
		var (
			e  jetstream.KeyValueEntry
			ok bool
			b  int
		)
		select {
		case <-ctx.Done():
			return
		case e, ok = <-chans[bSandboxes]:
			b = bSandboxes
		case e, ok = <-chans[bLeases]:
			b = bLeases
		case e, ok = <-chans[bInventory]:
			b = bInventory
		}
		if !ok {
			if !l.closed.Load() {
				l.log.Error("bucket watcher stopped (NATS connection closed?); the ledger no longer follows it", "bucket", []string{BucketSandboxes, BucketLeases, BucketInventory}[b])
			}
			chans[b] = nil
			if !slices.ContainsFunc(chans, func(c <-chan jetstream.KeyValueEntry) bool { return c != nil }) {
				return
			}
			continue
		}
		if e == nil {
			if !loaded[b] {
				loaded[b] = true
				if !slices.Contains(loaded, false) {
					l.ready.Store(true)
					close(l.readyCh)
					l.log.Info("ledger loaded", "sandboxes", l.Len())
				}
			}
			continue
		}
		switch b {
		case bSandboxes:
			l.applySandbox(e)
		case bLeases:
			l.applyLease(e)
		case bInventory:
			l.applyInventory(e)
		}
	}
}

// applySandbox applies a watched entry of the sandboxes bucket.
func (l *Ledger) applySandbox(e jetstream.KeyValueEntry) {
	var r Record
	put := e.Operation() == jetstream.KeyValuePut
	if put {
		var err error
		if r, err = decodeSandboxEntry(e.Key(), e.Value()); err != nil {
			l.log.Warn("undecodable sandbox record ignored", "key", protocol.Clip(e.Key()), "revision", e.Revision(), "err", err)
			put = false
		}
		r.Revision = e.Revision()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq[bSandboxes] = max(l.seq[bSandboxes], e.Revision())
	if cur, ok := l.idx.recs[e.Key()]; ok && cur.Revision >= e.Revision() {
		return
	}
	if put {
		l.idx.put(e.Key(), r)
	} else if e.Operation() != jetstream.KeyValuePut {
		l.idx.remove(e.Key())
	}
}

// applyOwnSandbox applies the result of this ledger's own write at once,
// unless the watcher already went past it (then it applied this write or
// a newer one).
func (l *Ledger) applyOwnSandbox(key string, r Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Revision <= l.seq[bSandboxes] {
		return
	}
	if cur, ok := l.idx.recs[key]; ok && cur.Revision >= r.Revision {
		return
	}
	l.idx.put(key, r)
}

// Len is the number of records in the index.
func (l *Ledger) Len() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.idx.recs)
}

// Get returns the record of key k.
func (l *Ledger) Get(k Key) (Record, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	r, ok := l.idx.recs[k.kvKey()]
	return r, ok
}

// ByID returns the record of a sandbox by provider and gateway id (exec and
// watch routing). When several nodes have one (a gateway restored from
// another's backup), a record not deleted wins, then the one seen last.
func (l *Ledger) ByID(provider, id string) (Record, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.idx.best(l.idx.byID[[2]string{provider, id}])
}

// ByName returns the record of an OpenShell sandbox by workspace and name
// (get and delete routing), preferring, like ByID, a record not deleted
// and then the one seen last (a name is reused after a delete).
func (l *Ledger) ByName(provider, workspace, name string) (Record, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.idx.best(l.idx.byName[[3]string{provider, workspace, name}])
}

// Filter selects records; empty fields match all. Run matches a record's
// Run or Owner.
type Filter struct {
	Run, Node, State, Provider string
	// OwnedBy, when set, keeps only the records whose owner (OwnerOf) is
	// this identity.
	OwnedBy string
}

// match reports whether r passes f; l.mu is held (OwnedBy reads the
// leases).
func (l *Ledger) match(f Filter, r *Record) bool {
	return (f.Run == "" || r.Run == f.Run || r.Owner == f.Run) &&
		(f.Node == "" || r.Node == f.Node) &&
		(f.State == "" || string(r.State) == f.State) &&
		(f.Provider == "" || r.Provider == f.Provider) &&
		(f.OwnedBy == "" || l.ownerOfLocked(r) == f.OwnedBy)
}

// List returns the records matching f, sorted by key (provider, node, id).
// Records share their Labels maps with the index: treat them as read-only.
func (l *Ledger) List(f Filter) []Record {
	recs, _ := l.page(f, "", 0)
	return recs
}

// page returns up to limit (0: all) records matching f whose KV key sorts
// after after, and the key of the last one when more follow.
func (l *Ledger) page(f Filter, after string, limit int) ([]Record, string) {
	l.mu.RLock()
	var keys []string
	add := func(k string) {
		if k > after {
			if r := l.idx.recs[k]; l.match(f, &r) {
				keys = append(keys, k)
			}
		}
	}
	switch {
	case f.Run != "":
		for k := range l.idx.byRun[f.Run] {
			add(k)
		}
		for k := range l.idx.byOwner[f.Run] {
			if r := l.idx.recs[k]; r.Run != f.Run { // not added above
				add(k)
			}
		}
	case f.Node != "":
		for k := range l.idx.byNode[f.Node] {
			add(k)
		}
	default:
		for k := range l.idx.recs {
			add(k)
		}
	}
	slices.Sort(keys)
	next := ""
	if limit > 0 && len(keys) > limit {
		keys = keys[:limit]
		next = keys[limit-1]
	}
	out := make([]Record, len(keys))
	for i, k := range keys {
		out[i] = l.idx.recs[k]
	}
	l.mu.RUnlock()
	return out, next
}

// runRecords returns, sorted by key, the records of run (Filter{Run: run})
// and the records the run's lease owns under the label form NeMo Gym's
// OpenSandbox provider gives a long run id (when no lease has that form as
// its own id).
func (l *Ledger) runRecords(run string) []Record {
	recs := l.List(Filter{Run: run})
	s := sanitizeValue(run)
	if s == run {
		return recs
	}
	l.mu.RLock()
	_, exact := l.leaseIdx.byRun[s]
	l.mu.RUnlock()
	if exact {
		return recs
	}
	n := len(recs)
	for _, r := range l.List(Filter{Run: s}) {
		if r.OwnerLease() == s && !slices.ContainsFunc(recs[:n], func(o Record) bool { return o.Key() == r.Key() }) {
			recs = append(recs, r)
		}
	}
	if len(recs) > n {
		slices.SortFunc(recs, func(a, b Record) int { return strings.Compare(a.Key().kvKey(), b.Key().kvKey()) })
	}
	return recs
}

// ownedBy reports whether a record naming id as its owner lease
// (Record.OwnerLease) would be owned by run's lease, were it there: id is
// the run id, or its label form when no lease has that as its own id.
func (l *Ledger) ownedBy(id, run string) bool {
	if id == run {
		return true
	}
	if id != sanitizeValue(run) {
		return false
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	_, exact := l.leaseIdx.byRun[id]
	return !exact
}

// hasLease reports whether run has a lease of its own (open, expired or
// closed).
func (l *Ledger) hasLease(run string) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	_, ok := l.leaseIdx.byRun[run]
	return ok
}

// knownNode reports whether some coordinator has reconciled an inventory
// of node (its status is in BucketInventory): the node was connected.
func (l *Ledger) knownNode(node string) bool {
	_, ok := l.inventoryOf(node)
	return ok
}

// LiveOn counts the live sandboxes on node (placement).
func (l *Ledger) LiveOn(node string) int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.idx.live[node]
}

// nodes returns the nodes that have records.
func (l *Ledger) nodes() []string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]string, 0, len(l.idx.byNode))
	for n := range l.idx.byNode {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// event publishes a sandbox event.
func (l *Ledger) event(name string, r Record, reason, errMsg string) {
	ev := protocol.SandboxEvent{Time: l.now(), Event: name, Sandbox: r.Info(), Reason: reason, Error: errMsg, Coordinator: l.cfg.ID}
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	subj := protocol.SubjectSandboxEventPrefix + name
	if l.cfg.Publish != nil {
		err = l.cfg.Publish(subj, b)
	} else {
		err = l.cfg.NATS.Publish(subj, b)
	}
	if err != nil {
		l.log.Debug("sandbox event not published", "event", name, "sandbox_id", r.ID, "err", err)
	}
}

// isConflict reports whether a KV write lost a CAS race.
func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// maxCASAttempts bounds the retries of one CAS write under contention.
const maxCASAttempts = 16

// mutate changes the record of k by fn with compare-and-set, retrying with
// fresh state on a conflict. fn gets the current record (exists false: none,
// or deleted from the bucket) and returns the next one and whether to write
// it. The first attempt reads the index, later ones the bucket. It returns
// the record as stored afterwards, and whether this call wrote it; it
// publishes the events of the state change it made.
func (l *Ledger) mutate(ctx context.Context, k Key, fn func(cur Record, exists bool) (Record, bool)) (Record, bool, error) {
	if l.closed.Load() {
		return Record{}, false, ErrClosed
	}
	key := k.kvKey()
	l.mu.RLock()
	cur, exists := l.idx.recs[key]
	l.mu.RUnlock()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			var err error
			if cur, exists, err = l.getSandbox(ctx, key); err != nil {
				return Record{}, false, fmt.Errorf("ledger: read %s: %w", k, err)
			}
		}
		next, write := fn(cur, exists)
		if !write {
			return cur, false, nil
		}
		next.Provider, next.Node, next.ID = k.Provider, k.Node, k.ID
		info := next.Info()
		info.Revision = 0
		data, err := json.Marshal(info)
		if err != nil {
			return Record{}, false, fmt.Errorf("ledger: encode %s: %w", k, err)
		}
		var rev uint64
		if exists {
			rev, err = l.sandboxes.Update(ctx, key, data, cur.Revision)
		} else {
			rev, err = l.sandboxes.Create(ctx, key, data)
		}
		if err == nil {
			next.Revision = rev
			l.applyOwnSandbox(key, next)
			l.transitionEvents(cur, exists, next)
			return next, true, nil
		}
		if !isConflict(err) || attempt == maxCASAttempts {
			return Record{}, false, fmt.Errorf("ledger: write %s: %w", k, err)
		}
	}
}

// transitionEvents publishes created, deleted, lost and leaked events for a
// write that changed prev into next.
func (l *Ledger) transitionEvents(prev Record, existed bool, next Record) {
	if !existed {
		l.event(protocol.EventCreated, next, "", "")
		return
	}
	if prev.State == next.State {
		return
	}
	switch next.State {
	case StateDeleted:
		l.event(protocol.EventDeleted, next, "", "")
	case StateLost:
		l.event(protocol.EventLost, next, "", "")
	case StateLeaked:
		l.event(protocol.EventLeaked, next, "", next.LastError)
	}
}

// getSandbox reads one record from the bucket.
func (l *Ledger) getSandbox(ctx context.Context, key string) (Record, bool, error) {
	e, err := l.sandboxes.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, err
	}
	r, err := decodeSandboxEntry(key, e.Value())
	if err != nil {
		return Record{}, false, err
	}
	r.Revision = e.Revision()
	return r, true, nil
}

// managed reports whether labels carry the marker label.
func (l *Ledger) managed(labels map[string]string) bool {
	v, ok := labels[l.cfg.MarkerLabel]
	return ok && strings.TrimSpace(v) == l.cfg.MarkerValue
}

// bound returns the copy of labels the ledger stores (protocol.BoundLabels
// keeping the marker and the attribution keys first), and whether it cut
// anything.
func (l *Ledger) bound(labels map[string]string) (map[string]string, bool) {
	return protocol.BoundLabels(labels, l.keep)
}

// Created records that a facade saw a sandbox created on r.Node's gateway.
// r needs Provider, Node and ID; the record becomes live, Source facade (if
// new), LastSeen now. Fields set in r (labels, name, workspace, times,
// Owner, TTL, attribution) replace the record's; the rest of the
// attribution is read from the labels, which are stored bounded. It is
// managed (reaped as unowned past the grace period when no lease owns it)
// only if it carries the marker label or has an owning run (Owner, or Run
// given or read from the labels), or was managed before: r.Managed is
// ignored, so a plain user's sandbox created through a facade is recorded
// but never reaped as unowned.
func (l *Ledger) Created(ctx context.Context, r Record) error {
	_, err := l.upsertExplicit(ctx, r, SourceFacade)
	return err
}

// Register records a sandbox a client announced (explicit registration):
// as Created, with Source register, and always managed.
func (l *Ledger) Register(ctx context.Context, r Record) (Record, error) {
	return l.upsertExplicit(ctx, r, SourceRegister)
}

func (l *Ledger) upsertExplicit(ctx context.Context, r Record, source string) (Record, error) {
	k := r.Key()
	if err := validKey(k); err != nil {
		return Record{}, fmt.Errorf("ledger: record %s sandbox: %w", source, err)
	}
	now := l.now()
	rec, _, err := l.mutate(ctx, k, func(cur Record, exists bool) (Record, bool) {
		next := cur
		if !exists {
			next = Record{FirstSeen: now, Source: source, CreatedAt: now, StateSince: now}
		}
		setIf := func(dst *string, v string) {
			if v != "" {
				*dst = v
			}
		}
		setIf(&next.Workspace, r.Workspace)
		setIf(&next.Name, r.Name)
		setIf(&next.Team, r.Team)
		setIf(&next.User, r.User)
		setIf(&next.Workload, r.Workload)
		setIf(&next.Run, r.Run)
		setIf(&next.Owner, r.Owner)
		if next.CreatedBy == "" {
			next.CreatedBy = r.CreatedBy
		}
		if r.Labels != nil {
			next.Labels, next.LabelsTruncated = l.bound(r.Labels)
		}
		if !r.CreatedAt.IsZero() {
			next.CreatedAt = r.CreatedAt.UTC()
		}
		if !r.ExpiresAt.IsZero() {
			next.ExpiresAt = r.ExpiresAt.UTC()
		}
		if r.TTL > 0 {
			next.TTL = r.TTL
		}
		l.cfg.Attribution.attribute(&next)
		next.Managed = next.Managed || source == SourceRegister || l.managed(next.Labels) || next.Owner != "" || next.Run != ""
		next.LastSeen = now
		if next.State != StateLive {
			next.State, next.StateSince = StateLive, now
			next.Attempts, next.LastError = 0, ""
		}
		return next, true
	})
	return rec, err
}

// SetExpiry records a new gateway expiry for k (OpenSandbox
// renew-expiration, wire-facts §8.4). Unknown sandboxes are ignored.
func (l *Ledger) SetExpiry(ctx context.Context, k Key, expiresAt time.Time) error {
	_, _, err := l.mutate(ctx, k, func(cur Record, exists bool) (Record, bool) {
		if !exists || cur.ExpiresAt.Equal(expiresAt) {
			return cur, false
		}
		cur.ExpiresAt = expiresAt.UTC()
		return cur, true
	})
	return err
}

// Deleting records that a facade forwarded a delete of k. Unknown and
// deleted sandboxes are left alone.
func (l *Ledger) Deleting(ctx context.Context, k Key) error {
	now := l.now()
	_, _, err := l.mutate(ctx, k, func(cur Record, exists bool) (Record, bool) {
		if !exists || cur.State == StateDeleting || cur.State == StateDeleted {
			return cur, false
		}
		cur.State, cur.StateSince = StateDeleting, now
		return cur, true
	})
	return err
}

// Deleted records that k's gateway confirmed it gone (a delete answered OK
// or NOT_FOUND). Unknown sandboxes are ignored.
func (l *Ledger) Deleted(ctx context.Context, k Key) error {
	now := l.now()
	_, _, err := l.mutate(ctx, k, func(cur Record, exists bool) (Record, bool) {
		if !exists || cur.State == StateDeleted {
			return cur, false
		}
		cur.State, cur.StateSince = StateDeleted, now
		return cur, true
	})
	return err
}

// NodeLost marks the live and deleting records of node lost: nobody can
// know whether they still exist until the node's next complete inventory,
// which makes each live or deleted again. It returns how many it marked.
func (l *Ledger) NodeLost(ctx context.Context, node string) (int, error) {
	now := l.now()
	n := 0
	var errs []error
	for _, r := range l.List(Filter{Node: node}) {
		if r.State != StateLive && r.State != StateDeleting {
			continue
		}
		_, wrote, err := l.mutate(ctx, r.Key(), func(cur Record, exists bool) (Record, bool) {
			if !exists || cur.State != StateLive && cur.State != StateDeleting {
				return cur, false
			}
			cur.State, cur.StateSince = StateLost, now
			return cur, true
		})
		if err != nil {
			errs = append(errs, err)
		} else if wrote {
			n++
		}
	}
	return n, errors.Join(errs...)
}
