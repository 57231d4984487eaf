package protocol_test

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

func TestSelector(t *testing.T) {
	labels := map[string]string{"gpu": "a100", "zone": "us-east", "nemo-gym.nvidia.com/run": "r1", "empty": ""}
	tests := []struct {
		sel   string
		match bool
	}{
		{"", true},
		{"gpu=a100", true},
		{"gpu==a100", true},
		{"gpu=h100", false},
		{"gpu!=h100", true},
		{"missing!=x", true},
		{"gpu in (h100, a100)", true},
		{"gpu notin (a100)", false},
		{"missing notin (a)", true},
		{"gpu", true},
		{"!gpu", false},
		{"!missing", true},
		{"gpu=a100, zone in (us-east,us-west), !spot", true},
		{"nemo-gym.nvidia.com/run=r1", true},
		{"empty=", true},
		{" gpu = a100 ", true},
		{"empty in (x,y)", false},
	}
	for _, tt := range tests {
		s, err := protocol.ParseSelector(tt.sel)
		if err != nil {
			t.Errorf("ParseSelector(%q): %v", tt.sel, err)
			continue
		}
		if got := s.Matches(labels); got != tt.match {
			t.Errorf("%q.Matches = %v, want %v", tt.sel, got, tt.match)
		}
	}
}

func TestSelectorErrors(t *testing.T) {
	for _, sel := range []string{"a==b==c", "a in (b", "a in b)", "a in ((b))", "a b", "-a=b", "a=b c", "a in (b) x", "foo bar (x)", "!", "=v", strings.Repeat("a", protocol.MaxSelectorLen+1)} {
		if _, err := protocol.ParseSelector(sel); err == nil {
			t.Errorf("ParseSelector(%q) succeeded, want error", sel)
		}
	}
}

// Empty terms are errors, as in Kubernetes: a stray comma or a blank
// selector must never widen a selector to every node.
func TestSelectorEmptyTerms(t *testing.T) {
	tests := []struct {
		sel, want string
	}{
		{" ", "selector is blank"},
		{"\t\n", "selector is blank"},
		{",", "empty term at offset 0"},
		{",,", "empty term at offset 0"},
		{"a=b,,c=d", "empty term at offset 4"},
		{",a=b", "empty term at offset 0"},
		{"a=b,", "empty term at offset 4"},
		{"a=b, ", "empty term at offset 4"},
		{"a=b , ,c", "empty term at offset 5"},
		{"a in (x),", "empty term at offset 9"},
		{"a in ()", "a set needs at least one value"},
	}
	for _, tt := range tests {
		_, err := protocol.ParseSelector(tt.sel)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseSelector(%q) = %v, want an error containing %q", tt.sel, err, tt.want)
		}
	}
	// The empty string is no selector at all: callers decide what it
	// means (tether.v1.nodes: no filter; an exec target: no target).
	if s, err := protocol.ParseSelector(""); err != nil || !s.Empty() {
		t.Errorf(`ParseSelector("") = %v, %v; want the empty selector`, s, err)
	}
	// The API refuses them with 400 invalid_request.
	for _, sel := range []string{" ", ",", "a=b,,c=d"} {
		r := protocol.ExecRequest{Target: protocol.Target{Selector: sel}, Argv: []string{"true"}}
		if e := r.Validate(); e == nil || e.Status != 400 || e.Code != protocol.ErrCodeInvalid {
			t.Errorf("exec with selector %q: Validate = %v, want 400 %s", sel, e, protocol.ErrCodeInvalid)
		}
		nr := protocol.NodesRequest{Selector: sel}
		if e := nr.Validate(); e == nil || e.Status != 400 || e.Code != protocol.ErrCodeInvalid {
			t.Errorf("nodes with selector %q: Validate = %v, want 400 %s", sel, e, protocol.ErrCodeInvalid)
		}
	}
}

// TestSelectorNamesTheCharacter: a character a key or value may not hold
// is named as the character it is ('é', not the 'Ã' of its first byte),
// and a byte that is not UTF-8 as that byte (0xff, not 'ÿ').
func TestSelectorNamesTheCharacter(t *testing.T) {
	for _, tt := range []struct{ sel, want string }{
		{"gpu\xff", "at offset 3: byte 0xff (not UTF-8) is not allowed"},
		{"zone=caf\u00e9", "at offset 8: character 'é' is not allowed"},
		{"a*b", "at offset 1: character '*' is not allowed"},
		{"a in (x,\u00fcber)", "at offset 8: character 'ü' is not allowed"},
	} {
		_, err := protocol.ParseSelector(tt.sel)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseSelector(%q) = %v, want an error containing %q", tt.sel, err, tt.want)
		}
	}
}

func TestParseLabels(t *testing.T) {
	m, err := protocol.ParseLabels("gpu=a100, zone=x,")
	if err != nil || len(m) != 2 || m["gpu"] != "a100" || m["zone"] != "x" {
		t.Fatalf("ParseLabels = %v, %v", m, err)
	}
	for _, bad := range []string{"novalue", "a=b c", "-x=1", "UPPER.example.com/x=1"} {
		if _, err := protocol.ParseLabels(bad); err == nil {
			t.Errorf("ParseLabels(%q) succeeded, want error", bad)
		}
	}
}

func TestValidNodeID(t *testing.T) {
	for _, ok := range []string{"node-a", "gpu01.cluster.example.com", "A_1"} {
		if err := protocol.ValidNodeID(ok); err != nil {
			t.Errorf("ValidNodeID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "a*", "a>", "-a", "a.", strings.Repeat("a", 254)} {
		if err := protocol.ValidNodeID(bad); err == nil {
			t.Errorf("ValidNodeID(%q) succeeded", bad)
		}
	}
}
