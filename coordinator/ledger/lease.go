package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/protocol"
)

// Lease is a run's lease: while it is open and not expired, the run's
// sandboxes are owned. Its key in BucketLeases is the run id (encoded
// like a record key's tokens when it holds a '.').
type Lease struct {
	Run, Holder string
	// TTL is how long a renewal keeps it alive.
	TTL                                      time.Duration
	ExpiresAt, OpenedAt, RenewedAt, ClosedAt time.Time
	Closed                                   bool
	// OwnedBy is the identity that opened it (policy's Identity.String):
	// the run is its. "" for a lease opened before identities were
	// recorded, or through OpenLease.
	OwnedBy string
	// Revision is the lease's KV revision (read-only).
	Revision uint64
}

// Expired reports whether the lease is open and was not renewed in time.
func (ls Lease) Expired(now time.Time) bool { return !ls.Closed && now.After(ls.ExpiresAt) }

// Info returns the lease in its wire form.
func (ls Lease) Info() protocol.LeaseInfo {
	return protocol.LeaseInfo{Run: ls.Run, Holder: ls.Holder, TTLMS: ls.TTL.Milliseconds(), ExpiresAt: ls.ExpiresAt,
		OpenedAt: ls.OpenedAt, RenewedAt: ls.RenewedAt, Closed: ls.Closed, ClosedAt: ls.ClosedAt, OwnedBy: ls.OwnedBy}
}

func leaseFromInfo(i protocol.LeaseInfo) Lease {
	return Lease{Run: i.Run, Holder: i.Holder, TTL: time.Duration(i.TTLMS) * time.Millisecond, ExpiresAt: i.ExpiresAt,
		OpenedAt: i.OpenedAt, RenewedAt: i.RenewedAt, Closed: i.Closed, ClosedAt: i.ClosedAt, OwnedBy: i.OwnedBy}
}

// applyLease applies a watched entry of the leases bucket. A lease that
// becomes closed wakes the reaper.
func (l *Ledger) applyLease(e jetstream.KeyValueEntry) {
	var ls Lease
	put := e.Operation() == jetstream.KeyValuePut
	run, err := decodeToken(e.Key())
	if err == nil && put {
		ls, err = decodeLeaseEntry(e.Key(), e.Value())
		ls.Revision = e.Revision()
	}
	if err != nil {
		l.log.Warn("undecodable lease ignored", "key", protocol.Clip(e.Key()), "revision", e.Revision(), "err", err)
		return
	}
	l.mu.Lock()
	l.seq[bLeases] = max(l.seq[bLeases], e.Revision())
	cur, ok := l.leaseIdx.byRun[run]
	if ok && cur.Revision >= e.Revision() {
		l.mu.Unlock()
		return
	}
	if put {
		ls.Run = run
		l.leaseIdx.put(ls)
	} else {
		l.leaseIdx.remove(run)
	}
	l.mu.Unlock()
	if put && ls.Closed && !cur.Closed {
		l.wakeReaper()
	}
}

func (l *Ledger) wakeReaper() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// applyOwnLease applies this ledger's own lease write (see
// applyOwnSandbox).
func (l *Ledger) applyOwnLease(ls Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ls.Revision <= l.seq[bLeases] {
		return
	}
	if cur, ok := l.leaseIdx.byRun[ls.Run]; ok && cur.Revision >= ls.Revision {
		return
	}
	l.leaseIdx.put(ls)
}

// LeaseOf returns the lease that owns sandboxes naming id as Owner or Run:
// the run's lease, or (for a run id longer than a label value may be) the
// lease whose id NeMo Gym's label sanitising turns into id.
func (l *Ledger) LeaseOf(id string) (Lease, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.leaseIdx.get(id)
}

// RunClosed reports whether run's lease was closed: the run is over and
// its sandboxes are reaped, so a sandbox created for it now would be too.
func (l *Ledger) RunClosed(run string) bool {
	ls, ok := l.LeaseOf(run)
	return ok && ls.Closed
}

// Leases returns every lease, sorted by run.
func (l *Ledger) Leases() []Lease {
	l.mu.RLock()
	out := make([]Lease, 0, len(l.leaseIdx.byRun))
	for _, ls := range l.leaseIdx.byRun {
		out = append(out, ls)
	}
	l.mu.RUnlock()
	slices.SortFunc(out, func(a, b Lease) int { return strings.Compare(a.Run, b.Run) })
	return out
}

// mutateLease changes run's lease by fn with compare-and-set (like mutate).
// fn returns the next lease, whether to write it, or an error to return.
func (l *Ledger) mutateLease(ctx context.Context, run string, fn func(cur Lease, exists bool) (Lease, bool, error)) (Lease, error) {
	if l.closed.Load() {
		return Lease{}, ErrClosed
	}
	if err := protocol.ValidRunID(run); err != nil {
		return Lease{}, fmt.Errorf("ledger: lease: %w", err)
	}
	l.mu.RLock()
	cur, exists := l.leaseIdx.byRun[run]
	l.mu.RUnlock()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			var err error
			if cur, exists, err = l.getLease(ctx, run); err != nil {
				return Lease{}, fmt.Errorf("ledger: read lease of run %s: %w", run, err)
			}
		}
		next, write, err := fn(cur, exists)
		if err != nil || !write {
			return cur, err
		}
		next.Run = run
		data, err := json.Marshal(next.Info())
		if err != nil {
			return Lease{}, fmt.Errorf("ledger: encode lease of run %s: %w", run, err)
		}
		var rev uint64
		if exists {
			rev, err = l.leases.Update(ctx, encodeToken(run), data, cur.Revision)
		} else {
			rev, err = l.leases.Create(ctx, encodeToken(run), data)
		}
		if err == nil {
			next.Revision = rev
			l.applyOwnLease(next)
			if next.Closed && !cur.Closed {
				l.wakeReaper()
			}
			return next, nil
		}
		if !isConflict(err) || attempt == maxCASAttempts {
			return Lease{}, fmt.Errorf("ledger: write lease of run %s: %w", run, err)
		}
	}
}

func (l *Ledger) getLease(ctx context.Context, run string) (Lease, bool, error) {
	e, err := l.leases.Get(ctx, encodeToken(run))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Lease{}, false, nil
	}
	if err != nil {
		return Lease{}, false, err
	}
	ls, err := decodeLeaseEntry(e.Key(), e.Value())
	if err != nil {
		return Lease{}, false, err
	}
	ls.Revision = e.Revision()
	return ls, true, nil
}

// leaseClosedError is ErrLeaseClosed for one run, saying what to do.
type leaseClosedError struct{ run string }

func (e leaseClosedError) Error() string {
	return "run " + e.run + " was closed; its sandboxes are reaped — start a new run with a new run id"
}

func (e leaseClosedError) Unwrap() error { return ErrLeaseClosed }

// OpenLease opens run's lease for ttl (0 means protocol.DefaultLeaseTTL;
// it must be within protocol.MinLeaseTTL and MaxLeaseTTL), held by holder
// (free-form, for operators). Opening an open lease renews it with the new
// holder and TTL, even if it had expired. A closed lease stays closed:
// ErrLeaseClosed.
func (l *Ledger) OpenLease(ctx context.Context, run, holder string, ttl time.Duration) (Lease, error) {
	return l.openLease(ctx, run, holder, ttl, nil)
}

// openLease is OpenLease; with owner set, as OpenLeaseFor.
func (l *Ledger) openLease(ctx context.Context, run, holder string, ttl time.Duration, owner *string) (Lease, error) {
	if ttl == 0 {
		ttl = protocol.DefaultLeaseTTL
	}
	if ttl < protocol.MinLeaseTTL || ttl > protocol.MaxLeaseTTL {
		return Lease{}, fmt.Errorf("ledger: lease of run %s: ttl %v is outside %v to %v", run, ttl, protocol.MinLeaseTTL, protocol.MaxLeaseTTL)
	}
	now := l.now()
	return l.mutateLease(ctx, run, func(cur Lease, exists bool) (Lease, bool, error) {
		if owner != nil {
			if err := checkOwner(run, cur, exists, *owner); err != nil {
				return cur, false, err
			}
		}
		if exists && cur.Closed {
			return cur, false, leaseClosedError{run}
		}
		// A second holder of a live lease would end the run for the first
		// one when it closes: refuse it. The same holder (a reconnect) or
		// anyone once the lease expired may take it.
		if exists && now.Before(cur.ExpiresAt) && cur.Holder != "" && holder != cur.Holder {
			return cur, false, fmt.Errorf("%w: run %s is held by %q until %s (renewed); use another run id, or wait for it to close or expire",
				ErrLeaseHeld, run, cur.Holder, cur.ExpiresAt.Format(time.RFC3339))
		}
		next := cur
		if !exists {
			next = Lease{OpenedAt: now}
			if owner != nil {
				next.OwnedBy = *owner
			}
		}
		next.Holder, next.TTL = holder, ttl
		next.RenewedAt, next.ExpiresAt = now, now.Add(ttl)
		return next, true, nil
	})
}

// RenewLease extends run's lease to now plus its TTL. Errors:
// ErrLeaseNotFound, ErrLeaseClosed (wrapped).
func (l *Ledger) RenewLease(ctx context.Context, run string) (Lease, error) {
	return l.renewLease(ctx, run, nil)
}

func (l *Ledger) renewLease(ctx context.Context, run string, owner *string) (Lease, error) {
	now := l.now()
	return l.mutateLease(ctx, run, func(cur Lease, exists bool) (Lease, bool, error) {
		if owner != nil {
			if err := checkOwner(run, cur, exists, *owner); err != nil {
				return cur, false, err
			}
		}
		switch {
		case !exists:
			return cur, false, fmt.Errorf("renew lease of run %s: %w", run, ErrLeaseNotFound)
		case cur.Closed:
			return cur, false, leaseClosedError{run}
		}
		cur.RenewedAt, cur.ExpiresAt = now, now.Add(cur.TTL)
		return cur, true, nil
	})
}

// CloseLease closes run's lease, creating it closed if the run had none,
// so that every sandbox the run owns is reaped at once. Closing a closed
// lease changes nothing.
func (l *Ledger) CloseLease(ctx context.Context, run string) (Lease, error) {
	return l.closeLease(ctx, run, nil)
}

func (l *Ledger) closeLease(ctx context.Context, run string, owner *string) (Lease, error) {
	now := l.now()
	return l.mutateLease(ctx, run, func(cur Lease, exists bool) (Lease, bool, error) {
		if owner != nil {
			if err := checkOwner(run, cur, exists, *owner); err != nil {
				return cur, false, err
			}
		}
		if exists && cur.Closed {
			return cur, false, nil
		}
		if !exists {
			cur = Lease{OpenedAt: now, ExpiresAt: now}
			if owner != nil {
				cur.OwnedBy = *owner
			}
		}
		cur.Closed, cur.ClosedAt = true, now
		return cur, true, nil
	})
}

// applyInventory applies a watched entry of the inventory bucket.
func (l *Ledger) applyInventory(e jetstream.KeyValueEntry) {
	var s inventoryStatus
	put := e.Operation() == jetstream.KeyValuePut
	if put {
		if err := json.Unmarshal(e.Value(), &s); err != nil {
			l.log.Warn("undecodable inventory status ignored", "key", e.Key(), "err", err)
			return
		}
		s.revision = e.Revision()
	}
	node, err := decodeToken(e.Key())
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq[bInventory] = max(l.seq[bInventory], e.Revision())
	if cur, ok := l.invIdx[node]; ok && cur.revision >= e.Revision() {
		return
	}
	if put {
		l.invIdx[node] = s
	} else {
		delete(l.invIdx, node)
	}
}

// inventoryOf returns node's last inventory status.
func (l *Ledger) inventoryOf(node string) (inventoryStatus, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	s, ok := l.invIdx[node]
	return s, ok
}

// putInventory stores s as node's inventory status unless a newer listing
// is stored already.
func (l *Ledger) putInventory(ctx context.Context, s inventoryStatus) error {
	key := encodeToken(s.Node)
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	l.mu.RLock()
	cur, exists := l.invIdx[s.Node]
	l.mu.RUnlock()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			cur, exists = inventoryStatus{}, false
			e, err := l.inventory.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			case err != nil:
				return err
			default:
				if json.Unmarshal(e.Value(), &cur) == nil {
					cur.revision, exists = e.Revision(), true
				}
			}
		}
		if exists && cur.ListedAt.After(s.ListedAt) {
			return nil
		}
		var rev uint64
		if exists {
			rev, err = l.inventory.Update(ctx, key, data, cur.revision)
		} else {
			rev, err = l.inventory.Create(ctx, key, data)
		}
		if err == nil {
			s.revision = rev
			l.mu.Lock()
			if rev > l.seq[bInventory] {
				if c, ok := l.invIdx[s.Node]; !ok || c.revision < rev {
					l.invIdx[s.Node] = s
				}
			}
			l.mu.Unlock()
			return nil
		}
		if !isConflict(err) || attempt == maxCASAttempts {
			return err
		}
	}
}
