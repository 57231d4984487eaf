package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Ownership. A run belongs to the identity that opened its lease
// (Lease.OwnedBy). A run with no lease belongs to the identity that
// created or registered its sandboxes (Record.CreatedBy), so that nobody
// else can open its lease and close it to reap them. A run with neither is
// unclaimed: whoever first opens its lease, or registers a sandbox under
// it, claims it. A sandbox belongs to the owner of its owning lease
// (Record.OwnerLease) when that lease exists, else to its creator. The
// NATS API asks policy with these owners (Object.Owner); identities are
// policy's Identity.String.

// ErrOwnerChanged: the run's lease changed owner between the policy's
// decision and the write; the request may be retried.
var ErrOwnerChanged = errors.New("ledger: the run changed owner")

// ownerOfLocked is OwnerOf with l.mu held.
func (l *Ledger) ownerOfLocked(r *Record) string {
	if ls, ok := l.leaseIdx.get(r.OwnerLease()); ok {
		return ls.OwnedBy
	}
	return r.CreatedBy
}

// OwnerOf returns the identity r belongs to: its owning lease's OwnedBy
// when that lease exists, else r.CreatedBy; "" when unknown.
func (l *Ledger) OwnerOf(r Record) string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.ownerOfLocked(&r)
}

// RunOwner returns the identity run belongs to and whether anyone claimed
// it: its lease's OwnedBy (claimed, possibly "" for a lease from before
// identities were recorded), else the CreatedBy of its first record that
// has one; an unclaimed run returns "", false.
func (l *Ledger) RunOwner(run string) (owner string, claimed bool) {
	l.mu.RLock()
	ls, ok := l.leaseIdx.get(run)
	l.mu.RUnlock()
	if ok {
		return ls.OwnedBy, true
	}
	for _, r := range l.runRecords(run) {
		if r.CreatedBy != "" {
			return r.CreatedBy, true
		}
	}
	return "", false
}

type ownerChangedError struct{ run, owner string }

func (e ownerChangedError) Error() string {
	return fmt.Sprintf("run %s changed owner while the request was decided; retry", e.run)
}

func (e ownerChangedError) Unwrap() error { return ErrOwnerChanged }

// checkOwner refuses a change to an existing lease whose owner is not the
// one the policy decided on.
func checkOwner(run string, cur Lease, exists bool, owner string) error {
	if exists && cur.OwnedBy != owner {
		return ownerChangedError{run, owner}
	}
	return nil
}

// OpenLeaseFor is OpenLease for a run policy decided belongs to owner: a
// new lease records owner as its OwnedBy; an existing one must have it
// (else ErrOwnerChanged, nothing written).
func (l *Ledger) OpenLeaseFor(ctx context.Context, run, holder, owner string, ttl time.Duration) (Lease, error) {
	return l.openLease(ctx, run, holder, ttl, &owner)
}

// RenewLeaseFor is RenewLease for a run policy decided belongs to owner
// (ErrOwnerChanged when the lease has another).
func (l *Ledger) RenewLeaseFor(ctx context.Context, run, owner string) (Lease, error) {
	return l.renewLease(ctx, run, &owner)
}

// CloseLeaseFor is CloseLease for a run policy decided belongs to owner: a
// lease created closed records owner; an existing one must have it (else
// ErrOwnerChanged, nothing written).
func (l *Ledger) CloseLeaseFor(ctx context.Context, run, owner string) (Lease, error) {
	return l.closeLease(ctx, run, &owner)
}
