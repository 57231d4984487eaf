package protocol

import (
	"fmt"
	"slices"
	"strings"
)

// MaxSelectorLen bounds a selector's text, in bytes.
const MaxSelectorLen = 4096

// Op is a selector requirement's operator.
type Op int

// Selector operators, in Kubernetes' set-based selector syntax.
const (
	OpEquals    Op = iota // key=value or key==value
	OpNotEquals           // key!=value (also true when key is absent)
	OpIn                  // key in (a,b)
	OpNotIn               // key notin (a,b) (also true when key is absent)
	OpExists              // key
	OpNotExists           // !key
)

// Requirement is one comma-separated term of a selector.
type Requirement struct {
	Key    string
	Op     Op
	Values []string
}

// Matches reports whether labels satisfy r.
func (r Requirement) Matches(labels map[string]string) bool {
	v, ok := labels[r.Key]
	switch r.Op {
	case OpEquals:
		return ok && v == r.Values[0]
	case OpNotEquals:
		return !ok || v != r.Values[0]
	case OpIn:
		return ok && slices.Contains(r.Values, v)
	case OpNotIn:
		return !ok || !slices.Contains(r.Values, v)
	case OpExists:
		return ok
	case OpNotExists:
		return !ok
	}
	return false
}

// Selector is a conjunction of requirements. The zero Selector matches
// everything.
type Selector struct {
	Reqs []Requirement
	text string
}

// String returns the selector's source text.
func (s Selector) String() string { return s.text }

// Empty reports whether s has no requirements.
func (s Selector) Empty() bool { return len(s.Reqs) == 0 }

// Matches reports whether labels satisfy every requirement of s.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s.Reqs {
		if !r.Matches(labels) {
			return false
		}
	}
	return true
}

// ParseSelector parses a label selector: comma-separated requirements, all of
// which must hold. Each requirement is one of
//
//	key=value  key==value  key!=value  key in (v1,v2)  key notin (v1,v2)  key  !key
//
// Keys and values follow the label rules (ValidLabelKey, ValidLabelValue).
// Errors name the offending requirement and its byte offset.
//
// The empty string parses to the empty Selector (no requirements); what it
// means is the caller's to say (tether.v1.nodes: no filter; an exec target:
// no selector given). Anything else must hold at least one requirement and
// no empty one: a blank selector (only spaces), a leading, trailing or
// doubled comma, and a set with no value ("k in ()") are errors, as in
// Kubernetes, so that a stray comma never widens a selector to every node.
func ParseSelector(text string) (Selector, error) {
	if len(text) > MaxSelectorLen {
		return Selector{}, fmt.Errorf("selector is %d bytes, over the %d byte limit", len(text), MaxSelectorLen)
	}
	sel := Selector{text: text}
	if text == "" {
		return sel, nil
	}
	if strings.TrimSpace(text) == "" {
		return Selector{}, fmt.Errorf("selector is blank (%d bytes of white space): give at least one requirement", len(text))
	}
	terms, err := splitTerms(text)
	if err != nil {
		return Selector{}, err
	}
	for _, t := range terms {
		r, err := parseRequirement(t.s)
		if err != nil {
			return Selector{}, fmt.Errorf("selector %q at offset %d: %w", t.s, t.off, err)
		}
		sel.Reqs = append(sel.Reqs, r)
	}
	return sel, nil
}

type term struct {
	s   string
	off int
}

// splitTerms splits at commas outside parentheses and trims each term. An
// empty term (nothing but white space before, between or after commas) is
// an error naming its offset.
func splitTerms(text string) ([]term, error) {
	var out []term
	depth, start := 0, 0
	flush := func(end int) error {
		raw := text[start:end]
		s := strings.TrimSpace(raw)
		if s == "" {
			return fmt.Errorf("selector %s: empty term at offset %d (a leading, trailing or doubled comma)", Clip(text), start)
		}
		out = append(out, term{s: s, off: start + strings.Index(raw, s)})
		return nil
	}
	for i := 0; i < len(text); i++ {
		switch text[i] {
		case '(':
			depth++
			if depth > 1 {
				return nil, fmt.Errorf("selector: nested '(' at offset %d", i)
			}
		case ')':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("selector: unbalanced ')' at offset %d", i)
			}
		case ',':
			if depth == 0 {
				if err := flush(i); err != nil {
					return nil, err
				}
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("selector: unclosed '('")
	}
	if err := flush(len(text)); err != nil {
		return nil, err
	}
	return out, nil
}

func parseRequirement(t string) (Requirement, error) {
	if strings.HasPrefix(t, "!") {
		key := strings.TrimSpace(t[1:])
		if err := ValidLabelKey(key); err != nil {
			return Requirement{}, err
		}
		return Requirement{Key: key, Op: OpNotExists}, nil
	}
	if i := strings.Index(t, "!="); i >= 0 {
		return binaryReq(t[:i], t[i+2:], OpNotEquals)
	}
	if i := strings.Index(t, "=="); i >= 0 {
		return binaryReq(t[:i], t[i+2:], OpEquals)
	}
	if i := strings.IndexByte(t, '='); i >= 0 {
		return binaryReq(t[:i], t[i+1:], OpEquals)
	}
	if i := strings.IndexByte(t, '('); i >= 0 {
		head := strings.Fields(t[:i])
		if len(head) != 2 || (head[1] != "in" && head[1] != "notin") {
			return Requirement{}, fmt.Errorf("want 'key in (v1,v2)' or 'key notin (v1,v2)'")
		}
		if !strings.HasSuffix(t, ")") {
			return Requirement{}, fmt.Errorf("text after ')'")
		}
		if err := ValidLabelKey(head[0]); err != nil {
			return Requirement{}, err
		}
		op := OpIn
		if head[1] == "notin" {
			op = OpNotIn
		}
		set := t[i+1 : len(t)-1]
		if strings.TrimSpace(set) == "" {
			return Requirement{}, fmt.Errorf("a set needs at least one value: want '%s %s (v1,v2)'", head[0], head[1])
		}
		var vals []string
		for _, v := range strings.Split(set, ",") {
			v = strings.TrimSpace(v)
			if err := ValidLabelValue(v); err != nil {
				return Requirement{}, err
			}
			vals = append(vals, v)
		}
		return Requirement{Key: head[0], Op: op, Values: vals}, nil
	}
	if strings.ContainsAny(t, " \t()") {
		return Requirement{}, fmt.Errorf("want key, !key, key=value, key!=value, key in (...) or key notin (...)")
	}
	if err := ValidLabelKey(t); err != nil {
		return Requirement{}, err
	}
	return Requirement{Key: t, Op: OpExists}, nil
}

func binaryReq(k, v string, op Op) (Requirement, error) {
	k, v = strings.TrimSpace(k), strings.TrimSpace(v)
	if err := ValidLabelKey(k); err != nil {
		return Requirement{}, err
	}
	if err := ValidLabelValue(v); err != nil {
		return Requirement{}, err
	}
	return Requirement{Key: k, Op: op, Values: []string{v}}, nil
}
