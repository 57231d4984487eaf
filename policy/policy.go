package policy

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/tetherfleet/tether/internal/filetype"
	"github.com/tetherfleet/tether/protocol"
)

// Policy is a parsed, checked policy file, compiled for Decide. It is
// immutable and safe for concurrent use.
type Policy struct {
	name string
	doc  *fileDoc
	// index holds the entries by kind, then by the value callers are
	// matched on: string-keyed maps take the runtime's fast path.
	index    [numKinds]map[string]*entry
	nids     int
	defaults Limits
	warnings []string
	nroles   int
	nrules   int
}

// entry is one identities entry, compiled: for each operation, the rules
// that grant it, in decision order.
type entry struct {
	name   string // as written: "nats:alice"
	pos    position
	byOp   [numOps][]*rule
	limits *fileLimits
}

// rule is one rule, compiled. A role's rules are shared by every entry
// that lists the role.
type rule struct {
	ops     opSet
	all     bool // nodes: "*"
	sel     protocol.Selector
	nodes   string
	paths   []string
	targets []string
	runAs   string
	any     bool   // scope: any
	origin  string // its field path: roles.deployer[0], identities["nats:alice"].rules[1]
	pos     position
	name    string // String's answer, built once: every granted request names its rule
}

// Load reads and parses the policy file at path (Parse). A file over
// MaxFileSize is an error, and so is one whoever is not trusted could
// change: not a regular file, owned by neither root nor the process's
// effective uid, or writable by its group or others (the node's local
// policy, agent/localpolicy, has the same rules). The checks are made on
// the open descriptor, so the file checked is the file read.
func Load(path string) (*Policy, error) {
	// O_NONBLOCK: a FIFO put in the file's place opens at once (and is
	// then refused as not regular) instead of blocking the reload, and
	// with it every later SIGHUP and the shutdown, until a writer comes.
	// It changes nothing for a regular file.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if err := checkFile(path, fi, uint32(os.Geteuid())); err != nil {
		return nil, err
	}
	if fi.Size() > MaxFileSize {
		return nil, fmt.Errorf("%s: %d bytes, over the %d byte limit", path, fi.Size(), MaxFileSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("policy: read %s: %w", path, err)
	}
	return Parse(path, data)
}

// checkFile refuses a policy file that is not regular, not owned by root
// or euid, or writable by its group or others: whoever could write it
// could grant themselves everything.
func checkFile(path string, fi os.FileInfo, euid uint32) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("policy: %s is not a regular file (%s)", path, filetype.Of(fi.Mode()))
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("policy: %s: cannot tell its owner", path)
	}
	if st.Uid != 0 && st.Uid != euid {
		return fmt.Errorf("policy: %s is owned by uid %d (mode %04o): it must be owned by root or by the uid this runs as (%d), or its owner could grant themselves everything; chown it", path, st.Uid, fi.Mode().Perm(), euid)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		who := "its group"
		switch {
		case perm&0o022 == 0o022:
			who = "its group and anyone"
		case perm&0o002 != 0:
			who = "anyone"
		}
		return fmt.Errorf("policy: %s (owner uid %d) is writable by %s (mode %04o): it must be writable by its owner only, or whoever can write it can grant themselves everything; chmod go-w it", path, st.Uid, who, perm)
	}
	return nil
}

// Parse parses a policy file's contents; name is the file's name, used in
// errors as name:LINE:COLUMN. The error reports every problem found (see
// the package doc), one per line.
func Parse(name string, data []byte) (*Policy, error) {
	doc, err := decode(name, data)
	if err != nil {
		return nil, err
	}
	return compile(name, doc), nil
}

// compile indexes a checked document.
func compile(name string, doc *fileDoc) *Policy {
	p := &Policy{name: name, doc: doc, nids: len(doc.Identities), nroles: len(doc.Roles)}
	for k := range p.index {
		p.index[k] = map[string]*entry{}
	}
	p.defaults = DefaultLimits()
	if doc.Defaults != nil && doc.Defaults.Limits != nil {
		p.defaults = doc.Defaults.Limits.over(p.defaults)
	}
	compileRules := func(rs []fileRule, origin func(int) string) []*rule {
		out := make([]*rule, len(rs))
		for i, fr := range rs {
			out[i] = &rule{
				ops: fr.ops, all: fr.Nodes == "*", sel: fr.sel, nodes: fr.Nodes,
				paths: fr.Paths, targets: fr.Targets, runAs: fr.RunAs, any: fr.Scope == "any",
				origin: origin(i), pos: fr.pos,
			}
			out[i].name = out[i].origin + " (" + out[i].pos.String() + ")"
		}
		p.nrules += len(rs)
		return out
	}
	roles := make(map[string][]*rule, len(doc.Roles))
	for _, rn := range sortedKeys(doc.Roles) {
		roles[rn] = compileRules(doc.Roles[rn], func(i int) string { return index(child("roles", rn), i) })
		if !doc.roleUsed[rn] {
			p.warnings = append(p.warnings, fmt.Sprintf("%s: role %s is not used by any identity", doc.rolePos[rn], rn))
		}
	}
	for _, en := range sortedKeys(doc.Identities) {
		fe := doc.Identities[en]
		e := &entry{name: en, pos: fe.pos, limits: fe.Limits}
		ip := child("identities", en)
		all := compileRules(fe.Rules, func(i int) string { return index(ip+".rules", i) })
		for _, rn := range fe.Roles {
			all = append(all, roles[rn]...)
		}
		for _, r := range all {
			for o := OpExec; o < numOps; o++ {
				if r.ops.has(o) {
					e.byOp[o] = append(e.byOp[o], r)
				}
			}
		}
		if len(fe.Roles) == 0 && len(fe.Rules) == 0 && fe.Limits == nil {
			p.warnings = append(p.warnings, fmt.Sprintf("%s: %s grants nothing (no roles, rules or limits)", fe.pos, ip))
		}
		p.index[fe.key.kind][fe.key.value] = e
	}
	if len(doc.Identities) == 0 {
		p.warnings = append(p.warnings, fmt.Sprintf("%s: identities is empty: the policy refuses everything", name))
	}
	return p
}

// Name returns the name the policy was parsed under (Load: its path).
func (p *Policy) Name() string { return p.name }

// Warnings lists what is valid but probably a mistake: unused roles,
// entries that grant nothing, no identities. Each names its position.
func (p *Policy) Warnings() []string { return slices.Clone(p.warnings) }

// Counts returns how many identity entries, roles and rules the policy has
// (a role's rules counted once).
func (p *Policy) Counts() (identities, roles, rules int) {
	return p.nids, p.nroles, p.nrules
}

// Node is the node an operation runs on, as the coordinator knows it.
type Node struct {
	// ID is the node's id; empty for an operation that is not on a node.
	ID string
	// Labels are the node's labels, matched by rules' selectors. Decide
	// only reads the map.
	Labels map[string]string
}

// Object is what an operation acts on; each operation reads its own field.
type Object struct {
	// Path is the node path of cp.read (the source) and cp.write (the
	// destination): absolute, without ".." components.
	Path string
	// Target is forward's target name.
	Target string
	// Owner is the Identity.String of whoever owns the job (job.*) or run
	// (sandboxes.*), recorded when the job or lease was created. An
	// operation that creates a run (opening a new lease, registering under
	// a new run) passes the caller's own string. Empty means unknown: only
	// scope any grants it.
	Owner string
}

// Grant is an allowed operation: the rule that allowed it and what it says.
type Grant struct {
	// RunAs is the local user the operation runs as (exec, shell, cp.*,
	// ssh); empty for the others.
	RunAs string
	// Targets are the rule's targets (forward), filled by Grants only.
	Targets []string
	// Paths are the rule's path prefixes (cp.read, cp.write), filled by
	// Decide: absolute, clean, as the policy lists them. The
	// coordinator hands them to the node, which confines the copy
	// beneath them (protocol.CopyParams.Roots).
	Paths []string
	rule  *rule
}

// Rule names the rule that granted the operation, for audit:
// "roles.deployer[0] (policy.yaml:9:7)".
func (g Grant) Rule() string {
	if g.rule == nil {
		return ""
	}
	return g.rule.String()
}

func (r *rule) String() string { return r.name }

// ErrRefused matches every *Refusal with errors.Is.
var ErrRefused = errors.New("policy: refused")

// Reason is why a Refusal refused.
type Reason uint8

// Reasons, with the metric label each is counted under.
const (
	ReasonNoIdentity Reason = iota + 1 // no entry of the policy names the caller ("no_identity")
	ReasonNoRule                       // no rule of the caller's grants it ("no_rule")
	ReasonBadRequest                   // the request cannot be decided: no node, a relative path... ("bad_request")
	ReasonRateLimit                    // over the caller's requests_per_second and burst ("rate_limit")
	ReasonJobLimit                     // at the caller's max_concurrent_jobs ("job_limit")
	numReasons
)

var reasonNames = [numReasons]string{
	ReasonNoIdentity: "no_identity", ReasonNoRule: "no_rule", ReasonBadRequest: "bad_request",
	ReasonRateLimit: "rate_limit", ReasonJobLimit: "job_limit",
}

// String returns the reason's metric label, or "reason(N)".
func (r Reason) String() string {
	if r >= ReasonNoIdentity && r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Refusal is a refused operation. Its message names the identity, the
// operation, the node and object, and the rule that is missing (with the
// caller's own rules that came closest).
type Refusal struct {
	Identity Identity
	Op       Operation
	Node     string // the node id; empty for an operation not on a node
	Object   Object
	Reason   Reason
	msg      string
}

func (r *Refusal) Error() string { return r.msg }

// Is makes errors.Is(err, ErrRefused) true for every Refusal.
func (r *Refusal) Is(target error) bool { return target == ErrRefused }

// Decide reports whether id may do op on node to obj: a Grant, or a
// *Refusal. Node matters for operations on a node (Operation.OnNode) and
// must then have an ID; obj's fields matter as Object says. It does not
// count: Store.Decide counts refusals.
func (p *Policy) Decide(id Identity, op Operation, node Node, obj Object) (Grant, error) {
	if !op.Valid() {
		return Grant{}, p.bad(id, op, node, obj, "it is not an operation the policy knows")
	}
	info := &ops[op]
	if info.node && node.ID == "" {
		return Grant{}, p.bad(id, op, node, obj, "the request names no node")
	}
	var cpath string
	if info.paths {
		c, err := cleanPath(obj.Path)
		if err != nil {
			return Grant{}, p.bad(id, op, node, obj, "the path "+err.Error())
		}
		cpath = c
	}
	if info.target && obj.Target == "" {
		return Grant{}, p.bad(id, op, node, obj, "the request names no target")
	}
	var buf [3]*entry
	ents := p.lookup(id, &buf)
	if len(ents) == 0 {
		return Grant{}, p.refuse(id, op, node, obj, ReasonNoIdentity, p.noIdentity(id))
	}
	own := info.scoped && id.owns(obj.Owner)
	for _, e := range ents {
		for _, r := range e.byOp[op] {
			if info.node && !r.all && !r.sel.Matches(node.Labels) {
				continue
			}
			if info.paths && !r.under(cpath) {
				continue
			}
			if info.target && !contains(r.targets, obj.Target) {
				continue
			}
			if info.scoped && !r.any && !own {
				continue
			}
			g := Grant{RunAs: r.runAs, rule: r}
			if info.paths {
				g.Paths = slices.Clone(r.paths)
			}
			return g, nil
		}
	}
	return Grant{}, p.refuse(id, op, node, obj, ReasonNoRule, p.missing(ents, op, node, cpath, obj, own))
}

// Grants returns every grant of op to id on node, in decision order, for
// operations that take no path, target or owner (ssh: each grant's RunAs
// is a login the caller may use there; forward: each grant's Targets).
// It refuses as Decide does when nothing grants op there, and refuses
// operations that need an object (cp.*, job.*, sandboxes.*) with
// ReasonBadRequest: use Decide for those.
func (p *Policy) Grants(id Identity, op Operation, node Node) ([]Grant, error) {
	if !op.Valid() {
		return nil, p.bad(id, op, node, Object{}, "it is not an operation the policy knows")
	}
	info := &ops[op]
	if info.paths || info.scoped {
		return nil, p.bad(id, op, node, Object{}, "it needs an object; decide it one object at a time")
	}
	if info.node && node.ID == "" {
		return nil, p.bad(id, op, node, Object{}, "the request names no node")
	}
	var buf [3]*entry
	ents := p.lookup(id, &buf)
	if len(ents) == 0 {
		return nil, p.refuse(id, op, node, Object{}, ReasonNoIdentity, p.noIdentity(id))
	}
	var out []Grant
	for _, e := range ents {
		for _, r := range e.byOp[op] {
			if info.node && !r.all && !r.sel.Matches(node.Labels) {
				continue
			}
			out = append(out, Grant{RunAs: r.runAs, Targets: slices.Clone(r.targets), rule: r})
		}
	}
	if len(out) == 0 {
		return nil, p.refuse(id, op, node, Object{}, ReasonNoRule, p.missing(ents, op, node, "", Object{}, false))
	}
	return out, nil
}

// Peek is Grants: a Policy counts nothing (Store.Peek is the uncounted
// Grants of a Store).
func (p *Policy) Peek(id Identity, op Operation, node Node) ([]Grant, error) {
	return p.Grants(id, op, node)
}

// lookup returns the entries that match id, in decision order: a NATS
// user's key entry, name entry and account entry; another caller's one
// entry.
func (p *Policy) lookup(id Identity, buf *[3]*entry) []*entry {
	out := buf[:0]
	add := func(k Kind, v string) {
		if v == "" || !k.Valid() {
			return
		}
		if e := p.index[k][v]; e != nil && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	if id.Kind == KindNATS {
		add(KindNATS, id.Key)
		add(KindNATS, id.Name)
		add(KindNATSAccount, id.Account)
		return out
	}
	add(id.Kind, id.Name)
	if id.Kind == KindSSHPrincipal {
		for i, pr := range id.Principals {
			if i == MaxPrincipals {
				break
			}
			add(KindSSHPrincipal, pr)
		}
	}
	return out
}

// under reports whether the clean absolute path c is one of r's prefixes or
// below one, on component boundaries.
func (r *rule) under(c string) bool {
	for _, pre := range r.paths {
		if underPrefix(c, pre) {
			return true
		}
	}
	return false
}

func underPrefix(c, pre string) bool {
	if pre == "/" {
		return true
	}
	return strings.HasPrefix(c, pre) && (len(c) == len(pre) || c[len(pre)] == '/')
}

// subject is the start of a refusal's message: who may not do what, where.
func subject(id Identity, op Operation, node Node, obj Object) string {
	var b strings.Builder
	b.WriteString(id.String())
	b.WriteString(" may not ")
	b.WriteString(op.String())
	if op.Valid() {
		info := &ops[op]
		switch {
		case info.paths:
			b.WriteString(" " + clipQuote(obj.Path))
		case info.target:
			b.WriteString(" to target " + clipQuote(obj.Target))
		case info.scoped && obj.Owner == "":
			b.WriteString(" a " + info.noun + " with no recorded owner")
		case info.scoped && id.owns(obj.Owner):
			b.WriteString(" its own " + info.noun)
		case info.scoped:
			// Not the owner's name: a caller probing ids must not learn
			// whose they are. Refusal.Object has it, for the log.
			b.WriteString(" another identity's " + info.noun)
		}
	}
	if node.ID != "" {
		b.WriteString(" on " + node.ID)
	}
	return b.String()
}

func (p *Policy) refuse(id Identity, op Operation, node Node, obj Object, reason Reason, why string) *Refusal {
	return &Refusal{Identity: id, Op: op, Node: node.ID, Object: obj, Reason: reason, msg: subject(id, op, node, obj) + ": " + why}
}

func (p *Policy) bad(id Identity, op Operation, node Node, obj Object, why string) *Refusal {
	return p.refuse(id, op, node, obj, ReasonBadRequest, why)
}

// noIdentity explains that no entry names the caller, listing what was
// looked for.
func (p *Policy) noIdentity(id Identity) string {
	var looked []string
	if id.Kind == KindNATS {
		if id.Key != "" {
			looked = append(looked, "nats:"+id.Key)
		}
		if id.Name != "" {
			looked = append(looked, "nats:"+id.Name)
		}
		if id.Account != "" {
			looked = append(looked, "nats-account:"+id.Account)
		}
	} else if id.Kind == KindSSHPrincipal {
		for i, pr := range id.Principals {
			if i == MaxPrincipals {
				break
			}
			looked = append(looked, "ssh-principal:"+pr)
		}
		if len(id.Principals) == 0 && id.Name != "" {
			looked = append(looked, "ssh-principal:"+id.Name)
		}
	} else if id.Name != "" {
		looked = append(looked, id.Kind.String()+":"+id.Name)
	}
	if len(looked) == 0 {
		return fmt.Sprintf("the identity has no name to look up in policy %s; everything not granted is refused", p.name)
	}
	return fmt.Sprintf("policy %s has no entry for it (looked for %s); everything not granted is refused", p.name, strings.Join(looked, ", "))
}

// maxHints bounds the rules a refusal lists as the closest grants.
const maxHints = 3

// missing explains which part of the caller's rules for op did not match:
// the node, then the path, the target, the scope, listing the rules that
// passed the parts before.
func (p *Policy) missing(ents []*entry, op Operation, node Node, cpath string, obj Object, own bool) string {
	info := &ops[op]
	var cands []*rule
	for _, e := range ents {
		cands = append(cands, e.byOp[op]...)
	}
	if len(cands) == 0 {
		names := make([]string, len(ents))
		for i, e := range ents {
			names[i] = e.name + " (" + e.pos.String() + ")"
		}
		return fmt.Sprintf("no rule grants %s to it: its %s %s grant%s no %s", op, plural(len(ents), "entry", "entries"), strings.Join(names, ", "), sIf(len(ents) == 1), op)
	}
	filter := func(rs []*rule, keep func(*rule) bool) []*rule {
		var out []*rule
		for _, r := range rs {
			if keep(r) {
				out = append(out, r)
			}
		}
		return out
	}
	if info.node {
		on := filter(cands, func(r *rule) bool { return r.all || r.sel.Matches(node.Labels) })
		if len(on) == 0 {
			return fmt.Sprintf("no rule grants %s on a node with %s's labels (%s); %s is granted on %s", op, node.ID, formatLabels(node.Labels), op,
				hints(cands, func(r *rule) string { return "nodes " + strconv.Quote(r.nodes) }))
		}
		cands = on
	}
	where := ""
	if info.node {
		where = " on " + node.ID
	}
	if info.paths {
		in := filter(cands, func(r *rule) bool { return r.under(cpath) })
		if len(in) == 0 {
			return fmt.Sprintf("no rule grants %s under %s%s; %s%s is granted under %s", op, clipQuote(cpath), where, op, where,
				hints(cands, func(r *rule) string { return strings.Join(r.paths, ", ") }))
		}
		cands = in
	}
	if info.target {
		to := filter(cands, func(r *rule) bool { return contains(r.targets, obj.Target) })
		if len(to) == 0 {
			return fmt.Sprintf("no rule grants %s to target %s%s; %s%s is granted to targets %s", op, clipQuote(obj.Target), where, op, where,
				hints(cands, func(r *rule) string { return strings.Join(r.targets, ", ") }))
		}
		cands = to
	}
	if info.scoped && !own {
		whose := "other identities' " + info.noun + "s"
		if obj.Owner == "" {
			whose = info.noun + "s with no recorded owner"
		}
		return fmt.Sprintf("no rule grants %s on %s (that needs scope: any)%s; %s is granted on its own %ss only, by %s", op, whose, where, op, info.noun,
			hints(cands, nil))
	}
	// Unreachable: a rule passing every part would have granted.
	return fmt.Sprintf("no rule grants %s", op)
}

// hints lists up to maxHints rules as "WHAT (ORIGIN, POSITION)".
func hints(rs []*rule, what func(*rule) string) string {
	var parts []string
	for i, r := range rs {
		if i == maxHints {
			parts = append(parts, fmt.Sprintf("and %d more", len(rs)-maxHints))
			break
		}
		s := r.origin + ", " + r.pos.String()
		if what != nil {
			s = what(r) + " (" + s + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// maxLabelsShown bounds the labels a message lists.
const maxLabelsShown = 8

func formatLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for i, k := range keys {
		if i == maxLabelsShown {
			parts = append(parts, fmt.Sprintf("and %d more", len(keys)-maxLabelsShown))
			break
		}
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ", ")
}

// maxQuoted bounds a path or name quoted in a message, in bytes.
const maxQuoted = 256

func clipQuote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "…"
	}
	return strconv.Quote(s)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func sIf(b bool) string {
	if b {
		return "s"
	}
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Holds reports whether some rule of id's grants op at all, on any node,
// path, target or scope: nil, or a *Refusal (ReasonNoIdentity when no
// entry names id, else ReasonNoRule) whose message names the identity,
// the operation and the entries that grant no op, and nothing about any
// node or object. A handler asks it before it looks up what a request
// names, so that a caller who may never do op learns nothing about whether
// that exists (tether.v1.cancel's job ids). Holds is not Decide: a nil
// answer still needs Decide on the object itself.
func (p *Policy) Holds(id Identity, op Operation) error {
	if !op.Valid() {
		return p.bad(id, op, Node{}, Object{}, "it is not an operation the policy knows")
	}
	var buf [3]*entry
	ents := p.lookup(id, &buf)
	if len(ents) == 0 {
		return p.refuse(id, op, Node{}, Object{}, ReasonNoIdentity, p.noIdentity(id))
	}
	for _, e := range ents {
		if len(e.byOp[op]) > 0 {
			return nil
		}
	}
	return p.refuse(id, op, Node{}, Object{}, ReasonNoRule, p.missing(ents, op, Node{}, "", Object{}, false))
}
