package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tetherfleet/tether/internal/identity"
	"github.com/tetherfleet/tether/internal/yamlerr"
	"github.com/tetherfleet/tether/protocol"
)

// MaxFileSize bounds a policy file, in bytes.
const MaxFileSize = 1 << 20

// Version is the only policy file version.
const Version = 1

// maxErrors bounds the errors one Parse reports; past it, their count.
const maxErrors = 50

// Bounds of limit values.
const (
	maxLimitCount = 1 << 20
	maxRate       = 1e6
)

// The file's shape. These types are also what Marshal encodes, so their
// yaml tags are the canonical form; the unexported fields hold what the
// parser found out (positions, parsed selectors) and are not encoded.

type fileDoc struct {
	Version    int                   `yaml:"version"`
	Defaults   *fileDefaults         `yaml:"defaults,omitempty"`
	Roles      map[string][]fileRule `yaml:"roles,omitempty"`
	Identities map[string]fileEntry  `yaml:"identities"`

	rolePos  map[string]position
	roleUsed map[string]bool
}

type fileDefaults struct {
	Limits *fileLimits `yaml:"limits,omitempty"`
}

type fileLimits struct {
	MaxConcurrentJobs *int     `yaml:"max_concurrent_jobs,omitempty"`
	RequestsPerSecond *float64 `yaml:"requests_per_second,omitempty"`
	Burst             *int     `yaml:"burst,omitempty"`

	pos  position
	path string
	from string // "path (file:line:col)": where a refusal says a limit is set
}

type fileEntry struct {
	Roles  []string    `yaml:"roles,flow,omitempty"`
	Rules  []fileRule  `yaml:"rules,omitempty"`
	Limits *fileLimits `yaml:"limits,omitempty"`

	key entryKey
	pos position
}

type fileRule struct {
	Nodes      string   `yaml:"nodes,omitempty"`
	Operations []string `yaml:"operations,flow"`
	Paths      []string `yaml:"paths,flow,omitempty"`
	Targets    []string `yaml:"targets,flow,omitempty"`
	RunAs      string   `yaml:"run_as,omitempty"`
	Scope      string   `yaml:"scope,omitempty"`

	ops opSet
	sel protocol.Selector
	pos position
}

// position is a place in a file: 1-based line and column.
type position struct {
	file      string
	line, col int
}

func (p position) String() string { return fmt.Sprintf("%s:%d:%d", p.file, p.line, p.col) }

// parser walks a YAML node tree, collecting every error with its position
// and field path.
type parser struct {
	file string
	errs []posError
}

// posError is an error and where it is, for sorting.
type posError struct {
	line, col int
	err       error
}

func (p *parser) pos(n *yaml.Node) position {
	return position{file: p.file, line: n.Line, col: n.Column}
}

// errf records an error at n about the field at fieldPath.
func (p *parser) errf(n *yaml.Node, fieldPath, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if fieldPath != "" {
		msg = fieldPath + ": " + msg
	}
	pe := posError{}
	if n != nil && n.Line > 0 {
		pe.line, pe.col = n.Line, n.Column
		msg = p.pos(n).String() + ": " + msg
	} else {
		msg = p.file + ": " + msg
	}
	pe.err = errors.New(msg)
	p.errs = append(p.errs, pe)
}

// err joins the errors in file order, at most maxErrors of them.
func (p *parser) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(p.errs, func(a, b posError) int {
		if a.line != b.line {
			return a.line - b.line
		}
		return a.col - b.col
	})
	errs := make([]error, 0, min(len(p.errs), maxErrors)+1)
	for i, pe := range p.errs {
		if i == maxErrors {
			errs = append(errs, fmt.Errorf("%s: %d more errors", p.file, len(p.errs)-maxErrors))
			break
		}
		errs = append(errs, pe.err)
	}
	return errors.Join(errs...)
}

// describe names what n holds, for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "…"
	}
	switch n.ShortTag() {
	case "!!null":
		return "null (an empty value)"
	case "!!bool":
		return "the boolean " + v
	case "!!int":
		return "the integer " + v
	case "!!float":
		return "the number " + v
	case "!!str":
		return "the string " + strconv.Quote(v)
	case "!!timestamp":
		return "the timestamp " + v
	}
	return "a " + n.ShortTag() + " value"
}

// plain refuses what the format leaves out of YAML: aliases, anchors and
// tags other than the core schema's.
func (p *parser) plain(n *yaml.Node, fieldPath string) bool {
	switch {
	case n.Kind == yaml.AliasNode:
		p.errf(n, fieldPath, "aliases (*%s) are not supported: write the value out, or share rules through a role", n.Value)
		return false
	case n.Anchor != "":
		p.errf(n, fieldPath, "anchors (&%s) are not supported: write the value out, or share rules through a role", n.Anchor)
		return false
	}
	switch n.ShortTag() {
	case "!!str", "!!int", "!!float", "!!bool", "!!null", "!!map", "!!seq", "!!timestamp":
		return true
	}
	p.errf(n, fieldPath, "tag %s is not supported", n.Tag)
	return false
}

// str returns n's value if it is a string.
func (p *parser) str(n *yaml.Node, fieldPath string) (string, bool) {
	if !p.plain(n, fieldPath) {
		return "", false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		p.errf(n, fieldPath, "want a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// integer returns n's value if it is an integer in [min, max].
func (p *parser) integer(n *yaml.Node, fieldPath string, min, max int) (int, bool) {
	if !p.plain(n, fieldPath) {
		return 0, false
	}
	var v int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		p.errf(n, fieldPath, "want an integer, got %s", describe(n))
		return 0, false
	}
	if v < int64(min) || v > int64(max) {
		p.errf(n, fieldPath, "%d is out of range: want %d to %d", v, min, max)
		return 0, false
	}
	return int(v), true
}

// number returns n's value if it is a finite number in (0, max].
func (p *parser) number(n *yaml.Node, fieldPath string, max float64) (float64, bool) {
	if !p.plain(n, fieldPath) {
		return 0, false
	}
	var v float64
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") || n.Decode(&v) != nil {
		p.errf(n, fieldPath, "want a number, got %s", describe(n))
		return 0, false
	}
	if math.IsNaN(v) || v <= 0 || v > max {
		p.errf(n, fieldPath, "%s is out of range: want a number above 0, at most %g", n.Value, max)
		return 0, false
	}
	return v, true
}

// pair is one key and value of a mapping.
// pair is a mapping entry; dup marks a repeated key (refused already), kept
// so that its value's own errors are reported too.
type pair struct {
	k, v *yaml.Node
	dup  bool
}

// pairs returns n's entries in file order, refusing non-string keys, merge
// keys and repeated keys (a repeated one is returned marked dup).
func (p *parser) pairs(n *yaml.Node, fieldPath string) ([]pair, bool) {
	if !p.plain(n, fieldPath) {
		return nil, false
	}
	if n.Kind != yaml.MappingNode {
		p.errf(n, fieldPath, "want a mapping, got %s", describe(n))
		return nil, false
	}
	out := make([]pair, 0, len(n.Content)/2)
	seen := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			p.errf(k, fieldPath, "merge keys (<<) are not supported")
			continue
		}
		if !p.plain(k, fieldPath) {
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			p.errf(k, fieldPath, "want a string key, got %s", describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			p.errf(k, fieldPath, "key %q appears twice (first at line %d, column %d)", k.Value, first.Line, first.Column)
			out = append(out, pair{k, v, true})
			continue
		}
		seen[k.Value] = k
		out = append(out, pair{k: k, v: v})
	}
	return out, true
}

// fields reads a mapping with a fixed set of keys: an unknown key is an
// error naming the known ones.
func (p *parser) fields(n *yaml.Node, fieldPath string, known ...string) (map[string]*yaml.Node, bool) {
	ps, ok := p.pairs(n, fieldPath)
	if !ok {
		return nil, false
	}
	out := make(map[string]*yaml.Node, len(ps))
	for _, kv := range ps {
		if kv.dup {
			continue
		}
		if !contains(known, kv.k.Value) {
			p.errf(kv.k, fieldPath, "unknown field %q (known: %s)", kv.k.Value, strings.Join(known, ", "))
			continue
		}
		out[kv.k.Value] = kv.v
	}
	return out, true
}

// seq returns n's items if it is a list.
func (p *parser) seq(n *yaml.Node, fieldPath string) ([]*yaml.Node, bool) {
	if !p.plain(n, fieldPath) {
		return nil, false
	}
	if n.Kind != yaml.SequenceNode {
		p.errf(n, fieldPath, "want a list, got %s", describe(n))
		return nil, false
	}
	return n.Content, true
}

// strings reads a non-empty list of distinct strings, each checked by check
// (which may return a normalised value).
func (p *parser) strings(n *yaml.Node, fieldPath string, check func(string) (string, error)) []string {
	items, ok := p.seq(n, fieldPath)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		p.errf(n, fieldPath, "the list is empty")
		return nil
	}
	out := make([]string, 0, len(items))
	seen := map[string]int{}
	for i, it := range items {
		ip := index(fieldPath, i)
		s, ok := p.str(it, ip)
		if !ok {
			continue
		}
		v, err := check(s)
		if err != nil {
			p.errf(it, ip, "%v", err)
			continue
		}
		if j, dup := seen[v]; dup {
			p.errf(it, ip, "%s is listed twice (also at index %d)", strconv.Quote(v), j)
			continue
		}
		seen[v] = i
		out = append(out, v)
	}
	return out
}

// simpleKey reports whether key matches ^[A-Za-z0-9_-]+$ (a path shows it
// bare). A loop, not a regexp: a package-level regexp is compiled at every
// start of the tether binary.
func simpleKey(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// child is the path of key in the mapping at fieldPath.
func child(fieldPath, key string) string {
	if simpleKey(key) {
		if fieldPath == "" {
			return key
		}
		return fieldPath + "." + key
	}
	return fieldPath + "[" + strconv.Quote(key) + "]"
}

func index(fieldPath string, i int) string { return fieldPath + "[" + strconv.Itoa(i) + "]" }

// decode parses data into a fileDoc, checking everything the format says.
func decode(file string, data []byte) (*fileDoc, error) {
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s: %d bytes, over the %d byte limit", file, len(data), MaxFileSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: the file is empty: a policy needs at least \"version: 1\" and \"identities:\"", file)
		}
		return nil, yamlerr.Syntax(file, data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, yamlerr.Syntax(file, data, err)
		}
		return nil, fmt.Errorf("%s:%d:%d: a second YAML document: a policy file holds one", file, extra.Line, extra.Column)
	}
	p := &parser{file: file}
	doc := p.document(&root)
	if err := p.err(); err != nil {
		return nil, err
	}
	return doc, nil
}

func (p *parser) document(root *yaml.Node) *fileDoc {
	doc := &fileDoc{rolePos: map[string]position{}, roleUsed: map[string]bool{}, Identities: map[string]fileEntry{}}
	n := root
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) != 1 {
			p.errf(n, "", "want one mapping at the top level")
			return doc
		}
		n = n.Content[0]
	}
	f, ok := p.fields(n, "", "version", "defaults", "roles", "identities")
	if !ok {
		return doc
	}
	if v, ok := f["version"]; !ok {
		p.errf(n, "", "version is missing: the file must start with \"version: %d\"", Version)
	} else if ver, ok := p.integer(v, "version", math.MinInt, math.MaxInt); ok {
		if ver != Version {
			p.errf(v, "version", "version %d is not supported: the only version is %d", ver, Version)
		}
		doc.Version = ver
	}
	if v, ok := f["defaults"]; ok {
		doc.Defaults = &fileDefaults{}
		if d, ok := p.fields(v, "defaults", "limits"); ok {
			if l, ok := d["limits"]; ok {
				doc.Defaults.Limits = p.limits(l, "defaults.limits")
			}
		}
	}
	if v, ok := f["roles"]; ok {
		doc.Roles = p.roles(v, doc)
	}
	refs := map[string][]ref{}
	if v, ok := f["identities"]; !ok {
		p.errf(n, "", "identities is missing: name who may do what (identities: {} denies everything)")
	} else {
		p.identities(v, doc, refs)
	}
	// Role references are checked once every role is known, so that roles
	// may be written after the identities that use them.
	for name, rs := range refs {
		if _, ok := doc.Roles[name]; ok {
			doc.roleUsed[name] = true
			continue
		}
		if _, ok := doc.rolePos[name]; ok {
			continue // defined, but with errors already reported
		}
		for _, r := range rs {
			p.errf(r.n, r.path, "role %q is not defined (roles: %s)", name, roleList(doc))
		}
	}
	return doc
}

// ref is a use of a role name.
type ref struct {
	n    *yaml.Node
	path string
}

func roleList(doc *fileDoc) string {
	if len(doc.rolePos) == 0 {
		return "none"
	}
	names := make([]string, 0, len(doc.rolePos))
	for n := range doc.rolePos {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func (p *parser) roles(n *yaml.Node, doc *fileDoc) map[string][]fileRule {
	ps, ok := p.pairs(n, "roles")
	if !ok {
		return nil
	}
	out := make(map[string][]fileRule, len(ps))
	for _, kv := range ps {
		name := kv.k.Value
		rp := child("roles", name)
		if err := checkRoleName(name); err != nil || kv.dup {
			if err != nil {
				p.errf(kv.k, "roles", "%v", err)
			}
			p.rules(kv.v, rp) // its own errors too; it is not defined
			continue
		}
		doc.rolePos[name] = p.pos(kv.k)
		before := len(p.errs)
		rules := p.rules(kv.v, rp)
		if len(p.errs) == before && rules != nil {
			out[name] = rules
		}
	}
	return out
}

// checkRoleName checks a role name: 1-63 bytes of [A-Za-z0-9._-], starting
// and ending with a letter or digit.
func checkRoleName(s string) error {
	if err := identity.CheckName(s, 63, "._-"); err != nil {
		return fmt.Errorf("role %w", err)
	}
	if c := s[len(s)-1]; c == '.' || c == '_' || c == '-' {
		return fmt.Errorf("role name %q must end with a letter or digit", s)
	}
	return nil
}

func (p *parser) rules(n *yaml.Node, fieldPath string) []fileRule {
	items, ok := p.seq(n, fieldPath)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		p.errf(n, fieldPath, "no rules: give at least one, or leave the key out")
		return nil
	}
	out := make([]fileRule, 0, len(items))
	for i, it := range items {
		if r, ok := p.rule(it, index(fieldPath, i)); ok {
			out = append(out, r)
		}
	}
	return out
}

func (p *parser) rule(n *yaml.Node, rp string) (fileRule, bool) {
	r := fileRule{pos: p.pos(n)}
	f, ok := p.fields(n, rp, "operations", "nodes", "paths", "targets", "run_as", "scope")
	if !ok {
		return r, false
	}
	before := len(p.errs)
	on, ok := f["operations"]
	if !ok {
		p.errf(n, rp, "operations is missing: list what the rule grants")
		return r, false
	}
	r.Operations = p.strings(on, rp+".operations", func(s string) (string, error) {
		o, err := ParseOperation(s)
		if err == nil {
			r.ops.add(o)
		}
		return s, err
	})
	// With no operation known, which keys the rule needs is unknown: their
	// values are still checked, so one run reports every error.
	unknownOps := r.ops == 0
	all := func(opInfo) bool { return true }

	// Each of these keys is required when some operation needs it, and
	// refused when none does: a key that grants nothing is a mistake.
	need := func(key string, needs func(opInfo) bool, why string) (*yaml.Node, bool) {
		v, present := f[key]
		if unknownOps {
			return v, present
		}
		switch wanted := r.ops.any(needs); {
		case wanted && !present:
			p.errf(n, rp, "%s is missing: %s %s", key, r.ops.names(needs), why)
		case !wanted && present:
			p.errf(v, child(rp, key), "none of the rule's operations (%s) takes %s", r.ops.names(all), key)
			return nil, false
		}
		return v, present
	}
	if v, ok := need("nodes", func(o opInfo) bool { return o.node }, "runs on nodes: give a label selector, or \"*\" for every node"); ok {
		if s, ok := p.str(v, rp+".nodes"); ok {
			r.Nodes = s
			switch {
			case s == "*":
			case strings.TrimSpace(s) == "":
				p.errf(v, rp+".nodes", "the selector is empty: write \"*\" for every node")
			default:
				sel, err := protocol.ParseSelector(s)
				if err != nil {
					p.errf(v, rp+".nodes", "%v", err)
				}
				r.sel = sel
			}
		}
	}
	if v, ok := need("paths", func(o opInfo) bool { return o.paths }, "copies files: give the path prefixes it may copy under"); ok {
		r.Paths = p.strings(v, rp+".paths", cleanPrefix)
	}
	if v, ok := need("targets", func(o opInfo) bool { return o.target }, "dials targets: give their names"); ok {
		r.Targets = p.strings(v, rp+".targets", func(s string) (string, error) { return s, protocol.ValidTargetName(s) })
	}
	if v, ok := need("run_as", func(o opInfo) bool { return o.runAs }, "runs as a local user: name it (root must be written as root)"); ok {
		if s, ok := p.str(v, rp+".run_as"); ok {
			if err := checkUser(s); err != nil {
				p.errf(v, rp+".run_as", "%v", err)
			}
			r.RunAs = s
		}
	}
	if v, ok := f["scope"]; ok {
		if !unknownOps && !r.ops.any(func(o opInfo) bool { return o.scoped }) {
			p.errf(v, rp+".scope", "none of the rule's operations (%s) has a scope: scope is for job.* and sandboxes.*", r.ops.names(all))
		} else if s, ok := p.str(v, rp+".scope"); ok {
			if s != "own" && s != "any" {
				p.errf(v, rp+".scope", "scope %q: want own or any", s)
			}
			r.Scope = s
		}
	}
	return r, len(p.errs) == before
}

// cleanPrefix checks a policy path prefix and returns it cleaned.
func cleanPrefix(s string) (string, error) {
	c, err := cleanPath(s)
	if err != nil {
		return "", fmt.Errorf("path prefix %w", err)
	}
	return c, nil
}

// cleanPath checks a path (absolute, no NUL, no ".." component) and returns
// it cleaned (repeated and trailing slashes and "." components dropped). It
// does not allocate for a path that is already clean.
func cleanPath(s string) (string, error) {
	switch {
	case s == "":
		return "", errors.New("is empty")
	case s[0] != '/':
		return "", fmt.Errorf("%s is not absolute", protocol.Clip(s))
	case strings.IndexByte(s, 0) >= 0:
		return "", fmt.Errorf("%s holds a NUL byte", protocol.Clip(s))
	}
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '.' && s[i+1] == '.' && s[i-1] == '/' && (i+2 == len(s) || s[i+2] == '/') {
			return "", fmt.Errorf("%s has a \"..\" component", protocol.Clip(s))
		}
	}
	return path.Clean(s), nil
}

func (p *parser) identities(n *yaml.Node, doc *fileDoc, refs map[string][]ref) {
	ps, ok := p.pairs(n, "identities")
	if !ok {
		return
	}
	for _, kv := range ps {
		ip := child("identities", kv.k.Value)
		key, err := parseEntryKey(kv.k.Value)
		if err != nil {
			p.errf(kv.k, "identities", "%v", err)
		}
		e := fileEntry{key: key, pos: p.pos(kv.k)}
		before := len(p.errs)
		if err != nil || kv.dup {
			before = -1 // its body is checked, never kept
		}
		if f, ok := p.fields(kv.v, ip, "roles", "rules", "limits"); ok {
			if v, ok := f["roles"]; ok {
				e.Roles = p.strings(v, ip+".roles", func(s string) (string, error) { return s, checkRoleName(s) })
				if v.Kind == yaml.SequenceNode {
					for i, it := range v.Content {
						if it.Kind == yaml.ScalarNode && it.ShortTag() == "!!str" && checkRoleName(it.Value) == nil {
							refs[it.Value] = append(refs[it.Value], ref{it, index(ip+".roles", i)})
						}
					}
				}
			}
			if v, ok := f["rules"]; ok {
				e.Rules = p.rules(v, ip+".rules")
			}
			if v, ok := f["limits"]; ok {
				e.Limits = p.limits(v, ip+".limits")
			}
		}
		if len(p.errs) == before {
			doc.Identities[kv.k.Value] = e
		}
	}
}

func (p *parser) limits(n *yaml.Node, lp string) *fileLimits {
	l := &fileLimits{pos: p.pos(n), path: lp}
	l.from = lp + " (" + l.pos.String() + ")"
	f, ok := p.fields(n, lp, "max_concurrent_jobs", "requests_per_second", "burst")
	if !ok {
		return l
	}
	if v, ok := f["max_concurrent_jobs"]; ok {
		if x, ok := p.integer(v, lp+".max_concurrent_jobs", 1, maxLimitCount); ok {
			l.MaxConcurrentJobs = &x
		}
	}
	if v, ok := f["requests_per_second"]; ok {
		if x, ok := p.number(v, lp+".requests_per_second", maxRate); ok {
			l.RequestsPerSecond = &x
		}
	}
	if v, ok := f["burst"]; ok {
		if x, ok := p.integer(v, lp+".burst", 1, maxLimitCount); ok {
			l.Burst = &x
		}
	}
	return l
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
