package openshell

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// errNoGateway is the status of a call no connected node can serve.
func errNoGateway() error {
	return status.Error(codes.Unavailable, "tether: no connected node has an openshell gateway")
}

// errNotConnected is the status of a call routed to a node that is not
// connected (or has no OpenShell gateway).
func errNotConnected(what, node string) error {
	return status.Errorf(codes.Unavailable, "tether: %s is on node %s, which is not connected or has no openshell gateway", what, node)
}

// callerError reports whether code is one a gateway gives for the call
// itself (the same on every gateway), so that it passes through verbatim
// even when other nodes answered differently.
func callerError(code codes.Code) bool {
	return code == codes.InvalidArgument || code == codes.Unauthenticated || code == codes.PermissionDenied
}

// decodeErr is the status of a request the facade cannot decode.
func decodeErr(msg string, err error) error {
	return status.Errorf(codes.InvalidArgument, "tether: decode %s: %v", msg, err)
}

// maxPlaceAttempts bounds the nodes a create placed by load is offered to
// when the chosen node's gateway cannot be reached.
const maxPlaceAttempts = 3

// create places a CreateSandbox on a node, forwards it, and records the
// sandbox the gateway made.
func (c *call) create() error {
	first, err := c.recvFirst()
	if err != nil {
		return err
	}
	var req openshell.CreateSandboxRequest
	if err := proto.Unmarshal(first.b, &req); err != nil {
		return decodeErr("CreateSandboxRequest", err)
	}
	ttl, err := c.ttl()
	if err != nil {
		return err
	}
	owner := mdFirst(c.md, MetaRun)
	if owner != "" {
		if err := protocol.ValidRunID(owner); err != nil {
			return status.Errorf(codes.InvalidArgument, "tether: metadata %s: %v", MetaRun, err)
		}
		if c.s.cfg.Ledger != nil && c.s.cfg.Ledger.RunClosed(owner) {
			return status.Errorf(codes.FailedPrecondition, "tether: metadata %s: run %s was closed (its sandboxes are reaped); start a new run with a new run id", MetaRun, owner)
		}
		if err := c.mayCreateIn(owner); err != nil {
			return err
		}
	}
	key := wsName{openshell.Workspace(req.GetWorkspace()), req.GetName()}
	c.noteSandbox(key.ws + "/" + key.name)
	n, release, cands, err := c.place(key, req.GetLabels())
	if err != nil {
		return err
	}
	// Counted in flight until the ledger has it (or the create failed).
	defer func() { release() }()
	// A node placed by load whose gateway cannot be reached is passed
	// over for the next least loaded one: nothing was sent to it.
	tried := map[string]bool{}
	for attempt := 1; len(cands) > 1 && attempt < maxPlaceAttempts && c.s.pool.unreachable(c.ctx, n); attempt++ {
		tried[n.ID] = true
		var rest []protocol.NodeInfo
		for _, m := range cands {
			if !tried[m.ID] {
				rest = append(rest, m)
			}
		}
		if len(rest) == 0 {
			break
		}
		release()
		c.s.log.Warn("create: the chosen node's gateway cannot be reached; placing on the next least loaded node", "node", n.ID)
		n, release = c.s.leastLoaded(rest)
	}
	p := pendingCreate{node: n.ID, owner: owner, ttl: ttl, labels: req.GetLabels()}
	c.s.idx.addPending(key, p)
	a := c.invoke(n, c.method, first)
	if a.err == nil {
		c.recordCreate(n.ID, key, a.resp, p)
	}
	release()
	return c.reply(a)
}

// ttl returns the TTL of a create: metadata tether-ttl, else
// Config.DefaultTTL. "0" means no TTL.
func (c *call) ttl() (time.Duration, error) {
	v := mdFirst(c.md, MetaTTL)
	if v == "" {
		return c.s.cfg.DefaultTTL, nil
	}
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(secs) * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	switch {
	case err == nil && d < 0, err != nil && strings.HasPrefix(v, "-") && isInt(v[1:]):
		return 0, status.Errorf(codes.InvalidArgument, "tether: metadata %s %s: must not be negative (0 means no TTL)", MetaTTL, protocol.Clip(v))
	case err != nil:
		return 0, status.Errorf(codes.InvalidArgument, "tether: metadata %s %s: want a Go duration (90m) or whole seconds (5400); 0 means no TTL", MetaTTL, protocol.Clip(v))
	}
	return d, nil
}

// isInt reports whether s is a non-empty string of decimal digits.
func isInt(s string) bool {
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil
}

// place chooses the node of a create of key: the node that already has
// (workspace, name), so that a retry meets ALREADY_EXISTS where the first
// attempt landed (wire-facts §1.5, OS-3) — unless that sandbox is being
// deleted and the create names its node; else the node of label
// tether.node; else metadata tether-node; else the least loaded node of
// metadata tether-node-selector or of all nodes. A selector together with
// a node (label or metadata) is refused.
//
// cands are the nodes a placement by load chose among (nil otherwise): a
// create may move to another of them when n's gateway cannot be reached.
// release ends the create's count as in flight on the node (placement
// load); it may be called more than once.
func (c *call) place(key wsName, labels map[string]string) (n protocol.NodeInfo, release func(), cands []protocol.NodeInfo, err error) {
	selText := mdFirst(c.md, MetaNodeSelector)
	if selText != "" {
		for _, set := range []struct{ v, what string }{
			{mdFirst(c.md, MetaNode), "metadata " + MetaNode},
			{labels[LabelNode], "label " + LabelNode},
		} {
			if set.v != "" {
				return n, nil, nil, status.Errorf(codes.InvalidArgument,
					"tether: set at most one of %s and metadata %s (both are set)", set.what, MetaNodeSelector)
			}
		}
	}
	if l, m := labels[LabelNode], mdFirst(c.md, MetaNode); l != "" && m != "" && l != m {
		return n, nil, nil, status.Errorf(codes.InvalidArgument,
			"tether: label %s=%s and metadata %s=%s name different nodes; set one", LabelNode, l, MetaNode, m)
	}
	nodes := c.s.gatewayNodes(protocol.Selector{})
	// A name being freed where it was does not hold an explicitly
	// placed create there.
	pinned := labels[LabelNode] != "" || mdFirst(c.md, MetaNode) != ""
	r, known := c.s.recordByName(key)
	freeing := known && r.State == ledger.StateDeleting && pinned
	if key.name != "" && !freeing {
		if node, _, _ := c.s.knownName(key, true); node != "" {
			n, ok := findNode(nodes, node)
			if !ok {
				return n, nil, nil, errNotConnected(fmt.Sprintf("sandbox %s/%s", key.ws, key.name), node)
			}
			c.s.m.placements.WithLabelValues(placeExisting).Inc()
			return n, c.s.startCreate(n.ID), nil, nil
		}
	}
	for _, pick := range []struct{ id, by, from string }{
		{labels[LabelNode], placeLabel, "label " + LabelNode},
		{mdFirst(c.md, MetaNode), placeNode, "metadata " + MetaNode},
	} {
		if pick.id == "" {
			continue
		}
		n, ok := findNode(nodes, pick.id)
		if !ok {
			return n, nil, nil, status.Errorf(codes.FailedPrecondition, "tether: %s=%s names no connected node with an openshell gateway", pick.from, pick.id)
		}
		c.s.m.placements.WithLabelValues(pick.by).Inc()
		return n, c.s.startCreate(n.ID), nil, nil
	}
	by := placeLeastLoaded
	if selText != "" {
		sel, err := protocol.ParseSelector(selText)
		if err != nil {
			return n, nil, nil, status.Errorf(codes.InvalidArgument, "tether: metadata %s: %v", MetaNodeSelector, err)
		}
		nodes, by = c.s.gatewayNodes(sel), placeSelector
		if len(nodes) == 0 {
			return n, nil, nil, status.Errorf(codes.FailedPrecondition, "tether: no connected node matching %s %q has an openshell gateway", MetaNodeSelector, selText)
		}
	}
	// Placed by load: only on nodes the caller may reach.
	if all := nodes; len(all) > 0 {
		if nodes = c.reachable(all); len(nodes) == 0 {
			return n, nil, nil, c.reach(all[0])
		}
	}
	if len(nodes) == 0 {
		return n, nil, nil, errNoGateway()
	}
	c.s.m.placements.WithLabelValues(by).Inc()
	n, release = c.s.leastLoaded(nodes)
	return n, release, nodes, nil
}

// knownName returns the node (and id, if known) that holds (workspace,
// name) according to the ledger, then the facade's index, and, when
// creates is set, a create of it forwarded recently.
func (s *Server) knownName(k wsName, creates bool) (node, id, via string) {
	if r, ok := s.recordByName(k); ok {
		return r.Node, r.ID, viaLedger
	}
	if node, id, ok := s.idx.byNameNode(k); ok {
		return node, id, viaIndex
	}
	if creates {
		if p, ok := s.idx.pendingFor(k); ok {
			return p.node, "", viaIndex
		}
	}
	return "", "", ""
}

// recordCreate records the sandbox of a successful create (or of one
// adopted later) in the index and the ledger.
func (c *call) recordCreate(node string, key wsName, resp *frame, p pendingCreate) {
	var sr openshell.SandboxResponse
	if err := proto.Unmarshal(resp.b, &sr); err != nil || sr.GetSandbox().GetMetadata().GetId() == "" {
		c.s.log.Warn("create: cannot read the sandbox's id from the gateway's answer; the inventory will record it",
			"node", node, "workspace", key.ws, "name", key.name, "err", err)
		return
	}
	meta := sr.GetSandbox().GetMetadata()
	ws := meta.GetWorkspace()
	if ws == "" {
		ws = key.ws
	}
	c.s.idx.learn(node, meta.GetId(), ws, meta.GetName())
	c.s.idx.dropPending(key)
	labels := meta.GetLabels()
	if labels == nil {
		labels = p.labels
	}
	now := time.Now().UTC()
	created := now
	if ms := meta.GetCreatedAtMs(); ms > 0 {
		created = time.UnixMilli(ms).UTC()
	}
	r := ledger.Record{
		Provider:  protocol.ProviderOpenShell,
		Node:      node,
		Workspace: ws,
		Name:      meta.GetName(),
		ID:        meta.GetId(),
		Labels:    labels,
		Managed:   true,
		Owner:     p.owner,
		CreatedAt: created,
		LastSeen:  now,
		TTL:       p.ttl,
		State:     ledger.StateLive,
		Source:    ledger.SourceFacade,
	}
	if c.identified {
		r.CreatedBy = c.who.String()
	}
	c.s.ledgerWrite(c.ctx, opCreated, r.Key(), func(ctx context.Context) error { return c.s.cfg.Ledger.Created(ctx, r) })
}

// byName routes GetSandbox, DeleteSandbox, StopSandbox and StartSandbox,
// which address a sandbox by (workspace, name): to the node the ledger or
// the index names, else to the node whose gateway answers GetSandbox for
// it. A NOT_FOUND where a hint pointed is checked on every other node
// before it is believed: names are unique per gateway, not per fleet, and a
// name may have been deleted and made again elsewhere.
func (c *call) byName() error {
	first, err := c.recvFirst()
	if err != nil {
		return err
	}
	var req openshell.GetSandboxRequest // Delete/Stop/Start requests share its fields: name=1, workspace=2
	if err := proto.Unmarshal(first.b, &req); err != nil {
		return decodeErr(methodLabel(c.method)+" request", err)
	}
	key := wsName{openshell.Workspace(req.GetWorkspace()), req.GetName()}
	what := fmt.Sprintf("sandbox %s/%s", key.ws, key.name)
	c.noteSandbox(key.ws + "/" + key.name)
	op := policy.OpSandboxesList
	if c.method == openshell.MethodDeleteSandbox {
		op = policy.OpSandboxesReap
	}
	rec, known := c.s.recordByName(key)
	if err := c.mayUse(op, rec, known); err != nil {
		return err
	}
	nodes, err := c.gatewayNodes(protocol.Selector{})
	if err != nil {
		return err
	}

	if explicit := mdFirst(c.md, MetaNode); explicit != "" {
		n, ok := findNode(nodes, explicit)
		if !ok {
			return c.notReachable(explicit, status.Errorf(codes.FailedPrecondition, "tether: metadata %s=%s names no connected node with an openshell gateway", MetaNode, explicit))
		}
		_, id, _ := c.s.knownName(key, false)
		a := c.invoke(n, c.method, first)
		c.accountName(key, id, a)
		return c.reply(a)
	}

	var hinted *answer
	hintedGone := "" // the hinted node, when it is not connected
	rest := nodes
	if node, id, via := c.s.knownName(key, false); node != "" && key.name != "" {
		c.s.m.lookups.WithLabelValues(via).Inc()
		if n, ok := findNode(nodes, node); ok {
			a := c.invoke(n, c.method, first)
			c.accountName(key, id, a)
			if status.Code(a.err) != codes.NotFound {
				return c.reply(a)
			}
			hinted = &a
			rest = without(nodes, node)
		} else {
			hintedGone = node
		}
	}

	// Ask every (other) node. GetSandbox is the probe for every method:
	// it changes nothing.
	probe := first
	if c.method != openshell.MethodGetSandbox {
		b, err := proto.Marshal(&openshell.GetSandboxRequest{Name: req.GetName(), Workspace: req.GetWorkspace()})
		if err != nil {
			return status.Errorf(codes.Internal, "tether: encode GetSandboxRequest: %v", err)
		}
		probe = &frame{b: b}
	}
	var answers, found []answer
	for _, a := range c.invokeAll(rest, openshell.MethodGetSandbox, probe) {
		switch {
		case a.err == nil:
			found = append(found, a)
		case c.s.skippable(a.node, a.err):
			// Its gateway cannot be dialed and it holds nothing.
		default:
			answers = append(answers, a)
		}
	}
	switch len(found) {
	case 0:
	case 1:
		a := found[0]
		c.s.m.lookups.WithLabelValues(viaProbe).Inc()
		id := c.learnSandbox(a.node.ID, key, a.resp)
		if c.method == openshell.MethodGetSandbox {
			return c.reply(a)
		}
		b := c.invoke(a.node, c.method, first)
		c.accountName(key, id, b)
		return c.reply(b)
	default:
		// Names are unique per gateway only: made on two gateways
		// directly, the name does not say which sandbox is meant.
		var on []string
		for _, a := range found {
			on = append(on, a.node.ID)
		}
		return status.Errorf(codes.FailedPrecondition, "tether: sandbox name %s/%s exists on nodes %s; set %s to choose",
			key.ws, key.name, andList(on), MetaNode)
	}
	c.s.m.lookups.WithLabelValues(viaNone).Inc()
	if err := fanoutFailure(what, answers); err != nil {
		return err
	}
	if hintedGone != "" {
		return c.notReachable(hintedGone, errNotConnected(what, hintedGone))
	}
	switch {
	case hinted != nil:
		return c.reply(*hinted)
	case len(answers) > 0:
		return c.reply(answers[0]) // the gateway's own NOT_FOUND
	}
	return status.Error(codes.NotFound, "sandbox not found")
}

// fanoutFailure returns, for answers that found nothing, the status to
// give instead of NOT_FOUND: a caller error (verbatim) if any node gave
// one, else UNAVAILABLE naming the nodes that failed otherwise (the sandbox
// may be on one of them); nil if every node said NOT_FOUND.
func fanoutFailure(what string, answers []answer) error {
	var failed []string
	for _, a := range answers {
		code := status.Code(a.err)
		switch {
		case callerError(code):
			return a.err
		case code != codes.NotFound && code != codes.OK:
			failed = append(failed, fmt.Sprintf("node %s: %v", a.node.ID, a.err))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return status.Errorf(codes.Unavailable, "tether: %s: not found on the nodes that answered; %s", what, strings.Join(failed, "; "))
}

// andList joins ids as "a", "a and b", "a, b and c".
func andList(ids []string) string {
	if len(ids) < 2 {
		return strings.Join(ids, "")
	}
	return strings.Join(ids[:len(ids)-1], ", ") + " and " + ids[len(ids)-1]
}

// without returns nodes without the node with id.
func without(nodes []protocol.NodeInfo, id string) []protocol.NodeInfo {
	out := make([]protocol.NodeInfo, 0, len(nodes))
	for _, n := range nodes {
		if n.ID != id {
			out = append(out, n)
		}
	}
	return out
}

// learnSandbox indexes the sandbox of a SandboxResponse from node, records
// it in the ledger if it is the sandbox of a create forwarded to node that
// failed ambiguously (the caller retried, met ALREADY_EXISTS and adopted it
// with GetSandbox: wire-facts §1.5), and returns its id.
func (c *call) learnSandbox(node string, key wsName, resp *frame) string {
	var sr openshell.SandboxResponse
	if err := proto.Unmarshal(resp.b, &sr); err != nil {
		return ""
	}
	meta := sr.GetSandbox().GetMetadata()
	id := meta.GetId()
	ws := meta.GetWorkspace()
	if ws == "" {
		ws = key.ws
	}
	c.s.idx.learn(node, id, ws, meta.GetName())
	k := wsName{ws, meta.GetName()}
	if p, ok := c.s.idx.pendingFor(k); ok && p.node == node && id != "" {
		if _, known := c.s.recordByID(id); !known {
			c.recordCreate(node, k, resp, p)
		}
		c.s.idx.dropPending(k)
	}
	return id
}

// accountName does the bookkeeping of a by-name call's answer a: it indexes
// the sandbox of a SandboxResponse; for DeleteSandbox it records the
// sandbox (with id, if known) as deleting (deleted=true: the inventory
// confirms it gone) or deleted (deleted=false, or NOT_FOUND).
func (c *call) accountName(key wsName, id string, a answer) {
	node := a.node.ID
	if c.method != openshell.MethodDeleteSandbox {
		if a.err == nil {
			c.learnSandbox(node, key, a.resp)
		}
		return
	}
	code := status.Code(a.err)
	if code != codes.OK && code != codes.NotFound {
		return
	}
	gone := code == codes.NotFound
	if !gone {
		var dr openshell.DeleteSandboxResponse
		if err := proto.Unmarshal(a.resp.b, &dr); err != nil {
			return
		}
		gone = !dr.GetDeleted()
	}
	if gone {
		c.s.idx.dropPending(key)
	}
	if id == "" {
		return
	}
	k := ledger.Key{Provider: protocol.ProviderOpenShell, Node: node, ID: id}
	if gone {
		c.s.idx.forget(id)
		c.s.ledgerWrite(c.ctx, opDeleted, k, func(ctx context.Context) error { return c.s.cfg.Ledger.Deleted(ctx, k) })
		return
	}
	c.s.ledgerWrite(c.ctx, opDeleting, k, func(ctx context.Context) error { return c.s.cfg.Ledger.Deleting(ctx, k) })
}

// sandboxID returns the sandbox id of the first message of an id-routed
// method, and whether the message could be read.
func sandboxID(method string, b []byte) (string, error) {
	switch method {
	case openshell.MethodExecSandbox:
		var m openshell.ExecSandboxRequest
		err := proto.Unmarshal(b, &m)
		return m.GetSandboxId(), err
	case openshell.MethodWatchSandbox:
		var m openshell.WatchSandboxRequest
		err := proto.Unmarshal(b, &m)
		return m.GetId(), err
	default: // ExecSandboxInteractive: the first input must be start
		var m openshell.ExecSandboxInput
		err := proto.Unmarshal(b, &m)
		return m.GetStart().GetSandboxId(), err
	}
}

// byID routes ExecSandbox, WatchSandbox and ExecSandboxInteractive, which
// address a sandbox by id (wire-facts §1.4): to the node the ledger or the
// index names, else to the node whose gateway lists it. Ids are UUIDs
// that never move between gateways, so a hint is never stale in a way that
// matters. A request the gateway must refuse anyway (no id, a first
// interactive message that is not start) and an id no node has go to the
// first node, whose gateway answers with its own status (OS-13).
func (c *call) byID() error {
	first, err := c.recvFirst()
	if err != nil {
		return err
	}
	id, err := sandboxID(c.method, first.b)
	if err != nil {
		return decodeErr(methodLabel(c.method)+" request", err)
	}
	if id != "" {
		c.noteSandbox(id)
		rec, known := c.s.recordByID(id)
		if err := c.mayUse(policy.OpSandboxesList, rec, known); err != nil {
			return err
		}
	}
	nodes, err := c.gatewayNodes(protocol.Selector{})
	if err != nil {
		return err
	}
	what := "sandbox " + id
	target, err := c.routeID(nodes, id)
	if err != nil {
		return err
	}
	if target == "" {
		if len(nodes) == 0 {
			if id == "" {
				return errNoGateway()
			}
			return status.Error(codes.NotFound, "sandbox not found")
		}
		return c.relay(nodes[0], first)
	}
	n, ok := findNode(nodes, target)
	if !ok {
		return c.notReachable(target, errNotConnected(what, target))
	}
	return c.relay(n, first)
}

// routeID returns the node holding sandbox id, or "" if no node has it
// (or id is empty); an error if a node could not be asked.
func (c *call) routeID(nodes []protocol.NodeInfo, id string) (string, error) {
	if explicit := mdFirst(c.md, MetaNode); explicit != "" {
		if _, ok := findNode(nodes, explicit); !ok {
			return "", c.notReachable(explicit, status.Errorf(codes.FailedPrecondition, "tether: metadata %s=%s names no connected node with an openshell gateway", MetaNode, explicit))
		}
		return explicit, nil
	}
	if id == "" {
		return "", nil
	}
	if r, ok := c.s.recordByID(id); ok {
		c.s.m.lookups.WithLabelValues(viaLedger).Inc()
		return r.Node, nil
	}
	if node, ok := c.s.idx.byIDNode(id); ok {
		c.s.m.lookups.WithLabelValues(viaIndex).Inc()
		return node, nil
	}
	node, err := c.scan(nodes, id)
	if err != nil {
		return "", err
	}
	if node == "" {
		c.s.m.lookups.WithLabelValues(viaNone).Inc()
	} else {
		c.s.m.lookups.WithLabelValues(viaScan).Inc()
	}
	return node, nil
}

// health answers Health from the first node (by id) whose gateway answers
// it, verbatim.
func (c *call) health() error {
	first, err := c.recvFirst()
	if err != nil {
		return err
	}
	nodes, err := c.gatewayNodes(protocol.Selector{})
	if err != nil {
		return err
	}
	if len(nodes) == 0 {
		return errNoGateway()
	}
	var failed []string
	for _, n := range nodes {
		a := c.invoke(n, c.method, first)
		if a.err == nil {
			return c.reply(a)
		}
		if c.ctx.Err() != nil {
			return a.err
		}
		failed = append(failed, fmt.Sprintf("node %s: %v", n.ID, a.err))
	}
	return status.Errorf(codes.Unavailable, "tether: no openshell gateway answered Health: %s", strings.Join(failed, "; "))
}

// other forwards a method the facade does not route by sandbox: to the node
// metadata tether-node names, else to the only node with a gateway.
func (c *call) other() error {
	nodes := c.s.gatewayNodes(protocol.Selector{})
	var n protocol.NodeInfo
	switch explicit := mdFirst(c.md, MetaNode); {
	case explicit != "":
		var ok bool
		if n, ok = findNode(nodes, explicit); !ok {
			return status.Errorf(codes.FailedPrecondition, "tether: metadata %s=%s names no connected node with an openshell gateway", MetaNode, explicit)
		}
	case len(nodes) == 1:
		n = nodes[0]
	case len(nodes) == 0:
		return errNoGateway()
	default:
		return status.Errorf(codes.FailedPrecondition,
			"tether: %s is not routed by sandbox and %d nodes have an openshell gateway: set gRPC metadata %s to the id of the node to call",
			c.method, len(nodes), MetaNode)
	}
	return c.relay(n, nil)
}
