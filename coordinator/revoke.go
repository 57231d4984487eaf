package coordinator

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Revocation of running work (RecheckCallers). Every request is decided
// once, at its start; a job or stream that runs for an hour would keep
// the right it was given for the hour. An operator who takes a caller's
// grant away (a policy reload) or its NATS credentials (tether nats user
// revoke) expects what the caller runs to end now: RecheckCallers decides
// each running attached job and open stream again and cancels those whose
// caller lost the right.

// revokeGrace bounds how long a revoked job's nodes have to report their
// exit status after the cancel (Config.CancelGrace when shorter): the
// result reaches the client, and the job ends, within it.
const revokeGrace = 2 * time.Second

// revokedError is the cause of a job cancelled by RecheckCallers: why its
// caller lost the right to run it.
type revokedError struct{ why string }

func (e *revokedError) Error() string { return "access revoked: " + e.why }

// RecheckCallers decides every running attached exec job and every open
// stream of tether.v1.stream (exec, cp, shell, forward, ssh; relayed over
// NATS or on the direct data path) again under the policy and the NATS
// credentials in force, for a caller that reloaded the policy (the
// coordinator's SIGHUP, after the policy's Apply) or applied revocations
// of NATS users (natsauth.Layout.ReloadRevocations).
//
// A job whose caller is no longer identified (its user JWT revoked or
// expired) or no longer granted exec on one of its nodes as the user it
// runs as there is cancelled whole: each node's result has error_code
// revoked (protocol.ResultCodeRevoked) and says why, its nodes get at most
// revokeGrace to report their exit, and its audit event has reason
// revoked. A stream whose caller is no longer identified or granted its
// operation on its node (with its path, target, user or, for ssh, each
// login and forward target: the agent's SSH server serves the params of
// the open for the connection's life, every session an OpenSSH
// ControlMaster multiplexes over it included) is aborted: the client
// reads a 403 "access revoked: …", and the audit its event with reason
// revoked. The log has one line for each. The jump host's own channels
// are its (sshgate.Gate.Recheck); detached jobs already started run on
// (see README). It does not block on the jobs or streams. Safe for
// concurrent use.
func (c *Coordinator) RecheckCallers() {
	c.mu.Lock()
	jobs := c.jobs.all()
	c.mu.Unlock()
	for _, j := range jobs {
		why := c.jobRevoked(j)
		if why == "" {
			continue
		}
		j.c.log.Warn("job cancelled: its caller's access was revoked", "job_id", j.id, "caller", j.ownerString(), "why", why)
		j.cancel(&revokedError{why})
	}
	for _, r := range c.relays.list() {
		why := c.streamRevoked(r)
		if why == "" || !r.revoked.CompareAndSwap(nil, &why) {
			continue
		}
		if r.ssh != nil {
			r.log.Warn("ssh stream closed: its grant was revoked", "session", r.ssh.Session, "why", why)
		} else {
			r.log.Warn("stream closed: its caller's access was revoked", "why", why)
		}
		r.abort(protocol.NewAPIError(403, protocol.ErrCodeForbidden, "access revoked: %s", why))
	}
}

// unidentified returns why Config.Identify no longer names the sender of
// the request whose headers are h (its user JWT revoked or expired since),
// or "".
func (c *Coordinator) unidentified(id policy.Identity, h nats.Header) string {
	if c.cfg.Identify == nil || h == nil {
		return ""
	}
	if _, err := c.cfg.Identify(h); err != nil {
		return fmt.Sprintf("the NATS credentials of %s are no longer accepted: %v", id, err)
	}
	return ""
}

// recheckNode returns the policy node id is decided on now: its labels
// when it is connected here or known to the fleet registry, and false
// when it is known nowhere (its run there is over, or cannot be told).
func (c *Coordinator) recheckNode(id string) (policy.Node, bool) {
	c.mu.Lock()
	n := c.nodes[id]
	c.mu.Unlock()
	if n != nil {
		return n.policyNode(), true
	}
	if owner, info := c.remoteRecord(id); owner != "" {
		return policy.Node{ID: id, Labels: info.Labels}, true
	}
	return policy.Node{}, false
}

// lostRunAs returns why the policy in force no longer grants id op on
// node as user (a run_as; "" for the agent's own account), or "".
func (c *Coordinator) lostRunAs(id policy.Identity, op policy.Operation, node policy.Node, user string) string {
	gs, err := c.cfg.Policy.Peek(id, op, node)
	if err != nil {
		return fmt.Sprintf("the policy no longer grants %s on %s: %v", op, node.ID, err)
	}
	if !slices.ContainsFunc(gs, func(g policy.Grant) bool { return g.RunAs == user }) {
		if user == "" {
			return fmt.Sprintf("the policy no longer grants %s %s on %s as the agent's own user", id, op, node.ID)
		}
		return fmt.Sprintf("the policy no longer grants %s %s on %s as user %s", id, op, node.ID, user)
	}
	return ""
}

// jobRevoked returns why the caller of running job j lost the right to
// run it (see RecheckCallers), or "". A job with no known caller (a
// coordinator without Identify) is never revoked.
func (c *Coordinator) jobRevoked(j *job) string {
	if !j.ownerKnown {
		return ""
	}
	if why := c.unidentified(j.owner, j.header); why != "" {
		return why
	}
	if c.cfg.Policy == nil {
		return ""
	}
	for _, t := range j.targets {
		node, ok := c.recheckNode(t)
		if !ok {
			continue
		}
		if why := c.lostRunAs(j.owner, policy.OpExec, node, j.users[t]); why != "" {
			return why
		}
	}
	return ""
}

// streamRevoked returns why the caller of the open stream r lost the
// right to it (see RecheckCallers), or "".
func (c *Coordinator) streamRevoked(r *relay) string {
	id, ok := caller.Of(r.req)
	if !ok {
		return ""
	}
	if why := c.unidentified(id, nats.Header(r.req.Headers())); why != "" {
		return why
	}
	if r.ssh != nil {
		return c.sshRevoked(r)
	}
	if c.cfg.Policy == nil {
		return ""
	}
	op, obj, e := streamOp(r.kind, r.params)
	if e != nil {
		return "" // not reached: such a stream is refused at its open
	}
	node := c.relayPolicyNode(r)
	if op == policy.OpExec || op == policy.OpShell {
		var p struct {
			User string `json:"user"`
		}
		json.Unmarshal(r.params, &p)
		return c.lostRunAs(id, op, node, p.User)
	}
	if _, err := c.cfg.Policy.Policy().Decide(id, op, node, obj); err != nil {
		return fmt.Sprintf("the policy no longer grants %s on %s: %v", op, node.ID, err)
	}
	return ""
}

// relayPolicyNode is the node of relay r as a recheck judges it: with its
// labels now while it is still connected, with those of the open otherwise.
func (c *Coordinator) relayPolicyNode(r *relay) policy.Node {
	c.mu.Lock()
	n := c.nodes[r.n.id]
	c.mu.Unlock()
	if n == nil {
		n = r.n
	}
	return n.policyNode()
}
