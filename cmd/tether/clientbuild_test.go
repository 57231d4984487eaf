package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// daemonOnly are the top-level commands only the full build links.
var daemonOnly = []string{"coordinator", "agent", "dev", "policy", "config", "nats"}

// heavyPackages are import-path prefixes of what the daemons link and a
// client command never needs: their package initialisation (or their
// size) is what made every `tether` start-up slow (issue 12).
var heavyPackages = []string{
	"github.com/nats-io/nats-server/",
	"google.golang.org/grpc",
	"google.golang.org/protobuf/",
	"github.com/prometheus/",
	"golang.org/x/crypto/ssh",
	"github.com/pkg/sftp",
	"github.com/creack/pty",
	"github.com/coreos/go-systemd/",
	"github.com/tetherfleet/tether/coordinator",
	"github.com/tetherfleet/tether/agent",
	"github.com/tetherfleet/tether/gateway",
	"github.com/tetherfleet/tether/internal/sdnotify",
	// Not the daemons' alone, but what a client does not use of it is
	// costly to initialise: micro compiles regular expressions.
	"github.com/nats-io/nats.go/micro",
	// policy's parser and YAML (a client needs only its operations'
	// names, in protocol).
	"github.com/tetherfleet/tether/policy",
	"go.yaml.in/yaml/",
}

// deps lists the packages ./ (cmd/tether) links with the build tags.
func deps(t *testing.T, tags string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-tags", tags, "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps -tags %q: %v\n%s", tags, err, ee.Stderr)
		}
		t.Fatalf("go list -deps -tags %q: %v", tags, err)
	}
	return strings.Fields(string(out))
}

// heavy returns the packages of list that heavyPackages names.
func heavy(list []string) []string {
	var out []string
	for _, p := range list {
		for _, h := range heavyPackages {
			if strings.HasPrefix(p, h) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// The client-only build (-tags tetherclient) links none of the daemons'
// packages; the full build links them (so that the list above names what
// the full build really has).
func TestClientBuildLinksNoDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("go list -deps of two builds")
	}
	if got := heavy(deps(t, "tetherclient")); len(got) > 0 {
		t.Errorf("the client build (-tags tetherclient) links %d daemon packages:\n  %s", len(got), strings.Join(got, "\n  "))
	}
	full := heavy(deps(t, ""))
	for _, h := range []string{"github.com/nats-io/nats-server/", "github.com/prometheus/", "github.com/tetherfleet/tether/coordinator", "github.com/tetherfleet/tether/agent"} {
		if !slices.ContainsFunc(full, func(p string) bool { return strings.HasPrefix(p, h) }) {
			t.Errorf("the full build links nothing under %s: heavyPackages is out of date", h)
		}
	}
}

// buildTether builds cmd/tether with tags into dir and returns the binary.
func buildTether(t *testing.T, dir, name, tags string) string {
	t.Helper()
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-tags", tags, "-o", bin, ".")
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags %q: %v\n%s", tags, err, out)
	}
	return bin
}

type result struct {
	stdout, stderr string
	code           int
}

// runBin runs bin with args, no stdin, an empty environment but HOME and
// PATH (no NATS to reach: a client command that would connect fails the
// same way in both builds). A process still running after 20 s (a daemon
// that a broken client build really started) is killed: its result has
// code -1.
func runBin(t *testing.T, bin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.WaitDelay = time.Second
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=/usr/bin:/bin", "TETHER_NATS_URL=nats://127.0.0.1:1"}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%s %q: %v", bin, args, err)
		}
		code = ee.ExitCode()
	}
	return result{out.String(), errb.String(), code}
}

// subcommands are the commands an "Available Commands:" section of help
// lists.
func subcommands(help string) []string {
	_, rest, ok := strings.Cut(help, "\nAvailable Commands:\n")
	if !ok {
		return nil
	}
	var names []string
	for _, line := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(line, "  ") {
			break
		}
		names = append(names, strings.Fields(line)[0])
	}
	return names
}

// The client build runs: `version` prints what the full build's does; its
// help lists the client commands and none of the daemons'; every client
// command and subcommand has the full build's help (flags, defaults,
// text), and the same usage errors and exit codes; a daemon command is
// refused with exit 2, naming the full build, whatever its flags.
func TestClientBuildRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tether twice")
	}
	dir := t.TempDir()
	client := buildTether(t, dir, "tether-client", "tetherclient")
	full := buildTether(t, dir, "tether", "")

	v := runBin(t, client, "version")
	if v.code != 0 || !regexp.MustCompile(`^tether \S+ \(go\S+ \w+/\w+\)\n$`).MatchString(v.stdout) || v.stderr != "" {
		t.Errorf("client version: exit %d, stdout %q, stderr %q", v.code, v.stdout, v.stderr)
	}
	if fv := runBin(t, full, "version"); fv != v {
		t.Errorf("client version %+v, full build's %+v", v, fv)
	}

	h := runBin(t, client, "--help")
	if h.code != 0 {
		t.Fatalf("client --help: exit %d, stderr %q", h.code, h.stderr)
	}
	cmds := subcommands(h.stdout)
	for _, want := range []string{"version", "exec", "nodes", "shell", "job", "cp", "forward", "ssh-config", "ssh-proxy", "sandboxes", "run-lease", "audit", "token", "node", "completion", "help"} {
		if !slices.Contains(cmds, want) {
			t.Errorf("client --help does not list %q (lists %q)", want, cmds)
		}
	}
	for _, d := range daemonOnly {
		if slices.Contains(cmds, d) {
			t.Errorf("client --help lists %q, which the client build does not link", d)
		}
	}
	if !strings.Contains(h.stdout, "client-only build") {
		t.Errorf("client --help does not say it is the client-only build:\n%s", h.stdout)
	}
	fullCmds := subcommands(runBin(t, full, "--help").stdout)
	for _, d := range daemonOnly {
		if !slices.Contains(fullCmds, d) {
			t.Errorf("the full build's --help does not list %q: daemonOnly is out of date", d)
		}
	}
	for _, c := range cmds {
		if !slices.Contains(fullCmds, c) {
			t.Errorf("client --help lists %q, which the full build lacks", c)
		}
	}

	// Completion offers what exists.
	comp := runBin(t, client, "__complete", "")
	for _, d := range daemonOnly {
		if regexp.MustCompile(`(?m)^` + d + `\t`).MatchString(comp.stdout) {
			t.Errorf("client completion offers %q:\n%s", d, comp.stdout)
		}
	}
	if !strings.Contains(comp.stdout, "exec\t") {
		t.Errorf("client completion does not offer exec:\n%s", comp.stdout)
	}

	// Every client command's help, at every depth, is the full build's.
	compared := 0
	var walk func(path []string)
	walk = func(path []string) {
		compared++
		args := append(append([]string(nil), path...), "--help")
		c, f := runBin(t, client, args...), runBin(t, full, args...)
		if c != f {
			t.Errorf("tether %s: client build %+v, full build %+v", strings.Join(args, " "), c, f)
			return
		}
		for _, sub := range subcommands(c.stdout) {
			if sub != "help" && sub != "completion" {
				walk(append(append([]string(nil), path...), sub))
			}
		}
	}
	for _, c := range cmds {
		if c != "help" && c != "completion" {
			walk([]string{c})
		}
	}
	t.Logf("compared the help of %d client commands", compared)

	// Usage errors, and failures to reach NATS, end alike.
	for _, args := range [][]string{
		{"exec"},
		{"exec", "--node", "n1", "--bogus", "--", "true"},
		{"exce", "--node", "n1"},
		{"job", "status", "bad id!"},
		{"nodes", "--json", "extra"},
		{"cp", "a"},
		{"version", "extra"},
	} {
		c, f := runBin(t, client, args...), runBin(t, full, args...)
		if c != f {
			t.Errorf("tether %q: client build %+v, full build %+v", args, c, f)
		}
		if c.code != 2 {
			t.Errorf("tether %q: exit %d, want 2 (usage)", args, c.code)
		}
	}

	// Each of these fails fast in the full build (no --policy, no
	// --coordinator, an unknown flag): a broken client build starts no
	// daemon on the ports other tests use.
	for _, args := range [][]string{
		{"coordinator"}, {"coordinator", "--help"}, {"agent", "--token-file", "x"}, {"dev", "--no-such-flag"},
		{"policy", "check", "p.yaml"}, {"config", "example", "--role", "agent"}, {"nats", "user", "list"},
	} {
		r := runBin(t, client, args...)
		want := "tether: this is the client-only build of tether (built with -tags tetherclient); `tether " + args[0] + "` needs the full build (make build: bin/tether)\n"
		if r.code != 2 || r.stdout != "" || r.stderr != want {
			t.Errorf("client tether %q: exit %d, stdout %q, stderr %q; want exit 2, stderr %q", args, r.code, r.stdout, r.stderr, want)
		}
	}
}
