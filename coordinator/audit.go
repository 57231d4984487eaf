package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Audit. With Config.Audit set, every request the micro service serves is
// one audit event (coordinator/audit), recorded when its outcome is known:
//
//   - a request answered at once (nodes, cancel, job.*, the ledger's
//     endpoints, an invalid or refused exec or stream) when the guard's
//     wrapper (auditReq) sees its first reply;
//   - an exec job when it ended (job.recordAudit): command digest, nodes,
//     exit code or counts, bytes;
//   - a stream relay when it ended (relay.recordAudit): kind, node, path
//     or target, bytes both ways, the agent's exit status when it sent one,
//     a copy's outcome from the receiver's FrameCopyDone and the sender's
//     FrameCopySkip frames (ok, or failed copy_partial);
//   - what a node's local policy refused (the agent's CodeForbidden, on a
//     job's every node or a stream) is refused, reason local_policy;
//   - a policy refusal is the request's event too: Authorizer.Observe
//     (observeDecision) keeps the first refusal on the request, and the
//     error reply that follows is recorded as refused, with the policy's
//     reason, operation, node and object and the reply's message (which
//     names every node refused). A refusal that does not refuse the
//     request (a listing that hides what the caller may not see) leaves
//     no trace. A decision about a caller that is not a NATS request (a
//     facade call) is recorded when it refuses; the facades record their
//     other calls themselves (AuditLog, their Config.Audit).
//
// A NATS request's Source is the client's IP the NATS server stamped in
// Nats-Request-Info (natsauth.RequestHost: the server overwrites that
// header on every request crossing the clients' import, and only
// coordinators publish inside TETHER); never an address from the body. A
// facade's refusal carries the TCP peer its DecideAs was given.

// endpointOps maps request subjects to the operation they are audited
// under: a policy operation, or one of protocol.AuditOtherOperations for
// a request none covers (the CLI's tether audit --operation accepts just
// these names). Every endpoint the coordinator serves has an entry
// (TestAuditEndpointOperations).
var endpointOps = map[string]string{
	protocol.SubjectExec:              policy.OpExec.String(),
	protocol.SubjectExecOnce:          policy.OpExec.String(),
	protocol.SubjectNodes:             policy.OpNodesList.String(),
	protocol.SubjectCancel:            policy.OpJobCancel.String(),
	protocol.SubjectStream:            protocol.AuditOpStream, // refined by the kind (relayOp)
	protocol.SubjectExecAlive:         protocol.AuditOpExecAlive,
	protocol.SubjectJobStatus:         policy.OpJobStatus.String(),
	protocol.SubjectJobOutput:         policy.OpJobLogs.String(),
	protocol.SubjectJobCancel:         policy.OpJobCancel.String(),
	protocol.SubjectJobGet:            policy.OpJobStatus.String(),
	protocol.SubjectJobList:           policy.OpJobStatus.String(),
	protocol.SubjectLeaseOpen:         policy.OpSandboxesLease.String(),
	protocol.SubjectLeaseRenew:        policy.OpSandboxesLease.String(),
	protocol.SubjectLeaseClose:        policy.OpSandboxesLease.String(),
	protocol.SubjectSandboxesList:     policy.OpSandboxesList.String(),
	protocol.SubjectSandboxesRegister: policy.OpSandboxesRegister.String(),
	protocol.SubjectSandboxesReap:     policy.OpSandboxesReap.String(),
	protocol.SubjectSandboxesSync:     policy.OpAdmin.String(),
	protocol.SubjectAuditQuery:        policy.OpAdmin.String(),
	protocol.SubjectTokensCreate:      policy.OpAdmin.String(),
	protocol.SubjectNodesRevoke:       policy.OpAdmin.String(),
	protocol.SubjectSSHInfo:           policy.OpNodesList.String(),
}

// auditReq is a request whose outcome is audited: the first reply through
// it records the event, unless a job or relay took the event over
// (takeOver) or a refusal was recorded already.
type auditReq struct {
	micro.Request
	c        *Coordinator
	endpoint string
	start    time.Time

	mu      sync.Mutex
	done    bool             // the event was recorded or taken over
	refusal *caller.Decision // the first refusal observeDecision saw
	// identity and outer are set by the guard once the sender is known:
	// the wrapper sits inside the caller.Request (outer), which keeps the
	// rules that allowed the request.
	identity *policy.Identity
	outer    *caller.Request
}

func (a *auditReq) Respond(data []byte, opts ...micro.RespondOpt) error {
	a.finish(0, "", "")
	return a.Request.Respond(data, opts...)
}

func (a *auditReq) RespondJSON(v any, opts ...micro.RespondOpt) error {
	a.finish(0, "", "")
	return a.Request.RespondJSON(v, opts...)
}

func (a *auditReq) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	status, _ := strconv.Atoi(code)
	var e protocol.APIError
	json.Unmarshal(data, &e)
	a.finish(status, e.Code, description)
	return a.Request.Error(code, description, data, opts...)
}

// takeOver hands the request's event to a job or relay; it reports false
// when the event was recorded already.
func (a *auditReq) takeOver() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done {
		return false
	}
	a.done = true
	return true
}

// finish records the event of a request answered with status (0: a
// successful reply), code and message.
func (a *auditReq) finish(status int, code, msg string) {
	a.mu.Lock()
	if a.done {
		a.mu.Unlock()
		return
	}
	a.done = true
	ref := a.refusal
	a.mu.Unlock()
	ev := a.event()
	var body struct {
		Node   string          `json:"node"`
		ID     string          `json:"id"`
		Run    string          `json:"run"`
		Target protocol.Target `json:"target"`
		Kind   string          `json:"kind"`
		Params json.RawMessage `json:"params"`
	}
	json.Unmarshal(a.Data(), &body) // best effort: the request may be invalid
	if body.Node != "" {
		ev.Nodes = []string{protocol.ClipUTF8(body.Node, protocol.MaxNodeIDLen)}
	}
	if body.Target.Node != "" {
		ev.Nodes = []string{protocol.ClipUTF8(body.Target.Node, protocol.MaxNodeIDLen)}
	} else if body.Target.Selector != "" || body.Target.All {
		ev.Target = protocol.ClipUTF8(body.Target.String(), protocol.MaxAuditErrorLen)
	}
	ev.JobID = protocol.ClipUTF8(body.ID, protocol.MaxJobIDLen)
	ev.Run = protocol.ClipUTF8(body.Run, protocol.MaxRunIDLen)
	if a.Subject() == protocol.SubjectStream {
		if k, ok := relayKinds[body.Kind]; ok {
			ev.Operation = relayOp(k, body.Params)
		}
	}
	ev.Result = protocol.AuditOK
	if status != 0 {
		ev.Result, ev.Status, ev.ErrorCode = protocol.AuditError, status, code
		policyRefused := ref != nil && ref.Err.Status == status && ref.Err.Code == code
		if status == 401 || status == 403 || status == 429 || policyRefused {
			// Refusals: the message names who, what and the rule missing.
			ev.Result, ev.Error = protocol.AuditRefused, protocol.ClipUTF8(msg, protocol.MaxAuditErrorLen)
			if status == 401 {
				ev.Reason = protocol.ErrCodeUnauthenticated
			}
		}
		if policyRefused {
			withRefusal(ev, ref)
		}
	}
	a.c.cfg.Audit.Record(ev)
}

// withRefusal adds what policy refused to ev: the operation decided, the
// reason, the node and object (unless the request named them already).
func withRefusal(ev *protocol.AuditEvent, d *caller.Decision) {
	ev.Operation = d.Op.String()
	switch {
	case d.Refusal != nil:
		ev.Reason = d.Refusal.Reason.String()
	case !d.Identified:
		ev.Reason = protocol.ErrCodeUnauthenticated
	}
	if d.Node.ID != "" && len(ev.Nodes) == 0 {
		ev.Nodes = []string{d.Node.ID}
	}
	if d.Object.Path != "" {
		ev.Paths = []string{protocol.AuditPath(d.Object.Path)}
	}
	if d.Object.Target != "" {
		ev.Target = protocol.ClipUTF8(d.Object.Target, protocol.MaxAuditProgramLen)
	}
}

// event starts the request's event: who, what, when, how long so far.
func (a *auditReq) event() *protocol.AuditEvent {
	ev := &protocol.AuditEvent{
		Operation:  a.endpoint,
		Subject:    a.Subject(),
		Source:     natsauth.RequestHost(nats.Header(a.Headers())), // what the server stamped
		DurationMS: float64(time.Since(a.start)) / float64(time.Millisecond),
	}
	if op, ok := endpointOps[a.Subject()]; ok {
		ev.Operation = op
	}
	a.mu.Lock()
	id, outer := a.identity, a.outer
	a.mu.Unlock()
	if id != nil {
		ev.Identity, ev.IdentityKey, ev.Account = id.String(), id.Key, id.Account
	}
	if outer != nil {
		ev.Rule = strings.Join(caller.Rules(outer), "; ")
	}
	return ev
}

// auditOf returns the audit wrapper inside req, nil when the coordinator
// audits nothing.
func auditOf(req micro.Request) *auditReq {
	if r, ok := req.(*caller.Request); ok {
		req = r.Request
	}
	a, _ := req.(*auditReq)
	return a
}

// withAudit wraps req for the audit log when the coordinator keeps one.
func (c *Coordinator) withAudit(req micro.Request, endpoint string) micro.Request {
	if c.cfg.Audit == nil {
		return req
	}
	return &auditReq{Request: req, c: c, endpoint: endpoint, start: time.Now()}
}

// observeDecision is Authorizer.Observe. A refusal of a NATS request is
// kept on it for its event (auditReq.finish); one of another caller (a
// facade call: no request) is recorded at once.
func (c *Coordinator) observeDecision(d caller.Decision) {
	if d.Err == nil || c.cfg.Audit == nil {
		return
	}
	if a := auditOf(d.Request); a != nil {
		// A copy made here, on the refusal path only: taking d's address
		// would move every decision to the heap, allowed ones too.
		r := d
		a.mu.Lock()
		if a.refusal == nil {
			a.refusal = &r
		}
		a.mu.Unlock()
		return
	}
	if d.Request != nil {
		return // a request the guard did not wrap: not one of ours
	}
	ev := &protocol.AuditEvent{Result: protocol.AuditRefused, Status: d.Err.Status, ErrorCode: d.Err.Code,
		Error: protocol.ClipUTF8(d.Err.Message, protocol.MaxAuditErrorLen), Source: d.Source}
	if d.Identified {
		ev.Identity, ev.IdentityKey, ev.Account = d.Identity.String(), d.Identity.Key, d.Identity.Account
	}
	withRefusal(ev, &d)
	c.cfg.Audit.Record(ev)
}

// authorizer is the policy's Authorizer, observed for the audit log.
func (c *Coordinator) authorizer() caller.Authorizer {
	return caller.Authorizer{Policy: c.cfg.Policy, Observe: c.observeDecision}
}

// relayOp is the policy operation of a relayed stream of kind with params.
func relayOp(kind protocol.Kind, params json.RawMessage) string {
	switch kind {
	case protocol.KindExec:
		return policy.OpExec.String()
	case protocol.KindPTY:
		return policy.OpShell.String()
	case protocol.KindDial:
		return policy.OpForward.String()
	case protocol.KindSSH:
		return policy.OpSSH.String()
	case protocol.KindCopy:
		var p struct {
			Direction string `json:"direction"`
		}
		json.Unmarshal(params, &p)
		if p.Direction == protocol.CopyPull {
			return policy.OpCopyRead.String()
		}
		return policy.OpCopyWrite.String()
	}
	return protocol.AuditOpStream
}

// recordAudit records the event of an exec job that ran (or whose
// goroutine panicked: res nil).
func (j *job) recordAudit() {
	if j.audit == nil {
		return
	}
	ev := j.audit.event()
	ev.JobID = j.id
	ev.Nodes = j.targets
	if len(ev.Nodes) > protocol.MaxAuditNodes {
		ev.Nodes, ev.NodesTotal = ev.Nodes[:protocol.MaxAuditNodes], len(ev.Nodes)
	}
	ev.Target = j.target
	ev.Command = protocol.AuditExecCommand(&j.params)
	ev.RunAs = j.runAs()
	ev.BytesIn = int64(len(j.stdin))
	res := j.res
	switch {
	case res == nil:
		ev.Result, ev.Status, ev.ErrorCode = protocol.AuditError, 500, protocol.ErrCodeInternal
	case res.Failed == 0:
		ev.Result = protocol.AuditOK
	default:
		ev.Result = protocol.AuditFailed
	}
	if res != nil {
		ev.NodesOK, ev.NodesFailed = res.Succeeded, res.Failed
		if refusal, all := localRefusals(j.results); all {
			// Every node's local policy refused: nothing ran.
			localRefusal(ev, refusal)
		}
		for i := range j.results {
			r := &j.results[i]
			ev.BytesOut += r.StdoutBytes + r.StderrBytes
		}
		if len(j.results) == 1 {
			r := &j.results[0]
			if r.Error == "" || r.ExitCode >= 0 {
				code := r.ExitCode
				ev.ExitCode = &code
			}
			ev.ErrorCode = r.ErrorCode
		}
	}
	var rev *revokedError
	if errors.As(context.Cause(j.ctx), &rev) {
		// Cancelled by RecheckCallers: it ran, until its caller lost
		// the right.
		ev.Result, ev.Reason, ev.ErrorCode = protocol.AuditFailed, protocol.AuditReasonRevoked, protocol.ResultCodeRevoked
		ev.Error = protocol.ClipUTF8(rev.Error(), protocol.MaxAuditErrorLen)
	}
	j.c.cfg.Audit.Record(ev)
}

// runAs is the job's AuditEvent.RunAs: the user its nodes ran as (the
// policy grants', j.users), or, when they differ, each of them sorted and
// once, joined by ", ", with "-" for a node that ran as the agent's own
// account (no run_as).
func (j *job) runAs() string {
	var users []string
	for _, id := range j.targets {
		users = append(users, j.users[id])
	}
	slices.Sort(users)
	users = slices.Compact(users)
	if len(users) == 1 {
		return users[0]
	}
	for i, u := range users {
		if u == "" {
			users[i] = "-"
		}
	}
	slices.Sort(users)
	return protocol.ClipUTF8(strings.Join(users, ", "), protocol.MaxAuditProgramLen)
}

// localRefusal makes ev a refusal by a node's local policy (the agent's
// CodeForbidden), with msg, the agent's message (which names the node, the
// policy file and the rule missing), as its Error.
func localRefusal(ev *protocol.AuditEvent, msg string) {
	ev.Result, ev.ErrorCode, ev.Reason = protocol.AuditRefused, protocol.CodeForbidden, protocol.AuditReasonLocalPolicy
	ev.Error = protocol.ClipUTF8(msg, protocol.MaxAuditErrorLen)
}

// localRefusals reports whether every one of results (at least one) is a
// refusal by the node's local policy, and returns the first one's message
// (with how many nodes refused, when more than one did).
func localRefusals(results []protocol.NodeResult) (string, bool) {
	if len(results) == 0 {
		return "", false
	}
	for i := range results {
		if results[i].ErrorCode != protocol.CodeForbidden {
			return "", false
		}
	}
	msg := results[0].Error
	if len(results) > 1 {
		msg = strconv.Itoa(len(results)) + " nodes refused by their local policy; the first: " + msg
	}
	return msg, true
}

// recordAudit records the event of a relay that started (its open may
// still have failed: the error reply then recorded the event already).
func (r *relay) recordAudit() {
	a := auditOf(r.req)
	if a == nil || !a.takeOver() {
		return
	}
	ev := a.event()
	ev.Operation = relayOp(r.kind, r.params)
	ev.Nodes = []string{r.n.id}
	ev.BytesIn, ev.BytesOut = r.bytesIn.Load(), r.bytesOut.Load()
	switch r.kind {
	case protocol.KindExec:
		var p protocol.ExecParams
		if json.Unmarshal(r.params, &p) == nil {
			ev.Command, ev.RunAs = protocol.AuditExecCommand(&p), p.User
		}
	case protocol.KindPTY:
		var p protocol.PTYParams
		if json.Unmarshal(r.params, &p) == nil {
			ev.Command, ev.RunAs = protocol.AuditPTYCommand(&p), p.User
		}
	case protocol.KindCopy:
		var p protocol.CopyParams
		if json.Unmarshal(r.params, &p) == nil {
			ev.Paths, ev.RunAs = []string{protocol.AuditPath(p.Path)}, p.User
		}
	case protocol.KindDial:
		var p protocol.DialParams
		json.Unmarshal(r.params, &p)
		ev.Target = protocol.ClipUTF8(p.Target, protocol.MaxAuditProgramLen)
	case protocol.KindSSH:
		// The connection; each of its channels is an event of its own,
		// reported by the agent (ssh.go).
		var p protocol.SSHParams
		json.Unmarshal(r.params, &p)
		ev.Method, ev.Session = "connect", p.Session
		ev.RunAs = protocol.ClipUTF8(strings.Join(p.Logins, ", "), protocol.MaxAuditProgramLen)
	}
	// The agent's last word decides (a copy's: the receiver's, which may
	// be the client; a dial's or ssh stream's first frame, its refusal);
	// without one (a dial that connected), how the pipe ended. A client
	// closing its end after the exit frame or the copy's FrameCopyDone is
	// done, not failed, and so is a raw stream's client closing its end
	// (clientEnded: that is how ssh-proxy and forward end).
	var pe *panics.Error
	switch es, ei, err := r.exit, r.agentErr, r.endErr; {
	case r.revoked.Load() != nil:
		// Aborted by RecheckCallers: it ran, until its caller lost the
		// right to it.
		ev.Result, ev.Reason, ev.ErrorCode = protocol.AuditFailed, protocol.AuditReasonRevoked, protocol.ErrCodeForbidden
		ev.Error = protocol.ClipUTF8(*r.revoked.Load(), protocol.MaxAuditErrorLen)
	case errors.As(err, &pe):
		ev.Result, ev.Status, ev.ErrorCode = protocol.AuditError, 500, protocol.ErrCodeInternal
	case r.copyDone.Load():
		ev.Result = protocol.AuditOK
		if r.copySkips.Load() > 0 {
			ev.Result, ev.ErrorCode = protocol.AuditFailed, protocol.ErrCodeCopyPartial
		}
	case es != nil:
		code := es.ExitCode
		ev.ExitCode = &code
		ev.Result = protocol.AuditOK
		if code != 0 || es.Cancelled || es.TimedOut {
			ev.Result = protocol.AuditFailed
		}
	case ei != nil && ei.Code == protocol.CodeForbidden:
		localRefusal(ev, ei.Message)
	case ei != nil:
		ev.Result, ev.ErrorCode = protocol.AuditFailed, ei.Code
	case err != nil && !r.clientEnded():
		ev.Result = protocol.AuditFailed
	default:
		ev.Result = protocol.AuditOK
	}
	r.c.cfg.Audit.Record(ev)
}

// handleAuditQuery serves SubjectAuditQuery for admins: one page of the
// audit log, bounded by the server's max payload. The read runs in a
// goroutine counted with the jobs, at most maxAuditQueries at once.
func (c *Coordinator) handleAuditQuery(req micro.Request) {
	if c.cfg.Audit == nil {
		c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s keeps no audit log", c.cfg.ID))
		return
	}
	var q protocol.AuditQueryRequest
	if !c.decodeValid(req, &q) {
		return
	}
	if _, e := c.authorizer().Authorize(req, policy.OpAdmin, nil, policy.Object{}); e != nil { // the rate budget, then the decision
		c.replyError(req, e)
		return
	}
	if a := auditOf(req); a != nil && q.Cursor > 0 {
		// A page that continues a read (paging, or tether audit -f
		// polling every second) is the read its first page recorded.
		a.takeOver()
	}
	c.mu.Lock()
	if c.closing || c.life == nil {
		c.mu.Unlock()
		c.replyError(req, c.unavailable())
		return
	}
	if c.auditQueries >= maxAuditQueries {
		c.mu.Unlock()
		c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s is answering %d audit queries; try again", c.cfg.ID, maxAuditQueries))
		return
	}
	c.auditQueries++
	life := c.life
	c.jobWG.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.jobWG.Done()
		defer func() {
			c.mu.Lock()
			c.auditQueries--
			c.mu.Unlock()
		}()
		defer c.guard.Recover("audit query", func(e *panics.Error) { c.replyError(req, c.internalError(e)) })
		ctx, cancel := context.WithTimeout(life, jobAnswerTimeout)
		defer cancel()
		resp, err := c.cfg.Audit.Query(ctx, q, int(c.cfg.NATS.MaxPayload())-replyHeaderRoom)
		if err != nil {
			var e *protocol.APIError
			if !errors.As(err, &e) {
				e = protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s: %v", c.cfg.ID, err)
			}
			c.replyError(req, e)
			return
		}
		c.replyJSON(req, resp, strconv.Itoa(len(resp.Events))+" audit events", "ask for fewer with a smaller limit")
	}()
}

// maxAuditQueries bounds the audit queries read at once.
const maxAuditQueries = 4
