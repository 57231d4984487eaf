package coordinator_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// onceFleet is a fleet of two nodes whose coordinator identifies callers
// by a test header and lets alice run jobs, bob only list nodes.
func onceFleet(t *testing.T) *fleettest.Fleet {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(`version: 1
identities:
  nats:alice:
    rules:
      - nodes: "*"
        operations: [exec, nodes.list]
        run_as: `+runAsSelf(t)+`
  nats:carol:
    rules:
      - nodes: "*"
        operations: [exec]
        run_as: `+runAsSelf(t)+`
  nats:bob:
    rules:
      - nodes: "*"
        operations: [nodes.list]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fleettest.Start(t, fleettest.Options{Agents: 2, Logger: testLogger(t), Coordinator: func(c *coordinator.Config) {
		c.Identify = identifyFromHeader
		c.Policy = store
	}})
}

// execOnce sends req to tether.v1.exec.once as a plain request/reply
// client does and returns the first reply; it also checks that no second
// reply follows.
func execOnce(t *testing.T, nc *nats.Conn, hdr nats.Header, req any) *nats.Msg {
	t.Helper()
	body, ok := req.([]byte) // a raw body, as a hostile client sends it
	if !ok {
		var err error
		if body, err = json.Marshal(req); err != nil {
			t.Fatal(err)
		}
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishMsg(&nats.Msg{Subject: protocol.SubjectExecOnce, Reply: inbox, Header: hdr, Data: body}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(3 * defaultTestTimeout)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	// A keepalive would come within protocol.DefaultKeepAliveInterval; a
	// streamed output chunk or result at once.
	if extra, err := sub.NextMsg(200 * time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("a second reply: %v %q (%v)", extra.Header, extra.Data, err)
	}
	return m
}

func onceResult(t *testing.T, m *nats.Msg) *protocol.ExecOnceResult {
	t.Helper()
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		t.Fatalf("error reply %s: %s", code, m.Data)
	}
	var res protocol.ExecOnceResult
	if err := json.Unmarshal(m.Data, &res); err != nil {
		t.Fatalf("reply %q: %v", m.Data, err)
	}
	return &res
}

// TestExecOnceOneReply: a fan-out answered with one reply holding every
// node's exit status, stdout and stderr.
func TestExecOnceOneReply(t *testing.T) {
	f := onceFleet(t)
	m := execOnce(t, f.NC, as("alice"), protocol.ExecRequest{Target: protocol.Target{All: true},
		Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	res := onceResult(t, m)
	if res.ID == "" || res.Nodes != 2 || res.Failed != 2 || len(res.Results) != 2 || res.Clipped {
		t.Fatalf("result %+v", res)
	}
	for i, r := range res.Results {
		if want := []string{"node-0", "node-1"}[i]; r.Node != want || r.ExitCode != 3 || r.Stdout != "out\n" || r.Stderr != "err\n" || r.StdoutBytes != 4 {
			t.Errorf("results[%d] = %+v", i, r)
		}
	}
}

// TestExecOnceClipped: output past the per-stream bound is dropped and
// flagged; the byte counts still say what the node wrote.
func TestExecOnceClipped(t *testing.T) {
	f := onceFleet(t)
	const n = 3 * protocol.ExecOnceStreamLimit
	m := execOnce(t, f.NC, as("alice"), protocol.ExecRequest{Target: protocol.Target{Node: "node-0"},
		Argv: []string{"sh", "-c", "head -c " + strconv.Itoa(n) + " /dev/zero | tr '\\0' a"}})
	res := onceResult(t, m)
	if len(res.Results) != 1 || !res.Clipped {
		t.Fatalf("result %+v", res)
	}
	r := res.Results[0]
	if len(r.Stdout) != protocol.ExecOnceStreamLimit || !r.StdoutClipped || r.StderrClipped || r.StdoutBytes != n || r.ExitCode != 0 || strings.Trim(r.Stdout, "a") != "" {
		t.Errorf("node result: %d bytes of stdout, clipped %v/%v, stdout_bytes %d, exit %d", len(r.Stdout), r.StdoutClipped, r.StderrClipped, r.StdoutBytes, r.ExitCode)
	}
}

// TestExecOnceRefusals: authorized as exec: an unidentified caller gets
// 401, one whose policy grants no exec 403, and nothing runs; a bad or too
// long job is a 400.
func TestExecOnceRefusals(t *testing.T) {
	f := onceFleet(t)
	job := protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"touch", filepath.Join(t.TempDir(), "ran")}}
	for _, tt := range []struct {
		name string
		hdr  nats.Header
		req  any
		code string
		want string
	}{
		{"unidentified", nil, job, "401", "unauthenticated"},
		{"no exec grant", as("bob"), job, "403", "forbidden"},
		{"nothing to run", as("alice"), protocol.ExecRequest{Target: protocol.Target{All: true}}, "400", ""},
		{"not JSON", as("alice"), []byte(`{"target":{"all":true},"argv":["true"]`), "400", "malformed"},
		{"not an object", as("alice"), []byte(`["true"]`), "400", "JSON object"},
		{"unknown field", as("alice"), []byte(`{"target":{"all":true},"argv":["true"],"timeout_cap":"1h"}`), "400", "timeout_cap"},
		{"negative timeout", as("alice"), []byte(`{"target":{"all":true},"argv":["true"],"timeout":"-1s"}`), "400", ""},
		{"just over the cap", as("alice"), protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"true"}, Timeout: protocol.Duration(protocol.ExecOnceMaxTimeout + time.Millisecond)}, "400", "use tether.v1.exec"},
		{"too long", as("alice"), protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"true"}, Timeout: protocol.Duration(time.Hour)}, "400", "use tether.v1.exec"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := execOnce(t, f.NC, tt.hdr, tt.req)
			if got := m.Header.Get(micro.ErrorCodeHeader); got != tt.code || !strings.Contains(string(m.Data), tt.want) {
				t.Errorf("reply %s %q, want %s with %q", got, m.Data, tt.code, tt.want)
			}
		})
	}
	if _, err := os.Stat(job.Argv[1]); err == nil {
		t.Error("a refused job ran")
	}
}

// TestExecOnceStockNATSCLI: the stock nats CLI's one-shot `nats req` gets
// the whole result (when the CLI is installed: go install
// github.com/nats-io/natscli/nats@latest).
func TestExecOnceStockNATSCLI(t *testing.T) {
	natsCLI, err := exec.LookPath("nats")
	if err != nil {
		t.Skip("no nats CLI on PATH")
	}
	f := onceFleet(t)
	out, err := exec.Command(natsCLI, "req", "-s", f.NATS.ClientURL(), "--creds", f.CredsFile, "--inbox-prefix", f.ClientCreds.InboxPrefix(),
		"-H", testIdentity+":alice", "--timeout", "30s", "--raw",
		protocol.SubjectExecOnce, `{"target":{"all":true},"argv":["sh","-c","echo hi; echo '2>&1' >&2; exit 5"]}`).Output()
	if err != nil {
		t.Fatalf("nats req: %v\n%s", err, out)
	}
	var res protocol.ExecOnceResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("nats req printed %q: %v", out, err)
	}
	if len(res.Results) != 2 || res.Results[0].Stdout != "hi\n" || res.Results[1].Stderr != "2>&1\n" || res.Results[0].ExitCode != 5 {
		t.Errorf("result %+v", res)
	}
	if !strings.Contains(string(out), "2>&1") {
		t.Errorf("the reply escapes what people read: %s", out)
	}
}

// TestExecOnceAnotherIdentitysJob: exec.once naming the id of a job
// another identity is running is refused (409), and does not attach the
// caller to that job's output.
func TestExecOnceAnotherIdentitysJob(t *testing.T) {
	f := onceFleet(t)
	body, err := json.Marshal(protocol.ExecRequest{ID: "alices-job", Target: protocol.Target{Node: "node-0"},
		Argv: []string{"sh", "-c", "echo secret; sleep 30"}, Timeout: protocol.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	inbox := f.NC.NewInbox()
	sub, err := f.NC.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := f.NC.PublishMsg(&nats.Msg{Subject: protocol.SubjectExec, Reply: inbox, Header: as("alice"), Data: body}); err != nil {
		t.Fatal(err)
	}
	for { // alice's job runs once its output streams
		m, err := sub.NextMsg(3 * defaultTestTimeout)
		if err != nil {
			t.Fatalf("alice's job: %v", err)
		}
		if m.Header.Get(micro.ErrorCodeHeader) != "" {
			t.Fatalf("alice's job refused: %s", m.Data)
		}
		if m.Header.Get(protocol.HeaderType) == protocol.ReplyStdout {
			break
		}
	}
	m := execOnce(t, f.NC, as("carol"), protocol.ExecRequest{ID: "alices-job", Target: protocol.Target{Node: "node-0"}, Argv: []string{"true"}})
	if got := m.Header.Get(micro.ErrorCodeHeader); got != "409" || strings.Contains(string(m.Data), "secret") {
		t.Errorf("reply %s %q, want 409 without alice's output", got, m.Data)
	}
	f.NC.PublishMsg(&nats.Msg{Subject: protocol.SubjectCancel, Header: as("alice"), Data: []byte(`{"id":"alices-job"}`)})
}

// TestExecOnceAuthorizesFirst: a caller without the exec grant hears 403
// for a bad request whose target names nodes (not what is wrong with a
// job it could not run), an unidentified one 401; a request whose target
// cannot be read stays 400 (no node to decide on).
func TestExecOnceAuthorizesFirst(t *testing.T) {
	f := onceFleet(t)
	all := protocol.Target{All: true}
	for _, tt := range []struct {
		name string
		hdr  nats.Header
		req  any
		code string
	}{
		{"nothing to run", as("bob"), protocol.ExecRequest{Target: all}, "403"},
		{"over the cap", as("bob"), protocol.ExecRequest{Target: all, Argv: []string{"true"}, Timeout: protocol.Duration(time.Hour)}, "403"},
		{"negative timeout", as("bob"), []byte(`{"target":{"all":true},"argv":["true"],"timeout":"-1s"}`), "403"},
		{"unknown field", as("bob"), []byte(`{"target":{"node":"node-0"},"argv":["true"],"timeout_cap":"1h"}`), "403"},
		{"unidentified, over the cap", nil, protocol.ExecRequest{Target: all, Argv: []string{"true"}, Timeout: protocol.Duration(time.Hour)}, "401"},
		{"not JSON", as("bob"), []byte(`{"target":{"all":true},"argv":["true"]`), "400"},
		{"no target", as("bob"), protocol.ExecRequest{Argv: []string{"true"}}, "400"},
		{"two targets", as("bob"), protocol.ExecRequest{Target: protocol.Target{All: true, Node: "node-0"}, Argv: []string{"true"}}, "400"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := execOnce(t, f.NC, tt.hdr, tt.req)
			if got := m.Header.Get(micro.ErrorCodeHeader); got != tt.code {
				t.Errorf("reply %s %q, want %s", got, m.Data, tt.code)
			}
		})
	}
}

// TestExecOnceWholeJobBound: a fan-out that runs its nodes one at a time
// and would outlast the bound (2 nodes × a 2 s timeout, one at a time,
// bound 3 s) is cancelled at the bound and answered with one reply
// holding every node: the first ended by its own timeout, the second cut
// by the bound (exec_once_bound), not a 503 while the job runs on.
func TestExecOnceWholeJobBound(t *testing.T) {
	f := onceFleet(t)
	coordinator.SetExecOnceBoundForTest(f.Coordinator, 3*time.Second)
	m := execOnce(t, f.NC, as("alice"), protocol.ExecRequest{Target: protocol.Target{All: true}, MaxParallel: 1,
		Timeout: protocol.Duration(2 * time.Second), Argv: []string{"sh", "-c", "echo started; exec sleep 60"}})
	res := onceResult(t, m)
	if !res.TimedOut || res.Nodes != 2 || len(res.Results) != 2 || res.Failed != 2 {
		t.Fatalf("result %+v, want both nodes, timed out", res)
	}
	if r := res.Results[0]; r.Node != "node-0" || r.OK() || r.ErrorCode == protocol.ResultCodeExecOnceBound {
		t.Errorf("first node: %+v, want ended by its own timeout", r.NodeResult)
	}
	if r := res.Results[1]; r.Node != "node-1" || !r.Cancelled || r.ErrorCode != protocol.ResultCodeExecOnceBound || !strings.Contains(r.Error, "whole-job bound") {
		t.Errorf("second node: %+v, want cancelled by the bound", r.NodeResult)
	}
	// The bound also caps the timeout it takes, checked once authorized.
	m = execOnce(t, f.NC, as("alice"), protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"true"}, Timeout: protocol.Duration(4 * time.Second)})
	if got := m.Header.Get(micro.ErrorCodeHeader); got != "400" || !strings.Contains(string(m.Data), "use tether.v1.exec") {
		t.Errorf("timeout over the bound: %s %q, want 400", got, m.Data)
	}
}
