package cli

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestJobStatusOneLayout: tether job status prints one layout whatever
// the job: the same keys for a detached and an attached job, on one node
// or several, and a node: line for every node with its exit code and
// output sizes. Before, a detached job on one node had a layout of its
// own (no nodes:, owner: or held by: line; node:, stdout: and stderr:
// lines instead), and a fan-out's node: lines had no output sizes
// (fresh-user pass cliux19).
func TestJobStatusOneLayout(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 2, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	keys := func(out string) []string {
		var ks []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			k, _, _ := strings.Cut(l, ":")
			if len(ks) == 0 || ks[len(ks)-1] != k {
				ks = append(ks, k)
			}
		}
		return ks
	}
	var layouts [][]string
	for _, tc := range []struct {
		name   string
		target []string
		nodes  []string
	}{
		{"detached on one node", []string{"--node", "node-0", "--detach"}, []string{"node-0"}},
		{"attached on one node", []string{"--node", "node-0"}, []string{"node-0"}},
		{"detached fan-out", []string{"--all", "--detach"}, []string{"node-0", "node-1"}},
		{"attached fan-out", []string{"--all"}, []string{"node-0", "node-1"}},
	} {
		r := runCLI(ctx, nil, "", append(append([]string{"exec", "--nats-url", url, "--json"}, tc.target...), "--", "sh", "-c", "echo hi; exit 3")...)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		var res protocol.ExecResult
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || res.ID == "" {
			t.Fatalf("%s: exec: exit %d, stdout %q, stderr %q", tc.name, r.code, r.stdout, r.stderr)
		}
		if w := runCLI(ctx, nil, "", "job", "wait", "--nats-url", url, "--poll", "50ms", res.ID); w.code == 0 {
			t.Fatalf("%s: job wait: exit 0, want the job's failure", tc.name)
		}
		r = runCLI(ctx, nil, "", "job", "status", "--nats-url", url, res.ID)
		if r.code != 0 {
			t.Fatalf("%s: job status: exit %d, stderr %q", tc.name, r.code, r.stderr)
		}
		for _, n := range tc.nodes {
			if !regexp.MustCompile(`(?m)^node: +` + n + ` exit 3, stdout 3 bytes, stderr 0 bytes$`).MatchString(r.stdout) {
				t.Errorf("%s: job status has no node: line of %s with its exit and sizes:\n%s", tc.name, n, r.stdout)
			}
		}
		layouts = append(layouts, keys(r.stdout))
	}
	for _, l := range layouts[1:] {
		if !slices.Equal(l, layouts[0]) {
			t.Errorf("job status layouts differ: %q and %q", layouts[0], l)
		}
	}

	// A running detached fan-out: each node is asked, and shown.
	r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--all", "--detach", "--", "sleep", "30")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("exec --all --detach: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	t.Cleanup(func() { runCLI(ctx, nil, "", "job", "cancel", "--nats-url", url, id) })
	r = runCLI(ctx, nil, "", "job", "status", "--nats-url", url, id)
	for _, n := range []string{"node-0", "node-1"} {
		if r.code != 0 || !regexp.MustCompile(`(?m)^node: +`+n+` running, stdout 0 bytes, stderr 0 bytes$`).MatchString(r.stdout) {
			t.Errorf("job status of a running fan-out: exit %d, stdout:\n%s\nwant %s running with its sizes; stderr %q", r.code, r.stdout, n, r.stderr)
		}
	}
	if !slices.Equal(keys(r.stdout), slices.DeleteFunc(slices.Clone(layouts[0]), func(k string) bool { return k == "exit" || k == "finished" })) {
		t.Errorf("job status of a running fan-out: layout %q, want %q without exit and finished", keys(r.stdout), layouts[0])
	}
}
