package hostcheck

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// loopbackNames describes the names every checking policy accepts.
const loopbackNames = "localhost, 127.0.0.0/8, ::1"

// Config configures New.
type Config struct {
	// Listen is the facade's bound address, "host:port" as
	// net.Listener.Addr().String() gives it (a bare host is accepted too).
	// A loopback host makes the policy check; an unspecified host
	// ("0.0.0.0", "::", "") does not, and is not a name callers use. A
	// specific host is one of the accepted names.
	Listen string
	// Allowed lists further names callers may use: host names (matched
	// case-insensitively, a trailing dot ignored), IP addresses, or
	// "*.domain" for every name below domain (not domain itself). No
	// scheme, port or path. A non-empty list makes the policy check even
	// on a non-loopback Listen.
	Allowed []string
	// Hint is appended to refusal messages, e.g. "add it to
	// --facade-allowed-hosts". Empty: nothing.
	Hint string
}

// Policy is a facade's rule for Host, :authority and Origin (see the
// package doc). The zero value and nil are not usable; use New or
// Loopback.
type Policy struct {
	check    bool
	names    map[string]bool // lower-case names and canonical IP strings
	suffixes []string        // ".domain" of "*.domain" entries
	allowed  string          // what it accepts, for messages
	hint     string
}

// Loopback returns the policy of a facade on loopback with no extra names:
// localhost, 127.0.0.0/8 and ::1 only.
func Loopback() *Policy {
	p, _ := New(Config{Listen: "127.0.0.1"})
	return p
}

// New returns the policy for cfg. It fails, naming every bad entry, if an
// Allowed entry is not a host name, an IP address or a *.domain pattern.
func New(cfg Config) (*Policy, error) {
	p := &Policy{names: map[string]bool{}, hint: cfg.Hint}
	host := cfg.Listen
	if h, _, err := net.SplitHostPort(cfg.Listen); err == nil {
		host = h
	}
	host = canonical(host)
	ip := net.ParseIP(host)
	switch {
	case host == "" || ip != nil && ip.IsUnspecified():
	case host == "localhost" || ip != nil && ip.IsLoopback():
		p.check = true
	default:
		p.addName(host)
	}
	var errs []error
	for _, a := range cfg.Allowed {
		if err := p.addAllowed(a); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("allowed hosts: %w", err)
	}
	if len(cfg.Allowed) > 0 {
		p.check = true
	}
	desc := []string{loopbackNames}
	for n := range p.names {
		desc = append(desc, n)
	}
	for _, s := range p.suffixes {
		desc = append(desc, "*"+s)
	}
	slices.Sort(desc[1:])
	p.allowed = strings.Join(desc, ", ")
	return p, nil
}

func (p *Policy) addName(n string) {
	if ip := net.ParseIP(n); ip != nil {
		n = ip.String()
	}
	p.names[n] = true
}

// addAllowed adds one Config.Allowed entry.
func (p *Policy) addAllowed(a string) error {
	bad := fmt.Errorf("%q: want a host name, an IP address or *.domain, without scheme, port or path", a)
	n := canonical(strings.TrimSpace(a))
	if strings.HasPrefix(n, "[") && strings.HasSuffix(n, "]") {
		n = n[1 : len(n)-1]
	}
	if ip := net.ParseIP(n); ip != nil {
		p.addName(n)
		return nil
	}
	if rest, ok := strings.CutPrefix(n, "*."); ok {
		if !validName(rest) {
			return bad
		}
		p.suffixes = append(p.suffixes, "."+rest)
		return nil
	}
	if !validName(n) {
		return bad
	}
	p.addName(n)
	return nil
}

// validName reports whether n (lower case) is a DNS-style name: dot-
// separated non-empty labels of letters, digits, '-' and '_'.
func validName(n string) bool {
	if n == "" || len(n) > 253 {
		return false
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// canonical lower-cases a host and drops one trailing dot.
func canonical(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// hostOf returns the host of a Host header or :authority value
// ("host[:port]", "[v6][:port]"), canonical.
func hostOf(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	return canonical(h)
}

// Checks reports whether p checks names at all (see the package doc).
func (p *Policy) Checks() bool { return p.check }

// String describes what p accepts, e.g. "localhost, 127.0.0.0/8, ::1,
// osb.example".
func (p *Policy) String() string {
	if !p.check {
		return "any name"
	}
	return p.allowed
}

// accepts reports whether host (canonical, no port) is one of p's names.
func (p *Policy) accepts(host string) bool {
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback() || p.names[ip.String()]
	}
	if host == "localhost" || p.names[host] {
		return true
	}
	for _, s := range p.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// RefusedError is a Host, :authority or Origin a Policy refused.
type RefusedError struct {
	// Header is "Host", ":authority" or "Origin".
	Header string
	// Value is the header's value as received.
	Value   string
	allowed string
	hint    string
	origin  bool
}

func (e *RefusedError) Error() string {
	var msg string
	if e.origin {
		msg = fmt.Sprintf("%s %s is a page of another site; this facade serves pages of %s only", e.Header, clip(e.Value), e.allowed)
	} else {
		msg = fmt.Sprintf("%s %s is not a name of this facade (it answers to %s)", e.Header, clip(e.Value), e.allowed)
	}
	if e.hint != "" {
		msg += "; " + e.hint
	}
	return msg
}

// clip quotes a header value for a message, cut to 64 bytes ("…" marks
// a cut): a Host header can be as long as the server's header limit.
func clip(v string) string {
	if len(v) <= 64 {
		return strconv.Quote(v)
	}
	return strconv.Quote(v[:64]) + "…"
}

// Host checks a Host header or gRPC :authority value (header names which,
// for the message). An empty value passes: browsers always send one, so
// it is no rebinding page's request.
func (p *Policy) Host(header, value string) error {
	if !p.check || value == "" || p.accepts(hostOf(value)) {
		return nil
	}
	return &RefusedError{Header: header, Value: value, allowed: p.allowed, hint: p.hint}
}

// Origin checks the Origin header values of a request whose Host is host.
// No value passes (no browser sent the request cross-origin). A checking
// policy accepts origins whose host is one of its names; otherwise the
// origin's host must be host's (same origin).
func (p *Policy) Origin(values []string, host string) error {
	for _, v := range values {
		if !p.originOK(v, host) {
			allowed := p.allowed
			if !p.check {
				allowed = "its own origin (" + hostOf(host) + ")"
			}
			return &RefusedError{Header: "Origin", Value: v, allowed: allowed, hint: p.hint, origin: true}
		}
	}
	return nil
}

func (p *Policy) originOK(v, host string) bool {
	u, err := url.Parse(strings.TrimSpace(v))
	if err != nil || u.Host == "" || u.Scheme == "" {
		return false // "null" (an opaque origin), or not an origin at all
	}
	oh := canonical(u.Hostname())
	if p.check {
		return p.accepts(oh)
	}
	return oh == hostOf(host)
}
