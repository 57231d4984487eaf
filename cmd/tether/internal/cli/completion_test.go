package cli

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestCompletionScripts: `tether completion SHELL` writes cobra's script
// for each shell, and --version prints the version line.
func TestCompletionScripts(t *testing.T) {
	ctx := testCtx(t)
	for shell, want := range map[string]string{"bash": "__start_tether", "zsh": "#compdef tether", "fish": "complete -c tether", "powershell": "Register-ArgumentCompleter"} {
		r := runCLI(ctx, nil, "", "completion", shell)
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("completion %s: exit %d, stderr %q, no %q in stdout", shell, r.code, r.stderr, want)
		}
	}
	r := runCLI(ctx, nil, "", "--version")
	if r.code != 0 || r.stdout != versionString()+"\n" {
		t.Errorf("--version: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestSuggestions: a mistyped command or subcommand is a usage error that
// names the one meant.
func TestSuggestions(t *testing.T) {
	ctx := testCtx(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"exce"}, `unknown command "exce" for "tether"; did you mean "exec"?`},
		{[]string{"nodse"}, `did you mean "node" or "nodes"?`},
		{[]string{"job", "stauts", "j1"}, `unknown command "stauts" for "tether job"; did you mean "status"?`},
		{[]string{"nats", "usr"}, `did you mean "user"?`},
		// A mistyped command followed by the meant command's flags is
		// still an unknown command, not "unknown flag: --node".
		{[]string{"exce", "--node", "n1", "--", "true"}, `unknown command "exce" for "tether"; did you mean "exec"?`},
		{[]string{"job", "stauts", "--node", "n1", "j1"}, `unknown command "stauts" for "tether job"; did you mean "status"?`},
	} {
		r := runCLI(ctx, nil, "", tt.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, r.code, r.stderr, tt.want)
		}
	}
}

// completions runs `tether __complete args...` and returns the
// candidates (without descriptions) and the directive line.
func completions(t *testing.T, vars map[string]string, args ...string) ([]string, string, result) {
	t.Helper()
	r := runCLI(testCtx(t), vars, "", append([]string{"__complete"}, args...)...)
	if r.code != 0 {
		t.Fatalf("__complete %v: exit %d, stderr %q", args, r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var cands []string
	for _, l := range lines[:len(lines)-1] {
		cands = append(cands, strings.SplitN(l, "\t", 2)[0])
	}
	return cands, lines[len(lines)-1], r
}

// TestCompletionFromFleet: node ids, label terms, job ids and a node's
// targets are completed from the live fleet the command would use.
func TestCompletionFromFleet(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 2, Jobs: true,
		Agent: func(i int, c *agent.Config) {
			c.Labels = map[string]string{"zone": []string{"a", "b"}[i]}
			c.Targets = map[string]string{"echo": "127.0.0.1:9"}
		}})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	// An attached job: its record lists it (a detached one would leave
	// its output files to the test's cleanup).
	r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-1", "--json", "--", "true")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var res protocol.ExecResult
	if r.code != 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &res) != nil || res.ID == "" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	job := res.ID

	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"exec", "--nats-url", url, "--node", ""}, []string{"node-0", "node-1"}},
		{[]string{"exec", "--nats-url", url, "--node", "node-1"}, []string{"node-1"}},
		{[]string{"job", "status", "--nats-url", url, "--node", "node-"}, []string{"node-0", "node-1"}},
		{[]string{"exec", "--nats-url", url, "--selector", "zo"}, []string{"zone", "zone!=a", "zone!=b", "zone=a", "zone=b"}},
		{[]string{"exec", "--nats-url", url, "--selector", "zone=a,!z"}, []string{"zone=a,!zone"}},
		{[]string{"job", "status", "--nats-url", url, ""}, []string{job}},
		{[]string{"job", "wait", "--nats-url", url, job[:4]}, []string{job}},
		{[]string{"job", "logs", "--nats-url", url, job, ""}, nil},
		{[]string{"shell", "--nats-url", url, "node-0"}, []string{"node-0"}},
		{[]string{"forward", "--nats-url", url, "node-0", ""}, []string{"echo"}},
		{[]string{"cp", "--nats-url", url, "node-"}, []string{"node-0:", "node-1:"}},
		{[]string{"job", "list", "--state", "su"}, []string{"succeeded"}},
	} {
		got, _, _ := completions(t, nil, tt.args...)
		if strings.Join(got, " ") != strings.Join(tt.want, " ") {
			t.Errorf("__complete %v = %q, want %q", tt.args, got, tt.want)
		}
	}
}

// TestCompletionWithoutFleet: with no fleet to ask (nothing listens, or
// something that never answers), completion offers nothing and prints no
// error for the shell to show.
func TestCompletionWithoutFleet(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "nats://" + refused.Addr().String()
	refused.Close()
	for _, url := range []string{deadURL, "nats://" + silent.Addr().String()} {
		for _, args := range [][]string{
			{"exec", "--nats-url", url, "--node", ""},
			{"job", "status", "--nats-url", url, ""},
			{"forward", "--nats-url", url, ""},
		} {
			got, directive, r := completions(t, nil, args...)
			if len(got) != 0 || directive != ":4" || strings.Contains(r.stderr, "tether:") {
				t.Errorf("__complete %v: candidates %q, directive %q, stderr %q", args, got, directive, r.stderr)
			}
		}
	}
}

// TestClipText: a job's command as a candidate's description: one line,
// unquoted, cut at a rune.
func TestClipText(t *testing.T) {
	for in, want := range map[string]string{
		"[sleep 5]":               "[sleep 5]",
		"echo a\n\techo b":        "echo a echo b",
		strings.Repeat("é", 40):   strings.Repeat("é", 30) + "…",
		strings.Repeat("x", 61):   strings.Repeat("x", 60) + "…",
		`sh -c "echo \"quoted\""`: `sh -c "echo \"quoted\""`,
	} {
		if got := clipText(in, 60); got != want {
			t.Errorf("clipText(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCompletionUnsupportedShell: `tether completion SHELL` for a shell
// cobra writes no script for, or none at all, is a usage error (2) naming
// the shells there are; cobra alone printed its help and exited 0.
func TestCompletionUnsupportedShell(t *testing.T) {
	for _, args := range [][]string{{"completion", "tcsh"}, {"completion"}, {"completion", "tcsh", "csh"}} {
		r := runCLI(testCtx(t), nil, "", args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "bash, fish, powershell or zsh") || r.stdout != "" {
			t.Errorf("tether %s: exit %d, stdout %q, stderr %q; want 2, nothing on stdout and the shells named", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
	}
	if r := runCLI(testCtx(t), nil, "", "completion", "tcsh"); !strings.Contains(r.stderr, `"tcsh"`) {
		t.Errorf("completion tcsh does not name the shell asked for: %q", r.stderr)
	}
}
