package policy

import (
	"errors"
	"fmt"
	"slices"
)

// SSHGrantLost says why the policy that grants answers for (Policy.Grants
// or Store.Peek: a recheck refuses no request, so it need not count
// refusals) no longer grants id what an SSH session on node was given
// when it opened (ssh there as each of logins, and forwarding to each of
// targets), or "" when it still grants all of it. A decision it cannot
// make counts as lost (fail closed). The jump host's channels
// (coordinator/sshgate) and the coordinator's ssh streams (tether
// ssh-proxy) are rechecked with it after a reload, so both close a session
// for the same reasons, in the same words.
func SSHGrantLost(grants func(Identity, Operation, Node) ([]Grant, error), id Identity, node Node, logins, targets []string) string {
	ssh, err := grants(id, OpSSH, node)
	if err != nil {
		var r *Refusal
		if errors.As(err, &r) {
			return fmt.Sprintf("the policy no longer grants ssh on %s: %s", node.ID, r.Error())
		}
		return fmt.Sprintf("the policy could not decide ssh on %s for %s: %v", node.ID, id, err)
	}
	for _, l := range logins {
		if !slices.ContainsFunc(ssh, func(g Grant) bool { return g.RunAs == l }) {
			return fmt.Sprintf("the policy no longer grants %s ssh on %s as login %s", id, node.ID, l)
		}
	}
	if len(targets) == 0 {
		return ""
	}
	fwd, _ := grants(id, OpForward, node) // a refusal grants no target
	for _, t := range targets {
		if !slices.ContainsFunc(fwd, func(g Grant) bool { return slices.Contains(g.Targets, t) }) {
			return fmt.Sprintf("the policy no longer grants %s forwarding to %s on %s", id, t, node.ID)
		}
	}
	return ""
}
