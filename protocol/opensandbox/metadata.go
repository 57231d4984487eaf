package opensandbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tetherfleet/tether/protocol"
)

// ErrInvalidMetadataFilter is wrapped by ParseMetadataFilter's errors; the
// server answers them with 400 CodeInvalidMetadataFormat (OSB-3).
var ErrInvalidMetadataFilter = errors.New("opensandbox: invalid metadata filter")

// ParseMetadataFilter parses the list call's metadata query parameter
// (wire-facts §2.4) as the server does, with strict query-string rules:
// the string (already URL-decoded once as a query value) is split at '&';
// every segment must hold a '=' (an empty segment or one without '=' is an
// error wrapping ErrInvalidMetadataFilter, e.g. "a=1&broken"); key and value
// are then decoded once more ('+' is a space, %XX a byte; a '%' not
// followed by two hex digits stays as it is). Blank values are kept; a
// repeated key keeps its last value. The empty string is no filter: an
// empty map and no error.
func ParseMetadataFilter(s string) (map[string]string, error) {
	m := map[string]string{}
	if s == "" {
		return m, nil
	}
	for seg := range strings.SplitSeq(s, "&") {
		k, v, ok := strings.Cut(seg, "=")
		if !ok {
			return nil, fmt.Errorf("%w: segment %q of %q has no '='", ErrInvalidMetadataFilter, seg, s)
		}
		m[unquotePlus(k)] = unquotePlus(v)
	}
	return m, nil
}

// EncodeMetadataFilter renders filter as the metadata query parameter's
// value (before the query's own URL encoding): "k=v" pairs sorted by key,
// joined with '&'. Bytes that ParseMetadataFilter would read specially
// ('%', '&', '=', '+', and anything outside printable ASCII) are written as
// %XX, so every map round-trips; valid label keys and values pass
// unchanged, which is what the SDKs send. An empty or nil map yields "".
func EncodeMetadataFilter(filter map[string]string) string {
	keys := make([]string, 0, len(filter))
	for k := range filter {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('&')
		}
		quote(&b, k)
		b.WriteByte('=')
		quote(&b, filter[k])
	}
	return b.String()
}

// MatchMetadata reports whether metadata holds every pair of filter with an
// equal value (AND, exact equality). An empty filter matches everything.
func MatchMetadata(metadata, filter map[string]string) bool {
	for k, want := range filter {
		got, ok := metadata[k]
		if !ok || got != want {
			return false
		}
	}
	return true
}

// ValidateMetadata checks sandbox metadata as the server does on create
// and patch: Kubernetes label rules for every key and value
// (protocol.ValidLabelKey, protocol.ValidLabelValue) and no key under
// ReservedMetadataPrefix. Violations are answered with 400
// CodeInvalidMetadataLabel (OSB-8). It reports every problem.
func ValidateMetadata(m map[string]string) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var errs []error
	for _, k := range keys {
		if strings.HasPrefix(k, ReservedMetadataPrefix) {
			errs = append(errs, fmt.Errorf("metadata key %q: prefix %q is reserved", k, ReservedMetadataPrefix))
			continue
		}
		if err := protocol.ValidLabelKey(k); err != nil {
			errs = append(errs, fmt.Errorf("metadata: %w", err))
		}
		if err := protocol.ValidLabelValue(m[k]); err != nil {
			errs = append(errs, fmt.Errorf("metadata key %q: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// MaxMetadataValueLen is the longest sanitised metadata value (a label
// value's limit).
const MaxMetadataValueLen = 63

// SanitizeMetadataValue turns any string into a valid metadata value the
// way NeMo Gym's OpenSandbox provider does (wire-facts §4.3, vectors NG-5):
// every run of characters outside [A-Za-z0-9_.-] becomes one '_'; leading
// and trailing '.', '_' and '-' are stripped; the result is cut to
// MaxMetadataValueLen bytes and stripped again; an empty result becomes
// "metadata". Examples: "gym team" → "gym_team", "héllo wörld" →
// "h_llo_w_rld", "__init__" → "init", "" → "metadata".
func SanitizeMetadataValue(v string) string {
	var b strings.Builder
	inRun := false
	for _, r := range v {
		if r < 0x80 && (isAlnum(byte(r)) || r == '_' || r == '.' || r == '-') {
			b.WriteRune(r)
			inRun = false
			continue
		}
		if !inRun {
			b.WriteByte('_')
			inRun = true
		}
	}
	s := strings.Trim(b.String(), "._-")
	if len(s) > MaxMetadataValueLen {
		s = strings.Trim(s[:MaxMetadataValueLen], "._-")
	}
	if s == "" {
		return "metadata"
	}
	return s
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// unquotePlus decodes a query-string component leniently: '+' is a space,
// %XX (hex) a byte, and a malformed '%' is kept literally.
func unquotePlus(s string) string {
	if !strings.ContainsAny(s, "+%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b = append(b, ' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// quote writes s with every byte that unquotePlus reads specially, or that
// is not printable ASCII, as %XX.
func quote(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '%' || c == '&' || c == '=' || c == '+' || c == '#' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}
