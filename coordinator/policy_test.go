package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// writePolicy writes a policy file and returns a Store on it.
func writePolicy(tb testing.TB, yaml string) (*policy.Store, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		tb.Fatal(err)
	}
	s, err := policy.NewStore(path, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return s, path
}

// replacePolicy writes a new policy file over path (write beside and
// rename, as an editor does).
func replacePolicy(tb testing.TB, path, yaml string) {
	tb.Helper()
	if err := os.WriteFile(path+".new", []byte(yaml), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		tb.Fatal(err)
	}
}

// newPolicyHarness is a harness whose coordinator decides by the policy
// yaml. Callers are real NATS client users (h.as): the identity is what
// the NATS server stamped on their requests.
func newPolicyHarness(t *testing.T, yaml string, mutate func(*coordinator.Config)) (*harness, string) {
	t.Helper()
	store, path := writePolicy(t, yaml)
	h := newHarness(t, func(c *coordinator.Config) {
		c.Policy = store
		if mutate != nil {
			mutate(c)
		}
	})
	return h, path
}

// clients are the connections of the client users a test made, by name.
var clients sync.Map // *harness+name -> *nats.Conn

// as returns a connection as the NATS client user who (identity
// nats:WHO), made once per harness.
func (h *harness) as(who string) *nats.Conn {
	h.t.Helper()
	key := fmt.Sprintf("%p/%s", h, who)
	if nc, ok := clients.Load(key); ok {
		return nc.(*nats.Conn)
	}
	nc := h.env.Client(h.t, who)
	clients.Store(key, nc)
	h.t.Cleanup(func() { clients.Delete(key) })
	return nc
}

// requestAs sends a request on nc and returns the API error of the reply
// (nil for a success) and the reply.
func requestAs(t *testing.T, nc *nats.Conn, subject string, body any) (*protocol.APIError, *nats.Msg) {
	t.Helper()
	reply, err := nc.Request(subject, mustJSON(t, body), defaultTestTimeout)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	return replyError(t, reply), reply
}

func replyError(t *testing.T, m *nats.Msg) *protocol.APIError {
	t.Helper()
	if m.Header.Get(micro.ErrorCodeHeader) == "" {
		return nil
	}
	var e protocol.APIError
	if err := json.Unmarshal(m.Data, &e); err != nil {
		t.Fatalf("decode error reply %q: %v", m.Data, err)
	}
	return &e
}

// execAs runs an exec request on nc and collects its replies (execRaw).
func execAs(t *testing.T, nc *nats.Conn, body any) execReply {
	t.Helper()
	r, err := execRaw(nc, mustJSON(t, body))
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	return r
}

// wantRefused fails unless e is the API error status/code whose message
// holds every one of parts.
func wantRefused(t *testing.T, what string, e *protocol.APIError, status int, code string, parts ...string) {
	t.Helper()
	if e == nil {
		t.Fatalf("%s: allowed, want %d %s", what, status, code)
	}
	if e.Status != status || e.Code != code {
		t.Fatalf("%s: got %d %s (%s), want %d %s", what, e.Status, e.Code, e.Message, status, code)
	}
	for _, p := range parts {
		if !strings.Contains(e.Message, p) {
			t.Errorf("%s: message %q does not name %q", what, e.Message, p)
		}
	}
}

// headerLog records the params of every exec-like stream the fake agents
// were sent, by node.
type headerLog struct {
	mu sync.Mutex
	hs map[string][]protocol.Header
}

func (l *headerLog) hook(node string) func(protocol.Header) {
	return func(h protocol.Header) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.hs == nil {
			l.hs = map[string][]protocol.Header{}
		}
		l.hs[node] = append(l.hs[node], h)
	}
}

func (l *headerLog) of(node string) []protocol.Header {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]protocol.Header(nil), l.hs[node]...)
}

func userOf(t *testing.T, h protocol.Header) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(h.Params, &m); err != nil {
		t.Fatal(err)
	}
	var u string
	if raw, ok := m["user"]; ok {
		if err := json.Unmarshal(raw, &u); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

const stagingPolicy = `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "env=staging"
        operations: [exec, job.status, job.logs, job.cancel, nodes.list]
        run_as: deploy
      - nodes: "env=staging"
        operations: [cp.write]
        paths: [/srv/app]
        run_as: deploy
      - nodes: "env=staging"
        operations: [forward]
        targets: [openshell]
  nats:bob:
    rules:
      - nodes: "*"
        operations: [exec, nodes.list]
        run_as: bob
  nats:ops:
    rules:
      - nodes: "*"
        operations: [job.status, job.cancel]
        scope: any
`

// TestPolicyExec: an exec runs only when policy allows it on every node it
// targets, as the user the policy names; a refusal names the identity, the
// operation, the node and the rule missing, and nothing runs anywhere.
func TestPolicyExec(t *testing.T) {
	h, _ := newPolicyHarness(t, stagingPolicy, nil)
	var hdrs headerLog
	a := h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}, header: hdrs.hook("n-a")})
	b := h.dialAgent(t, agentOpts{id: "n-b", labels: map[string]string{"env": "prod"}, header: hdrs.hook("n-b")})

	r := execAs(t, h.as("alice"), map[string]any{"target": map[string]any{"all": true}, "argv": []string{"ok"}})
	wantRefused(t, "alice exec on all", r.err, 403, protocol.ErrCodeForbidden, "nats:alice", "exec", "n-b", "env=prod")
	if n := a.execs.Load() + b.execs.Load(); n != 0 {
		t.Fatalf("a refused fan-out ran %d exec streams", n)
	}

	r = execAs(t, h.as("alice"), map[string]any{"target": map[string]any{"node": "n-a"}, "argv": []string{"ok"}})
	if r.err != nil || r.result == nil || r.result.Succeeded != 1 {
		t.Fatalf("alice exec on n-a: %+v %+v, want success", r.err, r.result)
	}
	if hs := hdrs.of("n-a"); len(hs) != 1 || userOf(t, hs[0]) != "deploy" {
		t.Fatalf("n-a got %d streams (user %v), want one as deploy", len(hs), hs)
	}

	// bob runs as bob everywhere; a fan-out sets each node's user.
	r = execAs(t, h.as("bob"), map[string]any{"target": map[string]any{"all": true}, "argv": []string{"ok"}})
	if r.err != nil || r.result == nil || r.result.Succeeded != 2 {
		t.Fatalf("bob exec on all: %+v %+v", r.err, r.result)
	}
	if hs := hdrs.of("n-b"); len(hs) != 1 || userOf(t, hs[0]) != "bob" {
		t.Fatalf("n-b streams %v, want one as bob", hs)
	}

	r = execAs(t, h.as("mallory"), map[string]any{"target": map[string]any{"node": "n-a"}, "argv": []string{"ok"}})
	wantRefused(t, "mallory", r.err, 403, protocol.ErrCodeForbidden, "nats:mallory", "no entry")
}

// TestPolicyNodesList: a caller sees the nodes a nodes.list rule of its
// matches, and the total counts only those; a caller the policy does not
// name is told so.
func TestPolicyNodesList(t *testing.T) {
	h, _ := newPolicyHarness(t, stagingPolicy, nil)
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}})
	h.dialAgent(t, agentOpts{id: "n-b", labels: map[string]string{"env": "prod"}})
	for _, tt := range []struct {
		who  string
		want []string
	}{
		{"alice", []string{"n-a"}},
		{"bob", []string{"n-a", "n-b"}},
		{"ops", nil},
	} {
		e, m := requestAs(t, h.as(tt.who), protocol.SubjectNodes, protocol.NodesRequest{})
		if e != nil {
			t.Fatalf("%s: %v", tt.who, e)
		}
		var resp protocol.NodesResponse
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, n := range resp.Nodes {
			got = append(got, n.ID)
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") || resp.Total != len(tt.want) {
			t.Errorf("%s sees %v (total %d), want %v", tt.who, got, resp.Total, tt.want)
		}
	}
	e, _ := requestAs(t, h.as("mallory"), protocol.SubjectNodes, protocol.NodesRequest{})
	wantRefused(t, "mallory", e, 403, protocol.ErrCodeForbidden, "nats:mallory", "nodes.list", "no entry")
	// A caller the policy does not know learns no node's name from it.
	if e != nil && (strings.Contains(e.Message, "n-a") || strings.Contains(e.Message, "n-b")) {
		t.Errorf("mallory's refusal names a node: %s", e.Message)
	}
}

// streamAs opens a tether.v1.stream on nc; it returns the API error of a
// refusal, or the pipe.
func streamAs(t *testing.T, nc *nats.Conn, node string, kind protocol.Kind, params any) (*protocol.APIError, *natspipe.Pipe) {
	t.Helper()
	body := mustJSON(t, protocol.StreamRequest{Node: node, Kind: kind.String(), Params: mustJSON(t, params)})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	p, err := natspipe.Dial(ctx, nc, protocol.SubjectStream, nil, body, natspipe.Config{})
	if err != nil {
		var rej *natspipe.RejectedError
		if !errors.As(err, &rej) {
			t.Fatalf("stream: %v", err)
		}
		var e protocol.APIError
		if jerr := json.Unmarshal(rej.Msg.Data, &e); jerr != nil {
			t.Fatalf("stream: rejected with %q: %v", rej.Msg.Data, jerr)
		}
		return &e, nil
	}
	t.Cleanup(func() { p.Close() })
	return nil, p
}

// TestPolicyStreams: each stream kind is decided as its operation (exec,
// cp.write with the destination, cp.read with the source, shell, forward
// with the target), and the params the agent gets carry the user of the
// grant, not the one the client wrote, and for a copy the grant's paths
// as its roots, not the ones the client wrote.
func TestPolicyStreams(t *testing.T) {
	h, _ := newPolicyHarness(t, stagingPolicy, nil)
	var hdrs headerLog
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}, header: hdrs.hook("n-a"), features: []string{protocol.FeatureCopyRoots}})
	h.dialAgent(t, agentOpts{id: "n-b", labels: map[string]string{"env": "prod"}, header: hdrs.hook("n-b")})
	// An agent of a release that cannot confine copies to the grant.
	h.dialAgent(t, agentOpts{id: "n-old", labels: map[string]string{"env": "staging"}, header: hdrs.hook("n-old")})

	for _, tt := range []struct {
		name   string
		node   string
		kind   protocol.Kind
		params any
		user   string   // the user the agent must see ("" for dial)
		refuse []string // non-nil: refused, naming these
		roots  string   // the roots the agent must see, comma-joined ("" but for a copy)
	}{
		{"exec", "n-a", protocol.KindExec, protocol.ExecParams{Argv: []string{"ok"}, User: "root"}, "deploy", nil, ""},
		{"exec elsewhere", "n-b", protocol.KindExec, protocol.ExecParams{Argv: []string{"ok"}}, "", []string{"nats:alice", "exec", "n-b"}, ""},
		{"push", "n-a", protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: "/srv/app/current", User: "root", Roots: []string{"/"}}, "deploy", nil, "/srv/app"},
		{"push to an old agent", "n-old", protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: "/srv/app/current"}, "", []string{"node n-old", "/srv/app", protocol.FeatureCopyRoots, "upgrade"}, ""},
		{"push outside", "n-a", protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: "/etc/cron.d/x"}, "", []string{"nats:alice", "cp.write", `"/etc/cron.d/x"`, "/srv/app"}, ""},
		{"push sibling", "n-a", protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: "/srv/application"}, "", []string{"cp.write"}, ""},
		{"pull", "n-a", protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: "/srv/app/log"}, "", []string{"nats:alice", "cp.read"}, ""},
		{"shell", "n-a", protocol.KindPTY, protocol.PTYParams{}, "", []string{"nats:alice", "shell"}, ""},
		{"dial", "n-a", protocol.KindDial, protocol.DialParams{Target: "openshell"}, "", nil, ""},
		{"dial execd", "n-a", protocol.KindDial, protocol.DialParams{Target: "execd"}, "", []string{"nats:alice", "forward", `"execd"`, "openshell"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := len(hdrs.of(tt.node))
			e, _ := streamAs(t, h.as("alice"), tt.node, tt.kind, tt.params)
			if tt.refuse != nil {
				wantRefused(t, tt.name, e, 403, protocol.ErrCodeForbidden, tt.refuse...)
				if n := len(hdrs.of(tt.node)); n != before {
					t.Fatalf("a refused stream reached the agent")
				}
				return
			}
			if e != nil {
				t.Fatalf("refused: %v", e)
			}
			var hs []protocol.Header
			checkFor(t, defaultTestTimeout, func() error {
				if hs = hdrs.of(tt.node); len(hs) == before {
					return errors.New("no stream reached the agent")
				}
				return nil
			})
			got := hs[len(hs)-1]
			if got.Kind != tt.kind || userOf(t, got) != tt.user {
				t.Fatalf("agent got a %s stream as user %q (%s), want %s as %q", got.Kind, userOf(t, got), got.Params, tt.kind, tt.user)
			}
			var p struct{ Roots []string }
			json.Unmarshal(got.Params, &p)
			if r := strings.Join(p.Roots, ","); r != tt.roots {
				t.Fatalf("agent got roots %q (%s), want %q", r, got.Params, tt.roots)
			}
		})
	}
}

// TestPolicyJobLimit: one caller cannot hold every job slot of the
// coordinator: past its max_concurrent_jobs its next exec is refused with
// 429 naming the limit, while another caller still runs; once its jobs end
// the slots are free again. (Before policy, one client could fill all of
// Config.MaxJobs.)
func TestPolicyJobLimit(t *testing.T) {
	const pol = `version: 1
identities:
  nats:greedy:
    limits:
      max_concurrent_jobs: 2
    rules:
      - nodes: "*"
        operations: [exec, job.cancel]
        run_as: greedy
  nats:other:
    rules:
      - nodes: "*"
        operations: [exec]
        run_as: other
`
	h, _ := newPolicyHarness(t, pol, func(c *coordinator.Config) { c.MaxJobs = 8 })
	a := h.dialAgent(t, agentOpts{id: "n1"})

	// Two hanging jobs take greedy's slots.
	var wg sync.WaitGroup
	ids := []string{"hang-1", "hang-2"}
	results := make([]execReply, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			results[i], err = execRaw(h.as("greedy"), mustJSON(t, map[string]any{"id": id, "target": map[string]any{"node": "n1"}, "argv": []string{"hang"}}))
			if err != nil {
				t.Errorf("exec %s: %v", id, err)
			}
		}()
	}
	checkFor(t, defaultTestTimeout, func() error {
		if n := a.execs.Load(); n != 2 {
			return errors.New("jobs not started yet")
		}
		return nil
	})
	r := execAs(t, h.as("greedy"), map[string]any{"target": map[string]any{"node": "n1"}, "argv": []string{"ok"}})
	wantRefused(t, "third job", r.err, 429, protocol.ErrCodeRateLimited, "nats:greedy", "max_concurrent_jobs is 2")
	r = execAs(t, h.as("other"), map[string]any{"target": map[string]any{"node": "n1"}, "argv": []string{"ok"}})
	if r.err != nil || r.result == nil || r.result.Succeeded != 1 {
		t.Fatalf("other's job: %+v %+v", r.err, r.result)
	}
	for _, id := range ids {
		if e, _ := requestAs(t, h.as("greedy"), protocol.SubjectCancel, protocol.CancelRequest{ID: id}); e != nil {
			t.Fatalf("greedy cancels its %s: %v", id, e)
		}
	}
	wg.Wait()
	r = execAs(t, h.as("greedy"), map[string]any{"target": map[string]any{"node": "n1"}, "argv": []string{"ok"}})
	if r.err != nil || r.result == nil || r.result.Succeeded != 1 {
		t.Fatalf("greedy's job after its slots were freed: %+v %+v", r.err, r.result)
	}
}

// TestPolicyCancelOwnJobOnly: a running job is cancelled only by its
// submitter or by a caller with job.cancel scope any.
func TestPolicyCancelOwnJobOnly(t *testing.T) {
	h, _ := newPolicyHarness(t, stagingPolicy, nil)
	a := h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}})
	done := make(chan execReply, 1)
	go func() {
		r, err := execRaw(h.as("alice"), mustJSON(t, map[string]any{"id": "alices-job", "target": map[string]any{"node": "n-a"}, "argv": []string{"hang"}}))
		if err != nil {
			t.Errorf("alice's exec: %v", err)
		}
		done <- r
	}()
	checkFor(t, defaultTestTimeout, func() error {
		if n := a.execs.Load(); n != 1 {
			return errors.New("job not started yet")
		}
		return nil
	})
	e, _ := requestAs(t, h.as("bob"), protocol.SubjectCancel, protocol.CancelRequest{ID: "alices-job"})
	wantRefused(t, "bob cancels alice's job", e, 403, protocol.ErrCodeForbidden, "nats:bob", "job.cancel", "no rule grants job.cancel")
	if strings.Contains(e.Message, "alice") {
		t.Errorf("the refusal names the owner: %s", e.Message)
	}
	e, _ = requestAs(t, h.as("ops"), protocol.SubjectCancel, protocol.CancelRequest{ID: "alices-job"})
	if e != nil {
		t.Fatalf("ops (scope any) cancels: %v", e)
	}
	select {
	case r := <-done:
		if r.result == nil || len(r.result.Results) != 1 || !r.result.Results[0].Cancelled {
			t.Fatalf("alice's job: %+v %+v, want cancelled", r.err, r.result)
		}
	case <-time.After(defaultTestTimeout):
		t.Fatal("alice's job did not end")
	}
}

// TestPolicyCancelNoOracle: tether.v1.cancel tells a caller nothing about
// job ids it may not cancel. A caller holding no job.cancel is refused
// the same way whether the job runs or not; one holding it on other nodes
// or on its own jobs only gets the same not_found for a running job it may
// not cancel as for an id no job has.
func TestPolicyCancelNoOracle(t *testing.T) {
	const pol = stagingPolicy + `  nats:carol:
    rules:
      - nodes: "*"
        operations: [exec, job.cancel]
        run_as: carol
  nats:dave:
    rules:
      - nodes: "env=prod"
        operations: [job.cancel]
        scope: any
`
	h, _ := newPolicyHarness(t, pol, nil)
	a := h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}})
	done := make(chan execReply, 1)
	go func() {
		r, err := execRaw(h.as("alice"), mustJSON(t, map[string]any{"id": "alices-job", "target": map[string]any{"node": "n-a"}, "argv": []string{"hang"}}))
		if err != nil {
			t.Errorf("alice's exec: %v", err)
		}
		done <- r
	}()
	checkFor(t, defaultTestTimeout, func() error {
		if n := a.execs.Load(); n != 1 {
			return errors.New("job not started yet")
		}
		return nil
	})
	cancel := func(who, id string) *protocol.APIError {
		t.Helper()
		e, _ := requestAs(t, h.as(who), protocol.SubjectCancel, protocol.CancelRequest{ID: id})
		if e == nil {
			t.Fatalf("%s cancelled %s", who, id)
		}
		return e
	}
	// The same answer for both ids, but for the id itself.
	same := func(who string, status int, code string) {
		t.Helper()
		running, missing := cancel(who, "alices-job"), cancel(who, "no-such-job")
		if running.Status != status || running.Code != code {
			t.Errorf("%s on alice's running job: %d %s (%s), want %d %s", who, running.Status, running.Code, running.Message, status, code)
		}
		got := strings.ReplaceAll(running.Message, "alices-job", "ID")
		want := strings.ReplaceAll(missing.Message, "no-such-job", "ID")
		if running.Status != missing.Status || running.Code != missing.Code || got != want {
			t.Errorf("%s tells a running job from none:\n  running: %d %s %s\n  none:    %d %s %s",
				who, running.Status, running.Code, running.Message, missing.Status, missing.Code, missing.Message)
		}
		if strings.Contains(got, "alice") || strings.Contains(got, "n-a") {
			t.Errorf("%s's answer names the job's owner or node: %s", who, running.Message)
		}
	}
	same("bob", 403, protocol.ErrCodeForbidden)  // no job.cancel at all
	same("carol", 404, protocol.ErrCodeNotFound) // her own jobs only
	same("dave", 404, protocol.ErrCodeNotFound)  // other nodes only
	e := cancel("alice", "no-such-job")          // the owner's own miss
	wantRefused(t, "alice cancels no job", e, 404, protocol.ErrCodeNotFound, "no-such-job", "nats:alice")
	if e, _ := requestAs(t, h.as("alice"), protocol.SubjectCancel, protocol.CancelRequest{ID: "alices-job"}); e != nil {
		t.Fatalf("alice cancels her own job: %v", e)
	}
	select {
	case r := <-done:
		if r.result == nil || len(r.result.Results) != 1 || !r.result.Results[0].Cancelled {
			t.Fatalf("alice's job: %+v %+v, want cancelled", r.err, r.result)
		}
	case <-time.After(defaultTestTimeout):
		t.Fatal("alice's job did not end")
	}
}

// TestPolicyRateLimit: past its requests per second and burst a caller is
// refused with 429 naming the limit.
func TestPolicyRateLimit(t *testing.T) {
	const pol = `version: 1
identities:
  nats:chatty:
    limits:
      requests_per_second: 0.001
      burst: 3
    rules:
      - nodes: "*"
        operations: [nodes.list]
`
	h, _ := newPolicyHarness(t, pol, nil)
	for i := range 3 {
		if e, _ := requestAs(t, h.as("chatty"), protocol.SubjectNodes, protocol.NodesRequest{}); e != nil {
			t.Fatalf("request %d: %v", i, e)
		}
	}
	e, _ := requestAs(t, h.as("chatty"), protocol.SubjectNodes, protocol.NodesRequest{})
	wantRefused(t, "fourth request", e, 429, protocol.ErrCodeRateLimited, "nats:chatty", "burst 3")
}

// fleetAs connects to f's NATS as the client user who.
func fleetAs(t *testing.T, f *fleettest.Fleet, who string) *nats.Conn {
	t.Helper()
	key := fmt.Sprintf("%p/%s", f, who)
	if nc, ok := clients.Load(key); ok {
		return nc.(*nats.Conn)
	}
	nc := natsauthtest.Connect(t, f.NATS.ClientURL(), natsauthtest.ClientCreds(t, f.Layout, who))
	clients.Store(key, nc)
	t.Cleanup(func() { clients.Delete(key) })
	return nc
}

// runAsSelf is a run_as user every agent may run as: the one running the
// tests.
func runAsSelf(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Skipf("current user: %v", err)
	}
	return u.Username
}

// TestPolicyDetachedJobOwner: a detached job's status, output and cancel
// are decided by who submitted it, recorded when the node started it:
// another identity is refused each, as if there were no such job (the
// issue's "any client may read or cancel any job"), one with scope any
// is not, and reusing the id of a job still on the node does not take it
// over.
func TestPolicyDetachedJobOwner(t *testing.T) {
	self := runAsSelf(t)
	pol := `version: 1
roles:
  runner:
    - nodes: "*"
      operations: [exec, job.status, job.logs, job.cancel]
      run_as: ` + self + `
identities:
  nats:alice:
    roles: [runner]
  nats:bob:
    roles: [runner]
  nats:ops:
    rules:
      - nodes: "*"
        operations: [job.status, job.logs]
        scope: any
`
	store, _ := writePolicy(t, pol)
	f := fleettest.Start(t, fleettest.Options{Logger: testLogger(t), Coordinator: func(c *coordinator.Config) {
		c.Policy = store
	}})
	r := execAs(t, fleetAs(t, f, "alice"), protocol.ExecRequest{ID: "alice-1", Target: protocol.Target{Node: "node-0"}, Detach: true, Argv: []string{"sleep", "60"}})
	if r.err != nil || r.result == nil || !r.result.Results[0].Detached {
		t.Fatalf("alice's detached job: %+v %+v", r.err, r.result)
	}
	status := protocol.JobRequest{Node: "node-0", ID: "alice-1"}
	output := protocol.JobOutputRequest{Node: "node-0", ID: "alice-1", Stream: "stdout"}

	e, _ := requestAs(t, fleetAs(t, f, "bob"), protocol.SubjectJobStatus, status)
	wantRefused(t, "bob's status", e, 404, protocol.ErrCodeNotFound, `no job "alice-1"`, "node-0")
	e, _ = requestAs(t, fleetAs(t, f, "bob"), protocol.SubjectJobOutput, output)
	wantRefused(t, "bob's output", e, 404, protocol.ErrCodeNotFound, `no job "alice-1"`)
	e, _ = requestAs(t, fleetAs(t, f, "bob"), protocol.SubjectJobCancel, status)
	wantRefused(t, "bob's cancel", e, 404, protocol.ErrCodeNotFound, `no job "alice-1"`)
	// bob reuses the id: the agent refuses it (the job is still there),
	// and alice stays the owner.
	r = execAs(t, fleetAs(t, f, "bob"), protocol.ExecRequest{ID: "alice-1", Target: protocol.Target{Node: "node-0"}, Detach: true, Argv: []string{"true"}})
	if r.result != nil && r.result.Results[0].Detached {
		t.Fatalf("bob started a second job alice-1: %+v", r.result)
	}
	e, _ = requestAs(t, fleetAs(t, f, "bob"), protocol.SubjectJobCancel, status)
	wantRefused(t, "bob's cancel after reusing the id", e, 404, protocol.ErrCodeNotFound, `no job "alice-1"`)

	for _, who := range []string{"alice", "ops"} {
		e, m := requestAs(t, fleetAs(t, f, who), protocol.SubjectJobStatus, status)
		if e != nil {
			t.Fatalf("%s's status: %v", who, e)
		}
		var st protocol.JobStatus
		if err := json.Unmarshal(m.Data, &st); err != nil || st.State != protocol.JobRunning {
			t.Fatalf("%s's status: %s (%v)", who, m.Data, err)
		}
		if e, _ := requestAs(t, fleetAs(t, f, who), protocol.SubjectJobOutput, output); e != nil {
			t.Fatalf("%s's output: %v", who, e)
		}
	}
	e, _ = requestAs(t, fleetAs(t, f, "ops"), protocol.SubjectJobCancel, status)
	wantRefused(t, "ops' cancel (no job.cancel)", e, 403, protocol.ErrCodeForbidden, "nats:ops", "job.cancel")
	if e, _ := requestAs(t, fleetAs(t, f, "alice"), protocol.SubjectJobCancel, status); e != nil {
		t.Fatalf("alice cancels her job: %v", e)
	}
	// Until the job has ended its shim is waited for by the agent (a
	// goroutine goleak would find after the tests, as CI did).
	checkFor(t, defaultTestTimeout, func() error {
		e, m := requestAs(t, fleetAs(t, f, "alice"), protocol.SubjectJobStatus, status)
		if e != nil {
			return e
		}
		var st protocol.JobStatus
		if err := json.Unmarshal(m.Data, &st); err != nil {
			return err
		}
		if st.State == protocol.JobRunning {
			return errors.New("alice's job still running after her cancel")
		}
		return nil
	})
}

// TestPolicyAdminRateLimited: the admin endpoints take each request from
// the caller's rate budget before they decide, like every other handler:
// an admin past its burst gets 429, and so does a caller flooding them
// without the right (its refusals count against its budget too).
func TestPolicyAdminRateLimited(t *testing.T) {
	const pol = `version: 1
identities:
  nats:root:
    limits:
      requests_per_second: 0.001
      burst: 2
    rules:
      - operations: [admin]
  nats:outsider:
    limits:
      requests_per_second: 0.001
      burst: 2
    rules:
      - nodes: "*"
        operations: [nodes.list]
`
	store, _ := writePolicy(t, pol)
	ih := newIDHarness(t, false, func(c *coordinator.Config) {
		c.Policy = store
		withAudit(t, c, testLogger(t))
	})
	endpoints := []struct {
		subject string
		body    any
	}{
		{protocol.SubjectTokensCreate, protocol.TokenCreateRequest{TTLSeconds: 600, Uses: 1}},
		{protocol.SubjectNodesRevoke, protocol.NodeRevokeRequest{Node: "nobody"}},
		{protocol.SubjectAuditQuery, protocol.AuditQueryRequest{}},
	}
	// One budget per identity across the admin endpoints: two requests,
	// then 429 on whichever comes third.
	for i, ep := range endpoints[:2] {
		e, _ := requestAs(t, ih.as("root"), ep.subject, ep.body)
		if e != nil && e.Status == 429 {
			t.Fatalf("root's request %d (%s) was rate limited within its burst: %v", i, ep.subject, e)
		}
		e, _ = requestAs(t, ih.as("outsider"), ep.subject, ep.body)
		wantRefused(t, "outsider "+ep.subject, e, 403, protocol.ErrCodeForbidden, "nats:outsider", "admin")
	}
	for _, ep := range endpoints {
		e, _ := requestAs(t, ih.as("root"), ep.subject, ep.body)
		wantRefused(t, "root past its burst on "+ep.subject, e, 429, protocol.ErrCodeRateLimited, "nats:root", "burst 2")
		e, _ = requestAs(t, ih.as("outsider"), ep.subject, ep.body)
		wantRefused(t, "outsider past its burst on "+ep.subject, e, 429, protocol.ErrCodeRateLimited, "nats:outsider", "burst 2")
	}
}

// TestPolicyAnothersJobIsMissing: a caller who may see only its own jobs
// gets, for another identity's job, a reply byte for byte the one it gets
// for a job that does not exist (status, code, message, headers), on each
// way of asking: job.status, job.output and job.cancel on the node (what
// tether job status|logs|cancel --node send, and send for each node
// after the record), and job.get by id alone (tether job status|wait ID).
// A caller holding the operation in no rule is refused 403 alike for
// both. (Before, the node's answers were two different 403s: "another
// identity's job" and "a job with no recorded owner", an oracle of which
// ids are someone's job.)
func TestPolicyAnothersJobIsMissing(t *testing.T) {
	self := runAsSelf(t)
	pol := `version: 1
roles:
  runner:
    - nodes: "*"
      operations: [exec, job.status, job.logs, job.cancel]
      run_as: ` + self + `
identities:
  nats:alice:
    roles: [runner]
  nats:bob:
    roles: [runner]
  nats:eve:
    rules:
      - nodes: "*"
        operations: [nodes.list]
`
	store, _ := writePolicy(t, pol)
	f := fleettest.Start(t, fleettest.Options{Logger: testLogger(t), Jobs: true, Coordinator: func(c *coordinator.Config) {
		c.Policy = store
	}})
	r := execAs(t, fleetAs(t, f, "alice"), protocol.ExecRequest{ID: "job-a", Target: protocol.Target{Node: "node-0"}, Detach: true, Argv: []string{"sleep", "60"}})
	if r.err != nil || r.result == nil || !r.result.Results[0].Detached {
		t.Fatalf("alice's detached job: %+v %+v", r.err, r.result)
	}
	t.Cleanup(func() {
		requestAs(t, fleetAs(t, f, "alice"), protocol.SubjectJobCancel, protocol.JobRequest{Node: "node-0", ID: "job-a"})
	})
	// The same length as job-a's id, so that a reply naming either is
	// comparable once the id is swapped.
	const missing = "job-z"
	asks := []struct {
		subject string
		body    func(id string) any
	}{
		{protocol.SubjectJobStatus, func(id string) any { return protocol.JobRequest{Node: "node-0", ID: id} }},
		{protocol.SubjectJobOutput, func(id string) any {
			return protocol.JobOutputRequest{Node: "node-0", ID: id, Stream: "stdout"}
		}},
		{protocol.SubjectJobCancel, func(id string) any { return protocol.JobRequest{Node: "node-0", ID: id} }},
		{protocol.SubjectJobGet, func(id string) any { return protocol.JobGetRequest{ID: id} }},
	}
	raw := func(m *nats.Msg, id string) string {
		var b strings.Builder
		keys := make([]string, 0, len(m.Header))
		for k := range m.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s: %q\n", k, m.Header[k])
		}
		b.WriteString("\n")
		b.Write(m.Data)
		return strings.ReplaceAll(b.String(), id, "ID")
	}
	for _, who := range []string{"bob", "eve"} {
		for _, a := range asks {
			e, other := requestAs(t, fleetAs(t, f, who), a.subject, a.body("job-a"))
			if e == nil {
				t.Errorf("%s %s of alice's job: answered %s", who, a.subject, other.Data)
				continue
			}
			_, none := requestAs(t, fleetAs(t, f, who), a.subject, a.body(missing))
			if got, want := raw(other, "job-a"), raw(none, missing); got != want {
				t.Errorf("%s %s: alice's job is answered\n%s\nand a job that does not exist\n%s", who, a.subject, got, want)
			}
			if who == "bob" && e.Status != 404 {
				t.Errorf("bob %s of alice's job: %d %s, want 404", a.subject, e.Status, e.Message)
			}
		}
	}
}

// TestPolicyCancelOfAnothersIsMissing: tether.v1.cancel (Ctrl-C of
// tether exec) of another identity's running job, on a fleet of two
// coordinators, is answered byte for byte as the cancel of a job that
// does not exist, whichever coordinator takes it. (Before, the holder of
// the job said "is running on coordinator C" and a missing job was "is
// running in the fleet": an oracle of which ids run.)
func TestPolicyCancelOfAnothersIsMissing(t *testing.T) {
	self := runAsSelf(t)
	pol := `version: 1
roles:
  runner:
    - nodes: "*"
      operations: [exec, job.status, job.logs, job.cancel]
      run_as: ` + self + `
identities:
  nats:alice:
    roles: [runner]
  nats:bob:
    roles: [runner]
`
	store, _ := writePolicy(t, pol)
	f := fleettest.Start(t, fleettest.Options{Logger: testLogger(t), Coordinators: 2, Jobs: true, Coordinator: func(c *coordinator.Config) {
		c.Policy = store
	}})
	done := make(chan execReply, 1)
	go func() {
		r, _ := execRaw(fleetAs(t, f, "alice"), mustJSON(t, protocol.ExecRequest{ID: "run-a", Target: protocol.Target{Node: "node-0"}, Argv: []string{"sleep", "60"}}))
		done <- r
	}()
	checkFor(t, defaultTestTimeout, func() error {
		e, m := requestAs(t, fleetAs(t, f, "alice"), protocol.SubjectJobGet, protocol.JobGetRequest{ID: "run-a"})
		if e != nil {
			return e
		}
		var rec protocol.JobRecord
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			return err
		}
		if rec.State != "running" {
			return fmt.Errorf("alice's job is %s", rec.State)
		}
		return nil
	})
	raw := func(m *nats.Msg, id string) string {
		var b strings.Builder
		keys := make([]string, 0, len(m.Header))
		for k := range m.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s: %q\n", k, m.Header[k])
		}
		b.WriteString("\n")
		b.Write(m.Data)
		return strings.ReplaceAll(b.String(), id, "ID")
	}
	for i := 0; i < 6; i++ {
		e, other := requestAs(t, fleetAs(t, f, "bob"), protocol.SubjectCancel, protocol.CancelRequest{ID: "run-a"})
		_, none := requestAs(t, fleetAs(t, f, "bob"), protocol.SubjectCancel, protocol.CancelRequest{ID: "run-z"})
		if e == nil || e.Status != 404 {
			t.Fatalf("bob cancels alice's job: %v %s, want 404", e, other.Data)
		}
		if got, want := raw(other, "run-a"), raw(none, "run-z"); got != want {
			t.Fatalf("bob's cancel of alice's job is answered\n%s\nand of a job that does not exist\n%s", got, want)
		}
	}
	if e, _ := requestAs(t, fleetAs(t, f, "alice"), protocol.SubjectCancel, protocol.CancelRequest{ID: "run-a"}); e != nil {
		t.Fatalf("alice cancels her job: %v", e)
	}
	<-done
}
