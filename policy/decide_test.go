package policy

import (
	"errors"
	"strings"
	"testing"
)

const decideFile = `version: 1
roles:
  deployer:
    - nodes: "env=staging"
      operations: [exec, shell]
      run_as: deploy
    - nodes: "env=staging"
      operations: [cp.read, cp.write]
      paths: [/data, /srv/app/]
      run_as: deploy
    - nodes: "*"
      operations: [job.status, job.cancel]
  observer:
    - nodes: "*"
      operations: [job.status, nodes.list]
      scope: any
identities:
  nats:alice:
    roles: [deployer]
    rules:
      - nodes: "gpu"
        operations: [forward]
        targets: [openshell]
      - operations: [sandboxes.lease, sandboxes.reap]
  nats-account:CLIENTS:
    rules:
      - nodes: "*"
        operations: [nodes.list]
  nats:UDBEYJRDOFYTEW5TGTNPDPV53M74KESNMZXW2WD6GHEC4PIEXSVCZLHN:
    roles: [observer]
    rules:
      - nodes: "env=prod"
        operations: [exec]
        run_as: root
  cert:ops.example.com:
    rules:
      - operations: [admin, sandboxes.list]
        scope: any
  token:ci:
    rules:
      - operations: [sandboxes.list]
`

const carolKey = "UDBEYJRDOFYTEW5TGTNPDPV53M74KESNMZXW2WD6GHEC4PIEXSVCZLHN"

func mustParse(t testing.TB, data string) *Policy {
	t.Helper()
	p, err := Parse("policy.yaml", []byte(data))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

var (
	alice   = Identity{Kind: KindNATS, Name: "alice", Key: "UALICEKEY", Account: "CLIENTS"}
	bob     = Identity{Kind: KindNATS, Name: "bob", Account: "CLIENTS"}
	mallory = Identity{Kind: KindNATS, Name: "mallory", Account: "OTHER"}
	carol   = Identity{Kind: KindNATS, Name: "carol", Key: carolKey, Account: "CLIENTS"}
	ops1    = Identity{Kind: KindCert, Name: "ops.example.com"}
	ciTok   = Identity{Kind: KindToken, Name: "ci"}

	nodeA = Node{ID: "node-a", Labels: map[string]string{"env": "staging", "gpu": "true"}}
	nodeB = Node{ID: "node-b", Labels: map[string]string{"env": "prod"}}
)

func TestDecide(t *testing.T) {
	p := mustParse(t, decideFile)
	tests := []struct {
		name   string
		id     Identity
		op     Operation
		node   Node
		obj    Object
		runAs  string
		rule   string // Grant.Rule, when allowed
		reason Reason // 0: allowed
		msg    []string
	}{
		{name: "exec on a matching node", id: alice, op: OpExec, node: nodeA, runAs: "deploy", rule: "roles.deployer[0] (policy.yaml:4:7)"},
		{name: "selector excludes node-b", id: alice, op: OpExec, node: nodeB, reason: ReasonNoRule, msg: []string{
			`nats:alice may not exec on node-b: no rule grants exec on a node with node-b's labels (env=prod); exec is granted on nodes "env=staging" (roles.deployer[0], policy.yaml:4:7)`}},
		{name: "default deny: operation never granted", id: alice, op: OpAdmin, reason: ReasonNoRule, msg: []string{
			"nats:alice may not admin: no rule grants admin to it: its entries nats:alice (policy.yaml:18:3), nats-account:CLIENTS (policy.yaml:25:3) grant no admin"}},
		{name: "default deny: unknown identity", id: mallory, op: OpNodesList, node: nodeA, reason: ReasonNoIdentity, msg: []string{
			"nats:mallory may not nodes.list on node-a: policy policy.yaml has no entry for it (looked for nats:mallory, nats-account:OTHER)"}},
		{name: "account entry grants its users", id: bob, op: OpNodesList, node: nodeB, rule: "identities[\"nats-account:CLIENTS\"].rules[0] (policy.yaml:27:9)"},
		{name: "account entry grants no more", id: bob, op: OpExec, node: nodeA, reason: ReasonNoRule, msg: []string{"nats:bob may not exec on node-a: no rule grants exec to it"}},
		{name: "key entry", id: carol, op: OpExec, node: nodeB, runAs: "root"},
		{name: "key entry does not match a name", id: Identity{Kind: KindNATS, Name: "carol"}, op: OpExec, node: nodeB, reason: ReasonNoIdentity},
		{name: "cp.write under a prefix", id: alice, op: OpCopyWrite, node: nodeA, obj: Object{Path: "/data/x/y"}, runAs: "deploy"},
		{name: "cp.write on the prefix itself", id: alice, op: OpCopyWrite, node: nodeA, obj: Object{Path: "/data"}, runAs: "deploy"},
		{name: "cp.write prefix written with a trailing slash", id: alice, op: OpCopyRead, node: nodeA, obj: Object{Path: "/srv/app"}, runAs: "deploy"},
		{name: "cp.write unclean path is cleaned", id: alice, op: OpCopyWrite, node: nodeA, obj: Object{Path: "//data/./x/"}, runAs: "deploy"},
		{name: "/data does not grant /database", id: alice, op: OpCopyWrite, node: nodeA, obj: Object{Path: "/database"}, reason: ReasonNoRule, msg: []string{
			`nats:alice may not cp.write "/database" on node-a: no rule grants cp.write under "/database" on node-a; cp.write on node-a is granted under /data, /srv/app (roles.deployer[1], policy.yaml:7:7)`}},
		{name: "/srv/app does not grant /srv/application", id: alice, op: OpCopyRead, node: nodeA, obj: Object{Path: "/srv/application/x"}, reason: ReasonNoRule},
		{name: "/data does not grant its parent", id: alice, op: OpCopyRead, node: nodeA, obj: Object{Path: "/"}, reason: ReasonNoRule},
		{name: "dot-dot refused", id: alice, op: OpCopyWrite, node: nodeA, obj: Object{Path: "/data/../etc/passwd"}, reason: ReasonBadRequest, msg: []string{
			`nats:alice may not cp.write "/data/../etc/passwd" on node-a: the path "/data/../etc/passwd" has a ".." component`}},
		{name: "trailing dot-dot refused", id: alice, op: OpCopyWrite, node: nodeA, obj: Object{Path: "/data/.."}, reason: ReasonBadRequest},
		{name: "a name with dots is not dot-dot", id: alice, op: OpCopyWrite, node: nodeA, obj: Object{Path: "/data/..x/a..b/..."}, runAs: "deploy"},
		{name: "relative path refused", id: alice, op: OpCopyRead, node: nodeA, obj: Object{Path: "data/x"}, reason: ReasonBadRequest, msg: []string{"is not absolute"}},
		{name: "empty path refused", id: alice, op: OpCopyRead, node: nodeA, reason: ReasonBadRequest},
		{name: "path prefix on a node the selector excludes", id: alice, op: OpCopyWrite, node: nodeB, obj: Object{Path: "/data/x"}, reason: ReasonNoRule, msg: []string{"no rule grants cp.write on a node with node-b's labels"}},
		{name: "forward to a granted target", id: alice, op: OpForward, node: nodeA, obj: Object{Target: "openshell"}},
		{name: "forward to another target", id: alice, op: OpForward, node: nodeA, obj: Object{Target: "opensandbox"}, reason: ReasonNoRule, msg: []string{
			`nats:alice may not forward to target "opensandbox" on node-a: no rule grants forward to target "opensandbox" on node-a; forward on node-a is granted to targets openshell`}},
		{name: "forward without a target", id: alice, op: OpForward, node: nodeA, reason: ReasonBadRequest, msg: []string{"names no target"}},
		{name: "own job", id: alice, op: OpJobCancel, node: nodeA, obj: Object{Owner: "nats:alice"}},
		{name: "own job recorded by key", id: alice, op: OpJobCancel, node: nodeA, obj: Object{Owner: "nats:UALICEKEY"}},
		{name: "someone else's job", id: alice, op: OpJobCancel, node: nodeA, obj: Object{Owner: "nats:bob"}, reason: ReasonNoRule, msg: []string{
			"nats:alice may not job.cancel another identity's job on node-a: no rule grants job.cancel on other identities' jobs (that needs scope: any) on node-a; job.cancel is granted on its own jobs only, by roles.deployer[2], policy.yaml:11:7"}},
		{name: "owner with the same name of another kind", id: alice, op: OpJobStatus, node: nodeA, obj: Object{Owner: "cert:alice"}, reason: ReasonNoRule},
		{name: "owner prefix is not the owner", id: alice, op: OpJobStatus, node: nodeA, obj: Object{Owner: "nats:alic"}, reason: ReasonNoRule},
		{name: "job with no recorded owner", id: alice, op: OpJobStatus, node: nodeA, reason: ReasonNoRule, msg: []string{"a job with no recorded owner", "jobs with no recorded owner (that needs scope: any)"}},
		{name: "scope any grants others' jobs", id: carol, op: OpJobStatus, node: nodeB, obj: Object{Owner: "nats:alice"}},
		{name: "scope any grants ownerless jobs", id: carol, op: OpJobStatus, node: nodeB},
		{name: "scope any on one op only", id: carol, op: OpJobCancel, node: nodeB, obj: Object{Owner: "nats:alice"}, reason: ReasonNoRule},
		{name: "own run", id: alice, op: OpSandboxesReap, obj: Object{Owner: "nats:alice"}},
		{name: "another's run", id: alice, op: OpSandboxesLease, obj: Object{Owner: "token:ci"}, reason: ReasonNoRule, msg: []string{"nats:alice may not sandboxes.lease another identity's run: no rule grants sandboxes.lease on other identities' runs"}},
		{name: "cert admin", id: ops1, op: OpAdmin},
		{name: "cert sandboxes any", id: ops1, op: OpSandboxesList, obj: Object{Owner: "nats:alice"}},
		{name: "token own runs only", id: ciTok, op: OpSandboxesList, obj: Object{Owner: "nats:alice"}, reason: ReasonNoRule},
		{name: "token own runs", id: ciTok, op: OpSandboxesList, obj: Object{Owner: "token:ci"}},
		{name: "cert name is not a NATS name", id: Identity{Kind: KindCert, Name: "alice"}, op: OpExec, node: nodeA, reason: ReasonNoIdentity},
		{name: "node operation without a node", id: alice, op: OpExec, reason: ReasonBadRequest, msg: []string{"names no node"}},
		{name: "invalid operation", id: alice, op: Operation(200), reason: ReasonBadRequest, msg: []string{"nats:alice may not operation(200): it is not an operation the policy knows"}},
		{name: "identity with no name", id: Identity{Kind: KindToken}, op: OpAdmin, reason: ReasonNoIdentity},
		{name: "nil labels", id: alice, op: OpExec, node: Node{ID: "bare"}, reason: ReasonNoRule, msg: []string{"bare's labels (none)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := p.Decide(tt.id, tt.op, tt.node, tt.obj)
			if tt.reason == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if g.RunAs != tt.runAs {
					t.Errorf("RunAs = %q, want %q", g.RunAs, tt.runAs)
				}
				if tt.rule != "" && g.Rule() != tt.rule {
					t.Errorf("Rule() = %q, want %q", g.Rule(), tt.rule)
				}
				return
			}
			if err == nil {
				t.Fatalf("allowed (run as %q by %s), want a refusal", g.RunAs, g.Rule())
			}
			var r *Refusal
			if !errors.As(err, &r) || !errors.Is(err, ErrRefused) {
				t.Fatalf("error %T %v is not a *Refusal matching ErrRefused", err, err)
			}
			if r.Reason != tt.reason {
				t.Errorf("Reason = %v, want %v (%v)", r.Reason, tt.reason, err)
			}
			if r.Identity.String() != tt.id.String() || r.Op != tt.op || r.Node != tt.node.ID {
				t.Errorf("Refusal = %+v, want identity %v op %v node %q", r, tt.id, tt.op, tt.node.ID)
			}
			for _, m := range tt.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("message\n  %s\nlacks\n  %s", err, m)
				}
			}
		})
	}
}

// TestDecideFirstRuleWins: of two rules granting exec on a node, the
// caller's own entry's comes first and names the user.
func TestDecideFirstRuleWins(t *testing.T) {
	p := mustParse(t, `version: 1
roles:
  wide:
    - nodes: "*"
      operations: [exec]
      run_as: nobody
identities:
  nats:UDBEYJRDOFYTEW5TGTNPDPV53M74KESNMZXW2WD6GHEC4PIEXSVCZLHN:
    rules:
      - nodes: "env=prod"
        operations: [exec]
        run_as: keyuser
  nats:carol:
    roles: [wide]
    rules:
      - nodes: "env=prod"
        operations: [exec]
        run_as: nameuser
  nats-account:CLIENTS:
    roles: [wide]
`)
	for _, tt := range []struct {
		id   Identity
		node Node
		want string
	}{
		{carol, nodeB, "keyuser"},
		{carol, nodeA, "nobody"},
		{Identity{Kind: KindNATS, Name: "carol"}, nodeB, "nameuser"},
		{Identity{Kind: KindNATS, Name: "dave", Account: "CLIENTS"}, nodeB, "nobody"},
	} {
		g, err := p.Decide(tt.id, OpExec, tt.node, Object{})
		if err != nil {
			t.Fatalf("%v on %s: %v", tt.id, tt.node.ID, err)
		}
		if g.RunAs != tt.want {
			t.Errorf("%v on %s: RunAs %q, want %q", tt.id, tt.node.ID, g.RunAs, tt.want)
		}
	}
}

// TestDecideHintsAreTheCallersOwn: a refusal lists the caller's rules,
// never another identity's.
func TestDecideHintsAreTheCallersOwn(t *testing.T) {
	p := mustParse(t, decideFile)
	_, err := p.Decide(alice, OpExec, nodeB, Object{})
	if err == nil {
		t.Fatal("allowed")
	}
	if strings.Contains(err.Error(), "env=prod\" (") || strings.Contains(err.Error(), carolKey) {
		t.Errorf("refusal of alice mentions carol's rule: %v", err)
	}
}

func TestLimitsResolution(t *testing.T) {
	p := mustParse(t, `version: 1
defaults:
  limits:
    requests_per_second: 5
identities:
  nats:alice:
    limits:
      max_concurrent_jobs: 2
  nats-account:CLIENTS:
    limits:
      max_concurrent_jobs: 8
      burst: 7
`)
	got := p.Limits(alice)
	if got.MaxConcurrentJobs != 2 || got.RequestsPerSecond != 5 || got.Burst != 7 {
		t.Errorf("alice: %+v, want jobs 2 (her entry), rate 5 (defaults), burst 7 (account)", got)
	}
	got = p.Limits(bob)
	if got.MaxConcurrentJobs != 8 || got.RequestsPerSecond != 5 || got.Burst != 7 {
		t.Errorf("bob: %+v, want jobs 8, rate 5, burst 7", got)
	}
	got = p.Limits(mallory)
	def := DefaultLimits()
	if got.MaxConcurrentJobs != def.MaxConcurrentJobs || got.RequestsPerSecond != 5 || got.Burst != def.Burst {
		t.Errorf("mallory: %+v, want built-in jobs and burst, rate 5", got)
	}
}

func TestOperationNames(t *testing.T) {
	for _, o := range Operations() {
		got, err := ParseOperation(o.String())
		if err != nil || got != o {
			t.Errorf("ParseOperation(%q) = %v, %v", o, got, err)
		}
	}
	if _, err := ParseOperation("exec.any"); err == nil || !strings.Contains(err.Error(), "want one of exec, cp.read") {
		t.Errorf("ParseOperation(exec.any): %v", err)
	}
	if Operation(0).Valid() || numOps.Valid() {
		t.Error("zero or numOps operation is valid")
	}
}

// TestHolds: Holds answers whether any rule of the caller's grants the
// operation, whatever node, path or scope, and its refusals name neither
// a node nor an object.
func TestHolds(t *testing.T) {
	p := mustParse(t, decideFile)
	for _, c := range []struct {
		id     Identity
		op     Operation
		reason Reason // 0: held
	}{
		{alice, OpJobCancel, 0},          // scope own, every node
		{alice, OpForward, 0},            // gpu nodes only, one target
		{alice, OpCopyWrite, 0},          // under its paths only
		{bob, OpNodesList, 0},            // by its account's entry
		{bob, OpJobCancel, ReasonNoRule}, // its account grants no job.cancel
		{mallory, OpJobCancel, ReasonNoIdentity},
		{ops1, OpAdmin, 0},
		{ciTok, OpAdmin, ReasonNoRule},
	} {
		err := p.Holds(c.id, c.op)
		if c.reason == 0 {
			if err != nil {
				t.Errorf("%s %s: %v", c.id, c.op, err)
			}
			continue
		}
		var r *Refusal
		if !errors.As(err, &r) || r.Reason != c.reason {
			t.Errorf("%s %s: %v, want a %s refusal", c.id, c.op, err, c.reason)
			continue
		}
		if r.Node != "" || r.Object != (Object{}) || !strings.Contains(r.Error(), c.id.String()) || !strings.Contains(r.Error(), c.op.String()) {
			t.Errorf("%s %s: refusal %+v (%s)", c.id, c.op, r, r.Error())
		}
		if strings.Contains(r.Error(), " on ") && strings.Contains(r.Error(), "node-") {
			t.Errorf("%s %s: the refusal names a node: %s", c.id, c.op, r.Error())
		}
	}
}
