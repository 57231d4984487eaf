package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/audit"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

func TestAuditOptions(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	o := auditOptions{Since: "90m", Until: "2026-12-02T11:59:00Z", Identity: "alice", Limit: 5, Poll: time.Second}
	q, err := o.query(now)
	if err != nil {
		t.Fatal(err)
	}
	if !q.Since.Equal(now.Add(-90*time.Minute)) || !q.Until.Equal(now.Add(-time.Minute)) || q.Identity != "nats:alice" {
		t.Errorf("query = %+v", q)
	}
	for _, bad := range []auditOptions{
		{Since: "yesterday", Limit: 5, Poll: time.Second},
		{Since: "-1h", Limit: 5, Poll: time.Second},
		{Limit: 0, Poll: time.Second},
		{Limit: 5, Result: "maybe", Poll: time.Second},
		{Limit: 5, Follow: true, Until: "1h", Poll: time.Second},
		{Since: "1m", Until: "1h", Limit: 5, Poll: time.Second},
		{Limit: 5, Operation: "frobnicate", Poll: time.Second},
		{Limit: 5, Job: "bad id!", Poll: time.Second},
		{Limit: 5, Job: "-leading-dash", Poll: time.Second},
		{Limit: 5, Source: "gate.example", Poll: time.Second},
	} {
		if _, err := bad.query(now); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	good := auditOptions{Limit: 5, Operation: "cp.read", Job: "job-1.a_b", Source: "127.0.0.7", Poll: time.Second}
	if q, err := good.query(now); err != nil || q.Operation != "cp.read" || q.JobID != "job-1.a_b" || q.Source != "127.0.0.7" {
		t.Errorf("%+v: %v, query %+v", good, err, q)
	}
	// Every operation the coordinator records events under is accepted:
	// the policy's and the others (a stream request of no relayed kind).
	for _, op := range append([]string{"admin"}, protocol.AuditOtherOperations()...) {
		o := auditOptions{Limit: 5, Operation: op, Poll: time.Second}
		if q, err := o.query(now); err != nil || q.Operation != op {
			t.Errorf("--operation %s: %v, query %+v", op, err, q)
		}
	}
	// On the command line: usage errors (exit 2) naming the flag, before
	// anything is asked.
	for _, c := range []struct{ flag, value, want string }{
		{"--operation", "frobnicate", `--operation "frobnicate": want one of exec, `},
		{"--operation", "frobnicate", `admin, ssh, or stream, exec-alive`},
		{"--job", "bad id!", `--job: job id "bad id!": must be`},
		{"--result", "bogus", `tether: --result "bogus": want one of ok, `},
		{"--source", "gate.example", `tether: --source "gate.example": want an IP address, or IP:PORT`},
		// A number is seconds, as in every duration flag: out of range or
		// NaN says so rather than "neither a duration nor a time".
		{"--since", "1e10", `1e10 seconds is over the limit`},
		{"--since", "NaN", `NaN is not a number of seconds`},
		{"--since", "soon", `is neither a duration (1h, 30m, or seconds: 90) nor an RFC 3339 time`},
	} {
		r := runCLI(testCtx(t), nil, "", "audit", "--nats-url", "nats://127.0.0.1:1", c.flag, c.value)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("audit %s %q: exit %d (want %d), stderr %q (want %q)", c.flag, c.value, r.code, exitUsage, r.stderr, c.want)
		}
	}
}

// withAudit gives a test fleet's coordinator an audit recorder, as tether
// coordinator has, so tether audit can read its events.
func withAudit(t *testing.T) func(*coordinator.Config) {
	return func(c *coordinator.Config) {
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		rec, err := audit.New(ctx, audit.Config{NATS: c.NATS, Coordinator: c.ID})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rec.Close(context.Background()) })
		c.Audit = rec
	}
}

func TestAuditCommand(t *testing.T) {
	f := startFleet(t, fleettest.Options{Coordinator: withAudit(t)})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	const secret = "pa55-in-env"
	if r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "--env", "SECRET="+secret, "--", "sh", "-c", "exit 4"); r.code != 4 {
		t.Fatalf("exec: exit %d, stderr %q", r.code, r.stderr)
	}
	var r result
	deadline := time.Now().Add(defaultTestTimeout)
	for {
		r = runCLI(ctx, nil, "", "audit", "--nats-url", url, "--operation", "exec", "--json")
		if r.code == 0 && strings.Count(r.stdout, "\n") >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.code != 0 {
		t.Fatalf("audit --json: exit %d, stderr %q", r.code, r.stderr)
	}
	var ev protocol.AuditEvent
	if err := json.Unmarshal([]byte(strings.SplitN(r.stdout, "\n", 2)[0]), &ev); err != nil {
		t.Fatalf("audit --json line: %v\n%s", err, r.stdout)
	}
	if ev.Operation != "exec" || ev.ExitCode == nil || *ev.ExitCode != 4 || ev.Command == nil || ev.Command.Program != "sh" {
		t.Errorf("event = %+v", ev)
	}
	if strings.Contains(r.stdout, secret) {
		t.Errorf("the env value is in the audit output:\n%s", r.stdout)
	}

	r = runCLI(ctx, nil, "", "audit", "--nats-url", url, "--node", "node-0", "--since", "1h")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) < 2 || !strings.HasPrefix(lines[0], "TIME") {
		t.Fatalf("audit table: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	row := strings.Fields(lines[len(lines)-1])
	// TIME is two fields: date and clock.
	// SOURCE is the client's IP, as the NATS server saw its connection.
	if row[3] != "127.0.0.1" || row[4] != "exec" || row[5] != "node-0" || row[6] != protocol.AuditFailed || row[7] != "4" || !strings.Contains(lines[len(lines)-1], "sh sha256:") {
		t.Errorf("audit table row: %q", lines[len(lines)-1])
	}
	r = runCLI(ctx, nil, "", "audit", "--nats-url", url, "--identity", "nats:nobody")
	// The notice goes to stderr: stdout holds only events.
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "tether: no matching audit events") {
		t.Errorf("no match: exit %d, stdout %q, stderr %q; want exit 0, nothing on stdout, the notice on stderr", r.code, r.stdout, r.stderr)
	}
}

func TestAuditFollow(t *testing.T) {
	f := startFleet(t, fleettest.Options{Coordinator: withAudit(t)})
	url := f.NATS.ClientURL()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var stdout, stderr syncBuffer
	e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"audit", "--nats-url", url, "--operation", "exec", "--json", "-f", "--poll", "20ms"}, e)
	}()
	// Events that come while it follows are printed, once each, in order.
	for i := range 3 {
		if r := runCLI(testCtx(t), nil, "", "exec", "--nats-url", url, "--node", "node-0", "--", "sh", "-c", fmt.Sprintf("exit %d", i+1)); r.code != i+1 {
			t.Fatalf("exec %d: exit %d, stderr %q", i, r.code, r.stderr)
		}
	}
	deadline := time.Now().Add(defaultTestTimeout)
	for strings.Count(stdout.String(), "\n") < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("audit -f ended with %d, stderr %q", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("followed %d events, want 3:\n%s", len(lines), stdout.String())
	}
	for i, l := range lines {
		var ev protocol.AuditEvent
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.ExitCode == nil || *ev.ExitCode != i+1 {
			t.Errorf("line %d: %v %s", i, err, l)
		}
	}
}

// TestListingsEscapeWhatOthersRan: through a real fleet, a job whose
// argv holds an OSC 52 clipboard write, a clear screen, a \r and a bidi
// override is listed by `tether job list` and `tether audit` with those
// escaped, and a copy to a path that is not UTF-8 is shown by `tether
// audit` with its bytes (it was U+FFFD; fresh-user security pass
// termesc20).
func TestListingsEscapeWhatOthersRan(t *testing.T) {
	f := startFleet(t, fleettest.Options{Jobs: true, Coordinator: withAudit(t)})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	const evil = "x\x1b]52;c;ZXZpbA==\x07\x1b[2J\r\u202e"
	const shown = `x\x1b]52;c;ZXZpbA==\a\x1b[2J\r\u202e`
	if r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "--detach", "--", "true", evil); r.code != 0 {
		t.Fatalf("exec: exit %d, stderr %q", r.code, r.stderr)
	}
	// The audit records an argv's program: one no node has.
	if r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "--", evil); r.code != 127 {
		t.Fatalf("exec %q: exit %d, stderr %q", evil, r.code, r.stderr)
	}
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(f.DataDir("node-0"), "caf\xe9")
	if r := runCLI(ctx, nil, "", "cp", "--nats-url", url, src, "node-0:"+dst); r.code != 0 {
		t.Fatalf("cp: exit %d, stderr %q", r.code, r.stderr)
	}
	r := runCLI(ctx, nil, "", "job", "list", "--nats-url", url)
	checkTerminalSafe(t, "job list", r.stdout)
	if r.code != 0 || !strings.Contains(r.stdout, "true '"+shown+"'") {
		t.Errorf("job list: exit %d, stdout %q, want the command shown as %s", r.code, r.stdout, shown)
	}
	wantPath := strconv.Quote(dst)
	deadline := time.Now().Add(defaultTestTimeout)
	for {
		r = runCLI(ctx, nil, "", "audit", "--nats-url", url)
		if r.code == 0 && strings.Contains(r.stdout, "cp.write") && strings.Contains(r.stdout, "exec") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkTerminalSafe(t, "audit", r.stdout)
	if r.code != 0 || !strings.Contains(r.stdout, shown+" sha256:") || !strings.Contains(r.stdout, wantPath) {
		t.Errorf("audit: exit %d, stdout %q, stderr %q; want the program as %s and the path as %s", r.code, r.stdout, r.stderr, shown, wantPath)
	}
}
