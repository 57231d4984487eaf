package cli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tetherfleet/tether/protocol"
)

// hostile is what another user (a job's command, a copy path, a node's
// labels, a sandbox's name) can put in a field tether prints: an OSC 52
// clipboard write, a clear screen, a carriage return to overwrite the
// line, a bidi override, a C1 control (NEL), DEL, a tab and a newline
// (a cell or line of its own) and a byte that is not UTF-8.
const hostile = "a\x1b]52;c;ZXZpbA==\x07\x1b[2J\rb\u202ec\u0085\x7f\t\n\xff日本é"

// hostileShown is hostile as a terminal must show it.
const hostileShown = `a\x1b]52;c;ZXZpbA==\a\x1b[2J\rb\u202ec\u0085\x7f\t\n\xff日本é`

// checkTerminalSafe fails the test when out holds a byte or code point a
// terminal would act on or reorder by: a C0 control other than the
// layout's newlines, DEL, a C1 control, a bidi control, or a byte that is
// not UTF-8.
func checkTerminalSafe(t *testing.T, what, out string) {
	t.Helper()
	for i, r := range out {
		bad := ""
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(out[i:], "\uFFFD"):
			bad = fmt.Sprintf("byte %#02x (not UTF-8)", out[i])
		case r < 0x20 && r != '\n', r == 0x7f, r >= 0x80 && r <= 0x9f:
			bad = fmt.Sprintf("control %U", r)
		case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x061c:
			bad = fmt.Sprintf("bidi control %U", r)
		}
		if bad != "" {
			t.Errorf("%s: %s at byte %d of the output:\n%q", what, bad, i, out)
			return
		}
	}
}

func TestPrintable(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{hostile, hostileShown},
		{"plain /srv/app-1 x=y", "plain /srv/app-1 x=y"},
		{"日本語 café ×…", "日本語 café ×…"},
		{"\u2066x\u2069 \u200f \x00 \x9b", `\u2066x\u2069 \u200f \x00 \x9b`},
		{"caf\xe9", `caf\xe9`},
	} {
		if got := printable(tt.in); got != tt.want {
			t.Errorf("printable(%q) = %q, want %q", tt.in, got, tt.want)
		}
		checkTerminalSafe(t, fmt.Sprintf("printable(%q)", tt.in), printable(tt.in))
	}
}

// TestHumanOutputEscapesControls: every table and line `tether audit`,
// `job list`, `job status`, `nodes`, `sandboxes`, `sandboxes reap` and
// exec's summary table print shows what other users and agents wrote (commands, paths,
// identities, node ids, labels, errors) escaped, as printable does: a job
// command or copy path holding an OSC 52 clipboard write, a clear screen,
// a \r or a bidi override reached the terminal of whoever listed it
// (fresh-user security pass termesc20).
func TestHumanOutputEscapesControls(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	exit := 1
	for _, tc := range []struct {
		name  string
		print func(w *bytes.Buffer) error
	}{
		{"audit", func(w *bytes.Buffer) error {
			p := &auditPrinter{w: w}
			return p.print([]protocol.AuditEvent{{
				Time: now, Identity: "nats:" + hostile, Source: hostile, Operation: "cp.write" + hostile,
				Nodes: []string{"n1" + hostile}, Command: &protocol.AuditCommand{Mode: "argv", Program: hostile, SHA256: "0123456789abcdef"},
				Paths: []string{"/srv/" + hostile}, JobID: hostile, Run: hostile, RunAs: hostile,
				Result: protocol.AuditRefused + hostile, ExitCode: &exit, Reason: hostile, Error: hostile,
			}, {
				Time: now, Operation: "forward", Target: hostile, Result: protocol.AuditOK, ErrorCode: hostile,
			}})
		}},
		{"job list", func(w *bytes.Buffer) error {
			return writeJobsTable(w, []protocol.JobRecord{{
				ID: "j-" + hostile, State: protocol.JobStateRunning, Nodes: []string{"n1" + hostile, hostile},
				Owner: "nats:" + hostile, SubmittedAt: now, Command: "sh -c " + hostile,
			}})
		}},
		{"job status", func(w *bytes.Buffer) error {
			return printJobView(w, &protocol.JobRecord{
				ID: "j-" + hostile, State: protocol.JobFailed, Nodes: []string{"n1" + hostile}, Owner: "nats:" + hostile,
				Coordinator: hostile, SubmittedAt: now, Error: hostile,
				Results: []protocol.NodeResult{{Node: "n1" + hostile, ExitCode: 3, Error: hostile}},
			}, nil, "")
		}},
		{"job status, lost", func(w *bytes.Buffer) error {
			return printJobView(w, &protocol.JobRecord{
				ID: "j1", State: protocol.JobStateLost, Nodes: []string{"n1", hostile}, Coordinator: "c1", SubmittedAt: now, Error: hostile,
			}, []*protocol.JobStatus{{Node: hostile, State: protocol.JobRunning}}, "")
		}},
		{"exec summary", func(w *bytes.Buffer) error {
			return writeSummary(w, &protocol.ExecResult{Results: []protocol.NodeResult{
				{Node: "n1" + hostile, ExitCode: -1, Error: hostile, ErrorCode: "start_failed"},
				{Node: "n2", ExitCode: 3, Failure: "Command failed (exec on n2) with exit code 3:\n  " + hostile + "\n"},
			}}, 0, false, time.Second, exitInterrupted)
		}},
		{"nodes", func(w *bytes.Buffer) error {
			return writeNodesTable(w, []protocol.NodeInfo{{
				ID: "n1" + hostile, Labels: map[string]string{"k" + hostile: hostile},
				Capacity: protocol.Capacity{GPUs: 1, GPUModel: hostile}, Coordinator: hostile,
			}}, now)
		}},
		{"sandboxes", func(w *bytes.Buffer) error {
			return writeSandboxesTable(w, []protocol.SandboxInfo{{
				Node: "n1" + hostile, Provider: hostile, Name: hostile, Workspace: hostile, Run: hostile, State: hostile,
			}, {Node: "n1", Provider: "opensandbox", ID: hostile, Owner: hostile}}, now)
		}},
		{"sandboxes reap", func(w *bytes.Buffer) error {
			return writeReapTable(w, &protocol.ReapResponse{Candidates: []protocol.ReapCandidate{{
				Sandbox: protocol.SandboxInfo{Node: hostile, Provider: hostile, ID: hostile, Run: hostile},
				Reason:  hostile, Blocked: hostile,
			}}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.print(&b); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			checkTerminalSafe(t, tc.name, out)
			if !strings.Contains(out, hostileShown) {
				t.Errorf("%s: the hostile field is not shown escaped (%s):\n%s", tc.name, hostileShown, out)
			}
		})
	}
}
