package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// unreachableNATS is a NATS URL nothing listens on: a command that gets as
// far as connecting fails with 255 ("connect to NATS"), so a 2 proves the
// command refused its arguments before sending anything.
const unreachableNATS = "nats://127.0.0.1:1"

// TestRefusedArgumentsAreUsageErrors: whatever the API (or the agent) would
// refuse is found by the CLI first, with the protocol package's own
// validation, and is a usage error (2): nothing was sent.
func TestRefusedArgumentsAreUsageErrors(t *testing.T) {
	big := strings.Repeat("a", protocol.MaxHeaderSize)
	many := make([]string, protocol.MaxArgs+1)
	for i := range many {
		many[i] = "x"
	}
	tests := []struct {
		name  string
		stdin string
		args  []string
		want  string // a part of stderr
	}{
		{"exec --stdin over the limit", strings.Repeat("z", protocol.MaxStdinSize+1), []string{"exec", "--all", "--stdin", "--", "wc", "-c"}, "--stdin"},
		{"job status bad id", "", []string{"job", "status", "--node", "n1", "bad!"}, `job id "bad!"`},
		{"job cancel bad id", "", []string{"job", "cancel", "--node", "n1", "bad!"}, `job id "bad!"`},
		{"job logs bad id", "", []string{"job", "logs", "--node", "n1", "bad!"}, `job id "bad!"`},
		{"job logs --follow bad id", "", []string{"job", "logs", "--node", "n1", "--follow", "bad!"}, `job id "bad!"`},
		{"job status empty id", "", []string{"job", "status", "--node", "n1", ""}, `job id ""`},
		{"job status long id", "", []string{"job", "status", "--node", "n1", strings.Repeat("j", protocol.MaxJobIDLen+1)}, "job id"},
		{"shell empty command", "x", []string{"shell", "n1", "--", ""}, "the command after -- is empty"},
		{"exec empty idempotency key", "", []string{"exec", "--node", "n1", "--idempotency-key", "", "--", "true"}, "--idempotency-key is empty"},
		{"exec empty command", "", []string{"exec", "--node", "n1", "--", ""}, "the command after -- is empty"},
		{"shell too many arguments", "x", append([]string{"shell", "n1", "--"}, many...), "argv has 4097 entries"},
		{"shell params over the header limit", "x", []string{"shell", "n1", "--", "echo", big}, "stream header limit of 65536 bytes"},
		{"exec params over the header limit", "", []string{"exec", "--node", "n1", "--", "echo", big}, "stream header limit of 65536 bytes"},
		{"exec timeout out of range", "", []string{"exec", "--node", "n1", "--timeout", "1e12", "--", "true"}, "1e12 seconds is over the limit"},
		{"forward bad port", "", []string{"forward", "n1", "openshell", "99999"}, "99999"},
		{"forward bad port name", "", []string{"forward", "n1", "openshell", "127.0.0.1:http-alt"}, "port"},
		{"nodes bad selector", "", []string{"nodes", "--selector", "a in (b"}, "--selector"},
		{"sandboxes bad run", "", []string{"sandboxes", "--run", "a b"}, "--run"},
		{"reap bad run", "", []string{"sandboxes", "reap", "--run", "a b"}, "run"},
		{"run-lease bad run", "", []string{"run-lease", "--run", "a b", "--", "true"}, "--run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// --nats-url goes right after the command's path (before any
			// "--" or positional argument).
			n := 1
			if tt.args[0] == "job" || (tt.args[0] == "sandboxes" && len(tt.args) > 1 && tt.args[1] == "reap") {
				n = 2
			}
			args := append(append(append([]string(nil), tt.args[:n]...), "--nats-url", unreachableNATS), tt.args[n:]...)
			r := runCLI(testCtx(t), nil, tt.stdin, args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("exit %d, want %d (usage: nothing sent); stderr %q, want it to contain %q", r.code, exitUsage, clipForLog(r.stderr), tt.want)
			}
			if strings.Contains(r.stderr, "connect to NATS") {
				t.Errorf("the command tried to reach the coordinator: %q", clipForLog(r.stderr))
			}
		})
	}
}

func clipForLog(s string) string {
	if len(s) > 400 {
		return s[:400] + "…"
	}
	return s
}

// An empty script says that the script is empty, in the user's words (the
// file, or standard input), not in the API's.
func TestEmptyScriptMessages(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.sh")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"/dev/null", []string{"exec", "--nats-url", unreachableNATS, "--node", "n1", "--script", os.DevNull}, "--script " + os.DevNull + ": the script file is empty"},
		{"empty file", []string{"exec", "--nats-url", unreachableNATS, "--node", "n1", "--script", empty}, "--script " + empty + ": the script file is empty"},
		{"stdin", []string{"exec", "--nats-url", unreachableNATS, "--node", "n1", "--script", "-"}, "--script -: the script on standard input is empty"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(testCtx(t), nil, "", tt.args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) || strings.Contains(r.stderr, "argv or commands") {
				t.Errorf("exit %d, stderr %q; want 2 and %q", r.code, r.stderr, tt.want)
			}
		})
	}
}

// Every failure to read --script's file has one form, "--script FILE:
// REASON", with no operation named twice (fresh17 item 9: "read script
// /etc: read /etc: is a directory"), and a usage error's code.
func TestScriptFileErrors(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.sh")
	if err := os.WriteFile(big, bytes.Repeat([]byte("#"), protocol.MaxScriptSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	nl := filepath.Join(dir, "a\nb.sh")
	for _, tt := range []struct {
		name, path, want string
	}{
		{"directory", dir, "tether: --script " + dir + ": is a directory\n"},
		{"missing", filepath.Join(dir, "nope.sh"), "tether: --script " + filepath.Join(dir, "nope.sh") + ": no such file or directory\n"},
		{"too big", big, fmt.Sprintf("tether: --script %s: the script is over the %d byte limit\n", big, protocol.MaxScriptSize)},
		{"newline in the name", nl, "tether: --script " + strconv.Quote(nl) + ": no such file or directory\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(testCtx(t), nil, "", "exec", "--nats-url", unreachableNATS, "--node", "n1", "--script", tt.path)
			if r.code != exitUsage || !strings.HasPrefix(r.stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want 2 and a stderr starting %q", r.code, r.stderr, tt.want)
			}
		})
	}
}

// No flag's help says its default twice: a flag that documents its own
// default ("(default: ...)") must not also get cobra's "(default 0s)".
func TestFlagHelpDefaultsNotDoubled(t *testing.T) {
	root := newRootCmd(&env{getenv: testGetenv(nil)})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			fs := pflag.NewFlagSet("", pflag.ContinueOnError)
			fs.AddFlag(f)
			line := fs.FlagUsages()
			if strings.Contains(line, "(default:") && strings.Contains(line, "(default ") {
				t.Errorf("%s --%s: default given twice: %s", c.CommandPath(), f.Name, strings.TrimSpace(line))
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// Messages about a node name it once.
func TestMessagesNameTheNodeOnce(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"job not found", []string{"job", "status", "--nats-url", url, "--node", "node-0", "nosuchid"}, 255, `tether: node node-0: no detached job "nosuchid"`},
		{"shell bad cwd", []string{"shell", "node-0", "--nats-url", url, "--cwd", "/nonexistent", "--", "true"}, 255, "tether: node node-0: cwd /nonexistent: no such file or directory (start_failed)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(ctx, nil, "x", tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.want) || strings.Count(r.stderr, "node-0") != 1 {
				t.Errorf("exit %d, stderr %q; want %d, %q, naming node-0 once", r.code, r.stderr, tt.code, tt.want)
			}
		})
	}
}

func TestFormatSizeSingular(t *testing.T) {
	for n, want := range map[int64]string{1: "1 byte", 2: "2 bytes", 1 << 10: "1 KiB"} {
		if got := formatSize(n); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", n, got, want)
		}
	}
}
