package agent

import (
	"github.com/tetherfleet/tether/agent/localpolicy"
)

// The local policy (package localpolicy) is the agent's last line of
// defence: when one is loaded (Config.LocalPolicy, replaced by
// SetLocalPolicy on SIGHUP), every exec, pty, copy and dial stream is
// checked against it before anything runs, whatever the coordinator asked,
// and refused with a forbidden error frame naming the file and the missing
// rule. Without one the agent behaves as before local policies existed:
// it runs everything as its own account only (a named user that is not
// the agent's own uid is refused), copies are confined to
// Config.CopyRoots, and dial streams reach every configured target.
//
// With a local policy, the copy roots of an operation are the policy's
// (its global copy_roots and those of the users entries matching the
// account), not Config.CopyRoots: one file says everything a node allows.
// Either way the agent's own state (Config.SecretFiles, the jobs'
// directory) is never copied.

// localPolicy returns the local policy in force, or nil for none.
func (a *Agent) localPolicy() *localpolicy.Policy { return a.lp.Load() }

// LocalPolicy returns the local policy in force, or nil for none. Safe for
// concurrent use.
func (a *Agent) LocalPolicy() *localpolicy.Policy { return a.localPolicy() }

// SetLocalPolicy replaces the local policy in force (nil: none) for the
// streams that start from now on; running operations keep the decision
// they were started with. Safe for concurrent use (the CLI calls it on
// SIGHUP after a successful localpolicy.Load).
func (a *Agent) SetLocalPolicy(p *localpolicy.Policy) { a.lp.Store(p) }
