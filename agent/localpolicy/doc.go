// Package localpolicy is the node's own policy, the agent's last line of
// defence: a root-owned YAML file on the node (DefaultPath) that says which
// local accounts the agent may run jobs, shells and copies as, under which
// directories copies may write and read, whether exec, shell (pty) and
// forward (dial) streams are served, and which dial targets may be reached.
// The agent enforces it whatever an authenticated coordinator asks; every
// refusal is a *Refusal naming the file and the rule that is missing.
//
// The file format (strict: unknown keys, duplicate keys, wrong types are
// errors with file:line:column):
//
//	version: 1              # required, the only version
//	users:                  # accounts jobs may run as; none listed: none
//	  - name: alice         # by name,
//	    copy_roots: [/home/alice]   # extra copy roots for this entry
//	  - uid: 1001           # by uid,
//	  - group: builders     # or any member of a group (name or gid)
//	copy_roots: [/srv/shared]       # copy roots for every allowed user
//	exec: true              # exec streams (commands and detached jobs)
//	shell: false            # pty streams (tether shell)
//	forward: true           # dial streams (tether forward and the facades)
//	targets: [openshell]    # dial targets; omitted: every target the agent has
//	                        # (own-ports: SSH forwards to a login's own loopback ports)
//
// Omitted booleans are false and an omitted users list allows no account
// (not even the agent's own): a file allows only what it says. Loading
// (Load) refuses a file that is not owned by root or the agent's own uid,
// or that is writable by its group or by others.
//
// The package imports only the standard library and the YAML parser; it
// runs no goroutines. A *Policy is immutable once parsed and safe for
// concurrent use.
package localpolicy
