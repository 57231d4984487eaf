package localpolicy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tetherfleet/tether/internal/yamlerr"
)

// maxErrors bounds the errors one Parse reports.
const maxErrors = 20

// Parse parses a local policy file's contents; file names it in errors and
// refusals. Every problem is reported, joined, each as "FILE:LINE:COL:
// what": an unknown or duplicate key, a value of the wrong type, a users
// entry that names not exactly one of name, uid and group, a copy root that
// is not absolute, a missing or unknown version, more than one document,
// an anchor or alias.
func Parse(file string, data []byte) (*Policy, error) {
	ps := &parser{file: file}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: empty file: a local policy needs at least \"version: %d\"", file, Version)
		}
		return nil, yamlerr.Syntax(file, data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		ps.errf(&extra, "", "a second YAML document; a local policy is one document")
	} else if !errors.Is(err, io.EOF) {
		return nil, yamlerr.Syntax(file, data, err)
	}
	ps.noAliases(&doc)
	if len(ps.errs) > 0 {
		return nil, ps.err()
	}
	p := &Policy{File: file}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	sawVersion := false
	ps.mapping(root, "", func(key string, k, v *yaml.Node) {
		switch key {
		case "version":
			sawVersion = true
			if n, ok := ps.integer(v, key); ok && n != Version {
				ps.errf(v, key, "version %d is not supported (only %d)", n, Version)
			}
		case "users":
			p.Users = ps.users(v)
		case "copy_roots":
			p.CopyRoots = ps.roots(v, key)
		case "exec":
			p.Exec = ps.boolean(v, key)
		case "shell":
			p.Shell = ps.boolean(v, key)
		case "forward":
			p.Forward = ps.boolean(v, key)
		case "targets":
			p.Targets = ps.strings(v, key)
			if p.Targets == nil {
				p.Targets = []string{}
			}
		default:
			ps.errf(k, "", "unknown key %q (known: version, users, copy_roots, exec, shell, forward, targets)", clip(key))
		}
	})
	if !sawVersion && root.Kind == yaml.MappingNode {
		ps.errf(root, "", "version: missing (write \"version: %d\")", Version)
	}
	if err := ps.err(); err != nil {
		return nil, err
	}
	return p, nil
}

// parser collects errors with their positions.
type parser struct {
	file string
	errs []string
}

func (ps *parser) errf(n *yaml.Node, field, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if field != "" {
		msg = field + ": " + msg
	}
	if n != nil && n.Line > 0 {
		msg = fmt.Sprintf("%s:%d:%d: %s", ps.file, n.Line, n.Column, msg)
	} else {
		msg = ps.file + ": " + msg
	}
	ps.errs = append(ps.errs, msg)
}

func (ps *parser) err() error {
	if len(ps.errs) == 0 {
		return nil
	}
	errs := ps.errs
	if len(errs) > maxErrors {
		errs = append(slices.Clip(errs[:maxErrors]), fmt.Sprintf("%s: %d more errors", ps.file, len(ps.errs)-maxErrors))
	}
	return errors.New(strings.Join(errs, "\n"))
}

// mapping calls fn for each key of the mapping n, in order, reporting a
// node that is not a mapping, a key that is not a string and a duplicate
// key (yaml.Node decoding does not catch those).
func (ps *parser) mapping(n *yaml.Node, field string, fn func(key string, k, v *yaml.Node)) {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		ps.errf(n, field, "must be a mapping, not %s", kindName(n))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || (k.Tag != "!!str" && k.Tag != "") {
			ps.errf(k, field, "keys must be strings")
			continue
		}
		if line, dup := seen[k.Value]; dup {
			ps.errf(k, field, "duplicate key %q (first at line %d)", clip(k.Value), line)
			continue
		}
		seen[k.Value] = k.Line
		fn(k.Value, k, deref(v))
	}
}

func (ps *parser) boolean(n *yaml.Node, field string) bool {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		ps.errf(n, field, "must be true or false, not %s", valueName(n))
		return false
	}
	return n.Value == "true" || n.Value == "True" || n.Value == "TRUE"
}

func (ps *parser) integer(n *yaml.Node, field string) (uint64, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		if v, err := strconv.ParseUint(n.Value, 10, 32); err == nil {
			return v, true
		}
	}
	ps.errf(n, field, "must be a number from 0 to %d, not %s", uint32(1<<32-1), valueName(n))
	return 0, false
}

// str returns a non-empty string scalar.
func (ps *parser) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" || n.Value == "" {
		ps.errf(n, field, "must be a non-empty string, not %s", valueName(n))
		return "", false
	}
	return n.Value, true
}

// strings returns a sequence of non-empty strings without duplicates.
func (ps *parser) strings(n *yaml.Node, field string) []string {
	if n.Kind != yaml.SequenceNode {
		ps.errf(n, field, "must be a list, not %s", valueName(n))
		return nil
	}
	var out []string
	for _, e := range n.Content {
		e = deref(e)
		s, ok := ps.str(e, field)
		if !ok {
			continue
		}
		if slices.Contains(out, s) {
			ps.errf(e, field, "%q listed twice", clip(s))
			continue
		}
		out = append(out, s)
	}
	return out
}

// roots returns a list of absolute directories, cleaned. A ".." component
// is refused, as in the coordinator's policy: /srv/../etc would grant /etc
// under a name that reads as /srv.
func (ps *parser) roots(n *yaml.Node, field string) []string {
	var out []string
	for i, s := range ps.strings(n, field) {
		at := n.Content[min(i, len(n.Content)-1)]
		if !filepath.IsAbs(s) || strings.ContainsRune(s, 0) {
			ps.errf(at, field, "%q is not an absolute path", clip(s))
			continue
		}
		if slices.Contains(strings.Split(s, "/"), "..") {
			ps.errf(at, field, "%q has a \"..\" component (it names %s; write that)", clip(s), clip(filepath.Clean(s)))
			continue
		}
		out = append(out, filepath.Clean(s))
	}
	return out
}

func (ps *parser) users(n *yaml.Node) []UserRule {
	if n.Kind != yaml.SequenceNode {
		ps.errf(n, "users", "must be a list of entries (- name: NAME, - uid: UID or - group: GROUP), not %s", valueName(n))
		return nil
	}
	var out []UserRule
	for _, e := range n.Content {
		e = deref(e)
		r := UserRule{Line: e.Line}
		set := 0
		ps.mapping(e, "users", func(key string, k, v *yaml.Node) {
			switch key {
			case "name":
				set++
				if s, ok := ps.str(v, "users: name"); ok {
					if bad := badName(s); bad != "" {
						ps.errf(v, "users: name", "%q: %s", clip(s), bad)
					}
					r.Name = s
				}
			case "uid":
				set++
				if u, ok := ps.integer(v, "users: uid"); ok {
					u32 := uint32(u)
					r.UID = &u32
				}
			case "group":
				set++
				if v.Kind == yaml.ScalarNode && v.Tag == "!!int" {
					if _, ok := ps.integer(v, "users: group"); ok {
						r.Group = v.Value
					}
				} else if s, ok := ps.str(v, "users: group"); ok {
					if bad := badName(s); bad != "" {
						ps.errf(v, "users: group", "%q: %s", clip(s), bad)
					}
					r.Group = s
				}
			case "copy_roots":
				r.CopyRoots = ps.roots(v, "users: copy_roots")
			default:
				ps.errf(k, "users", "unknown key %q (known: name, uid, group, copy_roots)", clip(key))
			}
		})
		if e.Kind == yaml.MappingNode && set != 1 {
			ps.errf(e, "users", "an entry names exactly one of name, uid and group (this one names %d)", set)
			continue
		}
		out = append(out, r)
	}
	return out
}

// badName says why s cannot be a user or group name, or "".
func badName(s string) string {
	if len(s) > 255 {
		return "longer than 255 bytes"
	}
	if s[0] == '-' || s[0] == '+' || s == "." || s == ".." {
		return "not a user or group name"
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || r == '/' || r == ':' || r == ',' || r == '\\' {
			return "not a user or group name"
		}
	}
	return ""
}

// noAliases reports every anchor and alias under n: a local policy says
// each thing where it applies (as the coordinator's policy does), and no
// alias can blow a small file up into a large tree.
func (ps *parser) noAliases(n *yaml.Node) {
	if n.Anchor != "" {
		ps.errf(n, "", "anchor &%s: anchors and aliases are not allowed in a local policy", clip(n.Anchor))
	}
	if n.Kind == yaml.AliasNode {
		ps.errf(n, "", "alias *%s: anchors and aliases are not allowed in a local policy", clip(n.Value))
		return
	}
	for _, c := range n.Content {
		ps.noAliases(c)
	}
}

// deref returns n; aliases were reported by noAliases, and the node they
// stand for is not looked at.
func deref(n *yaml.Node) *yaml.Node { return n }

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a scalar"
	case yaml.DocumentNode:
		return "an empty document"
	}
	return "nothing"
}

func valueName(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return strconv.Quote(clip(n.Value))
	}
	return kindName(n)
}

// clip bounds what an error repeats of the file.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
