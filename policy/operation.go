package policy

import (
	"fmt"
	"strings"
)

// Operation is what a caller asks to do. The zero Operation is invalid.
type Operation uint8

// Operations, named in policy files as String returns.
const (
	OpExec              Operation = iota + 1 // run a command on a node
	OpCopyRead                               // copy from a node (cp pull)
	OpCopyWrite                              // copy to a node (cp push)
	OpShell                                  // an interactive terminal
	OpForward                                // a byte stream to a node's named target
	OpJobStatus                              // a job's status
	OpJobLogs                                // a job's output
	OpJobCancel                              // cancel a job
	OpSandboxesList                          // list sandbox ledger records
	OpSandboxesRegister                      // record a sandbox under a run
	OpSandboxesLease                         // open, renew or close a run's lease
	OpSandboxesReap                          // reap a run's sandboxes
	OpNodesList                              // see a node in a node listing
	OpAdmin                                  // coordinator administration
	OpSSH                                    // log in to a node over SSH (exec, shell, sftp)
	numOps                                   // one past the last operation
)

// opInfo says what an operation needs from a rule and from a request.
type opInfo struct {
	name   string
	node   bool // runs on (or is about) one node: the rule needs nodes
	paths  bool // takes a path: the rule needs paths
	target bool // takes a target: the rule needs targets
	runAs  bool // runs as a local user: the rule needs run_as
	scoped bool // is about someone's job or run: the rule may say scope
	noun   string
}

var ops = [numOps]opInfo{
	OpExec:              {name: "exec", node: true, runAs: true},
	OpCopyRead:          {name: "cp.read", node: true, paths: true, runAs: true},
	OpCopyWrite:         {name: "cp.write", node: true, paths: true, runAs: true},
	OpShell:             {name: "shell", node: true, runAs: true},
	OpForward:           {name: "forward", node: true, target: true},
	OpJobStatus:         {name: "job.status", node: true, scoped: true, noun: "job"},
	OpJobLogs:           {name: "job.logs", node: true, scoped: true, noun: "job"},
	OpJobCancel:         {name: "job.cancel", node: true, scoped: true, noun: "job"},
	OpSandboxesList:     {name: "sandboxes.list", scoped: true, noun: "run"},
	OpSandboxesRegister: {name: "sandboxes.register", node: true, scoped: true, noun: "run"},
	OpSandboxesLease:    {name: "sandboxes.lease", scoped: true, noun: "run"},
	OpSandboxesReap:     {name: "sandboxes.reap", scoped: true, noun: "run"},
	OpNodesList:         {name: "nodes.list", node: true},
	OpAdmin:             {name: "admin"},
	OpSSH:               {name: "ssh", node: true, runAs: true},
}

// Operations lists every operation, in declaration order.
func Operations() []Operation {
	out := make([]Operation, 0, numOps-1)
	for o := OpExec; o < numOps; o++ {
		out = append(out, o)
	}
	return out
}

// Valid reports whether o is a defined operation.
func (o Operation) Valid() bool { return o >= OpExec && o < numOps }

// String returns the operation's name as policy files write it ("exec",
// "cp.read", ...), or "operation(N)" for an invalid one.
func (o Operation) String() string {
	if o.Valid() {
		return ops[o].name
	}
	return fmt.Sprintf("operation(%d)", uint8(o))
}

// OnNode reports whether o runs on, or is about, one node: Decide then
// needs the node, and a rule granting o needs a node selector.
func (o Operation) OnNode() bool { return o.Valid() && ops[o].node }

// ParseOperation returns the operation named s, as String writes it.
func ParseOperation(s string) (Operation, error) {
	for o := OpExec; o < numOps; o++ {
		if ops[o].name == s {
			return o, nil
		}
	}
	names := make([]string, 0, numOps-1)
	for o := OpExec; o < numOps; o++ {
		names = append(names, ops[o].name)
	}
	return 0, fmt.Errorf("unknown operation %q: want one of %s", s, strings.Join(names, ", "))
}

// opSet is a set of operations, one bit each.
type opSet uint32

func (s opSet) has(o Operation) bool { return s&(1<<o) != 0 }

func (s *opSet) add(o Operation) { *s |= 1 << o }

// any reports whether some operation of s satisfies f.
func (s opSet) any(f func(opInfo) bool) bool {
	for o := OpExec; o < numOps; o++ {
		if s.has(o) && f(ops[o]) {
			return true
		}
	}
	return false
}

// names lists the operations of s satisfying f, comma-separated.
func (s opSet) names(f func(opInfo) bool) string {
	var out []string
	for o := OpExec; o < numOps; o++ {
		if s.has(o) && f(ops[o]) {
			out = append(out, ops[o].name)
		}
	}
	return strings.Join(out, ", ")
}
