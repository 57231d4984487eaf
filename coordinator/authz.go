package coordinator

import (
	"bytes"
	"encoding/json"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/audit"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Authorization. Every NATS API handler asks c.authorizer()
// (caller.Authorizer on Config.Policy) before it acts: one Authorize (or
// Filter, Scope) per request that decides the identity, the operation,
// the nodes and the object; Authorizer.Observe sees each decision, for the
// audit log.

// policyNode is n as policy decides on it: its id and the labels of its
// Hello.
func (n *node) policyNode() policy.Node {
	return policy.Node{ID: n.id, Labels: n.hello.Labels}
}

func policyNodes(ns []*node) []policy.Node {
	out := make([]policy.Node, len(ns))
	for i, n := range ns {
		out[i] = n.policyNode()
	}
	return out
}

// nodeOrID returns the policy node of id: its labels when it is
// connected, none otherwise (a rule with nodes "*" still matches it).
func (c *Coordinator) nodeOrID(id string) policy.Node {
	c.mu.Lock()
	n := c.nodes[id]
	c.mu.Unlock()
	if n == nil {
		return policy.Node{ID: id}
	}
	return n.policyNode()
}

// NodeLabels returns the labels of the connected node id (read-only), and
// false when it is not connected here nor, with a fleet registry, to
// another coordinator. The sandbox services decide by them.
func (c *Coordinator) NodeLabels(id string) (map[string]string, bool) {
	c.mu.Lock()
	n := c.nodes[id]
	c.mu.Unlock()
	if n == nil {
		if owner, info := c.remoteRecord(id); owner != "" {
			return info.Labels, true
		}
		return nil, false
	}
	return n.hello.Labels, true
}

// Authorizer returns the authorizer the coordinator's handlers use (its
// decisions are audited), for the packages that add endpoints
// (coordinator/ledger) or serve facades.
func (c *Coordinator) Authorizer() caller.Authorizer { return c.authorizer() }

// AuditLog returns the audit recorder of Config.Audit, nil when the
// coordinator keeps no audit log; the sandbox facades record their calls
// in it.
func (c *Coordinator) AuditLog() *audit.Recorder { return c.cfg.Audit }

// ownerString is the owner policy decides job.cancel and a detached job's
// job.* by: the submitter's Identity.String, "" when unknown.
func (j *job) ownerString() string {
	if !j.ownerKnown {
		return ""
	}
	return j.owner.String()
}

// streamOp returns the operation a tether.v1.stream request of kind with
// params asks for, and its object: exec → exec, copy push → cp.write
// (the destination), pull → cp.read (the source), pty → shell, dial →
// forward (the target). params passed protocol.StreamParamsAPIError.
func streamOp(kind protocol.Kind, params []byte) (policy.Operation, policy.Object, *protocol.APIError) {
	h := protocol.Header{Version: protocol.Version, Kind: kind, Params: params}
	switch kind {
	case protocol.KindExec:
		return policy.OpExec, policy.Object{}, nil
	case protocol.KindPTY:
		return policy.OpShell, policy.Object{}, nil
	case protocol.KindCopy:
		var p protocol.CopyParams
		if err := h.DecodeParams(&p); err != nil {
			return 0, policy.Object{}, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "%v", err)
		}
		if p.Direction == protocol.CopyPull {
			return policy.OpCopyRead, policy.Object{Path: p.Path}, nil
		}
		return policy.OpCopyWrite, policy.Object{Path: p.Path}, nil
	case protocol.KindDial:
		var p protocol.DialParams
		if err := h.DecodeParams(&p); err != nil {
			return 0, policy.Object{}, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "%v", err)
		}
		return policy.OpForward, policy.Object{Target: p.Target}, nil
	}
	return 0, policy.Object{}, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "kind %s: not a stream kind", kind)
}

// runsAs reports whether op runs as a local user (the params get a user).
func runsAs(op policy.Operation) bool {
	switch op {
	case policy.OpExec, policy.OpShell, policy.OpCopyRead, policy.OpCopyWrite:
		return true
	}
	return false
}

// authorizeStream decides a stream request for node n and returns its
// operation and its params with the user field set to the grant's run_as
// (removed when the grant names none), and for a copy the roots field set
// to the grant's paths (copyRoots), whatever the client wrote there.
func (c *Coordinator) authorizeStream(req micro.Request, kind protocol.Kind, n *node, params []byte) ([]byte, policy.Operation, *protocol.APIError) {
	op, obj, e := streamOp(kind, params)
	if e != nil {
		return nil, op, e
	}
	grants, e := c.authorizer().Authorize(req, op, []policy.Node{n.policyNode()}, obj)
	if e != nil {
		return nil, op, e
	}
	// Without a policy (tests of parts that do not authorize) the params
	// go as they came, a user the client chose included.
	if !runsAs(op) || c.cfg.Policy == nil {
		return params, op, nil
	}
	var roots []string
	if op == policy.OpCopyRead || op == policy.OpCopyWrite {
		roots = copyRoots(grants[0].Paths, obj.Path)
		if len(roots) == 0 {
			// Decide grants a path only under one of the rule's paths.
			return nil, op, protocol.NewAPIError(500, protocol.ErrCodeInternal, "the grant of %s %s names no path", op, protocol.Clip(obj.Path))
		}
		if !n.hello.HasFeature(protocol.FeatureCopyRoots) {
			if len(roots) != 1 || roots[0] != "/" {
				return nil, op, protocol.NewAPIError(403, protocol.ErrCodeForbidden,
					"node %s: its agent does not confine copies to the policy's paths (%s, granted by %s): it predates protocol feature %s; upgrade the agent",
					n.id, strings.Join(roots, ", "), grants[0].Rule(), protocol.FeatureCopyRoots)
			}
			roots = nil // "/" narrows nothing
		}
	}
	out, err := withGrant(params, grants[0].RunAs, roots)
	if err != nil {
		return nil, op, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "params: %v", err)
	}
	if len(out) > protocol.MaxHeaderSize {
		return nil, op, protocol.NewAPIError(413, protocol.ErrCodeTooLarge, "%v", protocol.HeaderSizeError("params with the user policy runs them as", len(out)))
	}
	return out, op, nil
}

// copyRoots returns the roots a copy of path granted by a rule with the
// path prefixes paths goes to the node with (protocol.CopyParams.Roots):
// the prefixes, clean, without those under another one (the outer one
// covers them), the one holding path first; past protocol.MaxCopyRoots
// or a total of protocol.MaxHeaderSize/4 bytes the others are dropped,
// which only narrows what the node lets symlinks reach. Empty if no
// prefix holds path.
func copyRoots(paths []string, p string) []string {
	p = path.Clean(p)
	var outer []string
	for _, a := range paths {
		a = path.Clean(a)
		covered := false
		for _, b := range paths {
			b = path.Clean(b)
			if b != a && underDir(a, b) {
				covered = true
				break
			}
		}
		if !covered && !slices.Contains(outer, a) {
			outer = append(outer, a)
		}
	}
	var out []string
	size := 0
	for _, a := range outer {
		if underDir(p, a) {
			out = append(out, a)
			size += len(a)
			break
		}
	}
	if out == nil {
		return nil
	}
	for _, a := range outer {
		if len(out) == protocol.MaxCopyRoots || size+len(a) > protocol.MaxHeaderSize/4 {
			break
		}
		if a != out[0] {
			out = append(out, a)
			size += len(a)
		}
	}
	return out
}

// underDir reports whether the clean absolute path p is dir or below it.
func underDir(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}

// withGrant returns the JSON object params with its "user" member set to
// user, or removed when user is empty, and its "roots" member set to
// roots, or removed when roots is empty. The other members keep their
// encoding (a copy's path_b64 too).
func withGrant(params []byte, user string, roots []string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(params, &m); err != nil {
		return nil, err
	}
	_, hasUser := m["user"]
	_, hasRoots := m["roots"]
	if user == "" && !hasUser && len(roots) == 0 && !hasRoots {
		return params, nil
	}
	if user == "" {
		delete(m, "user")
	} else {
		u, _ := json.Marshal(user)
		m["user"] = u
	}
	if len(roots) == 0 {
		delete(m, "roots")
	} else {
		r, _ := json.Marshal(roots)
		m["roots"] = r
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(buf.Bytes()), nil
}

// jobOps maps a job stream's op to the policy's operation.
var jobOps = map[string]policy.Operation{
	protocol.JobOpStatus: policy.OpJobStatus,
	protocol.JobOpOutput: policy.OpJobLogs,
	protocol.JobOpCancel: policy.OpJobCancel,
}

// maxJobOwners bounds the detached jobs whose owners a coordinator
// remembers; past it the oldest are forgotten (their owner is then
// unknown, and only scope any reaches them).
const maxJobOwners = 1 << 16

// jobOwners remembers who submitted each detached job, by node and job id:
// the owner policy decides job.status, job.logs and job.cancel by. An
// owner is recorded once the node reported the job started detached, so a
// request reusing the id of a job still on the node (which the agent
// refuses) cannot take it over. It is kept in memory: after a coordinator
// restart, or on another coordinator, a detached job's owner is unknown.
// Safe for concurrent use; mu is a leaf lock.
type jobOwners struct {
	mu    sync.Mutex
	m     map[jobKey]string
	order []jobKey // insertion order, a ring of maxJobOwners
	next  int
}

type jobKey struct{ node, id string }

func (o *jobOwners) set(node, id, owner string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[jobKey]string{}
	}
	k := jobKey{node, id}
	if _, ok := o.m[k]; !ok {
		if len(o.order) < maxJobOwners {
			o.order = append(o.order, k)
		} else {
			delete(o.m, o.order[o.next])
			o.order[o.next] = k
			o.next = (o.next + 1) % maxJobOwners
		}
	}
	o.m[k] = owner
}

func (o *jobOwners) get(node, id string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.m[jobKey{node, id}]
}
