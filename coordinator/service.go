package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// semver is the version syntax micro accepts (semver.org's suggested
// expression, without build metadata subtleties we never produce). It is
// compiled on first use, not at start-up: every run of the tether binary
// (a one-shot `tether exec` too) would pay for it otherwise.
var semver = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$`)
})

// serviceVersion returns v if micro accepts it, else "0.1.0".
func serviceVersion(v string) string {
	if semver().MatchString(v) {
		return v
	}
	return "0.1.0"
}

// startService registers the micro service "tether" and its endpoints.
// micro runs each endpoint's handler on one goroutine of the NATS
// connection, one request at a time, so handlers only validate and then
// hand long work to goroutines the coordinator owns.
func (c *Coordinator) startService() (micro.Service, error) {
	svc, err := micro.AddService(c.cfg.NATS, micro.Config{
		Name:        protocol.ServiceName,
		Version:     serviceVersion(c.cfg.Version),
		Description: protocol.ServiceDescription,
		Metadata: map[string]string{
			"coordinator_id": c.cfg.ID,
			"version":        c.cfg.Version,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator: add micro service %q: %w", protocol.ServiceName, err)
	}
	endpoints := []struct {
		name, subject string
		h             micro.HandlerFunc
	}{
		{"exec", protocol.SubjectExec, c.handleExec},
		{"exec-once", protocol.SubjectExecOnce, c.handleExecOnce}, // execonce.go
		{"exec-alive", protocol.SubjectExecAlive, c.handleExecAlive},
		{"nodes", protocol.SubjectNodes, c.handleNodes},
		{"cancel", protocol.SubjectCancel, c.handleCancel},
		{"stream", protocol.SubjectStream, c.handleStream},
		{"job-status", protocol.SubjectJobStatus, c.jobOpHandler(protocol.JobOpStatus)},
		{"job-output", protocol.SubjectJobOutput, c.handleJobOutput},
		{"job-cancel", protocol.SubjectJobCancel, c.jobOpHandler(protocol.JobOpCancel)},
		{"audit-query", protocol.SubjectAuditQuery, c.handleAuditQuery},
		{"tokens-create", protocol.SubjectTokensCreate, c.handleTokenCreate},
		{"nodes-revoke", protocol.SubjectNodesRevoke, c.handleNodeRevoke},
		{"ssh-info", protocol.SubjectSSHInfo, c.handleSSHInfo},
		{"job-get", protocol.SubjectJobGet, c.handleJobGet},    // durable.go
		{"job-list", protocol.SubjectJobList, c.handleJobList}, // durable.go
	}
	for _, e := range endpoints {
		if err := svc.AddEndpoint(e.name, c.guardHandler(e.name, e.h), micro.WithEndpointSubject(e.subject)); err != nil {
			svc.Stop()
			return nil, fmt.Errorf("coordinator: add endpoint %s on %s: %w", e.name, e.subject, err)
		}
	}
	if c.cfg.Endpoints != nil {
		if err := c.cfg.Endpoints(guardedService{svc, c}); err != nil {
			svc.Stop()
			return nil, fmt.Errorf("coordinator: add endpoints: %w", err)
		}
	}
	return svc, nil
}

// unanswered returns req as it is when it has a reply subject. A request
// published without one (what the Go client does with the cancel it sends
// when its context ends: it does not wait for an answer) is still served,
// but its answers go nowhere: Respond, RespondJSON and Error do nothing and
// succeed, where micro would fail them (nats.ErrMsgNoReply) and the reply
// helpers would warn about every such request.
func unanswered(req micro.Request) micro.Request {
	if req.Reply() != "" {
		return req
	}
	return noReply{req}
}

// noReply is a request without a reply subject (see unanswered).
type noReply struct{ micro.Request }

func (noReply) Respond([]byte, ...micro.RespondOpt) error               { return nil }
func (noReply) RespondJSON(any, ...micro.RespondOpt) error              { return nil }
func (noReply) Error(string, string, []byte, ...micro.RespondOpt) error { return nil }

// replyError sends e as a micro error: the status as the error code header,
// the message as the description and e as the JSON body.
func (c *Coordinator) replyError(req micro.Request, e *protocol.APIError) {
	body, _ := json.Marshal(e)
	if err := req.Error(strconv.Itoa(e.Status), e.Message, body); err != nil {
		c.log.Warn("send error reply", "subject", req.Subject(), "code", e.Code, "err", err)
	}
}

// replyJSON sends v as the JSON reply, or a 413 too_large error if it does
// not fit the NATS server's max payload (what, e.g. "3 nodes", and hint say
// what was too large and what to do instead).
func (c *Coordinator) replyJSON(req micro.Request, v any, what, hint string) {
	body, err := json.Marshal(v)
	if err != nil { // cannot happen: plain data
		c.replyError(req, protocol.NewAPIError(500, protocol.ErrCodeInternal, "encode reply: %v", err))
		return
	}
	if mp := int(c.cfg.NATS.MaxPayload()); mp > 0 && len(body)+replyHeaderRoom > mp {
		c.log.Warn("reply too large to publish; replying with an error", "subject", req.Subject(), "bytes", len(body), "max_payload", mp)
		c.replyError(req, protocol.NewAPIError(413, protocol.ErrCodeTooLarge,
			"reply with %s is %d bytes, over the server's max payload %d; %s", what, len(body), mp, hint))
		return
	}
	if err := req.Respond(body); err != nil {
		c.log.Warn("send reply", "subject", req.Subject(), "err", err)
	}
}

func (c *Coordinator) unavailable() *protocol.APIError {
	return protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s is shutting down", c.cfg.ID)
}

// handleExec validates an exec request and starts its job. Everything that
// can make the request invalid is checked here, before anything runs.
func (c *Coordinator) handleExec(req micro.Request) {
	if req.Reply() == "" {
		c.log.Debug("exec request without a reply subject ignored")
		return
	}
	dropCoordinatorHeaders(req)
	r, apiErr := protocol.DecodeExecRequest(req.Data())
	if apiErr != nil {
		c.refuseInvalid(req, apiErr)
		return
	}
	if r.Target.Node != "" && c.forwardForNode(req, r.Target.Node, "exec") {
		return
	}
	targets, apiErr := c.resolve(r.Target, !isForwarded(req))
	if apiErr != nil {
		c.replyError(req, apiErr)
		return
	}
	// Every node must be allowed, or nothing runs; each runs as the user
	// its grant names, whatever the request's params said.
	grants, apiErr := c.authorizer().Authorize(req, policy.OpExec, policyNodes(targets), policy.Object{})
	if apiErr != nil {
		c.replyError(req, apiErr)
		return
	}
	users := make(map[string]string, len(targets))
	for i, n := range targets {
		users[n.id] = grants[i].RunAs
	}
	bound := onceBoundOf(req) // exec.once's (execonce.go), checked once authorized
	if apiErr := checkOnce(r, bound); apiErr != nil {
		c.replyError(req, apiErr)
		return
	}
	// A fan-out's node run forwarded here holds one of the caller's jobs
	// on the coordinator that runs the fan-out already.
	release := func() {}
	fanoutRun := req.Headers().Get(headerFanoutRun) != "" && isForwarded(req)
	if !fanoutRun {
		release, apiErr = c.authorizer().Acquire(req, policy.OpExec)
		if apiErr != nil {
			c.replyError(req, apiErr)
			return
		}
	}
	started := false
	defer func() {
		if !started {
			release()
		}
	}()
	id := r.ID
	if id == "" {
		id = rand.Text()
	}
	maxParallel := r.MaxParallel
	if maxParallel == 0 {
		maxParallel = c.cfg.MaxParallel
	}
	ids := make([]string, len(targets))
	for i, n := range targets {
		ids[i] = n.id
	}
	r.ID = id
	owner, ownerKnown := caller.Of(req)
	j := &job{
		request:     req.Data(),
		header:      nats.Header(req.Headers()),
		owner:       owner,
		ownerKnown:  ownerKnown,
		c:           c,
		id:          id,
		reply:       req.Reply(),
		targets:     ids,
		params:      r.Params(c.Limits().DefaultTimeout),
		users:       users,
		stdin:       r.Stdin,
		maxParallel: maxParallel,

		idempotent:     r.Idempotent,
		idempotencyKey: r.IdempotencyKey,
	}
	if rr := rerunOf(req); rr != nil {
		j.attempt, j.rerunOf = rr.attempt, rr.of
	}
	j.fanoutPart = fanoutPartOf(req, r.ID, r.Detach)
	j.key = runKeyOf(id, ids, fanoutRun)
	if ownerKnown && !r.Detach && j.header.Get(protocol.HeaderHeartbeats) == "1" && j.header.Get(headerFanoutRun) == "" {
		// Its client promised heartbeats: watched from the start, as
		// if the first one had come (jobs.go, "Liveness"), so that one
		// dying before the first keepalive does not leave the job
		// running to its timeout. A fan-out's run here gets no client
		// heartbeats (its coordinator reads them).
		j.heard.Store(true)
		j.alive.Store(true)
	}
	if r.Target.Node == "" {
		j.target = r.Target.String()
	}

	c.mu.Lock()
	if c.closing || c.life == nil {
		c.mu.Unlock()
		c.replyError(req, c.unavailable())
		return
	}
	if c.jobs.len() >= c.cfg.MaxJobs {
		c.mu.Unlock()
		c.log.Warn("exec request refused: too many jobs in flight", "max_jobs", c.cfg.MaxJobs)
		c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s has %d jobs in flight", c.cfg.ID, c.cfg.MaxJobs))
		return
	}
	if old := c.jobs.get(j.key); old != nil {
		c.mu.Unlock()
		if old.ownerString() != j.ownerString() {
			// Another caller's: refused as the job store refuses it
			// (durable.go), telling nothing of that job.
			c.replyError(req, errIDInUse(id))
			return
		}
		c.replyError(req, protocol.NewAPIError(409, protocol.ErrCodeDuplicateJob, "job %s is already running", protocol.Clip(id)))
		return
	}
	j.ctx, j.cancel = context.WithCancelCause(c.life)
	stopBound := func() bool { return false }
	if bound > 0 {
		stopBound = time.AfterFunc(bound, func() { j.cancel(&onceBoundError{bound: bound}) }).Stop
	}
	c.jobs.add(j.key, j)
	if c.fl != nil {
		// Cancels and heartbeats landing on other coordinators come here.
		if s, err := c.cfg.NATS.ChanSubscribe(RunSubjectPrefix+subjectPart(id)+".*", c.fl.in); err != nil {
			c.log.Warn("subscribe to job subjects", "job_id", id, "err", err)
		} else {
			j.sub = s
		}
	}
	c.jobWG.Add(1)
	c.mu.Unlock()
	if a := auditOf(req); a != nil && a.takeOver() {
		j.audit = a
	}

	j.release = release
	// The job's record is on its way before its goroutine starts
	// (durable.go); the job waits for it before anything runs.
	j.startAccept()
	started = true
	go func() {
		defer c.jobWG.Done()
		defer stopBound()
		defer release()
		defer j.recordAudit() // after a contained panic too
		defer c.guard.Recover("exec job", func(e *panics.Error) { j.publishError(c.internalError(e)) })
		j.run()
	}()
}

// refuseInvalid answers an exec request that failed validation (bad,
// 400 or 413). The caller's exec grant is checked first as far as the
// request still names its nodes: its target alone is read and, when it is
// a valid node, selector or all that resolves here, authorized (a node
// another coordinator holds: the request is forwarded there, which does
// the same), so a caller who may not exec there hears 401/403, not what is
// wrong with a job it could never run. A request whose target cannot be
// read (not JSON, no target, a malformed or ambiguous one, or one that
// matches no node) names no node to decide on, and policy decides per
// node: it stays bad.
func (c *Coordinator) refuseInvalid(req micro.Request, bad *protocol.APIError) {
	var only struct {
		Target protocol.Target `json:"target"`
	}
	if json.Unmarshal(req.Data(), &only) == nil && validTarget(only.Target) {
		t := only.Target
		if t.Node != "" && c.forwardForNode(req, t.Node, "exec") {
			return
		}
		if targets, e := c.resolve(t, !isForwarded(req)); e == nil {
			if _, e := c.authorizer().Authorize(req, policy.OpExec, policyNodes(targets), policy.Object{}); e != nil {
				c.replyError(req, e)
				return
			}
		}
	}
	c.replyError(req, bad)
}

// validTarget reports whether t names exactly one of a valid node id, a
// selector that parses, or all.
func validTarget(t protocol.Target) bool {
	n := 0
	if t.Node != "" {
		if protocol.ValidNodeID(t.Node) != nil {
			return false
		}
		n++
	}
	if t.Selector != "" {
		if _, err := protocol.ParseSelector(t.Selector); err != nil {
			return false
		}
		n++
	}
	if t.All {
		n++
	}
	return n == 1
}

// resolve turns a validated target into registered nodes, sorted by id.
// With fleet, a selector or all also takes the nodes other coordinators
// hold (per the fleet registry) as stand-ins (remoteNode), whose runs are
// forwarded to their owners.
func (c *Coordinator) resolve(t protocol.Target, fleet bool) ([]*node, *protocol.APIError) {
	where := "connected to coordinator " + c.cfg.ID
	if fleet && c.fl != nil {
		where = "in the fleet"
	}
	switch {
	case t.Node != "":
		c.mu.Lock()
		n, ok := c.nodes[t.Node]
		c.mu.Unlock()
		if !ok {
			// A node the fleet knows, with no other holder to forward
			// to: this coordinator's view of the registry lags (just
			// back from a partition or a NATS reconnect) or the node is
			// between coordinators: 503, the caller should retry.
			return nil, c.notConnected(t.Node)
		}
		return []*node{n}, nil
	case t.Selector != "":
		sel, err := protocol.ParseSelector(t.Selector)
		if err != nil { // Validate parsed it already
			return nil, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "target: %v", err)
		}
		ns := c.fleetNodes(sel, fleet)
		if len(ns) == 0 {
			return nil, protocol.NewAPIError(404, protocol.ErrCodeNoMatch, "selector %s matches no node %s", protocol.Clip(t.Selector), where)
		}
		return ns, nil
	case t.All:
		ns := c.fleetNodes(protocol.Selector{}, fleet)
		if len(ns) == 0 {
			return nil, protocol.NewAPIError(404, protocol.ErrCodeNoMatch, "no node is %s", where)
		}
		return ns, nil
	}
	return nil, protocol.NewAPIError(400, protocol.ErrCodeNoTarget, "request has no target: set target.node, target.selector or target.all")
}

// fleetNodes returns the held nodes matching sel and, with fleet, the
// other coordinators' (as stand-ins), sorted by id.
func (c *Coordinator) fleetNodes(sel protocol.Selector, fleet bool) []*node {
	c.mu.Lock()
	ns := c.sortedNodesLocked(sel)
	c.mu.Unlock()
	if !fleet || c.fl == nil {
		return ns
	}
	local := make(map[string]bool, len(ns))
	for _, n := range ns {
		local[n.id] = true
	}
	c.mu.Lock()
	for id := range c.nodes {
		local[id] = true
	}
	c.mu.Unlock()
	for _, info := range c.remoteNodes(sel, local) {
		ns = append(ns, remoteNode(info))
	}
	sortNodes(ns)
	return ns
}

// sortedNodesLocked returns the registered nodes matching sel, sorted by id.
// c.mu must be held.
func (c *Coordinator) sortedNodesLocked(sel protocol.Selector) []*node {
	var ns []*node
	for _, n := range c.nodes {
		if sel.Matches(n.hello.Labels) {
			ns = append(ns, n)
		}
	}
	sortNodes(ns)
	return ns
}

// decodeValid decodes req's body strictly into v and validates it; on a
// problem it replies with the API error and returns false.
func (c *Coordinator) decodeValid(req micro.Request, v interface{ Validate() *protocol.APIError }) bool {
	e := protocol.DecodeRequest(req.Data(), v)
	if e == nil {
		e = v.Validate()
	}
	if e != nil {
		c.replyError(req, e)
		return false
	}
	return true
}

// handleNodes lists one page of the connected nodes matching the request's
// selector.
//
// With a fleet registry the list is the whole fleet's, and the live fields
// of other coordinators' nodes come from their owners (withLive): that
// wait runs in a goroutine counted with the jobs, not on micro's.
func (c *Coordinator) handleNodes(req micro.Request) {
	var r protocol.NodesRequest
	if !c.decodeValid(req, &r) {
		return
	}
	if c.fl == nil {
		c.listNodes(req, &r)
		return
	}
	c.goRequest(req, "nodes", func(context.Context) { c.listNodes(req, &r) })
}

// listNodes answers a nodes request.
func (c *Coordinator) listNodes(req micro.Request, r *protocol.NodesRequest) {
	sel, _ := protocol.ParseSelector(r.Selector) // Validate parsed it
	all := c.FleetNodes(sel)
	// A caller sees the nodes a nodes.list rule of its grants, as if the
	// others were not connected.
	pns := make([]policy.Node, len(all))
	for i, n := range all {
		pns[i] = policy.Node{ID: n.ID, Labels: n.Labels}
	}
	visible, apiErr := c.authorizer().Filter(req, policy.OpNodesList, pns, policy.Object{})
	if apiErr != nil {
		c.replyError(req, apiErr)
		return
	}
	if len(visible) < len(all) {
		seen := make([]protocol.NodeInfo, len(visible))
		for i, k := range visible {
			seen[i] = all[k]
		}
		all = seen
	}
	limit := r.Limit
	if limit == 0 {
		limit = protocol.DefaultNodesLimit
	}
	from := min(r.Offset, len(all))
	to := min(from+limit, len(all))
	c.withLive(all[from:to])
	resp := protocol.NodesResponse{Nodes: all[from:to], Total: len(all)}
	c.replyJSON(req, resp, fmt.Sprintf("%d nodes", to-from), "ask for fewer with a smaller limit")
}

// cancelNotFound is handleCancel's 404 for job id: the same whether no
// job id runs in the fleet or one runs that the caller may not cancel,
// on whichever coordinator (it names none), so that ids are no oracle.
func cancelNotFound(req micro.Request, id string) *protocol.APIError {
	who := ""
	if c, known := caller.Of(req); known {
		who = " that " + c.String() + " may cancel"
	}
	return protocol.NewAPIError(404, protocol.ErrCodeNotFound, "no job %s%s is running", protocol.Clip(id), who)
}

// handleCancel cancels a running job: each of its nodes is sent a cancel and
// reports its exit status in the job's final result.
//
// Authorization comes before the job is looked up, so that the answer
// tells a caller nothing about job ids it may not cancel: one request from
// the rate budget (429), then a caller who holds job.cancel in no rule is
// refused (403) whatever the id; for the others a job that is not running
// and a job they may not cancel (not on their nodes, another identity's
// without scope: any) get the same 404 not_found. The refusal itself is
// still decided (Decide), so the audit log and the refusal metrics keep it.
func (c *Coordinator) handleCancel(req micro.Request) {
	var r protocol.CancelRequest
	if e := protocol.DecodeRequest(req.Data(), &r); e != nil {
		c.replyError(req, e)
		return
	}
	if r.ID == "" {
		c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "id is required"))
		return
	}
	az := c.authorizer()
	if e := az.Allow(req, policy.OpJobCancel); e != nil {
		c.replyError(req, e)
		return
	}
	if e := az.Holds(req, policy.OpJobCancel); e != nil {
		c.replyError(req, e)
		return
	}
	// The job run whole here, else the node runs of another
	// coordinator's fan-out of that id (runKey), each cancelled.
	c.mu.Lock()
	js := c.jobs.parts(r.ID, "")
	if j := c.jobs.whole(r.ID); j != nil {
		js = []*job{j}
	}
	c.mu.Unlock()
	ok := len(js) > 0
	if !ok && c.fl != nil && !isForwarded(req) {
		// Another coordinator may run it: the one subscribed to its run
		// subject answers; nobody is the same 404 as here.
		c.forward(req, runSubject(r.ID, "cancel"), "(any)", "job "+protocol.Clip(r.ID), cancelNotFound(req, r.ID))
		return
	}
	for _, j := range js {
		if !ok {
			break
		}
		for _, id := range j.targets {
			if _, e := az.Decide(req, policy.OpJobCancel, c.nodeOrID(id), policy.Object{Owner: j.ownerString()}); e != nil {
				if e.Status != 403 {
					c.replyError(req, e) // 401, or 400: not about this job
					return
				}
				ok = false
				break
			}
		}
	}
	if !ok {
		c.replyError(req, cancelNotFound(req, r.ID))
		return
	}
	for _, j := range js {
		j.cancel(nil)
	}
	c.log.Info("job cancelled by request", "job_id", r.ID)
	c.replyJSON(req, protocol.CancelResponse{ID: r.ID, Cancelled: true}, "a cancel response", "raise the server's max_payload")
}
