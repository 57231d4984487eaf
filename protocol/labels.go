package protocol

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Label and node-id rules follow Kubernetes label syntax, which is also what
// OpenShell and OpenSandbox validate (reference/wire-facts.md §1.4, §2.3), so
// one selector language works for nodes and sandboxes.
const (
	maxLabelName   = 63
	maxLabelPrefix = 253
	maxLabelValue  = 63
	// MaxNodeIDLen bounds a node id, in bytes.
	MaxNodeIDLen = 253
	// MaxLabels bounds the number of labels on a node.
	MaxLabels = 64
)

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// validSegment checks a label name or value body: alphanumerics, '-', '_',
// '.', starting and ending with an alphanumeric.
func validSegment(s string, max int) bool {
	if len(s) == 0 || len(s) > max || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// validDNSSubdomain checks a lowercase DNS subdomain of at most max bytes.
func validDNSSubdomain(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" || part[0] == '-' || part[len(part)-1] == '-' {
			return false
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// ValidLabelKey reports whether k is a valid label key: an optional DNS
// subdomain prefix and '/', then a name of 1–63 characters.
func ValidLabelKey(k string) error {
	name := k
	if i := strings.IndexByte(k, '/'); i >= 0 {
		prefix := k[:i]
		name = k[i+1:]
		if !validDNSSubdomain(prefix, maxLabelPrefix) {
			return fmt.Errorf("label key %s: prefix must be a lowercase DNS subdomain of at most %d characters", Clip(k), maxLabelPrefix)
		}
	}
	if !validSegment(name, maxLabelName) {
		return fmt.Errorf("label key %s: name must be 1-%d characters of [A-Za-z0-9-_.], starting and ending with a letter or digit", Clip(k), maxLabelName)
	}
	return nil
}

// ValidLabelValue reports whether v is a valid label value: empty, or 1–63
// characters of [A-Za-z0-9-_.] starting and ending with a letter or digit.
func ValidLabelValue(v string) error {
	if v == "" || validSegment(v, maxLabelValue) {
		return nil
	}
	return fmt.Errorf("label value %s: must be empty or 1-%d characters of [A-Za-z0-9-_.], starting and ending with a letter or digit", Clip(v), maxLabelValue)
}

// ValidateLabels checks every key and value of m and their count.
func ValidateLabels(m map[string]string) error {
	if len(m) > MaxLabels {
		return fmt.Errorf("%d labels, over the limit of %d", len(m), MaxLabels)
	}
	var errs []error
	for _, k := range sortedKeys(m) {
		if err := ValidLabelKey(k); err != nil {
			errs = append(errs, err)
		}
		if err := ValidLabelValue(m[k]); err != nil {
			errs = append(errs, fmt.Errorf("key %s: %w", Clip(k), err))
		}
	}
	return errors.Join(errs...)
}

// ParseLabels parses "k=v,k2=v2" into a map and validates it. An empty string
// yields an empty map; a key given twice is an error. Errors quote the
// offending part clipped (Clip).
func ParseLabels(s string) (map[string]string, error) {
	m := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("label %s: want key=value", Clip(part))
		}
		k = strings.TrimSpace(k)
		if _, dup := m[k]; dup {
			// Which one was meant is anyone's guess: say so rather than
			// keep the last.
			return nil, fmt.Errorf("label %s: key %s is given twice", Clip(part), Clip(k))
		}
		m[k] = strings.TrimSpace(v)
	}
	if err := ValidateLabels(m); err != nil {
		return nil, err
	}
	return m, nil
}

// ValidNodeID checks a node id: a lowercase-or-digit DNS-like name of at most
// MaxNodeIDLen bytes using [A-Za-z0-9-_.], starting and ending alphanumeric.
// Hostnames qualify. Node ids appear in NATS subjects, so '*', '>' and spaces
// are excluded by construction.
func ValidNodeID(id string) error {
	if id == "" {
		return errors.New("node id is empty")
	}
	if !validSegment(id, MaxNodeIDLen) {
		return fmt.Errorf("node id %s: must be 1-%d characters of [A-Za-z0-9-_.], starting and ending with a letter or digit", Clip(id), MaxNodeIDLen)
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
