package coordinator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// Defaults of the inventory loop (RunInventory).
const (
	DefaultInventoryInterval = 30 * time.Second
	// inventoryParallel bounds the inventories in flight at once.
	inventoryParallel = 16
	// nodeUpDelay is how long after a node (re)connects its first
	// inventory is taken: long enough for a burst of reconnects after a
	// coordinator restart to coalesce.
	nodeUpDelay = 500 * time.Millisecond
)

// hasGateway reports whether the node's agent serves a sandbox gateway.
func (n *node) hasGateway() bool {
	return slices.Contains(n.hello.Targets, protocol.TargetOpenShell) ||
		slices.Contains(n.hello.Targets, protocol.TargetOpenSandbox)
}

// nodeUp tells the inventory loop (if running) that n registered.
func (c *Coordinator) nodeUp(n *node) {
	if !n.hasGateway() {
		return
	}
	select {
	case c.nodeUps <- n.id:
	default: // the loop is behind or not running; its next round covers n
	}
}

// Reachable reports whether the reaper may act on node: its tunnel is up on
// this coordinator and an inventory taken over this very session has been
// reconciled into the ledger. Until then the ledger's view of the node may be
// stale, and nothing there may be deleted on its account (issue 4: never
// delete on partial knowledge). Whether that inventory listed a given
// provider completely is the ledger's check, per provider: one dead gateway
// must not stop reaping on the node's other one. It implements
// ledger.FleetView.
//
// With a fleet registry, a node another coordinator holds is reachable when
// its record says that coordinator reconciled an inventory of the current
// session (deletes then go through that coordinator: DeleteSandbox).
func (c *Coordinator) Reachable(nodeID string) bool {
	n, err := c.node(nodeID)
	if err != nil {
		owner, _, inv := c.remoteInventoried(nodeID)
		return owner != "" && inv
	}
	return !n.sess.IsClosed() && n.inventoried.Load()
}

// ConnectedSince returns when node's current session was welcomed, and
// whether it has one. The reaper requires an inventory listed after it.
func (c *Coordinator) ConnectedSince(nodeID string) (time.Time, bool) {
	n, err := c.node(nodeID)
	if err != nil {
		if owner, info, _ := c.remoteInventoried(nodeID); owner != "" {
			return info.ConnectedAt, true
		}
		return time.Time{}, false
	}
	return n.connectedAt, true
}

// RunInventory keeps l in step with the gateways of every connected node:
// it takes an inventory of each node whose agent serves a gateway every
// interval (zero means DefaultInventoryInterval), of a node shortly after
// it (re)connects, and of every node when Sync is called, and hands each to
// l.Reconcile. It returns when ctx ends.
func (c *Coordinator) RunInventory(ctx context.Context, l *ledger.Ledger, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultInventoryInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	c.inventoryRunning.Store(true)
	defer c.inventoryRunning.Store(false)
	pending := map[string]bool{}
	var soon <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-c.nodeUps:
			pending[id] = true
			if soon == nil {
				soon = time.After(nodeUpDelay)
			}
		case <-soon:
			soon = nil
			c.inventoryNodes(ctx, l, slices.Collect(mapsKeys(pending)))
			clear(pending)
		case done := <-c.syncs:
			// Syncs that queued up meanwhile share this round.
			waiting := []chan []protocol.SyncProblem{done}
			for more := true; more; {
				select {
				case d := <-c.syncs:
					waiting = append(waiting, d)
				default:
					more = false
				}
			}
			p := c.inventoryNodes(ctx, l, nil)
			for _, d := range waiting {
				d <- p
			}
		case <-t.C:
			c.inventoryNodes(ctx, l, nil)
		}
	}
}

// Sync takes an inventory of every connected node now and returns once the
// ledger has reconciled them (or ctx ends), with what could not be listed:
// a node whose inventory failed, or a gateway whose listing was incomplete.
// It needs RunInventory running. With a fleet registry it asks every other
// coordinator holding nodes to do the same for its nodes, in parallel
// (fleet.go syncFleet); a coordinator that does not answer within ctx is
// one problem per node it holds.
func (c *Coordinator) Sync(ctx context.Context) ([]protocol.SyncProblem, error) {
	if c.fl == nil {
		return c.syncLocal(ctx)
	}
	remote := make(chan []protocol.SyncProblem, 1)
	go func() { remote <- c.syncFleet(ctx) }()
	p, err := c.syncLocal(ctx)
	rp := <-remote
	if err != nil {
		return nil, err
	}
	return append(p, rp...), nil
}

// syncLocal is Sync of the nodes this coordinator holds.
func (c *Coordinator) syncLocal(ctx context.Context) ([]protocol.SyncProblem, error) {
	if !c.inventoryRunning.Load() {
		return nil, errors.New("sandbox inventory sync: the inventory loop is not running")
	}
	done := make(chan []protocol.SyncProblem, 1)
	select {
	case c.syncs <- done:
	case <-ctx.Done():
		return nil, fmt.Errorf("sandbox inventory sync: %w", ctx.Err())
	}
	select {
	case p := <-done:
		return p, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("sandbox inventory sync: %w", ctx.Err())
	}
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// inventoryNodes inventories the given nodes (nil: every connected node
// with a gateway) in parallel, reconciles each into l, and returns what
// could not be listed.
func (c *Coordinator) inventoryNodes(ctx context.Context, l *ledger.Ledger, ids []string) []protocol.SyncProblem {
	c.mu.Lock()
	var nodes []*node
	for id, n := range c.nodes {
		if n.hasGateway() && (ids == nil || slices.Contains(ids, id)) {
			nodes = append(nodes, n)
		}
	}
	c.mu.Unlock()
	var (
		g        errgroup.Group
		mu       sync.Mutex
		problems []protocol.SyncProblem
	)
	g.SetLimit(inventoryParallel)
	for _, n := range nodes {
		g.Go(func() error {
			p := c.inventoryNodeGuarded(ctx, l, n)
			mu.Lock()
			problems = append(problems, p...)
			mu.Unlock()
			return nil
		})
	}
	g.Wait()
	slices.SortFunc(problems, func(a, b protocol.SyncProblem) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Target, b.Target))
	})
	return problems
}

// inventoryNodeGuarded is inventoryNode with a panic in it contained: the
// node's inventory then counts as failed (a problem naming the internal
// error), and the other nodes' go on.
func (c *Coordinator) inventoryNodeGuarded(ctx context.Context, l *ledger.Ledger, n *node) (p []protocol.SyncProblem) {
	was := n.inventoried.Load()
	defer func() {
		// The other coordinators' reapers read it from the registry.
		if c.fl != nil && n.inventoried.Load() != was {
			c.putRecord(n)
		}
	}()
	defer c.guard.Recover("inventory", func(e *panics.Error) {
		n.inventoried.Store(false)
		p = []protocol.SyncProblem{{Node: n.id, Error: e.Error()}}
	})
	return c.inventoryNode(ctx, l, n)
}

// inventoryNode takes one inventory of n and reconciles it. n.inventoried
// says afterwards whether it was complete.
func (c *Coordinator) inventoryNode(ctx context.Context, l *ledger.Ledger, n *node) []protocol.SyncProblem {
	log := c.log.With("node_id", n.id, "session_id", n.sessionID)
	listedAt := time.Now()
	sbs, gws, err := c.inventory(ctx, n)
	if err != nil {
		n.inventoried.Store(false)
		log.Warn("sandbox inventory failed", "err", err)
		return []protocol.SyncProblem{{Node: n.id, Error: err.Error()}}
	}
	var problems []protocol.SyncProblem
	for _, g := range gws {
		if !g.Complete {
			problems = append(problems, protocol.SyncProblem{Node: n.id, Target: g.Target, Error: g.Error})
			log.Warn("sandbox inventory incomplete", "target", g.Target, "err", g.Error)
		}
	}
	if err := l.ReconcileAt(ctx, n.id, listedAt, sbs, gws); err != nil {
		n.inventoried.Store(false)
		log.Warn("sandbox inventory not reconciled", "err", err, "sandboxes", len(sbs))
		return append(problems, protocol.SyncProblem{Node: n.id, Error: "ledger: " + err.Error()})
	}
	n.inventoried.Store(!n.sess.IsClosed())
	log.Debug("sandbox inventory reconciled", "sandboxes", len(sbs), "incomplete", len(problems))
	return problems
}

// Inventory asks node's agent for the sandboxes of every gateway it is
// configured for (protocol.KindInventory) and returns them with one status
// per gateway. A gateway whose status is not Complete may be missing
// sandboxes. Errors name the node.
func (c *Coordinator) Inventory(ctx context.Context, nodeID string) ([]protocol.Sandbox, []protocol.GatewayStatus, error) {
	n, err := c.node(nodeID)
	if err != nil {
		return nil, nil, fmt.Errorf("inventory of node %s: %w", nodeID, err)
	}
	return c.inventory(ctx, n)
}

func (c *Coordinator) inventory(ctx context.Context, n *node) ([]protocol.Sandbox, []protocol.GatewayStatus, error) {
	var out []protocol.Sandbox
	var end protocol.InventoryEnd
	err := c.nodeOp(ctx, n, protocol.KindInventory, protocol.InventoryParams{}, inventoryTimeout, func(f protocol.Frame) (bool, error) {
		switch f.Type {
		case protocol.FrameInventory:
			var p protocol.InventoryPage
			if err := protocol.DecodeJSON(f.Payload, &p); err != nil {
				return false, err
			}
			out = append(out, p.Sandboxes...)
			return false, nil
		case protocol.FrameInventoryEnd:
			return true, protocol.DecodeJSON(f.Payload, &end)
		}
		return false, fmt.Errorf("%w: %s frame", protocol.ErrUnexpected, f.Type)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("inventory of node %s: %w", n.id, err)
	}
	return out, end.Gateways, nil
}

// sandboxOpTimeout bounds one sandbox operation on a node when ctx has no
// deadline.
const sandboxOpTimeout = time.Minute

// DeleteSandbox deletes r's sandbox on its node's gateway, through the
// node's tunnel: the agent runs the delete with its own gateway
// credentials (protocol.KindSandbox). A sandbox the gateway does not know
// is gone: the error then wraps gateway.ErrNotFound. It implements
// ledger.Deleter.
func (c *Coordinator) DeleteSandbox(ctx context.Context, r ledger.Record) error {
	p := protocol.SandboxOpParams{Op: protocol.SandboxOpDelete, Provider: r.Provider, ID: r.ID, Workspace: r.Workspace, Name: r.Name}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("delete %s sandbox %s on node %s: %w", r.Provider, r.ID, r.Node, err)
	}
	n, err := c.node(r.Node)
	if err != nil {
		if owner, _ := c.remoteRecord(r.Node); owner != "" {
			return c.deleteRemote(ctx, r, owner)
		}
		return fmt.Errorf("delete %s sandbox %s on node %s: %w", r.Provider, r.ID, r.Node, err)
	}
	var res protocol.SandboxOpResult
	err = c.nodeOp(ctx, n, protocol.KindSandbox, p, sandboxOpTimeout, func(f protocol.Frame) (bool, error) {
		if f.Type != protocol.FrameSandboxOp {
			return false, fmt.Errorf("%w: %s frame", protocol.ErrUnexpected, f.Type)
		}
		return true, protocol.DecodeJSON(f.Payload, &res)
	})
	if err != nil {
		return fmt.Errorf("delete %s sandbox %s on node %s: %w", r.Provider, r.ID, r.Node, err)
	}
	if res.NotFound {
		return fmt.Errorf("delete %s sandbox %s on node %s: %w", r.Provider, r.ID, r.Node, gateway.ErrNotFound)
	}
	return nil
}

// nodeOp opens a stream of kind to n and feeds each answer frame to
// handle until handle says done. A FrameError ends it with the agent's
// *protocol.ErrorInfo. timeout applies when ctx has no deadline.
func (c *Coordinator) nodeOp(ctx context.Context, n *node, kind protocol.Kind, params any, timeout time.Duration, handle func(protocol.Frame) (done bool, err error)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	st, err := n.sess.Open(ctx, kind, params)
	if err != nil {
		return fmt.Errorf("open %s stream: %w", kind, err)
	}
	defer st.Close()
	c.m.streamsOpened.WithLabelValues(kind.String()).Inc()
	st.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { st.SetReadDeadline(time.Now()) })
	defer stop()
	fr := protocol.NewFrameReader(st)
	for {
		f, err := fr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if ctx.Err() != nil {
				err = errors.Join(err, ctx.Err())
			}
			return err
		}
		if f.Type == protocol.FrameError {
			var ei protocol.ErrorInfo
			if err := protocol.DecodeJSON(f.Payload, &ei); err != nil {
				return err
			}
			return &ei
		}
		done, err := handle(f)
		if err != nil || done {
			return err
		}
	}
}
