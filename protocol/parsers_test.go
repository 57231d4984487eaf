package protocol_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// Bugs the fuzzers found, as ordinary tests.

// TestErrorsClipLongValues: an error about a value quotes it clipped
// (protocol.Clip), however long it is, so that a 4 KiB selector or a
// 1 MiB copy path cannot make a 4 KiB or 1 MiB error message (and log
// line).
func TestErrorsClipLongValues(t *testing.T) {
	long := strings.Repeat("x", 5000)
	for name, err := range map[string]error{
		"selector term":     errOf(protocol.ParseSelector(long[:4000] + " y")),
		"selector key":      errOf(protocol.ParseSelector("!" + strings.Repeat("-", 4000))),
		"selector value":    errOf(protocol.ParseSelector("a=" + strings.Repeat("v", 4000))),
		"selector set":      errOf(protocol.ParseSelector(long[:4000] + " x (a)")),
		"label key":         protocol.ValidLabelKey(long),
		"label value":       protocol.ValidLabelValue(long + "-"),
		"labels":            errOf(protocol.ParseLabels("a=" + long)),
		"labels part":       errOf(protocol.ParseLabels(long)),
		"copy path":         protocol.ValidCopyPath("../" + long),
		"copy entry type":   (&protocol.CopyEntry{Path: "a", Type: long}).Validate(),
		"copy entry path":   (&protocol.CopyEntry{Path: strings.Repeat("a/", 2000) + "a", Type: "dir", Link: "x"}).Validate(),
		"target name":       protocol.ValidTargetName(long),
		"sandbox op":        (&protocol.SandboxOpParams{Op: long}).Validate(),
		"sandbox provider":  (&protocol.SandboxOpParams{Op: "delete", Provider: long}).Validate(),
		"hello label (key)": (&protocol.Hello{ProtocolVersion: protocol.Version, NodeID: "n", Labels: map[string]string{long: "v"}}).Validate(),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if n := len(err.Error()); n > 600 {
			t.Errorf("%s: error of %d bytes: %.200s…", name, n, err)
		}
		if !strings.Contains(err.Error(), "…") {
			t.Errorf("%s: error does not show the cut: %.200s", name, err)
		}
	}
}

func errOf[T any](_ T, err error) error { return err }

// TestParseLabelsRefusesDuplicateKey: "a=1,a=2" is a mistake, not "a=2".
func TestParseLabelsRefusesDuplicateKey(t *testing.T) {
	for _, s := range []string{"a=1,a=2", "a=1, a =1", "x/y=1,z=2,x/y=3"} {
		m, err := protocol.ParseLabels(s)
		if err == nil || !strings.Contains(err.Error(), "given twice") {
			t.Errorf("ParseLabels(%q) = %v, %v; want an error naming the repeated key", s, m, err)
		}
	}
}

// TestLongestTimeoutIsNotNegative: the longest duration a timeout string
// can give (2562047h47m16.854775807s, math.MaxInt64 ns) overflowed in the
// rounding to milliseconds and was refused as "timeout must not be
// negative"; it is over the limit, and said so.
func TestLongestTimeoutIsNotNegative(t *testing.T) {
	var d protocol.Duration
	if err := d.UnmarshalJSON([]byte(`"2562047h47m16.854775807s"`)); err != nil {
		t.Fatal(err)
	}
	req := protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"true"}, Timeout: d}
	if p := req.Params(0); p.TimeoutMS <= 0 {
		t.Errorf("timeout %v sent as timeout_ms %d", time.Duration(d), p.TimeoutMS)
	}
	e := req.Validate()
	if e == nil || strings.Contains(e.Message, "negative") || !strings.Contains(e.Message, "over the limit") {
		t.Errorf("Validate = %v; want over the limit", e)
	}
}
