package opensandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
)

// maxPlaceAttempts bounds the nodes a create placed by load is sent to
// when the chosen node's lifecycle server cannot be dialed.
const maxPlaceAttempts = 3

// create places POST /sandboxes on a node and forwards it; modifyResponse
// records a 202 (recordCreate).
func (f *Facade) create(w http.ResponseWriter, r *http.Request, st *reqState) {
	owner := r.Header.Get(HeaderRun)
	if owner != "" {
		if err := protocol.ValidRunID(owner); err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalidRun, fmt.Sprintf("%s header: %v", HeaderRun, err))
			return
		}
		if f.cfg.Ledger.RunClosed(owner) {
			writeError(w, http.StatusConflict, CodeRunClosed, fmt.Sprintf("%s header: run %s was closed (its sandboxes are reaped); start a new run with a new run id", HeaderRun, owner))
			return
		}
	}
	if err := f.mayCreateIn(st, owner); err != nil {
		writeRefusal(w, err)
		return
	}
	node, cands, status, code, msg := f.place(r)
	if status != 0 {
		writeError(w, status, code, msg)
		return
	}
	if err := f.reach(st, node); err != nil {
		// Placed by load or selector: among the nodes the caller may
		// reach, if any.
		if cands = f.reachable(st, cands); len(cands) == 0 {
			writeRefusal(w, err)
			return
		}
		node = f.leastLoaded(cands)
	}
	st.node, st.session = node.ID, node.SessionID
	st.owner = owner
	if len(cands) > 1 {
		// A create placed by load may be sent again to another node if
		// the dial to the chosen one fails: keep the body to replay.
		if b, ok := replayable(r); ok {
			st.cands = cands
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		}
	}
	st.decode = true
	f.forward(w, r, st)
}

// replayable reads r's body if it is at most maxDecodeBody bytes, and
// restores it either way; ok is false when it was not read whole.
func replayable(r *http.Request) (b []byte, ok bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	body := r.Body
	b, err := io.ReadAll(io.LimitReader(body, maxDecodeBody+1))
	switch {
	case err != nil:
		r.Body = readCloser{io.MultiReader(bytes.NewReader(b), errReader{err}), body}
		return nil, false
	case len(b) > maxDecodeBody:
		r.Body = readCloser{io.MultiReader(bytes.NewReader(b), body), body}
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return b, true
}

// nextNode moves a create placed by load whose dial to st.node failed to
// the least loaded of the candidates not tried yet; false when there is
// none, or maxPlaceAttempts nodes were tried.
func (f *Facade) nextNode(st *reqState) bool {
	st.tried = append(st.tried, st.node)
	if len(st.tried) >= maxPlaceAttempts {
		return false
	}
	var rest []protocol.NodeInfo
	for _, c := range st.cands {
		if !slices.Contains(st.tried, c.ID) {
			rest = append(rest, c)
		}
	}
	if len(rest) == 0 {
		return false
	}
	n := f.leastLoaded(rest)
	f.log.Warn("create: the chosen node's lifecycle server cannot be reached; placing on the next least loaded node", "node", st.node, "next", n.ID)
	st.node, st.session = n.ID, n.SessionID
	return true
}

// place picks the node for a create: the Tether-Node header's node, else
// the least loaded node matching the Tether-Node-Selector header, else the
// least loaded node with the target. cands are the nodes a placement by
// load chose among (nil for Tether-Node). When it cannot, it returns the
// status, code and message to answer with.
func (f *Facade) place(r *http.Request) (n protocol.NodeInfo, cands []protocol.NodeInfo, status int, code, msg string) {
	nodeID := strings.TrimSpace(r.Header.Get(HeaderNode))
	selText := strings.TrimSpace(r.Header.Get(HeaderNodeSelector))
	switch {
	case nodeID != "" && selText != "":
		return n, nil, http.StatusBadRequest, CodeInvalidPlacement, fmt.Sprintf("set at most one of the %s and %s headers", HeaderNode, HeaderNodeSelector)
	case nodeID != "":
		v := f.view()
		if p := v.nodeProblem(nodeID); p != "" {
			return n, nil, http.StatusServiceUnavailable, CodeNodeUnavailable, fmt.Sprintf("cannot create on the %s node: %s", HeaderNode, p)
		}
		return v.all[nodeID], nil, 0, "", ""
	case selText != "":
		sel, err := protocol.ParseSelector(selText)
		if err != nil {
			return n, nil, http.StatusBadRequest, CodeInvalidPlacement, fmt.Sprintf("%s header: %v", HeaderNodeSelector, err)
		}
		f.view() // prune transports
		for _, c := range f.cfg.Fleet.Nodes(sel) {
			if hasTarget(c) {
				cands = append(cands, c)
			}
		}
		if len(cands) == 0 {
			return n, nil, http.StatusServiceUnavailable, CodeNoNode, fmt.Sprintf("no connected node matching %s %q has the %s target", HeaderNodeSelector, selText, Target)
		}
		return f.leastLoaded(cands), cands, 0, "", ""
	}
	v := f.view()
	if len(v.targets) == 0 {
		return n, nil, http.StatusServiceUnavailable, CodeNoNode, fmt.Sprintf("no connected node has the %s target", Target)
	}
	return f.leastLoaded(v.targets), v.targets, 0, "", ""
}

// leastLoaded returns the node of cands with the fewest live sandboxes in
// the ledger; ties go to the smallest node id. Nodes whose lifecycle
// server could not be dialed lately (transports.failing) are passed over
// unless all of cands are.
func (f *Facade) leastLoaded(cands []protocol.NodeInfo) protocol.NodeInfo {
	healthy := make([]protocol.NodeInfo, 0, len(cands))
	for _, c := range cands {
		if !f.tr.failing(c) {
			healthy = append(healthy, c)
		}
	}
	if len(healthy) > 0 {
		cands = healthy
	}
	best, bestLoad := cands[0], f.cfg.Ledger.LiveOn(cands[0].ID)
	for _, c := range cands[1:] {
		l := f.cfg.Ledger.LiveOn(c.ID)
		if l < bestLoad || (l == bestLoad && c.ID < best.ID) {
			best, bestLoad = c, l
		}
	}
	return best
}

// recordCreate records a create the node accepted (202). The body is read
// and restored; a failure to decode or record is logged and counted, and
// the caller still gets the node's answer.
func (f *Facade) recordCreate(resp *http.Response, st *reqState) {
	b, ok := readLimited(resp, maxDecodeBody)
	if !ok {
		f.ledgerFailed(resp, st, "", fmt.Errorf("create response from node %s not readable (over %d bytes, encoded, or failed)", st.node, maxDecodeBody))
		return
	}
	var cr osb.CreateSandboxResponse
	if err := json.Unmarshal(b, &cr); err != nil || cr.ID == "" {
		if err == nil {
			err = fmt.Errorf("no id")
		}
		f.ledgerFailed(resp, st, "", fmt.Errorf("decode create response from node %s: %w", st.node, err))
		return
	}
	st.note.setSandbox(cr.ID)
	rec := ledger.Record{
		Provider:  protocol.ProviderOpenSandbox,
		Node:      st.node,
		ID:        cr.ID,
		Labels:    cr.Metadata,
		Managed:   true,
		Owner:     st.owner,
		CreatedAt: cr.CreatedAt,
		ExpiresAt: cr.ExpiresAt,
		LastSeen:  f.now(),
		State:     ledger.StateLive,
		Source:    ledger.SourceFacade,
	}
	if st.identified {
		rec.CreatedBy = st.who.String()
	}
	ctx, cancel := ledgerCtx(resp.Request.Context())
	defer cancel()
	if err := f.cfg.Ledger.Created(ctx, rec); err != nil {
		f.ledgerFailed(resp, st, cr.ID, fmt.Errorf("record create: %w", err))
		return
	}
	f.log.Info("sandbox created", "node", st.node, "id", cr.ID, "owner", st.owner)
}

// ledgerFailed logs and counts a ledger write the facade could not make.
func (f *Facade) ledgerFailed(resp *http.Response, st *reqState, id string, err error) {
	f.m.ledgerErrors.Inc()
	f.log.Error("ledger write failed", "node", st.node, "id", id, "route", st.class, "status", resp.StatusCode, "err", err)
}
