package openshell

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// maxListPages bounds the pages the facade reads from one gateway for one
// call (MaxListLimit rows each), so that a gateway that never returns a
// short page cannot hold a call forever.
const maxListPages = 1000

// listed is one sandbox of a gateway's ListSandboxesResponse: its bytes as
// the gateway sent them, and the metadata the facade sorts and indexes by.
type listed struct {
	node string
	raw  []byte
	meta *openshell.ObjectMeta
}

// parseList splits a ListSandboxesResponse into its sandboxes (field 1),
// keeping each one's bytes and decoding only its metadata (field 1 of
// Sandbox).
func parseList(node string, b []byte) ([]listed, error) {
	var out []listed
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		raw, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		meta, err := sandboxMeta(raw)
		if err != nil {
			return nil, err
		}
		out = append(out, listed{node: node, raw: raw, meta: meta})
	}
	return out, nil
}

// sandboxMeta decodes the metadata (field 1) of an encoded Sandbox. Proto
// merges repeated occurrences of a message field, and so does this.
func sandboxMeta(b []byte) (*openshell.ObjectMeta, error) {
	meta := new(openshell.ObjectMeta)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, meta); err != nil {
				return nil, err
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return meta, nil
}

// listOverlap is how many rows each page of listAll re-reads of the page
// before it: a sandbox deleted between two page reads shifts the rows after
// it back by one, and without the overlap the next page would skip a row.
// Rows read twice are dropped by id.
const listOverlap = 16

// listAll reads every sandbox n's gateway lists for base (its selector and
// workspace fields; limit and offset are the facade's), page by page, and
// indexes them.
func (c *call) listAll(n protocol.NodeInfo, base *openshell.ListSandboxesRequest) ([]listed, error) {
	var out []listed
	seen := make(map[string]bool)
	offset := 0
	for range maxListPages {
		req := proto.CloneOf(base)
		req.Limit, req.Offset = openshell.MaxListLimit, uint32(offset)
		b, err := proto.Marshal(req)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "tether: encode ListSandboxesRequest: %v", err)
		}
		a := c.invoke(n, openshell.MethodListSandboxes, &frame{b: b})
		if a.err != nil {
			return nil, a.err
		}
		rows, err := parseList(n.ID, a.resp.b)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "tether: node %s: decode ListSandboxesResponse: %v", n.ID, err)
		}
		for _, r := range rows {
			id := r.meta.GetId()
			if id != "" && seen[id] {
				continue
			}
			seen[id] = true
			c.s.idx.learn(n.ID, id, openshell.Workspace(r.meta.GetWorkspace()), r.meta.GetName())
			out = append(out, r)
		}
		if len(rows) < openshell.MaxListLimit {
			return out, nil
		}
		offset += openshell.MaxListLimit - listOverlap
	}
	return nil, status.Errorf(codes.Unavailable, "tether: node %s: ListSandboxes returned full pages past %d rows", n.ID, offset)
}

// listEach runs listAll for base on every node of nodes, at most
// maxParallel at once; results and errors are in the order of nodes.
func (c *call) listEach(nodes []protocol.NodeInfo, base *openshell.ListSandboxesRequest) ([][]listed, []error) {
	rows := make([][]listed, len(nodes))
	errs := make([]error, len(nodes))
	var g errgroup.Group
	g.SetLimit(maxParallel)
	for i, n := range nodes {
		g.Go(func() error {
			defer c.s.guard.Recover("list on a node", func(e *panics.Error) { rows[i], errs[i] = nil, internal(e) })
			rows[i], errs[i] = c.listAll(n, base)
			return nil
		})
	}
	g.Wait()
	return rows, errs
}

// list answers ListSandboxes for the whole fleet: it reads every matching
// sandbox from every node's gateway (the caller's label_selector,
// workspace and all_workspaces passed verbatim, the caller's metadata
// too), merges them, sorts them by (created_at_ms, name, workspace, id) and
// applies the caller's limit (0 → 100, capped at 1000) and offset to the
// merged list, so that paging through the facade visits every sandbox once
// whatever order each gateway lists in.
//
// The answer is complete or an error, never a silently partial list: a
// node that fails makes the call UNAVAILABLE naming it, and so does a node
// that holds live sandboxes in the ledger but is not connected. The one
// node left out is one whose gateway cannot be dialed while the ledger
// holds no live OpenShell sandbox on it (Server.skippable). A caller
// error (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED) passes
// through verbatim. NOT_FOUND from a node means the workspace is not on
// that gateway: it contributes no rows, unless no node has the workspace,
// when the first NOT_FOUND passes through.
func (c *call) list() error {
	first, err := c.recvFirst()
	if err != nil {
		return err
	}
	var req openshell.ListSandboxesRequest
	if err := proto.Unmarshal(first.b, &req); err != nil {
		return decodeErr("ListSandboxesRequest", err)
	}
	limit, offset := openshell.ListLimit(req.GetLimit()), int(req.GetOffset())
	if err := c.decide(policy.OpSandboxesList, policy.Node{}, policy.Object{Owner: c.who.String()}); err != nil {
		return err
	}
	nodes := c.s.gatewayNodes(protocol.Selector{})
	if err := c.s.missingHolders(nodes); err != nil {
		return err
	}
	nodes = c.reachable(nodes)
	perNode, errs := c.listEach(nodes, &req)
	var failed []string
	notFound := 0
	var firstNotFound error
	counted := 0 // nodes whose answer counts
	for i, err := range errs {
		switch code := status.Code(err); {
		case err == nil:
		case callerError(code):
			return err
		case code == codes.NotFound:
			notFound++
			if firstNotFound == nil {
				firstNotFound = err
			}
		case c.s.skippable(nodes[i], err):
			// Its gateway cannot be dialed and it holds nothing.
			c.s.log.Debug("list: leaving out a node whose gateway cannot be reached and that holds no live sandboxes", "node", nodes[i].ID, "err", err)
			continue
		default:
			failed = append(failed, fmt.Sprintf("node %s: %v", nodes[i].ID, err))
		}
		counted++
	}
	if len(failed) > 0 {
		return status.Errorf(codes.Unavailable, "tether: list sandboxes: %s", strings.Join(failed, "; "))
	}
	if notFound > 0 && notFound == counted {
		return firstNotFound
	}
	var all []listed
	keep := c.listFilter()
	for _, rows := range perNode {
		for _, r := range rows {
			if keep == nil || keep(r.meta.GetId()) {
				all = append(all, r)
			}
		}
	}
	slices.SortFunc(all, func(a, b listed) int {
		return cmp.Or(
			cmp.Compare(a.meta.GetCreatedAtMs(), b.meta.GetCreatedAtMs()),
			strings.Compare(a.meta.GetName(), b.meta.GetName()),
			strings.Compare(a.meta.GetWorkspace(), b.meta.GetWorkspace()),
			strings.Compare(a.meta.GetId(), b.meta.GetId()),
			strings.Compare(a.node, b.node),
		)
	})
	start := min(offset, len(all))
	end := min(start+limit, len(all))
	var out []byte
	for _, r := range all[start:end] {
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, r.raw)
	}
	return c.ss.SendMsg(&frame{b: out})
}

// missingHolders returns UNAVAILABLE naming the nodes that hold live
// OpenShell sandboxes in the ledger but are not among nodes (connected with
// a gateway): a fleet-wide list without them would be partial.
func (s *Server) missingHolders(nodes []protocol.NodeInfo) error {
	if s.cfg.Ledger == nil {
		return nil
	}
	connected := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		connected[n.ID] = true
	}
	var missing []string
	for _, r := range s.cfg.Ledger.List(ledger.Filter{Provider: protocol.ProviderOpenShell, State: string(ledger.StateLive)}) {
		if !connected[r.Node] && !slices.Contains(missing, r.Node) {
			missing = append(missing, r.Node)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return status.Errorf(codes.Unavailable, "tether: list sandboxes: node(s) %s hold live sandboxes but are not connected; the list would be incomplete", strings.Join(missing, ", "))
}

// scan looks for sandbox id on every node by listing each gateway's
// sandboxes (every workspace if the caller may list them, else the default
// workspace), indexing all it reads. It returns the node that has id, ""
// if none has, or an error if a node could not be listed.
func (c *call) scan(nodes []protocol.NodeInfo, id string) (string, error) {
	perNode, errs := c.listEach(nodes, &openshell.ListSandboxesRequest{AllWorkspaces: true})
	var failed []string
	for i, err := range errs {
		if err != nil && callerError(status.Code(err)) {
			// all_workspaces needs a platform admin (wire-facts §1.4).
			perNode[i], err = c.listAll(nodes[i], &openshell.ListSandboxesRequest{})
			if err != nil && callerError(status.Code(err)) {
				return "", err // the gateway would refuse the call itself too
			}
		}
		if err != nil {
			if !c.s.skippable(nodes[i], err) {
				failed = append(failed, fmt.Sprintf("node %s: %v", nodes[i].ID, err))
			}
			continue
		}
		for _, r := range perNode[i] {
			if r.meta.GetId() == id {
				return nodes[i].ID, nil
			}
		}
	}
	if len(failed) > 0 {
		return "", status.Errorf(codes.Unavailable, "tether: sandbox %s: not found on the nodes that answered; %s", id, strings.Join(failed, "; "))
	}
	return "", nil
}
