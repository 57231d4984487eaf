package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// Kinds of tether_ledger_disagreements_total.
const (
	// disagreeGatewayMissing: the ledger said live, a complete listing of
	// the gateway lacked the sandbox.
	disagreeGatewayMissing = "gateway_missing"
	// disagreeGatewayHasDeleted: the ledger said deleted, the gateway
	// listed the sandbox.
	disagreeGatewayHasDeleted = "gateway_has_deleted"
)

// Reconcile merges one inventory of node's gateways into the ledger, as
// ReconcileAt with the listing assumed to have started Config.ListingSlack
// before now.
func (l *Ledger) Reconcile(ctx context.Context, node string, inv []protocol.Sandbox, gw []protocol.GatewayStatus) error {
	return l.ReconcileAt(ctx, node, l.now().Add(-l.cfg.ListingSlack), inv, gw)
}

// ReconcileAt merges one inventory of node's gateways, whose listing
// started at listedAt, into the ledger; it waits for the initial load
// first. Every sandbox listed gets a record (created, Source inventory, or
// refreshed: labels (bounded), attribution, times; Owner and TTL are never
// touched), live unless its gateway shows it deleting. For each provider
// whose gateways all listed completely (protocol.GatewayStatus.Complete),
// the node's records of that provider absent from the listing become
// deleted, unless they were seen or changed at or after listedAt (a create
// the listing could not see yet). An incomplete gateway's absences change
// nothing. Records whose state changed at or after listedAt keep it.
// Afterwards it stores the node's inventory status, which the reaper
// checks. Writes run WriteConcurrency at a time; the error joins the
// first failures and counts them.
func (l *Ledger) ReconcileAt(ctx context.Context, node string, listedAt time.Time, inv []protocol.Sandbox, gw []protocol.GatewayStatus) error {
	if err := l.WaitReady(ctx); err != nil {
		return fmt.Errorf("ledger: reconcile node %s: %w", node, err)
	}
	if node == "" {
		return errors.New("ledger: reconcile: node is empty")
	}
	listedAt = listedAt.UTC()
	now := l.now()
	complete := map[string]bool{}
	for _, g := range gw {
		c, seen := complete[g.Provider]
		complete[g.Provider] = g.Complete && (c || !seen)
	}

	type op struct {
		k  Key
		sb *protocol.Sandbox // nil: absent from the listing
	}
	var ops []op
	present := make(map[Key]int, len(inv))
	skipped := 0
	for i := range inv {
		s := &inv[i]
		k := Key{s.Provider, node, s.ID}
		if validKey(k) != nil {
			skipped++
			continue
		}
		if j, dup := present[k]; dup { // listed twice: the later listing wins
			ops[j].sb = s
			continue
		}
		present[k] = len(ops)
		ops = append(ops, op{k, s})
	}
	if skipped > 0 {
		l.log.Warn("inventory sandboxes without a valid provider or id ignored", "node_id", node, "count", skipped)
	}
	l.mu.RLock()
	for key := range l.idx.byNode[node] {
		r := l.idx.recs[key]
		if _, ok := present[r.Key()]; !ok && complete[r.Provider] && r.State != StateDeleted {
			ops = append(ops, op{k: r.Key()})
		}
	}
	l.mu.RUnlock()

	var (
		mu    sync.Mutex
		errs  []error
		nfail int
	)
	work := make(chan op)
	var wg sync.WaitGroup
	for range min(l.cfg.WriteConcurrency, max(len(ops), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range work {
				var err error
				func() {
					// A panic fails this write only.
					defer l.guard.Recover("reconcile write", func(e *panics.Error) { err = e })
					var kind string // a disagreement the write settles
					var rec Record
					var wrote bool
					rec, wrote, err = l.mutate(ctx, o.k, func(cur Record, exists bool) (next Record, write bool) {
						if o.sb != nil {
							next, write, kind = l.refresh(cur, exists, o.sb, listedAt, now)
						} else {
							next, write, kind = l.absent(cur, exists, listedAt, now)
						}
						return next, write
					})
					if wrote && kind != "" {
						l.m.disagreements.WithLabelValues(kind).Inc()
						l.log.Info("ledger and gateway disagreed; the gateway wins", "kind", kind, "node_id", node, "provider", rec.Provider, "sandbox_id", rec.ID, "state", rec.State)
					}
				}()
				if err != nil {
					mu.Lock()
					if nfail++; len(errs) < 3 {
						errs = append(errs, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, o := range ops {
		if ctx.Err() != nil {
			break
		}
		work <- o
	}
	close(work)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ledger: reconcile node %s: %w", node, err)
	}
	if nfail > 0 {
		return fmt.Errorf("ledger: reconcile node %s: %d of %d writes failed: %w", node, nfail, len(ops), errors.Join(errs...))
	}
	st := inventoryStatus{Node: node, ListedAt: listedAt, At: l.now(), Coordinator: l.cfg.ID}
	for _, g := range gw {
		st.Gateways = append(st.Gateways, gatewayStatus{Target: g.Target, Provider: g.Provider, Complete: g.Complete, Count: g.Count, Error: g.Error})
	}
	if err := l.putInventory(ctx, st); err != nil {
		return fmt.Errorf("ledger: reconcile node %s: store inventory status: %w", node, err)
	}
	return nil
}

// refresh computes the record of a sandbox a listing showed, and the kind
// of disagreement it settles, if any.
func (l *Ledger) refresh(cur Record, exists bool, s *protocol.Sandbox, listedAt, now time.Time) (Record, bool, string) {
	want := StateLive
	if s.Deleting {
		want = StateDeleting
	}
	labels, cut := l.bound(s.Labels)
	cut = cut || s.LabelsTruncated
	if !exists {
		r := Record{
			Workspace: s.Workspace, Name: s.Name, Labels: labels, LabelsTruncated: cut,
			CreatedAt: s.CreatedAt.UTC(), ExpiresAt: s.ExpiresAt.UTC(),
			FirstSeen: now, LastSeen: now, State: want, StateSince: now, Source: SourceInventory,
			Managed: l.managed(labels),
		}
		if r.CreatedAt.IsZero() {
			r.CreatedAt = now
		}
		l.cfg.Attribution.attribute(&r)
		return r, true, ""
	}
	next := cur
	if !maps.Equal(cur.Labels, labels) {
		next.Labels = labels
	}
	next.LabelsTruncated = cut
	if next.Workspace == "" {
		next.Workspace = s.Workspace
	}
	if next.Name == "" {
		next.Name = s.Name
	}
	l.cfg.Attribution.attribute(&next)
	next.Managed = cur.Managed || l.managed(labels)
	if !s.CreatedAt.IsZero() {
		next.CreatedAt = s.CreatedAt.UTC()
	}
	if !s.ExpiresAt.IsZero() {
		next.ExpiresAt = s.ExpiresAt.UTC()
	}
	// A state set at or after listedAt is newer than what the listing
	// saw: keep it.
	kind := ""
	if cur.StateSince.Before(listedAt) && cur.State != want {
		switch cur.State {
		case StateLeaked:
			// The reaper gave up; an operator decides. Only absence clears it.
		case StateDeleted:
			kind = disagreeGatewayHasDeleted
			next.State, next.StateSince = want, now
		default: // live, deleting, lost
			next.State, next.StateSince = want, now
		}
	}
	if now.Sub(cur.LastSeen) >= l.cfg.TouchInterval {
		next.LastSeen = now
	}
	return next, !equalStored(cur, next), kind
}

// absent computes the record of a sandbox a complete listing lacked, and
// the kind of disagreement it settles, if any.
func (l *Ledger) absent(cur Record, exists bool, listedAt, now time.Time) (Record, bool, string) {
	if !exists || cur.State == StateDeleted || !cur.LastSeen.Before(listedAt) || !cur.StateSince.Before(listedAt) {
		return cur, false, ""
	}
	kind := ""
	if cur.State == StateLive {
		kind = disagreeGatewayMissing
	}
	cur.State, cur.StateSince = StateDeleted, now
	return cur, true, kind
}
