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
// Errors quote the selector (clipped, see Clip) and give the byte offset in
// it of what is wrong: the bad character, the unclosed '(', the empty term
// or value.
//
// The empty string parses to the empty Selector (no requirements); what it
// means is the caller's to say (tether.v1.nodes: no filter; an exec target:
// no selector given). Anything else must hold at least one requirement and
// no empty one: a blank selector (only spaces), a leading, trailing or
// doubled comma, a set with no value ("k in ()") and an empty value in a
// set ("k in (a,)", "k in (,)") are errors, as in Kubernetes for empty
// terms, so that a stray comma never widens (or, with notin, narrows) a
// selector silently. An empty label value is matched with "k=".
func ParseSelector(text string) (Selector, error) {
	if len(text) > MaxSelectorLen {
		return Selector{}, fmt.Errorf("selector is %d bytes, over the %d byte limit", len(text), MaxSelectorLen)
	}
	sel := Selector{text: text}
	if text == "" {
		return sel, nil
	}
	if strings.TrimSpace(text) == "" {
		return Selector{}, fmt.Errorf("selector is blank (%s of white space): give at least one requirement", plural(len(text), "byte"))
	}
	terms, err := splitTerms(text)
	if err != nil {
		return Selector{}, fmt.Errorf("selector %s: %w", Clip(text), err)
	}
	for _, t := range terms {
		r, err := parseRequirement(t)
		if err != nil {
			return Selector{}, fmt.Errorf("selector %s: %w", Clip(text), err)
		}
		sel.Reqs = append(sel.Reqs, r)
	}
	return sel, nil
}

// plural is "1 byte", "2 bytes": n and the noun in the right number.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// term is a piece of a selector's text: s, found at byte offset off of the
// whole selector.
type term struct {
	s   string
	off int
}

// sub returns t.s[i:j] as a term.
func (t term) sub(i, j int) term { return term{s: t.s[i:j], off: t.off + i} }

// trim returns t without its leading and trailing white space.
func (t term) trim() term {
	s := strings.TrimLeft(t.s, " \t\n\r\v\f")
	off := t.off + len(t.s) - len(s)
	return term{s: strings.TrimRight(s, " \t\n\r\v\f"), off: off}
}

// splitTerms splits at commas outside parentheses and trims each term. An
// empty term (nothing but white space before, between or after commas) is
// an error naming its offset, as are parentheses that do not pair up.
func splitTerms(text string) ([]term, error) {
	var out []term
	depth, start, open := 0, 0, 0
	flush := func(end int) error {
		t := term{s: text[start:end], off: start}.trim()
		if t.s == "" {
			return fmt.Errorf("empty term at offset %d (a leading, trailing or doubled comma)", start)
		}
		out = append(out, t)
		return nil
	}
	for i := 0; i < len(text); i++ {
		switch text[i] {
		case '(':
			depth++
			if depth > 1 {
				return nil, fmt.Errorf("nested '(' at offset %d", i)
			}
			open = i
		case ')':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("unbalanced ')' at offset %d", i)
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
		return nil, fmt.Errorf("unclosed '(' at offset %d", open)
	}
	if err := flush(len(text)); err != nil {
		return nil, err
	}
	return out, nil
}

// parseRequirement parses one trimmed term.
func parseRequirement(t term) (Requirement, error) {
	s := t.s
	if strings.HasPrefix(s, "!") {
		key, err := labelKey(t.sub(1, len(s)).trim())
		if err != nil {
			return Requirement{}, err
		}
		return Requirement{Key: key, Op: OpNotExists}, nil
	}
	if i := strings.Index(s, "!="); i >= 0 {
		return binaryReq(t.sub(0, i), t.sub(i+2, len(s)), OpNotEquals)
	}
	if i := strings.Index(s, "=="); i >= 0 {
		return binaryReq(t.sub(0, i), t.sub(i+2, len(s)), OpEquals)
	}
	if i := strings.IndexByte(s, '='); i >= 0 {
		return binaryReq(t.sub(0, i), t.sub(i+1, len(s)), OpEquals)
	}
	if i := strings.IndexByte(s, '('); i >= 0 {
		head := strings.Fields(s[:i])
		if len(head) != 2 || (head[1] != "in" && head[1] != "notin") {
			return Requirement{}, fmt.Errorf("%s at offset %d: want 'key in (v1,v2)' or 'key notin (v1,v2)'", Clip(s), t.off)
		}
		if !strings.HasSuffix(s, ")") {
			return Requirement{}, fmt.Errorf("%s at offset %d: text after ')'", Clip(s), t.off)
		}
		k := strings.Index(s, head[0])
		key, err := labelKey(t.sub(k, k+len(head[0])))
		if err != nil {
			return Requirement{}, err
		}
		op := OpIn
		if head[1] == "notin" {
			op = OpNotIn
		}
		set := t.sub(i+1, len(s)-1)
		if strings.TrimSpace(set.s) == "" {
			return Requirement{}, fmt.Errorf("empty set at offset %d: a set needs at least one value, as in '%s %s (v1,v2)'", set.off-1, head[0], head[1])
		}
		var vals []string
		for j := 0; j <= len(set.s); {
			end := strings.IndexByte(set.s[j:], ',')
			if end < 0 {
				end = len(set.s)
			} else {
				end += j
			}
			v := set.sub(j, end)
			if v.trim().s == "" {
				return Requirement{}, fmt.Errorf("empty value in the set at offset %d (a leading, trailing or doubled comma); match an empty label value with '%s='", v.off, head[0])
			}
			val, err := labelValue(v.trim())
			if err != nil {
				return Requirement{}, err
			}
			vals = append(vals, val)
			j = end + 1
		}
		return Requirement{Key: key, Op: op, Values: vals}, nil
	}
	if strings.ContainsAny(s, " \t()") {
		return Requirement{}, fmt.Errorf("%s at offset %d: want key, !key, key=value, key!=value, key in (...) or key notin (...)", Clip(s), t.off)
	}
	key, err := labelKey(t)
	if err != nil {
		return Requirement{}, err
	}
	return Requirement{Key: key, Op: OpExists}, nil
}

func binaryReq(k, v term, op Op) (Requirement, error) {
	key, err := labelKey(k.trim())
	if err != nil {
		return Requirement{}, err
	}
	val, err := labelValue(v.trim())
	if err != nil {
		return Requirement{}, err
	}
	return Requirement{Key: key, Op: op, Values: []string{val}}, nil
}

// labelKey checks t as a label key (ValidLabelKey); an error gives the
// offset of the first character a key may not hold, else of the key.
func labelKey(t term) (string, error) {
	if err := ValidLabelKey(t.s); err != nil {
		return "", atOffset(t, err, func(c byte) bool { return isAlnum(c) || c == '-' || c == '_' || c == '.' || c == '/' })
	}
	return t.s, nil
}

// labelValue checks t as a label value (ValidLabelValue), as labelKey does.
func labelValue(t term) (string, error) {
	if err := ValidLabelValue(t.s); err != nil {
		return "", atOffset(t, err, func(c byte) bool { return isAlnum(c) || c == '-' || c == '_' || c == '.' })
	}
	return t.s, nil
}

// atOffset places err, about t, in the selector: at the first byte of t
// that ok refuses, naming the character it starts (or the byte, when it
// starts no UTF-8 character), else at t's start.
func atOffset(t term, err error, ok func(byte) bool) error {
	for i := 0; i < len(t.s); i++ {
		if !ok(t.s[i]) {
			return fmt.Errorf("at offset %d: %s is not allowed: %w", t.off+i, CharAt(t.s, i), err)
		}
	}
	return fmt.Errorf("at offset %d: %w", t.off, err)
}
