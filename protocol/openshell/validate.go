package openshell

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
)

// The rules below are the gateway's (wire-facts §1.4). Error texts of name
// length follow the gateway verbatim; the others say what failed and where.
// Every error is meant to be returned as INVALID_ARGUMENT.

// Label limits (Kubernetes rules, wire-facts §1.4), in bytes.
const (
	maxLabelKeyLen    = 253
	maxLabelPrefixLen = 253
	maxLabelNameLen   = 63
	maxLabelValueLen  = 63
)

// ValidateName checks a caller-supplied sandbox name: at most MaxNameLen
// bytes and a DNS-1123 label (lowercase ASCII letters, digits and '-', not
// starting or ending with '-') without "--". An empty name is an error here;
// CreateSandbox treats it as "generate one" before calling this.
func ValidateName(name string) error {
	switch {
	case name == "":
		return errors.New("name is empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("name exceeds maximum length (%d > %d)", len(name), MaxNameLen)
	case name[0] == '-' || name[len(name)-1] == '-':
		return fmt.Errorf("name '%s' must start and end with a lowercase letter or digit", name)
	case strings.Contains(name, "--"):
		return fmt.Errorf("name '%s' must not contain '--'", name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("name '%s' must consist of lowercase letters, digits and '-'", name)
		}
	}
	return nil
}

// isLabelAlnum is the gateway's "alphanumeric": Unicode letters and numbers,
// so non-ASCII letters pass as they do on the gateway.
func isLabelAlnum(r rune) bool { return unicode.IsLetter(r) || unicode.IsNumber(r) }

// validLabelSegment checks 1..max bytes of alphanumerics, '-', '_' and '.',
// starting and ending with an alphanumeric.
func validLabelSegment(s string, max int) bool {
	if s == "" || len(s) > max || !utf8.ValidString(s) {
		return false
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	if !isLabelAlnum(first) || !isLabelAlnum(last) {
		return false
	}
	for _, r := range s {
		if !isLabelAlnum(r) && r != '-' && r != '_' && r != '.' {
			return false
		}
	}
	return true
}

// validDNSSubdomain checks a label-key prefix: lowercase ASCII letters,
// digits, '-' and '.', not starting or ending with '-' or '.', no "..".
func validDNSSubdomain(s string) bool {
	if s == "" || len(s) > maxLabelPrefixLen || strings.Contains(s, "..") {
		return false
	}
	if c := s[0]; c == '-' || c == '.' {
		return false
	}
	if c := s[len(s)-1]; c == '-' || c == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// ValidateLabelKey checks a label key: non-empty, at most 253 bytes, an
// optional "prefix/" that is a lowercase DNS subdomain, then a name of 1–63
// bytes of alphanumerics, '-', '_', '.' starting and ending alphanumeric.
func ValidateLabelKey(k string) error {
	if k == "" {
		return errors.New("label key is empty")
	}
	if len(k) > maxLabelKeyLen {
		return fmt.Errorf("label key '%s' exceeds maximum length (%d > %d)", clip(k), len(k), maxLabelKeyLen)
	}
	name := k
	if prefix, rest, ok := strings.Cut(k, "/"); ok {
		if !validDNSSubdomain(prefix) {
			return fmt.Errorf("label key '%s': prefix '%s' must be a lowercase DNS subdomain", k, prefix)
		}
		name = rest
	}
	if !validLabelSegment(name, maxLabelNameLen) {
		return fmt.Errorf("label key '%s': name must be 1-%d characters of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", k, maxLabelNameLen)
	}
	return nil
}

// ValidateLabelValue checks a label value: empty, or at most 63 bytes of
// alphanumerics, '-', '_', '.' starting and ending alphanumeric.
func ValidateLabelValue(v string) error {
	if v == "" || validLabelSegment(v, maxLabelValueLen) {
		return nil
	}
	return fmt.Errorf("label value '%s' must be empty or 1-%d characters of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", clip(v), maxLabelValueLen)
}

// ValidateLabels checks every key and value of labels, in key order, and
// returns the first violation (the gateway stops at the first one too).
func ValidateLabels(labels map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if err := ValidateLabelKey(k); err != nil {
			return err
		}
		if err := ValidateLabelValue(labels[k]); err != nil {
			return fmt.Errorf("label '%s': %w", k, err)
		}
	}
	return nil
}

// ParseLabelSelector parses a ListSandboxes label_selector: comma-separated
// key=value pairs, ANDed, equality only. Whitespace around pairs, keys and
// values is trimmed; empty segments are skipped; each pair splits at its
// first '='; a pair without '=' or with an empty key is an error; keys and
// values must pass ValidateLabelKey and ValidateLabelValue (so "a==b" fails:
// its value "=b" is invalid); an empty value matches an empty label value;
// at most MaxSelectorPairs pairs; a repeated key keeps its last value.
// An empty selector yields an empty map (matches everything).
func ParseLabelSelector(s string) (map[string]string, error) {
	sel := map[string]string{}
	pairs := 0
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		pairs++
		if pairs > MaxSelectorPairs {
			return nil, fmt.Errorf("label selector has more than %d pairs", MaxSelectorPairs)
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("label selector pair '%s' must be key=value", clip(part))
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if k == "" {
			return nil, fmt.Errorf("label selector pair '%s' has an empty key", clip(part))
		}
		if err := ValidateLabelKey(k); err != nil {
			return nil, fmt.Errorf("label selector: %w", err)
		}
		if err := ValidateLabelValue(v); err != nil {
			return nil, fmt.Errorf("label selector: key '%s': %w", k, err)
		}
		sel[k] = v
	}
	return sel, nil
}

// MatchLabels reports whether labels satisfy a parsed selector: every
// selector key is present with an equal value.
func MatchLabels(sel, labels map[string]string) bool {
	for k, v := range sel {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Spec limits checked on CreateSandbox (wire-facts §1.4), in bytes or counts.
const (
	maxProviders       = 32
	maxSpecEnv         = 128
	maxSpecEnvKeyLen   = 256
	maxSpecEnvValueLen = 8192
	maxPolicySize      = 262144
	maxTemplateStruct  = 65536
	maxTemplateString  = 1024
	maxExecArgs        = 1024
	maxExecArgLen      = 32 << 10
	maxExecEnvValueLen = 32 << 10
	maxExecWorkdirLen  = 4096
)

// ValidateSpec checks the size limits of a CreateSandbox spec: at most 32
// providers, 128 environment entries (key ≤256 B, value ≤8192 B), a policy
// of at most 262,144 B serialized, template Structs of at most 65,536 B and
// template strings of at most 1024 B. A nil spec is an error.
func ValidateSpec(spec *SandboxSpec) error {
	if spec == nil {
		return errors.New("spec is required")
	}
	if n := len(spec.GetProviders()); n > maxProviders {
		return fmt.Errorf("spec.providers has %d entries, more than %d", n, maxProviders)
	}
	if n := len(spec.GetEnvironment()); n > maxSpecEnv {
		return fmt.Errorf("spec.environment has %d entries, more than %d", n, maxSpecEnv)
	}
	for k, v := range spec.GetEnvironment() {
		if len(k) > maxSpecEnvKeyLen {
			return fmt.Errorf("spec.environment key of %d bytes exceeds %d", len(k), maxSpecEnvKeyLen)
		}
		if len(v) > maxSpecEnvValueLen {
			return fmt.Errorf("spec.environment['%s'] value of %d bytes exceeds %d", k, len(v), maxSpecEnvValueLen)
		}
	}
	if p := spec.GetPolicy(); p != nil {
		if n := proto.Size(p); n > maxPolicySize {
			return fmt.Errorf("spec.policy of %d bytes exceeds %d", n, maxPolicySize)
		}
	}
	if t := spec.GetTemplate(); t != nil {
		for field, s := range map[string]string{"image": t.GetImage(), "runtime_class_name": t.GetRuntimeClassName(), "agent_socket": t.GetAgentSocket()} {
			if len(s) > maxTemplateString {
				return fmt.Errorf("spec.template.%s of %d bytes exceeds %d", field, len(s), maxTemplateString)
			}
		}
		if t.GetResources() != nil {
			if n := proto.Size(t.GetResources()); n > maxTemplateStruct {
				return fmt.Errorf("spec.template.resources of %d bytes exceeds %d", n, maxTemplateStruct)
			}
		}
		if t.GetDriverConfig() != nil {
			if n := proto.Size(t.GetDriverConfig()); n > maxTemplateStruct {
				return fmt.Errorf("spec.template.driver_config of %d bytes exceeds %d", n, maxTemplateStruct)
			}
		}
	}
	return nil
}

// ValidEnvKey reports whether k is a valid exec environment key:
// ^[A-Za-z_][A-Za-z0-9_]*$.
func ValidEnvKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// ValidateExecRequest checks an ExecSandboxRequest as the gateway does
// before looking the sandbox up: sandbox_id and command required, at most
// 1024 args of at most 32 KiB each, environment keys matching
// ^[A-Za-z_][A-Za-z0-9_]*$ with values of at most 32 KiB, workdir at most
// 4096 bytes.
func ValidateExecRequest(req *ExecSandboxRequest) error {
	switch {
	case req.GetSandboxId() == "":
		return errors.New("sandbox_id is required")
	case len(req.GetCommand()) == 0:
		return errors.New("command is required")
	case len(req.GetCommand()) > maxExecArgs:
		return fmt.Errorf("command has %d arguments, more than %d", len(req.GetCommand()), maxExecArgs)
	case len(req.GetWorkdir()) > maxExecWorkdirLen:
		return fmt.Errorf("workdir of %d bytes exceeds %d", len(req.GetWorkdir()), maxExecWorkdirLen)
	}
	for i, a := range req.GetCommand() {
		if len(a) > maxExecArgLen {
			return fmt.Errorf("command argument %d of %d bytes exceeds %d", i, len(a), maxExecArgLen)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(req.GetEnvironment())) {
		if !ValidEnvKey(k) {
			return fmt.Errorf("environment key '%s' must match ^[A-Za-z_][A-Za-z0-9_]*$", clip(k))
		}
		if v := req.GetEnvironment()[k]; len(v) > maxExecEnvValueLen {
			return fmt.Errorf("environment['%s'] value of %d bytes exceeds %d", k, len(v), maxExecEnvValueLen)
		}
	}
	return nil
}

// clip shortens s for an error message to at most 80 bytes.
func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
