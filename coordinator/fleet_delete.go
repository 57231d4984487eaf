package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/protocol"
)

// Reaping across coordinators: one reaper runs in the fleet (the fenced
// lock in ledger.BucketLocks), on whichever coordinator holds the lock. A
// sandbox on a node another coordinator holds is deleted through that
// owner: the reaper's coordinator asks the node subject "sandbox.delete"
// with the ledger record as the body and the owner runs DeleteSandbox on
// its own tunnel, answering a deleteAnswer.

// deleteAnswer is the owner's answer to a forwarded delete.
type deleteAnswer struct {
	// Error is what failed ("" when deleted); NotFound: the gateway does
	// not know the sandbox (done, as ledger.Deleter says).
	Error    string `json:"error,omitempty"`
	NotFound bool   `json:"not_found,omitempty"`
}

// deleteRemote deletes r's sandbox through coordinator owner.
func (c *Coordinator) deleteRemote(ctx context.Context, r ledger.Record, owner string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, sandboxOpTimeout)
		defer cancel()
	}
	body, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("delete %s sandbox %s on node %s via coordinator %s: %w", r.Provider, r.ID, r.Node, owner, err)
	}
	c.m.forwarded.Inc()
	m, err := c.cfg.NATS.RequestMsgWithContext(ctx, &nats.Msg{Subject: nodeSubject(r.Node, "sandbox.delete"), Data: body,
		Header: nats.Header{HeaderForwardedBy: []string{c.cfg.ID}}})
	if err != nil {
		return fmt.Errorf("delete %s sandbox %s on node %s via coordinator %s: %w", r.Provider, r.ID, r.Node, owner, err)
	}
	var a deleteAnswer
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return fmt.Errorf("delete %s sandbox %s on node %s via coordinator %s: answer: %w", r.Provider, r.ID, r.Node, owner, err)
	}
	switch {
	case a.NotFound:
		return fmt.Errorf("delete %s sandbox %s on node %s via coordinator %s: %w", r.Provider, r.ID, r.Node, owner, gateway.ErrNotFound)
	case a.Error != "":
		return fmt.Errorf("delete %s sandbox %s on node %s via coordinator %s: %s", r.Provider, r.ID, r.Node, owner, a.Error)
	}
	return nil
}

// serveDelete answers a forwarded delete (dispatch) from a goroutine
// counted in jobWG.
func (c *Coordinator) serveDelete(m *nats.Msg, nodeID string) {
	if m.Reply == "" {
		return
	}
	answer := func(a deleteAnswer) {
		b, _ := json.Marshal(a)
		if err := c.cfg.NATS.Publish(m.Reply, b); err != nil {
			c.log.Debug("answer forwarded delete", "node_id", nodeID, "err", err)
		}
	}
	var r ledger.Record
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Node != nodeID {
		answer(deleteAnswer{Error: fmt.Sprintf("coordinator %s: bad delete request for node %s: %v", c.cfg.ID, nodeID, err)})
		return
	}
	if !c.holds(nodeID) {
		// Never forwarded again: the reaper retries once the registry
		// caught up.
		answer(deleteAnswer{Error: fmt.Sprintf("node %s is not connected to coordinator %s", nodeID, c.cfg.ID)})
		return
	}
	life, ok := c.enter(&c.jobWG)
	if !ok {
		answer(deleteAnswer{Error: fmt.Sprintf("coordinator %s is shutting down", c.cfg.ID)})
		return
	}
	go func() {
		defer c.jobWG.Done()
		ctx, cancel := context.WithTimeout(life, sandboxOpTimeout)
		defer cancel()
		err := c.DeleteSandbox(ctx, r)
		switch {
		case err == nil:
			answer(deleteAnswer{})
		case errors.Is(err, gateway.ErrNotFound):
			answer(deleteAnswer{NotFound: true})
		default:
			answer(deleteAnswer{Error: err.Error()})
		}
	}()
}

// syncFleet asks every other coordinator holding nodes (per the registry)
// to take an inventory of its nodes now, and returns their problems; one
// that does not answer before ctx ends counts one problem per node it
// holds.
func (c *Coordinator) syncFleet(ctx context.Context) []protocol.SyncProblem {
	owners := map[string][]string{}
	c.fl.mu.Lock()
	for id, r := range c.fl.recs {
		if r.info.Coordinator != c.cfg.ID {
			owners[r.info.Coordinator] = append(owners[r.info.Coordinator], id)
		}
	}
	c.fl.mu.Unlock()
	var mu sync.Mutex
	var out []protocol.SyncProblem
	var wg sync.WaitGroup
	for owner, nodes := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var p []protocol.SyncProblem
			m, err := c.cfg.NATS.RequestMsgWithContext(ctx, &nats.Msg{Subject: CoordSubjectPrefix + subjectPart(owner) + ".sync",
				Header: nats.Header{HeaderForwardedBy: []string{c.cfg.ID}}})
			var a syncAnswer
			switch {
			case err != nil:
				a.Error = err.Error()
			case json.Unmarshal(m.Data, &a) != nil:
				a.Error = "malformed answer"
			}
			if a.Error != "" {
				for _, n := range nodes {
					p = append(p, protocol.SyncProblem{Node: n, Error: fmt.Sprintf("coordinator %s holding it: sync: %s", owner, a.Error)})
				}
			} else {
				p = a.Problems
			}
			mu.Lock()
			out = append(out, p...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// syncAnswer is a coordinator's answer to another's sync request.
type syncAnswer struct {
	Problems []protocol.SyncProblem `json:"problems,omitempty"`
	Error    string                 `json:"error,omitempty"`
}

// serveSync answers another coordinator's sync request from a goroutine
// counted with the jobs.
func (c *Coordinator) serveSync(m *nats.Msg) {
	answer := func(a syncAnswer) {
		b, _ := json.Marshal(a)
		if err := c.cfg.NATS.Publish(m.Reply, b); err != nil {
			c.log.Debug("answer sync request", "err", err)
		}
	}
	life, ok := c.enter(&c.jobWG)
	if !ok {
		answer(syncAnswer{Error: fmt.Sprintf("coordinator %s is shutting down", c.cfg.ID)})
		return
	}
	go func() {
		defer c.jobWG.Done()
		ctx, cancel := context.WithTimeout(life, fleetSyncTimeout)
		defer cancel()
		p, err := c.syncLocal(ctx)
		if err != nil {
			answer(syncAnswer{Error: err.Error()})
			return
		}
		answer(syncAnswer{Problems: p})
	}()
}

// fleetSyncTimeout bounds a sync another coordinator asked for (below the
// API's own 2-minute bound on tether.v1.sandboxes.sync).
const fleetSyncTimeout = 100 * time.Second
