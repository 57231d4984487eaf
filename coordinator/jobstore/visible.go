package jobstore

import "github.com/tetherfleet/tether/policy"

// VisibleTo reports whether id may see rec under p: the one check behind
// tether.v1.job.list, tether.v1.job.get and the web console's job pages.
// nodes are rec.Nodes as policy sees them (with their labels), in any
// order. rec is visible when p grants id job.status on every one of them,
// with rec.Owner for a rule's scope. A record with no nodes (a job refused
// or lost before it reached one) would pass "every node" vacuously: it is
// visible only to its submitter (rec.Owner names id, by name or by key)
// and to an identity p grants admin. A nil p (a coordinator without a
// policy) shows everything.
func VisibleTo(p *policy.Policy, id policy.Identity, rec *Record, nodes []policy.Node) bool {
	if p == nil {
		return true
	}
	if len(nodes) == 0 {
		if rec.Owner != "" && (rec.Owner == id.String() || id.Key != "" && rec.Owner == id.Kind.String()+":"+id.Key) {
			return true
		}
		_, err := p.Decide(id, policy.OpAdmin, policy.Node{}, policy.Object{})
		return err == nil
	}
	for _, n := range nodes {
		if _, err := p.Decide(id, policy.OpJobStatus, n, policy.Object{Owner: rec.Owner}); err != nil {
			return false
		}
	}
	return true
}
