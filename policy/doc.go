// Package policy is the coordinator's authorization policy: one strict YAML
// file that maps identities (who the transport proved a caller is) to rules
// (what they may do, where, as which local user) and limits (how much).
// Everything the file does not grant is refused.
//
// Parse and Load read a file into an immutable *Policy; Policy.Decide answers
// one question (may this identity do this operation on this node, to this
// object?) with a Grant or a *Refusal. Store holds the current policy for a
// long-lived owner and swaps in a new one on Reload, keeping the old one when
// the file is bad. Limiter counts requests per second and concurrent jobs per
// identity. Metrics counts refusals and reloads.
//
// # The file
//
// A complete example, every field used:
//
//	version: 1                       # required; the only version is 1
//
//	defaults:                        # optional
//	  limits:                        # limits of an identity that sets none
//	    max_concurrent_jobs: 16
//	    requests_per_second: 20
//	    burst: 40
//
//	roles:                           # optional: name -> list of rules
//	  deployer:
//	    - nodes: "env in (staging,prod)"
//	      operations: [exec, shell, job.status, job.logs, job.cancel]
//	      run_as: deploy
//	    - nodes: "env=staging"
//	      operations: [cp.read, cp.write]
//	      paths: [/srv/app, /var/log/app]
//	      run_as: deploy
//	  observer:
//	    - nodes: "*"
//	      operations: [nodes.list, job.status, job.logs]
//	      scope: any
//	    - operations: [sandboxes.list]
//	      scope: any
//
//	identities:                      # required (may be {}): identity -> entry
//	  nats:alice:
//	    roles: [deployer, observer]
//	    limits:
//	      max_concurrent_jobs: 4
//	  nats-account:CI:
//	    rules:
//	      - nodes: "gpu"
//	        operations: [forward]
//	        targets: [openshell]
//	      - operations: [sandboxes.list, sandboxes.lease, sandboxes.reap]
//	  cert:ops.example.com:
//	    roles: [observer]
//	    rules:
//	      - operations: [admin]
//
// Top-level keys: version (required, the integer 1), defaults (optional; its
// only key is limits), roles (optional) and identities (required).
//
// # Identities
//
// Each key of identities is KIND:VALUE, KIND one of:
//
//	nats:NAME          a NATS user, by the name in its user JWT: 1-128 bytes
//	                   of [A-Za-z0-9._@+-], starting with a letter or digit
//	nats:UKEY          a NATS user, by its public key (56 characters from U;
//	                   the checksum is checked)
//	nats-account:NAME  every user of a NATS account, by the account's name:
//	                   1-64 bytes of [A-Za-z0-9._-]
//	nats-account:AKEY  the same, by the account's public key (56
//	                   characters from A; the checksum is checked)
//	cert:CN            a facade client certificate, by its subject's common
//	                   name: 1-64 bytes of printable UTF-8, no leading or
//	                   trailing space
//	token:NAME         a facade bearer token, by the name it was issued
//	                   under: 1-64 bytes of [A-Za-z0-9._-]
//	ssh-key:SHA256:FP  an SSH public key the client proved to the jump
//	                   host, by its SHA-256 fingerprint as ssh-keygen -lf
//	                   prints it (SHA256: and 43 base64 characters)
//	ssh-principal:NAME an SSH user certificate from a trusted user CA, by
//	                   a principal it lists: 1-128 bytes of
//	                   [A-Za-z0-9._@+-]
//
// Any other kind is refused. A caller matches up to three entries: a NATS
// user its key entry, its name entry and its account's entry; a facade
// certificate, token or plain SSH key its one entry; an SSH certificate the
// entries of its principals (the first MaxPrincipals), and it is named by
// its first principal. The grants of
// all matched entries add up. Each entry has three optional keys: roles (a
// list of role names; each must be defined, none twice), rules (a list of
// rules, as in a role) and limits.
//
// # Rules
//
// A rule grants its operations to the identity, on the nodes its selector
// matches, under its paths, for its targets, at its scope. Keys:
//
//	operations  required: a list of operation names, none twice
//	nodes       a label selector in the syntax of tether's --selector
//	            (protocol.ParseSelector: env=prod, gpu, !spot, zone in (a,b),
//	            comma for "and"), or "*" for every node; required when an
//	            operation runs on a node, refused otherwise
//	paths       absolute path prefixes for cp.read and cp.write (required
//	            with them, refused otherwise); "/srv/app" grants /srv/app and
//	            what is under it, not /srv/application; ".." is refused
//	targets     target names for forward (required with it, refused
//	            otherwise), as the agent names them (openshell, opensandbox,
//	            or its --target names), or own-ports: inside an SSH
//	            connection (ssh -L, ssh -D, VS Code Remote-SSH), loopback
//	            ports (127.0.0.0/8, ::1, localhost) whose listening socket
//	            belongs to the SSH login's own uid, never another user's
//	            or root's (the agent checks the owner with sock_diag); an
//	            agent target cannot take that name
//	run_as      the local user that exec, shell, cp.read and cp.write run as
//	            (required with them, refused otherwise): 1-32 bytes of
//	            [A-Za-z0-9._-], starting with a letter or '_'; root must be
//	            written as root
//	scope       own (the default) or any, for the job.* and sandboxes.*
//	            operations (refused otherwise): own grants them on the
//	            caller's own jobs and runs, any on everyone's
//
// Operations, and the keys each needs (scope is optional: own by default):
//
//	exec                run a command (nodes, run_as)
//	cp.read             copy from a node: tether cp NODE:PATH ... (nodes,
//	                    paths, run_as)
//	cp.write            copy to a node (nodes, paths, run_as)
//	shell               an interactive terminal (nodes, run_as)
//	forward             a byte stream to a named target (nodes, targets)
//	job.status          a job's status (nodes, scope)
//	job.logs            a job's output (nodes, scope)
//	job.cancel          cancel a job (nodes, scope)
//	sandboxes.list      list ledger records (scope: own lists one's runs')
//	sandboxes.register  record a sandbox under a run (nodes, scope)
//	sandboxes.lease     open, renew or close a run's lease (scope)
//	sandboxes.reap      reap a run's sandboxes (scope)
//	nodes.list          see a node in tether nodes (nodes)
//	admin               coordinator administration: tokens, node
//	                    revocation, sandboxes sync, audit (nothing else)
//	ssh                 log in to a node with OpenSSH through the jump host
//	                    or tether ssh-proxy (nodes, run_as): every rule
//	                    granting it on the node adds its run_as to the
//	                    logins the caller may use there (ssh run_as@node);
//	                    port forwarding inside the connection (ssh -L)
//	                    needs forward to the target as well (own-ports
//	                    for the login's own loopback servers)
//
// When several rules grant an operation, the first one that matches wins
// and names the run_as user: the caller's entries in the order key, name,
// account; in each entry its own rules, then its roles in the order listed,
// each role's rules in file order.
//
// # Limits
//
// limits has three optional keys: max_concurrent_jobs (an integer, 1 to
// 1048576), requests_per_second (a number, above 0, at most 1000000) and
// burst (an integer, 1 to 1048576: how many requests may come at once
// after a quiet period). Each key is taken from the caller's first matched
// entry that sets it, else from defaults.limits, else from the built-in
// DefaultLimits (64 concurrent jobs, 50 requests per second, burst 100).
// Limits are per caller (Identity.String): the users of one nats-account
// entry each have their own.
//
// # Strictness
//
// The file is at most MaxFileSize bytes of one YAML document. Unknown keys,
// repeated keys, a value of the wrong type (1000 for a user name, a list for
// a selector, yes for a number), null values, anchors, aliases, merge keys
// (<<) and tags other than YAML's own are errors. Every error reports
// FILE:LINE:COLUMN and the field's path, e.g.
//
//	policy.yaml:14:15: identities["nats:alice"].rules[0].run_as: want a
//	string, got the integer 1000
//
// and Parse reports every error it finds, not only the first. Load also
// refuses a file that is not owned by root or the process's effective
// uid, or that is writable by its group or others: whoever could change
// it could grant themselves everything (the node's local policy,
// agent/localpolicy, is held to the same rules).
//
// # Decisions
//
// Decide takes the caller's Identity, the Operation, the Node (id and
// labels) and the Object (path for cp.*, target for forward, owner for job.*
// and sandboxes.*). Paths are compared lexically, after cleaning, on whole
// components; a path that is relative or has a ".." component is refused.
// A refusal is a *Refusal (errors.Is(err, ErrRefused)) whose message names
// the identity, the operation and the rule that is missing, e.g.
//
//	nats:alice may not exec on node-b: no rule grants exec on a node with
//	node-b's labels (env=dev); exec is granted on nodes "env in
//	(staging,prod)" (roles.deployer[0], policy.yaml:11:7)
//
// The message lists only the caller's own rules (at most three), never
// another identity's. A Grant names the rule that allowed (Grant.Rule) for
// the audit log, and the run_as user.
// The policy is lexical about paths and trusts the labels it is given:
// the agent's local policy (symlinks, copy roots) and node identity are
// enforced elsewhere.
//
// # Concurrency
//
// A *Policy is immutable and safe for concurrent use. Store and Limiter are
// safe for concurrent use; each holds one mutex, taken by nothing else
// while held. The package starts no goroutines. It imports protocol (the
// selector and name rules), internal/identity (the KIND:VALUE syntax, shared
// with the client build) and no other tether package but leaves.
package policy
