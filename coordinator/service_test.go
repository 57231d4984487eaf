package coordinator_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
)

// replySummary is the comparable part of an output or result message.
type replySummary struct {
	Type, Node, Job, Seq, Data string
}

func summarize(r execReply) []replySummary {
	var out []replySummary
	for _, m := range r.msgs {
		s := replySummary{
			Type: m.Header.Get(protocol.HeaderType),
			Node: m.Header.Get(protocol.HeaderNode),
			Job:  m.Header.Get(protocol.HeaderJob),
			Seq:  m.Header.Get(protocol.HeaderSeq),
		}
		if s.Type != protocol.ReplyResult && s.Type != protocol.ReplyNodeResult {
			s.Data = string(m.Data)
		}
		out = append(out, s)
	}
	return out
}

// checkSeq verifies that the replies carry seq 0, 1, 2, ... in arrival order.
func checkSeq(t *testing.T, r execReply) {
	t.Helper()
	for i, m := range r.msgs {
		if got := m.Header.Get(protocol.HeaderSeq); got != strconv.Itoa(i) {
			t.Errorf("message %d has %s %q, want %d", i, protocol.HeaderSeq, got, i)
		}
	}
}

func TestExecOutputAndExitCode(t *testing.T) {
	h := newHarness(t, nil)
	a := h.dialAgent(t, agentOpts{id: "node-a"})
	r := h.exec(protocol.ExecRequest{ID: "job-1", Target: protocol.Target{Node: "node-a"}, Script: "echo"})
	if r.err != nil {
		t.Fatalf("exec error: %v", r.err)
	}
	want := []replySummary{
		{"stdout", "node-a", "job-1", "0", "hello\n"},
		{"stderr", "node-a", "job-1", "1", "oops\n"},
		{"stdout", "node-a", "job-1", "2", "bye\n"},
		{"node-result", "node-a", "job-1", "3", ""},
		{"result", "", "job-1", "4", ""},
	}
	if diff := cmp.Diff(want, summarize(r)); diff != "" {
		t.Errorf("replies (-want +got):\n%s", diff)
	}
	wantResult := &protocol.ExecResult{ID: "job-1", Results: []protocol.NodeResult{
		{Node: "node-a", ExitCode: 3, DurationMS: 1.5, StdoutBytes: 10, StderrBytes: 5,
			Failure: "Command failed (exec on node-a) with exit code 3:\n  bash -s\noops"},
	}, Nodes: 1, Failed: 1}
	if diff := cmp.Diff(wantResult, r.result); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if got := a.execs.Load(); got != 1 {
		t.Errorf("agent saw %d exec streams, want 1", got)
	}
	if got := h.metric("tether_coordinator_exec_results_total", "outcome", "failure"); got != 1 {
		t.Errorf("exec_results{failure} = %v, want 1", got)
	}
	if got := h.metric("tether_coordinator_streams_opened_total", "kind", "exec"); got != 1 {
		t.Errorf("streams_opened{exec} = %v, want 1", got)
	}
	if got := h.metric("tether_coordinator_exec_duration_seconds"); got != 1 {
		t.Errorf("exec_duration observations = %v, want 1", got)
	}
	// The fake agent wrote "hello\n", "bye\n" (10 bytes) and "oops\n" (5).
	if got := h.metric("tether_coordinator_exec_output_bytes_total", "stream", "stdout"); got != 10 {
		t.Errorf("exec_output_bytes{stdout} = %v, want 10", got)
	}
	if got := h.metric("tether_coordinator_exec_output_bytes_total", "stream", "stderr"); got != 5 {
		t.Errorf("exec_output_bytes{stderr} = %v, want 5", got)
	}

	// Without an id the coordinator picks one and reports it everywhere.
	r = h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "node-a"}, Argv: []string{"ok"}})
	if r.err != nil || r.result == nil {
		t.Fatalf("exec: %+v", r)
	}
	if r.result.ID == "" || r.msgs[0].Header.Get(protocol.HeaderJob) != r.result.ID {
		t.Errorf("generated job id %q, header %q", r.result.ID, r.msgs[0].Header.Get(protocol.HeaderJob))
	}
	if res := r.result.Results[0]; !res.OK() {
		t.Errorf("ok result = %+v", res)
	}
}

func TestExecStdin(t *testing.T) {
	h := newHarness(t, nil)
	h.dialAgent(t, agentOpts{id: "node-a"})
	in := make([]byte, 3*protocol.ChunkSize+123)
	rand.Read(in)
	r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "node-a"}, Argv: []string{"cat"}, Stdin: in})
	if r.err != nil {
		t.Fatal(r.err)
	}
	checkSeq(t, r)
	var out bytes.Buffer
	for _, m := range r.msgs {
		if m.Header.Get(protocol.HeaderType) == protocol.ReplyStdout {
			out.Write(m.Data)
		}
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Errorf("stdout is %d bytes, want the %d bytes of stdin echoed", out.Len(), len(in))
	}
	if res := r.result.Results[0]; !res.OK() || res.StdoutBytes != int64(len(in)) {
		t.Errorf("result = %+v", res)
	}
}

func TestExecFanOut(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.MaxParallel = 1 })
	var g concurrency
	for _, n := range []struct{ id, role string }{{"n1", "web"}, {"n2", "web"}, {"n3", "db"}} {
		h.dialAgent(t, agentOpts{id: n.id, labels: map[string]string{"role": n.role}, gauge: &g})
	}

	tests := []struct {
		name        string
		req         protocol.ExecRequest
		wantNodes   []string
		maxParallel int32
	}{
		{"all with the default bound", protocol.ExecRequest{Target: protocol.Target{All: true}, Script: "slow"}, []string{"n1", "n2", "n3"}, 1},
		{"selector with max_parallel", protocol.ExecRequest{Target: protocol.Target{Selector: "role=web"}, Script: "slow", MaxParallel: 2}, []string{"n1", "n2"}, 2},
		{"selector set-based", protocol.ExecRequest{Target: protocol.Target{Selector: "role in (db,cache)"}, Script: "slow"}, []string{"n3"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g.max.Store(0)
			r := h.exec(tt.req)
			if r.err != nil {
				t.Fatal(r.err)
			}
			checkSeq(t, r)
			var gotNodes []string
			for _, res := range r.result.Results {
				gotNodes = append(gotNodes, res.Node)
				if !res.OK() {
					t.Errorf("node result %+v", res)
				}
			}
			if diff := cmp.Diff(tt.wantNodes, gotNodes); diff != "" {
				t.Errorf("result nodes (-want +got):\n%s", diff)
			}
			var outNodes []string
			for _, m := range r.msgs {
				if m.Header.Get(protocol.HeaderType) == protocol.ReplyStdout {
					if string(m.Data) != m.Header.Get(protocol.HeaderNode) {
						t.Errorf("output %q labelled node %q", m.Data, m.Header.Get(protocol.HeaderNode))
					}
					outNodes = append(outNodes, string(m.Data))
				}
			}
			slices.Sort(outNodes)
			if diff := cmp.Diff(tt.wantNodes, outNodes); diff != "" {
				t.Errorf("output nodes (-want +got):\n%s", diff)
			}
			if got := g.max.Load(); got > tt.maxParallel {
				t.Errorf("%d nodes ran at once, bound is %d", got, tt.maxParallel)
			}
		})
	}
}

func TestExecAgentDropsMidExec(t *testing.T) {
	h := newHarness(t, nil)
	h.dialAgent(t, agentOpts{id: "n1"})
	h.dialAgent(t, agentOpts{id: "n2", handler: func(a *fakeAgent, st *yamux.Stream, _ protocol.ExecParams) {
		protocol.WriteFrame(st, protocol.FrameStdout, []byte("partial"))
		a.sess.Close() // the node dies mid-exec
	}})
	r := h.exec(protocol.ExecRequest{Target: protocol.Target{All: true}, Script: "ok"})
	if r.err != nil {
		t.Fatal(r.err)
	}
	res := r.result.Results
	if len(res) != 2 || res[0].Node != "n1" || res[1].Node != "n2" {
		t.Fatalf("results = %+v", res)
	}
	if !res[0].OK() {
		t.Errorf("n1 = %+v, want success", res[0])
	}
	// The session may close while the stream's open is still being
	// confirmed (a loaded machine): the open fails then, with the session
	// named; either way the node's result is a tunnel failure.
	if lost := strings.HasPrefix(res[1].Error, "tunnel lost during exec: ") || strings.Contains(res[1].Error, "session shutdown"); res[1].ExitCode != -1 || !lost {
		t.Errorf("n2 = %+v, want exit -1 and a tunnel-lost error", res[1])
	}
	if got := h.metric("tether_coordinator_exec_results_total", "outcome", "error"); got != 1 {
		t.Errorf("exec_results{error} = %v, want 1", got)
	}
	if got := h.metric("tether_coordinator_exec_results_total", "outcome", "success"); got != 1 {
		t.Errorf("exec_results{success} = %v, want 1", got)
	}
}

func TestExecAgentError(t *testing.T) {
	h := newHarness(t, nil)
	h.dialAgent(t, agentOpts{id: "n1"})
	r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"fail"}})
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := protocol.NodeResult{Node: "n1", ExitCode: -1, Error: "start bash: no such file", ErrorCode: protocol.CodeStartFailed}
	if diff := cmp.Diff(want, r.result.Results[0], cmpopts.IgnoreFields(protocol.NodeResult{}, "DurationMS")); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
}

func TestExecCancel(t *testing.T) {
	h := newHarness(t, nil)
	a := h.dialAgent(t, agentOpts{id: "n1"})
	req := protocol.ExecRequest{ID: "job-c", Target: protocol.Target{Node: "n1"}, Script: "hang"}
	done := h.execAsync(req)
	checkFor(t, defaultTestTimeout, func() error {
		if a.execs.Load() != 1 {
			return fmt.Errorf("agent has not seen the exec yet")
		}
		return nil
	})

	dup := h.exec(req)
	if dup.err == nil || dup.err.Code != protocol.ErrCodeDuplicateJob || dup.status != "409" {
		t.Errorf("duplicate job id: %+v, want 409 duplicate_job", dup)
	}

	m := h.request(protocol.SubjectCancel, protocol.CancelRequest{ID: "job-c"})
	var cr protocol.CancelResponse
	if err := json.Unmarshal(m.Data, &cr); err != nil {
		t.Fatalf("cancel reply %q: %v", m.Data, err)
	}
	if diff := cmp.Diff(protocol.CancelResponse{ID: "job-c", Cancelled: true}, cr); diff != "" {
		t.Errorf("cancel response (-want +got):\n%s", diff)
	}

	var r execReply
	select {
	case r = <-done:
	case <-time.After(defaultTestTimeout):
		t.Fatal("no exec result after cancel")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := protocol.NodeResult{Node: "n1", ExitCode: 137, Signal: "KILL", Cancelled: true, DurationMS: 2}
	if diff := cmp.Diff(want, r.result.Results[0]); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if got := h.metric("tether_coordinator_exec_results_total", "outcome", "cancelled"); got != 1 {
		t.Errorf("exec_results{cancelled} = %v, want 1", got)
	}

	// The job is gone once its result is out.
	m = h.request(protocol.SubjectCancel, protocol.CancelRequest{ID: "job-c"})
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "404" || !strings.Contains(string(m.Data), protocol.ErrCodeNotFound) {
		t.Errorf("second cancel: code %q body %s, want 404 not_found", code, m.Data)
	}
}

func TestExecBadRequests(t *testing.T) {
	h := newHarness(t, nil)
	a := h.dialAgent(t, agentOpts{id: "node-a", labels: map[string]string{"role": "web"}})
	tests := []struct {
		name       string
		body       string
		wantStatus int
		wantCode   string
		wantMsg    string // substring
	}{
		{"malformed JSON", `{"target":`, 400, protocol.ErrCodeMalformed, "not valid"},
		{"not an object", `[1,2]`, 400, protocol.ErrCodeMalformed, "must be a JSON object"},
		{"wrong type", `{"target":{"node":"node-a"},"argv":[1]}`, 400, protocol.ErrCodeMalformed, "argv: want a string, got number"},
		{"unknown field", `{"target":{"node":"node-a"},"script":"ok","bogus":1}`, 400, protocol.ErrCodeUnknownField, `"bogus"`},
		{"no target", `{"script":"ok"}`, 400, protocol.ErrCodeNoTarget, "no target"},
		{"two targets", `{"target":{"node":"node-a","all":true},"script":"ok"}`, 400, protocol.ErrCodeInvalid, "exactly one"},
		{"unknown node", `{"target":{"node":"nope"},"script":"ok"}`, 404, protocol.ErrCodeUnknownNode, `node "nope" is not connected to coordinator coord-test`},
		{"no match", `{"target":{"selector":"role=db"},"script":"ok"}`, 404, protocol.ErrCodeNoMatch, "role=db"},
		{"bad selector", `{"target":{"selector":"role in (a"},"script":"ok"}`, 400, protocol.ErrCodeInvalid, "selector"},
		{"oversized script", string(mustJSON(t, protocol.ExecRequest{Target: protocol.Target{Node: "node-a"}, Script: strings.Repeat("x", protocol.MaxScriptSize+1)})), 413, protocol.ErrCodeTooLarge, "script"},
		{"stdin with script", string(mustJSON(t, protocol.ExecRequest{Target: protocol.Target{Node: "node-a"}, Script: "cat", Stdin: []byte("x")})), 400, protocol.ErrCodeInvalid, "stdin"},
		{"no command", `{"target":{"node":"node-a"}}`, 400, protocol.ErrCodeInvalid, "one of script, argv or commands"},
		{"empty script", `{"target":{"node":"node-a"},"script":""}`, 400, protocol.ErrCodeInvalid, "script is empty"},
		{"negative timeout", `{"target":{"node":"node-a"},"script":"ok","timeout":"-5s"}`, 400, protocol.ErrCodeInvalid, "timeout must not be negative"},
		{"bad job id", `{"id":"a b","target":{"node":"node-a"},"script":"ok"}`, 400, protocol.ErrCodeInvalid, "id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.exec(tt.body)
			if r.err == nil {
				t.Fatalf("got %d replies and no error, want %d %s", len(r.msgs), tt.wantStatus, tt.wantCode)
			}
			if r.status != strconv.Itoa(tt.wantStatus) || r.err.Status != tt.wantStatus || r.err.Code != tt.wantCode {
				t.Errorf("error %s %+v, want %d %s", r.status, r.err, tt.wantStatus, tt.wantCode)
			}
			if r.desc != r.err.Message || !strings.Contains(r.err.Message, tt.wantMsg) {
				t.Errorf("message %q (header %q), want it to contain %q", r.err.Message, r.desc, tt.wantMsg)
			}
			if len(r.msgs) != 0 {
				t.Errorf("%d replies before the error", len(r.msgs))
			}
		})
	}
	if got := a.execs.Load(); got != 0 {
		t.Errorf("the agent saw %d exec streams for bad requests, want 0", got)
	}
	if got := h.metric("tether_coordinator_streams_opened_total", "kind", "exec"); got != 0 {
		t.Errorf("streams_opened{exec} = %v, want 0", got)
	}
}

func TestNodesEndpoint(t *testing.T) {
	h := newHarness(t, nil)
	h.dialAgent(t, agentOpts{id: "b", labels: map[string]string{"role": "web"}})
	h.dialAgent(t, agentOpts{id: "a", labels: map[string]string{"role": "db"}})
	tests := []struct {
		name     string
		body     string
		wantIDs  []string
		wantCode string
	}{
		{"empty body", "", []string{"a", "b"}, ""},
		{"all", `{}`, []string{"a", "b"}, ""},
		{"selector", `{"selector":"role=web"}`, []string{"b"}, ""},
		{"no match", `{"selector":"role=x"}`, nil, ""},
		{"bad selector", `{"selector":"=x"}`, nil, protocol.ErrCodeInvalid},
		{"unknown field", `{"sel":"x"}`, nil, protocol.ErrCodeUnknownField},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := h.request(protocol.SubjectNodes, tt.body)
			if code := m.Header.Get(micro.ErrorCodeHeader); code != "" || tt.wantCode != "" {
				var e protocol.APIError
				json.Unmarshal(m.Data, &e)
				if e.Code != tt.wantCode || code != "400" {
					t.Errorf("error %s %+v, want 400 %s", code, e, tt.wantCode)
				}
				return
			}
			var resp protocol.NodesResponse
			if err := json.Unmarshal(m.Data, &resp); err != nil {
				t.Fatal(err)
			}
			if resp.Nodes == nil {
				t.Error("nodes is null, want a list")
			}
			var ids []string
			for _, n := range resp.Nodes {
				ids = append(ids, n.ID)
				if n.Coordinator != "coord-test" || n.ConnectedAt.IsZero() {
					t.Errorf("node %+v", n)
				}
			}
			if diff := cmp.Diff(tt.wantIDs, ids); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
		})
	}
}

func TestServiceInfo(t *testing.T) {
	h := newHarness(t, nil)
	// Monitoring is the coordinators' own ($SRV is not exported to
	// clients).
	m, err := h.coordNC.Request("$SRV.INFO."+protocol.ServiceName, nil, defaultTestTimeout)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != protocol.ServiceName || info.Version != "0.1.0" || info.Metadata["coordinator_id"] != "coord-test" || info.Description == "" {
		t.Errorf("info = %+v", info)
	}
	var subjects []string
	for _, e := range info.Endpoints {
		subjects = append(subjects, e.Subject)
	}
	slices.Sort(subjects)
	want := []string{protocol.SubjectCancel, protocol.SubjectExec, protocol.SubjectExecOnce, protocol.SubjectExecAlive, protocol.SubjectNodes, protocol.SubjectStream,
		protocol.SubjectJobStatus, protocol.SubjectJobOutput, protocol.SubjectJobCancel, protocol.SubjectJobGet, protocol.SubjectJobList, protocol.SubjectAuditQuery,
		protocol.SubjectTokensCreate, protocol.SubjectNodesRevoke, protocol.SubjectSSHInfo}
	slices.Sort(want)
	if diff := cmp.Diff(want, subjects); diff != "" {
		t.Errorf("endpoint subjects (-want +got):\n%s", diff)
	}
}

func TestAdminHandler(t *testing.T) {
	h := newHarness(t, nil)
	srv := httptest.NewServer(h.c.AdminHandler(nil))
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz = %d while serving, want 200", code)
	}
	code, body := get("/metrics")
	for _, want := range []string{
		"tether_coordinator_agents_connected 0",
		`tether_coordinator_auth_failures_total{reason="bad_token"} 0`,
		`tether_coordinator_streams_opened_total{kind="dial"} 0`,
		`tether_coordinator_exec_results_total{outcome="timeout"} 0`,
		"tether_coordinator_exec_duration_seconds_count 0",
		`tether_coordinator_exec_output_bytes_total{stream="stderr"} 0`,
		"tether_coordinator_tunnel_reconnects_total 0",
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	if code, _ := get("/readyz"); code != 503 {
		t.Errorf("/readyz = %d after shutdown, want 503", code)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d after shutdown, want 200", code)
	}
}

func TestShutdownCancelsRunningJobs(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.DrainTimeout = 100 * time.Millisecond })
	a := h.dialAgent(t, agentOpts{id: "n1", heartbeat: true})
	done := h.execAsync(protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Script: "hang"})
	checkFor(t, defaultTestTimeout, func() error {
		if a.execs.Load() != 1 {
			return fmt.Errorf("agent has not seen the exec yet")
		}
		return nil
	})
	if err := h.stop(); err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if res := r.result.Results[0]; !res.Cancelled || res.ExitCode != 137 {
		t.Errorf("result = %+v, want cancelled", res)
	}
	a.waitClosed()
	if h.c.Ready() {
		t.Error("Ready after Serve returned")
	}
}

func TestCancelFanOutSkipsNodesNotStarted(t *testing.T) {
	h := newHarness(t, nil)
	var agents []*fakeAgent
	for _, id := range []string{"n1", "n2", "n3"} {
		agents = append(agents, h.dialAgent(t, agentOpts{id: id}))
	}
	execs := func() int32 {
		var n int32
		for _, a := range agents {
			n += a.execs.Load()
		}
		return n
	}
	done := h.execAsync(protocol.ExecRequest{ID: "job-f", Target: protocol.Target{All: true}, Script: "hang", MaxParallel: 1})
	checkFor(t, defaultTestTimeout, func() error {
		if execs() != 1 {
			return fmt.Errorf("%d exec streams, want 1", execs())
		}
		return nil
	})
	h.request(protocol.SubjectCancel, protocol.CancelRequest{ID: "job-f"})
	var r execReply
	select {
	case r = <-done:
	case <-time.After(defaultTestTimeout):
		t.Fatal("no exec result after cancel")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	res := r.result.Results
	if len(res) != 3 || res[0].Node != "n1" || res[0].ExitCode != 137 || !res[0].Cancelled {
		t.Fatalf("results = %+v, want n1 killed by the cancel", res)
	}
	for _, nr := range res[1:] {
		if !nr.Cancelled || nr.ExitCode != -1 || !strings.Contains(nr.Error, "cancelled before it started") {
			t.Errorf("%s = %+v, want cancelled before start", nr.Node, nr)
		}
	}
	if got := execs(); got != 1 {
		t.Errorf("%d exec streams opened, want 1", got)
	}
	if got := h.metric("tether_coordinator_exec_results_total", "outcome", "cancelled"); got != 3 {
		t.Errorf("exec_results{cancelled} = %v, want 3", got)
	}
}
