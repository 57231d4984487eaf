package cli

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

// TestExecFailedStderrPastLimit: a command that writes more than
// --output-limit to stderr and fails gets a "Command failed" block that
// does not repeat stderr's first bytes as if they were its tail (the
// agent sends nothing past the limit, so no real tail exists): it says
// stderr was cut and shows no tail.
func TestExecFailedStderrPastLimit(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	script := `printf 'FIRST-BYTES'; head -c 5000 /dev/zero | tr '\0' a; echo; echo LAST-LINE; exit 3`
	r := runCLI(testCtx(t), nil, "", "exec", "--nats-url", f.NATS.ClientURL(), "--node", "node-0", "--output-limit", "100", "--", "sh", "-c", "{ "+script+"; } >&2")
	i := strings.Index(r.stderr, "Command failed")
	if r.code != 3 || i < 0 {
		t.Fatalf("exit %d, stderr %q; want 3 and a Command failed block", r.code, r.stderr)
	}
	// The block past its first two lines (the header and the command,
	// which names FIRST-BYTES itself).
	block := strings.SplitN(r.stderr[i:], "\n", 3)[2]
	if strings.Contains(block, "FIRST-BYTES") || strings.Contains(block, "aaaa") {
		t.Errorf("the Command failed block shows stderr's first bytes as its tail:\n%s", block)
	}
	if !strings.Contains(block, "cut at the output limit") {
		t.Errorf("the Command failed block does not say stderr was cut:\n%s", block)
	}
	// The block starts on its own line though the cut output did not end
	// in one, and the note names the limit in force (F7 of fresh2).
	if r.stderr[i-1] != '\n' {
		t.Errorf("the Command failed block is glued to the output's last line:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, "stderr was truncated at the output limit in force, 100 bytes (5022 bytes produced)") {
		t.Errorf("the truncation note does not name the limit:\n%s", r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "FIRST-BYTES") {
		t.Errorf("stderr's first bytes should reach the terminal once, streamed:\n%s", r.stderr)
	}
}
