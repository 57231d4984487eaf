package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

// TestFilterFlagsShareTheirRules: job list and audit read their shared
// filters by one rule each, refused (exit 2, naming the flag, before
// anything is sent) alike: --node by the node id rule (audit took any
// text), an identity (audit --identity, job list --owner) by the policy's
// identity rule, naming the bad character (job list took any text), and
// --limit 1 to the command's maximum (job list read 0 as its default 100,
// audit refused it). Fresh-user pass cliux19.
func TestFilterFlagsShareTheirRules(t *testing.T) {
	ctx := testCtx(t)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"audit", "--node", "bad node"}, []string{`--node: node id "bad node": must be`}},
		{[]string{"job", "list", "--node", "bad node"}, []string{`--node: node id "bad node": must be`}},
		{[]string{"audit", "--identity", "bob smith"}, []string{`--identity "bob smith":`, `character ' '`}},
		{[]string{"job", "list", "--owner", "bob smith"}, []string{`--owner "bob smith":`, `character ' '`}},
		{[]string{"job", "list", "--owner", "nats:bob/x"}, []string{`--owner "nats:bob/x":`, `character '/'`}},
		{[]string{"job", "list", "--owner", "robot:bob"}, []string{`--owner "robot:bob":`, `unknown kind "robot"`}},
		{[]string{"audit", "--identity", "nats-account:ops"}, []string{`--identity "nats-account:ops":`, `give nats:USER`}},
		{[]string{"job", "list", "--limit", "0"}, []string{`--limit 0: want 1 to 1000`}},
		{[]string{"job", "list", "--limit", "1001"}, []string{`--limit 1001: want 1 to 1000`}},
		{[]string{"audit", "--limit", "0"}, []string{`--limit 0: want 1 to 100000`}},
		{[]string{"audit", "--limit", "-1"}, []string{`--limit -1: want 1 to 100000`}},
	} {
		r := runCLI(ctx, nil, "", append(c.args, "--nats-url", "nats://127.0.0.1:1")...)
		for _, want := range c.want {
			if r.code != exitUsage || !strings.Contains(r.stderr, want) {
				t.Errorf("%q: exit %d (want %d), stderr %q (want %q)", c.args, r.code, exitUsage, r.stderr, want)
			}
		}
	}
}

// TestJobListOwnerAsAuditIdentity: job list --owner takes an identity as
// audit --identity does, a bare name being the NATS user nats:NAME (it
// matched nothing, silently: owners are recorded as nats:NAME).
func TestJobListOwnerAsAuditIdentity(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 1, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	id := startDetached(ctx, t, url, "true")
	row := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + ` .* nats:fleettest `)
	for _, owner := range []string{"fleettest", "nats:fleettest"} {
		r := runCLI(ctx, nil, "", "job", "list", "--nats-url", url, "--owner", owner)
		if r.code != 0 || !row.MatchString(r.stdout) {
			t.Errorf("job list --owner %s: exit %d, stdout %q, stderr %q; want the row of %s", owner, r.code, r.stdout, r.stderr, id)
		}
	}
	r := runCLI(ctx, nil, "", "job", "list", "--nats-url", url, "--owner", "someone-else")
	if r.code != 0 || strings.Contains(r.stdout, id) {
		t.Errorf("job list --owner someone-else: exit %d, stdout %q; want no row of %s", r.code, r.stdout, id)
	}
}
