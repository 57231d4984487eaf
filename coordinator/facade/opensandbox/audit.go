package opensandbox

import (
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Auditor records audit events; *coordinator/audit.Recorder is one. Record
// must not block (the recorder queues).
type Auditor interface {
	Record(ev *protocol.AuditEvent)
}

// Audit (Config.Audit). Every request the facade answers is one event: the
// caller's identity, the operation (the sandbox operation the facade
// decided: sandboxes.list for a listing or a request on one sandbox,
// sandboxes.reap for a delete, sandboxes.lease for a create under
// another's run; else forward to target opensandbox), the method and route
// class ("DELETE sandbox"), the nodes whose lifecycle server it reached,
// the sandbox id when known (the route's, or the one a create made), the
// result (by the answer's status) and the duration. A request that policy
// refused is recorded by the Authorizer's Observe (it sees the refusal),
// so the facade adds no second event; one refused before policy (a foreign
// Host or Origin, no valid token) is recorded here as refused. Source is
// the TCP peer (http.Request.RemoteAddr), never X-Forwarded-For or another
// header a caller writes. Never in an event: headers (tokens), bodies,
// query strings.

// auditNote is what a request learns for its event as it goes (mu: a
// fan-out's goroutines may write it).
type auditNote struct {
	mu      sync.Mutex
	nodes   []string
	op      policy.Operation // the sandbox operation decided; zero: forward
	sandbox string
	refused bool   // policy refused a decision: Observe recorded it
	reason  string // a refusal before policy: "host", "origin", "unauthenticated", "throttled"
}

func (n *auditNote) node(ids ...string) {
	n.mu.Lock()
	for _, id := range ids {
		if !slices.Contains(n.nodes, id) {
			n.nodes = append(n.nodes, id)
		}
	}
	n.mu.Unlock()
}

func (n *auditNote) decision(op policy.Operation, err error) {
	n.mu.Lock()
	if op != policy.OpForward {
		n.op = op
	}
	if err != nil {
		n.refused = true
	}
	n.mu.Unlock()
}

func (n *auditNote) setSandbox(id string) {
	n.mu.Lock()
	n.sandbox = id
	n.mu.Unlock()
}

// audit records the event of request r, answered with status after it
// began at start.
func (f *Facade) audit(r *http.Request, st *reqState, status int, start time.Time) {
	if f.cfg.Audit == nil {
		return
	}
	n := &st.note
	n.mu.Lock()
	nodes, op, sandbox, refused, reason := slices.Clone(n.nodes), n.op, n.sandbox, n.refused, n.reason
	n.mu.Unlock()
	if refused && (status == http.StatusUnauthorized || status == http.StatusForbidden) {
		return // the Authorizer's Observe recorded the refusal
	}
	ev := &protocol.AuditEvent{
		Operation:  policy.OpForward.String(),
		Target:     Target,
		Facade:     Target,
		Method:     r.Method + " " + st.class,
		Source:     st.source,
		Sandbox:    protocol.ClipUTF8(sandbox, protocol.MaxAuditErrorLen),
		DurationMS: float64(time.Since(start).Microseconds()) / 1000,
	}
	if op != 0 {
		ev.Operation, ev.Target = op.String(), ""
	}
	if st.identified {
		ev.Identity, ev.IdentityKey, ev.Account = st.who.String(), st.who.Key, st.who.Account
	}
	slices.Sort(nodes)
	if len(nodes) > protocol.MaxAuditNodes {
		ev.NodesTotal = len(nodes)
		nodes = nodes[:protocol.MaxAuditNodes]
	}
	ev.Nodes = nodes
	switch {
	case status < 400:
		ev.Result = protocol.AuditOK
	case reason != "":
		ev.Result, ev.Reason = protocol.AuditRefused, reason
	case len(nodes) > 0:
		ev.Result = protocol.AuditFailed // a node answered it, or the way to one broke
	default:
		ev.Result = protocol.AuditError
	}
	if status >= 400 {
		ev.Status = status
	}
	f.cfg.Audit.Record(ev)
}
