package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// EndpointAdder is where AddEndpoints registers its endpoints: a
// micro.Service (or a micro.Group with no prefix: the subjects are full).
type EndpointAdder interface {
	AddEndpoint(name string, h micro.Handler, opts ...micro.EndpointOpt) error
}

// apiTimeout bounds the KV writes of one API request.
const apiTimeout = 10 * time.Second

// replyRoom is what a reply's headers may take beyond its body.
const replyRoom = 1024

// EndpointOption adjusts AddEndpoints.
type EndpointOption func(*endpointOptions)

type endpointOptions struct {
	knownNode func(node string) bool
	authz     caller.Authorizer
	labels    func(node string) map[string]string
}

// WithAuthorizer makes every endpoint ask a before it acts, as the
// caller's identity (caller.Of) and the run's owner (RunOwner, OwnerOf)
// decide: lease open, renew and close are sandboxes.lease on the run's
// owner; reap is sandboxes.reap on the run's owner (a dry run without a
// run lists everyone's: scope any); register is sandboxes.register on the
// node, on the owner of the run it names and, when the sandbox is recorded
// already, on its owner too (no one re-registers another's sandbox under
// their own run); list is sandboxes.list, limited to the caller's own
// runs' sandboxes unless its scope is any. A run nobody claimed is the
// caller's. Without it every request is allowed.
func WithAuthorizer(a caller.Authorizer) EndpointOption {
	return func(o *endpointOptions) { o.authz = a }
}

// WithNodeLabels gives the labels policy matches a register's node by
// (nil for a node not connected: only rules for every node match it).
func WithNodeLabels(labels func(node string) map[string]string) EndpointOption {
	return func(o *endpointOptions) { o.labels = labels }
}

// runOwner is the owner policy decides a request about run by: its
// RunOwner, or the caller when nobody claimed it.
func (l *Ledger) runOwner(req micro.Request, run string) string {
	if owner, claimed := l.RunOwner(run); claimed {
		return owner
	}
	return caller.Owner(req)
}

// WithKnownNode makes the register endpoint refuse, with 404
// protocol.ErrCodeUnknownNode, a node that is not connected now
// (connected(node) false) and that no coordinator ever took an inventory
// of (no inventory status in BucketInventory): a registration for a node
// that never existed would otherwise leave a live record that fleet-wide
// listings wait for. Without it, any valid node id is accepted. The
// coordinator passes e.g. its Reachable or ConnectedSince; connected must
// be safe for concurrent use and must not block.
func WithKnownNode(connected func(node string) bool) EndpointOption {
	return func(o *endpointOptions) { o.knownNode = connected }
}

// AddEndpoints registers the lease and sandbox endpoints of the NATS API
// (protocol.SubjectLease*, protocol.SubjectSandboxes*) on svc. r serves
// the reap endpoint; with r nil, reap requests get 503 unavailable.
// Handlers run on micro's goroutine per endpoint, one request at a time;
// each does at most a few KV round trips.
func (l *Ledger) AddEndpoints(svc EndpointAdder, r *Reaper, opts ...EndpointOption) error {
	var o endpointOptions
	for _, opt := range opts {
		opt(&o)
	}
	endpoints := []struct {
		name, subject string
		h             micro.HandlerFunc
	}{
		{"lease-open", protocol.SubjectLeaseOpen, func(req micro.Request) { l.handleLeaseOpen(req, &o) }},
		{"lease-renew", protocol.SubjectLeaseRenew, func(req micro.Request) { l.handleLeaseRenew(req, &o) }},
		{"lease-close", protocol.SubjectLeaseClose, func(req micro.Request) { l.handleLeaseClose(req, &o) }},
		{"sandboxes-list", protocol.SubjectSandboxesList, func(req micro.Request) { l.handleList(req, &o) }},
		{"sandboxes-register", protocol.SubjectSandboxesRegister, func(req micro.Request) { l.handleRegister(req, &o) }},
		{"sandboxes-reap", protocol.SubjectSandboxesReap, func(req micro.Request) { l.handleReap(req, r, &o) }},
	}
	for _, e := range endpoints {
		if err := svc.AddEndpoint(e.name, e.h, micro.WithEndpointSubject(e.subject)); err != nil {
			return fmt.Errorf("ledger: add endpoint %s on %s: %w", e.name, e.subject, err)
		}
	}
	return nil
}

func (l *Ledger) replyError(req micro.Request, e *protocol.APIError) {
	body, _ := json.Marshal(e)
	if err := req.Error(strconv.Itoa(e.Status), e.Message, body); err != nil {
		l.log.Warn("send error reply", "subject", req.Subject(), "code", e.Code, "err", err)
	}
}

// replyJSON sends v, or a 413 if it does not fit the server's max payload.
func (l *Ledger) replyJSON(req micro.Request, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		l.replyError(req, protocol.NewAPIError(500, protocol.ErrCodeInternal, "encode reply: %v", err))
		return
	}
	if mp := int(l.cfg.NATS.MaxPayload()); mp > 0 && len(body)+replyRoom > mp {
		l.replyError(req, protocol.NewAPIError(413, protocol.ErrCodeTooLarge, "reply is %d bytes, over the server's max payload %d; ask for a smaller page", len(body), mp))
		return
	}
	if err := req.Respond(body); err != nil {
		l.log.Warn("send reply", "subject", req.Subject(), "err", err)
	}
}

// decode decodes and validates a request body, replying with the error.
func (l *Ledger) decode(req micro.Request, v interface{ Validate() *protocol.APIError }) bool {
	e := protocol.DecodeRequest(req.Data(), v)
	if e == nil {
		e = v.Validate()
	}
	if e != nil {
		l.replyError(req, e)
		return false
	}
	return true
}

// apiError maps a ledger error to the API's.
func apiError(err error) *protocol.APIError {
	switch {
	case errors.Is(err, ErrLeaseNotFound):
		return protocol.NewAPIError(404, protocol.ErrCodeNotFound, "%v", err)
	case errors.Is(err, ErrLeaseClosed):
		return protocol.NewAPIError(409, protocol.ErrCodeLeaseClosed, "%v", err)
	case errors.Is(err, ErrLeaseHeld), errors.Is(err, ErrOwnerChanged):
		return protocol.NewAPIError(409, protocol.ErrCodeLeaseHeld, "%v", err)
	case errors.Is(err, ErrClosed), errors.Is(err, context.DeadlineExceeded):
		return protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "%v", err)
	}
	return protocol.NewAPIError(500, protocol.ErrCodeInternal, "%v", err)
}

// authorizeRun asks policy whether req's sender may do op on run, and
// returns the run's owner the decision was about; on a refusal it replies.
func (l *Ledger) authorizeRun(req micro.Request, o *endpointOptions, op policy.Operation, run string) (string, bool) {
	owner := l.runOwner(req, run)
	if _, e := o.authz.Authorize(req, op, nil, policy.Object{Owner: owner}); e != nil {
		l.replyError(req, e)
		return "", false
	}
	return owner, true
}

func (l *Ledger) handleLeaseOpen(req micro.Request, o *endpointOptions) {
	var r protocol.LeaseOpenRequest
	if !l.decode(req, &r) {
		return
	}
	owner, ok := l.authorizeRun(req, o, policy.OpSandboxesLease, r.Run)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	ls, err := l.OpenLeaseFor(ctx, r.Run, r.Holder, owner, time.Duration(r.TTLMS)*time.Millisecond)
	if err != nil {
		l.replyError(req, apiError(err))
		return
	}
	l.replyJSON(req, ls.Info())
}

func (l *Ledger) handleLeaseRenew(req micro.Request, o *endpointOptions) {
	var r protocol.LeaseRequest
	if !l.decode(req, &r) {
		return
	}
	owner, ok := l.authorizeRun(req, o, policy.OpSandboxesLease, r.Run)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	ls, err := l.RenewLeaseFor(ctx, r.Run, owner)
	if err != nil {
		l.replyError(req, apiError(err))
		return
	}
	l.replyJSON(req, ls.Info())
}

func (l *Ledger) handleLeaseClose(req micro.Request, o *endpointOptions) {
	var r protocol.LeaseRequest
	if !l.decode(req, &r) {
		return
	}
	owner, ok := l.authorizeRun(req, o, policy.OpSandboxesLease, r.Run)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	ls, err := l.CloseLeaseFor(ctx, r.Run, owner)
	if err != nil {
		l.replyError(req, apiError(err))
		return
	}
	l.replyJSON(req, ls.Info())
}

func (l *Ledger) handleList(req micro.Request, o *endpointOptions) {
	var r protocol.SandboxesListRequest
	if !l.decode(req, &r) {
		return
	}
	anyOwner, e := o.authz.Scope(req, policy.OpSandboxesList, policy.Node{})
	if e != nil {
		l.replyError(req, e)
		return
	}
	f := Filter{Run: r.Run, Node: r.Node, State: r.State, Provider: r.Provider}
	if !anyOwner {
		// Scope own: the caller's runs' sandboxes, and those it created.
		f.OwnedBy = caller.Owner(req)
	}
	if !l.Ready() {
		l.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "the sandbox ledger on coordinator %s is still loading", l.cfg.ID))
		return
	}
	limit := r.Limit
	if limit == 0 {
		limit = protocol.DefaultSandboxesLimit
	}
	recs, next := l.page(f, r.After, limit)
	resp := protocol.SandboxesListResponse{Sandboxes: make([]protocol.SandboxInfo, len(recs)), Next: next}
	for i, rec := range recs {
		resp.Sandboxes[i] = rec.Info()
	}
	// A page ends early, with its own cursor, where the next record would
	// take the reply over the server's max payload.
	if mp := int(l.cfg.NATS.MaxPayload()); mp > 0 {
		size := replyRoom + 64
		for i := range resp.Sandboxes {
			b, err := json.Marshal(&resp.Sandboxes[i])
			if err != nil {
				break // replyJSON reports it
			}
			key := recs[i].Key().kvKey()
			if size += len(b) + 1; i > 0 && size+2*len(key) > mp {
				resp.Sandboxes, resp.Next = resp.Sandboxes[:i], recs[i-1].Key().kvKey()
				break
			}
		}
	}
	l.replyJSON(req, resp)
}

func (l *Ledger) handleRegister(req micro.Request, o *endpointOptions) {
	var r protocol.SandboxRegisterRequest
	if !l.decode(req, &r) {
		return
	}
	node := policy.Node{ID: r.Node}
	if o.labels != nil {
		node.Labels = o.labels(r.Node)
	}
	owner := l.runOwner(req, r.Run)
	// The rate budget and the caller's own right first (Authorize), so
	// that a refused caller is refused the same whether the sandbox is
	// recorded or not.
	if _, e := o.authz.Authorize(req, policy.OpSandboxesRegister, []policy.Node{node}, policy.Object{Owner: owner}); e != nil {
		l.replyError(req, e)
		return
	}
	// A recorded sandbox that belongs to someone else stays theirs unless
	// policy grants the caller others' runs.
	if cur, ok := l.Get(Key{r.Provider, r.Node, r.ID}); ok {
		if prev := l.OwnerOf(cur); prev != "" && prev != owner {
			if _, e := o.authz.Decide(req, policy.OpSandboxesRegister, node, policy.Object{Owner: prev}); e != nil {
				l.replyError(req, e)
				return
			}
		}
	}
	knownNode := o.knownNode
	if knownNode != nil && !knownNode(r.Node) && !l.knownNode(r.Node) {
		l.replyError(req, protocol.NewAPIError(404, protocol.ErrCodeUnknownNode,
			"node %s is not connected and no coordinator has ever seen it; register a sandbox on the node whose gateway holds it", r.Node))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	rec, err := l.Register(ctx, Record{
		Provider: r.Provider, Node: r.Node, ID: r.ID, Name: r.Name, Workspace: r.Workspace,
		Run: r.Run, Owner: r.Run, TTL: time.Duration(r.TTLMS) * time.Millisecond, Labels: r.Labels,
		CreatedBy: caller.Owner(req),
	})
	if err != nil {
		l.replyError(req, apiError(err))
		return
	}
	l.replyJSON(req, rec.Info())
}

// handleReap lists every candidate for a dry run without a run, and what
// closing the run's lease would reap for a dry run with one; otherwise it
// closes the run's lease, which the active reaper (wherever it runs) acts
// on at once, and lists what goes. A run with no lease of its own and no
// records is 404, so a mistyped run id is not closed (and burnt).
func (l *Ledger) handleReap(req micro.Request, r *Reaper, o *endpointOptions) {
	var rq protocol.ReapRequest
	if !l.decode(req, &rq) {
		return
	}
	// A dry run without a run previews everyone's: that needs scope any
	// (an unknown owner).
	owner := ""
	if rq.Run != "" {
		owner = l.runOwner(req, rq.Run)
	}
	if _, e := o.authz.Authorize(req, policy.OpSandboxesReap, nil, policy.Object{Owner: owner}); e != nil {
		l.replyError(req, e)
		return
	}
	if r == nil {
		l.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s runs no reaper", l.cfg.ID))
		return
	}
	if !l.Ready() {
		l.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "the sandbox ledger on coordinator %s is still loading", l.cfg.ID))
		return
	}
	if rq.Run != "" && !l.hasLease(rq.Run) && len(l.runRecords(rq.Run)) == 0 {
		l.replyError(req, protocol.NewAPIError(404, protocol.ErrCodeNotFound, "run %s has no lease and no sandboxes", rq.Run))
		return
	}
	resp := protocol.ReapResponse{DryRun: rq.DryRun, Candidates: []protocol.ReapCandidate{}}
	plan := r.PlanRun
	if rq.DryRun {
		plan = r.PlanReap
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		defer cancel()
		if _, err := l.CloseLeaseFor(ctx, rq.Run, owner); err != nil {
			l.replyError(req, apiError(err))
			return
		}
		resp.Queued = true
	}
	mp := int(l.cfg.NATS.MaxPayload())
	size := replyRoom + 64
	cands := plan(rq.Run)
	for i, c := range cands {
		rc := protocol.ReapCandidate{Sandbox: c.Record.Info(), Reason: c.Reason, Blocked: c.Blocked}
		if mp > 0 {
			b, _ := json.Marshal(&rc)
			if size += len(b) + 1; size > mp {
				resp.Omitted = len(cands) - i
				break
			}
		}
		resp.Candidates = append(resp.Candidates, rc)
	}
	l.replyJSON(req, resp)
}
