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
		{" gpu = a100 ,", true},
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
