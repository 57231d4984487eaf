// Package monitoring checks Tether's monitoring files (the Grafana
// dashboard in deploy/grafana and the Prometheus rules and rule tests in
// deploy/prometheus) for their shape and lists the metric names they use,
// so that a test can hold them against the metrics the binaries register.
//
// Dashboards are checked against Grafana's own dashboard schema through
// the Grafana Foundation SDK's strict decoder (Apache-2.0; its model is
// generated from Grafana's schema), then for what the SDK leaves open:
// unique panel ids, the grid, the data source variable, targets with an
// expr.
//
// It does not evaluate PromQL: Prometheus's own parser lives in a module
// whose dependencies would move the tunnel's (gorilla/websocket) forward,
// so MetricNames is a tokenizer that knows PromQL's lexical grammar well
// enough to tell metric names from functions, aggregations, keywords,
// label lists, strings and durations. promtool checks the rules' syntax
// (make monitoring-check), and the dashboard's expressions too when it is
// on PATH (see the catalog test in cmd/tether/internal/cli).
package monitoring

import (
	"fmt"
	"slices"
	"strings"
)

// aggregations are PromQL's aggregation operators: followed by "(", "by"
// or "without" they are no metric names.
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// keywords are PromQL's binary operators and modifiers spelled as words;
// they are never metric names.
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"inf": true, "nan": true,
}

// labelListers are the modifiers followed by a parenthesized label list.
var labelListers = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// MetricNames returns the metric names expr selects, sorted and without
// duplicates: every bare selector name and every __name__="..." matcher
// (a regular-expression matcher on __name__ is an error: its names cannot
// be checked). Grafana variables ($var, ${var}, $__rate_interval) are
// skipped wherever they stand. The error names the offset and what was
// wrong: an unterminated string, unbalanced brackets, or a character that
// is no PromQL.
func MetricNames(expr string) ([]string, error) {
	l := lexer{s: expr}
	names := map[string]bool{}
	var stack []byte // open brackets: ( or [
	for {
		l.skipSpace()
		if l.eof() {
			break
		}
		start := l.i
		c := l.s[l.i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			if err := l.skipString(); err != nil {
				return nil, err
			}
		case c == '{':
			found, err := l.matchers()
			if err != nil {
				return nil, err
			}
			for _, n := range found {
				names[n] = true
			}
		case c == '[':
			// A range or subquery: durations, a colon, Grafana variables.
			end := strings.IndexByte(l.s[l.i:], ']')
			if end < 0 {
				return nil, fmt.Errorf("offset %d: unterminated [", start)
			}
			l.i += end + 1
		case c == '(':
			stack = append(stack, c)
			l.i++
		case c == ')':
			if len(stack) == 0 {
				return nil, fmt.Errorf("offset %d: ) without (", start)
			}
			stack = stack[:len(stack)-1]
			l.i++
		case c == ']' || c == '}':
			return nil, fmt.Errorf("offset %d: %c without its opening bracket", start, c)
		case c == '$':
			l.skipVariable()
		case isDigit(c) || (c == '.' && l.i+1 < len(l.s) && isDigit(l.s[l.i+1])):
			// A number or a duration (5m, 1h30m, 0x1f, 1e3).
			for !l.eof() && (isIdent(l.s[l.i]) || l.s[l.i] == '.') {
				l.i++
			}
		case isIdentStart(c):
			word := l.ident()
			next := l.peekNonSpace()
			switch {
			case labelListers[word]:
				if next == '(' {
					if err := l.skipLabelList(); err != nil {
						return nil, err
					}
				}
			case keywords[word]:
			case aggregations[word] && (next == '(' || l.peekWord() == "by" || l.peekWord() == "without"):
			case next == '(':
				// A function call.
			default:
				names[word] = true
			}
		case strings.IndexByte("+-*/%^=!<>,:@", c) >= 0:
			l.i++
		case c == '#':
			// A comment, to the end of the line.
			if nl := strings.IndexByte(l.s[l.i:], '\n'); nl >= 0 {
				l.i += nl
			} else {
				l.i = len(l.s)
			}
		default:
			return nil, fmt.Errorf("offset %d: unexpected character %q", start, c)
		}
	}
	if len(stack) > 0 {
		return nil, fmt.Errorf("%d unclosed (", len(stack))
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// SeriesName returns the metric name of a promtool test series selector
// such as `tether_x{a="b"}` or `{__name__="tether_x", a="b"}`.
func SeriesName(series string) (string, error) {
	names, err := MetricNames(series)
	if err != nil {
		return "", fmt.Errorf("series %q: %w", series, err)
	}
	if len(names) != 1 {
		return "", fmt.Errorf("series %q: names %d metrics, want 1", series, len(names))
	}
	return names[0], nil
}

// lexer walks a PromQL expression; i is the next byte.
type lexer struct {
	s string
	i int
}

func (l *lexer) eof() bool { return l.i >= len(l.s) }

func (l *lexer) skipSpace() {
	for !l.eof() && strings.IndexByte(" \t\r\n", l.s[l.i]) >= 0 {
		l.i++
	}
}

// peekNonSpace returns the next byte after white space without consuming
// anything, or 0 at the end.
func (l *lexer) peekNonSpace() byte {
	j := l.i
	for j < len(l.s) && strings.IndexByte(" \t\r\n", l.s[j]) >= 0 {
		j++
	}
	if j == len(l.s) {
		return 0
	}
	return l.s[j]
}

// peekWord returns the identifier after white space without consuming it.
func (l *lexer) peekWord() string {
	save := l.i
	defer func() { l.i = save }()
	l.skipSpace()
	if l.eof() || !isIdentStart(l.s[l.i]) {
		return ""
	}
	return l.ident()
}

func (l *lexer) ident() string {
	start := l.i
	for !l.eof() && isIdent(l.s[l.i]) {
		l.i++
	}
	return l.s[start:l.i]
}

// skipString consumes a quoted string: "..." and '...' with backslash
// escapes, `...` raw.
func (l *lexer) skipString() error {
	start, q := l.i, l.s[l.i]
	l.i++
	for !l.eof() {
		c := l.s[l.i]
		l.i++
		switch {
		case c == '\\' && q != '`':
			l.i++
		case c == q:
			return nil
		}
	}
	return fmt.Errorf("offset %d: unterminated string", start)
}

// readString consumes a quoted string and returns its contents (escapes
// are kept as written: metric names have none).
func (l *lexer) readString() (string, error) {
	start := l.i
	if err := l.skipString(); err != nil {
		return "", err
	}
	return l.s[start+1 : l.i-1], nil
}

// skipVariable consumes a Grafana variable: $name or ${name...}.
func (l *lexer) skipVariable() {
	l.i++ // $
	if !l.eof() && l.s[l.i] == '{' {
		if end := strings.IndexByte(l.s[l.i:], '}'); end >= 0 {
			l.i += end + 1
			return
		}
	}
	for !l.eof() && isIdent(l.s[l.i]) {
		l.i++
	}
}

// skipLabelList consumes "(a, b, ...)" after by, without, on, ignoring,
// group_left or group_right.
func (l *lexer) skipLabelList() error {
	l.skipSpace()
	start := l.i
	end := strings.IndexByte(l.s[l.i:], ')')
	if end < 0 {
		return fmt.Errorf("offset %d: unterminated label list", start)
	}
	for _, lb := range strings.Split(l.s[l.i+1:l.i+end], ",") {
		if lb = strings.TrimSpace(lb); lb != "" && !validIdent(lb) {
			return fmt.Errorf("offset %d: %q is no label name", start, lb)
		}
	}
	l.i += end + 1
	return nil
}

// matchers consumes a {...} block of label matchers and returns the names
// its __name__ equality matchers give.
func (l *lexer) matchers() ([]string, error) {
	start := l.i
	l.i++ // {
	var names []string
	for {
		l.skipSpace()
		if l.eof() {
			return nil, fmt.Errorf("offset %d: unterminated {", start)
		}
		switch c := l.s[l.i]; {
		case c == '}':
			l.i++
			return names, nil
		case c == ',':
			l.i++
			continue
		case !isIdentStart(c) && c != '"':
			return nil, fmt.Errorf("offset %d: unexpected %q in label matchers", l.i, c)
		}
		var label string
		if l.s[l.i] == '"' {
			// A quoted label name (UTF-8 names), or a quoted metric name.
			s, err := l.readString()
			if err != nil {
				return nil, err
			}
			l.skipSpace()
			if l.eof() || l.s[l.i] == ',' || l.s[l.i] == '}' {
				names = append(names, s)
				continue
			}
			label = s
		} else {
			label = l.ident()
		}
		l.skipSpace()
		op := ""
		for _, o := range []string{"=~", "!~", "!=", "="} {
			if strings.HasPrefix(l.s[l.i:], o) {
				op = o
				break
			}
		}
		if op == "" {
			return nil, fmt.Errorf("offset %d: label %s has no matcher operator", l.i, label)
		}
		l.i += len(op)
		l.skipSpace()
		if l.eof() || strings.IndexByte("\"'`", l.s[l.i]) < 0 {
			return nil, fmt.Errorf("offset %d: label %s: the value must be a quoted string", l.i, label)
		}
		v, err := l.readString()
		if err != nil {
			return nil, err
		}
		if label == "__name__" {
			if op != "=" {
				return nil, fmt.Errorf("offset %d: __name__%s%q: only __name__=\"...\" names a metric that can be checked", start, op, v)
			}
			names = append(names, v)
		}
	}
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdent(c byte) bool      { return isIdentStart(c) || isDigit(c) }

func validIdent(s string) bool {
	if s == "" || !isIdentStart(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isIdent(s[i]) {
			return false
		}
	}
	return true
}
