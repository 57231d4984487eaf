package coordinator_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/sshgate"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
)

// fakeHostCA certifies host keys as "cert(NODE,KEY)".
type fakeHostCA struct{}

func (fakeHostCA) Certify(node string, key []byte) ([]byte, error) {
	if len(key) == 0 {
		return nil, errors.New("no key")
	}
	return fmt.Appendf(nil, "cert(%s,%s)", node, key), nil
}

func (fakeHostCA) KnownHostsLine() string { return "@cert-authority *.tether ssh-ed25519 FAKE" }

// sshAgent serves ssh streams as a fake agent: it hands each stream's
// params to seen, refuses those whose first login is "refuse" with
// CodeForbidden, else answers FrameDialOK, runs during (if set) and echoes
// the bytes back until the client's EOF.
func sshAgent(seen chan<- protocol.SSHParams, during func(a *fakeAgent, p protocol.SSHParams)) func(a *fakeAgent, st *yamux.Stream, h protocol.Header) {
	return func(a *fakeAgent, st *yamux.Stream, h protocol.Header) {
		defer st.Close()
		if h.Kind != protocol.KindSSH {
			return
		}
		var p protocol.SSHParams
		if err := h.DecodeParams(&p); err != nil || p.Validate() != nil {
			protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeBadRequest, Message: fmt.Sprint(err, p.Validate())})
			return
		}
		if seen != nil {
			seen <- p
		}
		if p.Logins[0] == "refuse" {
			protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeForbidden, Message: "local policy allows none of the logins"})
			return
		}
		if err := protocol.WriteFrame(st, protocol.FrameDialOK, nil); err != nil {
			return
		}
		if during != nil {
			during(a, p)
		}
		io.Copy(st, st)
	}
}

var sshFeatures = []string{protocol.FeatureSSH, protocol.FeatureCancelStream}

// TestSSHNodesOpenSSH: the jump host's view of the fleet: only connected
// agents that serve SSH are nodes, with their labels and host keys;
// OpenSSH hands the agent the params and returns raw bytes after its
// dial-ok, or its refusal as an *ErrorInfo.
func TestSSHNodesOpenSSH(t *testing.T) {
	h := newHarness(t, nil)
	seen := make(chan protocol.SSHParams, 4)
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}, features: sshFeatures,
		sshHostKey: []byte("host-key-a"), stream: sshAgent(seen, nil)})
	// No ssh feature: its host key is not kept, and it is no SSH node.
	h.dialAgent(t, agentOpts{id: "n-b", sshHostKey: []byte("host-key-b"), stream: sshAgent(seen, nil)})
	nodes := h.c.SSHNodes()

	if n, ok := nodes.Node("n-a"); !ok || n.ID != "n-a" || n.Labels["env"] != "staging" {
		t.Errorf("Node(n-a) = %+v, %v", n, ok)
	}
	if got := nodes.HostKey("n-a"); string(got) != "host-key-a" {
		t.Errorf("HostKey(n-a) = %q", got)
	}
	for _, id := range []string{"n-b", "n-none"} {
		if _, ok := nodes.Node(id); ok {
			t.Errorf("Node(%s) is an SSH node", id)
		}
		if got := nodes.HostKey(id); got != nil {
			t.Errorf("HostKey(%s) = %q, want nil", id, got)
		}
	}

	params := protocol.SSHParams{Session: strings.Repeat("ab", 16), Identity: "ssh-key:SHA256:x", Logins: []string{"deploy"},
		Auth: protocol.SSHAuthPublicKey, PublicKey: []byte("proved-key")}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	conn, err := nodes.OpenSSH(ctx, "n-a", params)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-seen; !slices.Equal(got.Logins, params.Logins) || got.Session != params.Session || string(got.PublicKey) != "proved-key" {
		t.Errorf("agent got %+v", got)
	}
	if _, err := conn.Write([]byte("SSH-2.0-test\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "SSH-2.0-test\r\n" {
		t.Fatalf("echo = %q, %v", line, err)
	}
	conn.Close()

	if _, err := nodes.OpenSSH(ctx, "n-a", params); err == nil {
		t.Error("a session id still in its grace was opened again")
	}
	if _, err := nodes.OpenSSH(ctx, "n-b", protocol.SSHParams{Session: strings.Repeat("cd", 16), Identity: "x", Logins: []string{"deploy"}, Auth: protocol.SSHAuthNone}); err == nil {
		t.Error("an agent without the ssh feature was sent an ssh stream")
	}
	if _, err := nodes.OpenSSH(ctx, "n-a", protocol.SSHParams{Session: "short", Identity: "x", Logins: []string{"deploy"}, Auth: protocol.SSHAuthNone}); err == nil {
		t.Error("invalid params were sent")
	}
	refused := protocol.SSHParams{Session: strings.Repeat("ef", 16), Identity: "x", Logins: []string{"refuse"}, Auth: protocol.SSHAuthNone}
	_, err = nodes.OpenSSH(ctx, "n-a", refused)
	var ei *protocol.ErrorInfo
	if !errors.As(err, &ei) || ei.Code != protocol.CodeForbidden {
		t.Fatalf("refused OpenSSH: %v, want the agent's forbidden", err)
	}
	<-seen
}

const sshPolicy = `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "env=staging"
        operations: [ssh]
        run_as: deploy
      - nodes: "*"
        operations: [ssh]
        run_as: nobody
      - nodes: "env=staging"
        operations: [nodes.list]
      - nodes: "env=staging"
        operations: [forward]
        targets: [openshell, web]
  nats:bob:
    rules:
      - nodes: "*"
        operations: [nodes.list, forward]
        targets: [openshell]
  nats:carol:
    rules:
      - nodes: "*"
        operations: [ssh]
        run_as: refuse
`

// readDialOK reads the agent's first frame off a pipe and fails unless it
// is dial-ok.
func readDialOK(t *testing.T, p io.Reader) {
	t.Helper()
	f, err := protocol.NewFrameReader(p).Next()
	if err != nil || f.Type != protocol.FrameDialOK {
		t.Fatalf("first frame: %v %v, want dial-ok", f.Type, err)
	}
}

// TestSSHStreamKind: tether.v1.stream kind ssh (tether ssh-proxy) is
// decided as operation ssh on the node: the agent gets SSHParams vouching
// for the caller's NATS identity with the logins of every ssh grant, the
// targets of every forward grant and the node's host certificate; callers
// without an ssh grant there are refused with a message naming identity,
// operation and node, and reach no agent; params are refused; an agent
// without SSH is 501.
func TestSSHStreamKind(t *testing.T) {
	h, _ := newPolicyHarness(t, sshPolicy, func(c *coordinator.Config) { c.SSH.HostCA = fakeHostCA{} })
	seen := make(chan protocol.SSHParams, 8)
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}, features: sshFeatures, sshHostKey: []byte("ka"), stream: sshAgent(seen, nil)})
	h.dialAgent(t, agentOpts{id: "n-b", labels: map[string]string{"env": "prod"}, features: sshFeatures, sshHostKey: []byte("kb"), stream: sshAgent(seen, nil)})
	h.dialAgent(t, agentOpts{id: "n-c", labels: map[string]string{"env": "staging"}, stream: sshAgent(seen, nil)})

	for _, tt := range []struct {
		node            string
		logins, targets []string
		cert            string
	}{
		{"n-a", []string{"deploy", "nobody"}, []string{"openshell", "web"}, "cert(n-a,ka)"},
		{"n-b", []string{"nobody"}, nil, "cert(n-b,kb)"},
	} {
		e, p := streamAs(t, h.as("alice"), tt.node, protocol.KindSSH, struct{}{})
		if e != nil {
			t.Fatalf("%s: %v", tt.node, e)
		}
		got := <-seen
		if got.Identity != "nats:alice" || got.Auth != protocol.SSHAuthNone || len(got.PublicKey) != 0 ||
			!slices.Equal(got.Logins, tt.logins) || !slices.Equal(got.Targets, tt.targets) || string(got.HostCertificate) != tt.cert {
			t.Errorf("%s: agent got %+v", tt.node, got)
		}
		readDialOK(t, p)
		if _, err := p.Write([]byte("raw ssh bytes")); err != nil {
			t.Fatal(err)
		}
		p.CloseWrite()
		if b, err := io.ReadAll(p); err != nil || string(b) != "raw ssh bytes" {
			t.Errorf("%s: echo %q, %v", tt.node, b, err)
		}
	}

	e, _ := streamAs(t, h.as("bob"), "n-a", protocol.KindSSH, struct{}{})
	wantRefused(t, "bob", e, 403, protocol.ErrCodeForbidden, "nats:bob", "ssh", "n-a")
	e, _ = streamAs(t, h.as("mallory"), "n-a", protocol.KindSSH, struct{}{})
	wantRefused(t, "mallory", e, 403, protocol.ErrCodeForbidden, "nats:mallory")
	e, _ = streamAs(t, h.as("alice"), "n-a", protocol.KindSSH, map[string]any{"logins": []string{"root"}})
	wantRefused(t, "params", e, 400, protocol.ErrCodeInvalid, "takes none")
	e, _ = streamAs(t, h.as("alice"), "n-c", protocol.KindSSH, struct{}{})
	wantRefused(t, "no ssh feature", e, 501, protocol.ErrCodeUnsupported, "n-c", "SSH")
	select {
	case p := <-seen:
		t.Fatalf("a refused request reached an agent: %+v", p)
	default:
	}
}

// TestSSHInfo: tether.v1.ssh.info lists the SSH nodes the caller may list
// and log in to, with its logins, and the jump host and CA line.
func TestSSHInfo(t *testing.T) {
	h, _ := newPolicyHarness(t, sshPolicy, func(c *coordinator.Config) {
		c.SSH.HostCA = fakeHostCA{}
		c.SSH.Jump = func() (string, string) { return "127.0.0.1:7022", "ssh-ed25519 JUMP" }
	})
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}, features: sshFeatures, sshHostKey: []byte("ka")})
	h.dialAgent(t, agentOpts{id: "n-a2", labels: map[string]string{"env": "staging"}, features: sshFeatures})
	h.dialAgent(t, agentOpts{id: "n-b", labels: map[string]string{"env": "prod"}, features: sshFeatures})
	h.dialAgent(t, agentOpts{id: "n-c", labels: map[string]string{"env": "staging"}})

	info := func(who string) (*protocol.APIError, protocol.SSHInfo) {
		e, m := requestAs(t, h.as(who), protocol.SubjectSSHInfo, protocol.SSHInfoRequest{})
		var in protocol.SSHInfo
		if e == nil {
			if err := json.Unmarshal(m.Data, &in); err != nil {
				t.Fatal(err)
			}
		}
		return e, in
	}
	e, in := info("alice")
	if e != nil {
		t.Fatal(e)
	}
	want := []protocol.SSHInfoNode{
		{ID: "n-a", Alias: "n-a.tether", Logins: []string{"deploy", "nobody"}},
		{ID: "n-a2", Alias: "n-a2.tether", Logins: []string{"deploy", "nobody"}},
	}
	if in.JumpAddr != "127.0.0.1:7022" || in.JumpHostKey != "ssh-ed25519 JUMP" || in.KnownHostsCA != (fakeHostCA{}).KnownHostsLine() ||
		in.Coordinator != "coord-test" || in.NodesTotal != 2 || fmt.Sprint(in.Nodes) != fmt.Sprint(want) {
		t.Errorf("alice's ssh info = %+v, want nodes %+v", in, want)
	}
	if e, in := info("bob"); e != nil || len(in.Nodes) != 0 || in.Nodes == nil {
		t.Errorf("bob (nodes.list, no ssh) = %+v, %v; want no nodes", in, e)
	}
	e, _ = info("mallory")
	wantRefused(t, "mallory", e, 403, protocol.ErrCodeForbidden, "nats:mallory")
}

// auditLines returns the audit events logged to logs (JSON lines with msg
// "audit") as attribute maps.
func auditLines(t *testing.T, logs *lockedBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range bytes.Split([]byte(logs.String()), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(line, &m) == nil && m["msg"] == "audit" {
			out = append(out, m)
		}
	}
	return out
}

// TestSSHChannelEventsAudited: an agent's FrameSSHChannel is one audit
// event under the identity the coordinator recorded for the session (the
// jump host's proved key, or the NATS caller of an ssh stream), never an
// identity the agent names; events of unknown sessions, or of another
// node's, are counted and dropped, and malformed ones too, without ending
// the session.
func TestSSHChannelEventsAudited(t *testing.T) {
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	h, _ := newPolicyHarness(t, sshPolicy, func(c *coordinator.Config) {
		c.Logger = log
		withAudit(t, c, log)
	})
	const otherSession = "0123456789abcdef0123456789abcdef"
	// n-a reports, for each connection: its channel naming another
	// identity, a session nobody opened, a malformed event.
	report := func(a *fakeAgent, p protocol.SSHParams) {
		status := 3
		ev := protocol.SSHChannelEvent{Session: p.Session, Channel: 1, Type: protocol.SSHChannelExec, Login: "deploy",
			Command:    &protocol.AuditCommand{Mode: "argv", Program: "bash", SHA256: strings.Repeat("a", 64), Size: 7, Count: 1},
			ExitStatus: &status, BytesIn: 10, BytesOut: 20, Result: protocol.AuditFailed, Error: "exit status 3"}
		b, _ := json.Marshal(ev)
		forged := append(bytes.TrimSuffix(b, []byte("}")), []byte(`,"identity":"nats:mallory"}`)...)
		protocol.WriteFrame(a.ctrl, protocol.FrameSSHChannel, forged)
		ev.Session = otherSession
		protocol.WriteJSONFrame(a.ctrl, protocol.FrameSSHChannel, &ev)
		protocol.WriteFrame(a.ctrl, protocol.FrameSSHChannel, []byte(`{"session":1}`))
	}
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}, features: sshFeatures, stream: sshAgent(nil, report)})
	// n-b reports n-a's sessions as its own.
	var sessions = make(chan string, 4)
	b := h.dialAgent(t, agentOpts{id: "n-b", labels: map[string]string{"env": "staging"}, features: sshFeatures})

	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	// Through the jump host's path...
	jp := protocol.SSHParams{Session: strings.Repeat("1", 32), Identity: "ssh-key:SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU",
		Logins: []string{"deploy"}, Auth: protocol.SSHAuthPublicKey, PublicKey: []byte("k")}
	conn, err := h.c.SSHNodes().OpenSSH(sshgate.WithSource(ctx, "127.0.0.7:4022"), "n-a", jp)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sessions <- jp.Session
	// ...and through an ssh stream.
	e, p := streamAs(t, h.as("alice"), "n-a", protocol.KindSSH, nil)
	if e != nil {
		t.Fatal(e)
	}
	readDialOK(t, p)

	var events []map[string]any
	checkFor(t, defaultTestTimeout, func() error {
		events = events[:0]
		for _, ev := range auditLines(t, logs) {
			if ev["operation"] == "ssh" && ev["method"] == "exec" {
				events = append(events, ev)
			}
		}
		if len(events) < 2 {
			return fmt.Errorf("%d ssh exec events audited", len(events))
		}
		return nil
	})
	ids := map[string]bool{}
	sources := map[string]any{}
	for _, ev := range events {
		ids[fmt.Sprint(ev["identity"])] = true
		sources[fmt.Sprint(ev["identity"])] = ev["source"]
		if ev["nodes"] != "n-a" || ev["run_as"] != "deploy" || ev["exit_code"] != float64(3) || ev["result"] != protocol.AuditFailed ||
			ev["bytes_in"] != float64(10) || ev["bytes_out"] != float64(20) || ev["command_program"] != "bash" || ev["session"] == "" {
			t.Errorf("event %v", ev)
		}
	}
	if !ids[jp.Identity] || !ids["nats:alice"] || ids["nats:mallory"] || len(events) != 2 {
		t.Errorf("audited identities %v, want the jump host's and nats:alice's, once each", ids)
	}
	// Each names where its connection came from: the jump host's client
	// (sshgate.WithSource), the ssh stream's NATS client as the server
	// stamped it.
	if sources[jp.Identity] != "127.0.0.7:4022" || sources["nats:alice"] != "127.0.0.1" {
		t.Errorf("audited sources %v, want the jump host's client 127.0.0.7:4022 and nats:alice's 127.0.0.1", sources)
	}
	// n-b naming n-a's session is dropped like an unknown one.
	ev := protocol.SSHChannelEvent{Session: <-sessions, Type: protocol.SSHChannelShell, Result: protocol.AuditOK}
	if err := protocol.WriteJSONFrame(b.ctrl, protocol.FrameSSHChannel, &ev); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		got := [3]float64{
			h.metric("tether_coordinator_ssh_channel_events_total", "outcome", "audited"),
			h.metric("tether_coordinator_ssh_channel_events_total", "outcome", "unknown_session"),
			h.metric("tether_coordinator_ssh_channel_events_total", "outcome", "malformed"),
		}
		if got != [3]float64{2, 3, 2} {
			return fmt.Errorf("ssh channel events audited, unknown_session, malformed = %v, want [2 3 2]", got)
		}
		return nil
	})
	for _, ev := range auditLines(t, logs) {
		if ev["method"] == "shell" || ev["identity"] == "nats:mallory" {
			t.Errorf("a dropped event was audited: %v", ev)
		}
	}
	// The ssh stream itself is the connection's event: alice's is open;
	// carol's, which the agent refused (its local policy allows none of
	// her logins), is refused by the local policy.
	e, p = streamAs(t, h.as("carol"), "n-a", protocol.KindSSH, nil)
	if e != nil {
		t.Fatal(e)
	}
	if f, err := protocol.NewFrameReader(p).Next(); err != nil || f.Type != protocol.FrameError {
		t.Fatalf("carol's first frame: %v %v, want the agent's error", f.Type, err)
	}
	p.Close() // as client.SSH does on a refusal
	var refused map[string]any
	checkFor(t, defaultTestTimeout, func() error {
		for _, ev := range auditLines(t, logs) {
			if ev["operation"] == "ssh" && ev["method"] == "connect" && ev["identity"] == "nats:carol" {
				refused = ev
				return nil
			}
		}
		return errors.New("no connect event for carol")
	})
	if refused["result"] != protocol.AuditRefused || refused["reason"] != protocol.AuditReasonLocalPolicy || refused["run_as"] != "refuse" ||
		refused["nodes"] != "n-a" || refused["session"] == nil || !strings.Contains(fmt.Sprint(refused["error"]), "local policy") {
		t.Errorf("carol's connect event: %v", refused)
	}
	if _, ok := h.c.SSHNodes().Node("n-b"); !ok {
		t.Error("n-b's session ended over a dropped event")
	}
}

// TestSSHNodeCaseFolded: OpenSSH lowercases host names, so the jump host and
// ssh-proxy are asked for gpu-07 when the user typed GPU-07: an id without
// an exact match is found without case, if only one node matches; an exact
// match always wins.
func TestSSHNodeCaseFolded(t *testing.T) {
	h := newHarness(t, nil)
	seen := make(chan protocol.SSHParams, 4)
	for _, id := range []string{"GPU-07", "Twin", "twin", "TWIN-b", "Twin-B"} {
		h.dialAgent(t, agentOpts{id: id, features: sshFeatures, sshHostKey: []byte("key-" + id), stream: sshAgent(seen, nil)})
	}
	nodes := h.c.SSHNodes()
	for asked, want := range map[string]string{"gpu-07": "GPU-07", "GPU-07": "GPU-07", "twin": "twin", "Twin": "Twin", "TWIN": ""} {
		n, ok := nodes.Node(asked)
		switch {
		case want == "" && ok:
			t.Errorf("Node(%s) = %s; two nodes match without case, want none", asked, n.ID)
		case want != "" && (!ok || n.ID != want):
			t.Errorf("Node(%s) = %s, %v; want %s", asked, n.ID, ok, want)
		}
	}
	if _, ok := nodes.Node("twin-b"); ok {
		t.Error("Node(twin-b) found one of TWIN-b and Twin-B")
	}
	if got := nodes.HostKey("gpu-07"); string(got) != "key-GPU-07" {
		t.Errorf("HostKey(gpu-07) = %q", got)
	}
}

// TestSSHStreamRevoked: an ssh stream (tether ssh-proxy) whose caller the
// reloaded policy no longer grants ssh on its node is aborted by
// RecheckCallers, the client reading why, and audited as revoked; the same
// caller's stream to a node still granted as its logins keeps relaying.
func TestSSHStreamRevoked(t *testing.T) {
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	store, path := writePolicy(t, sshPolicy)
	h := newHarness(t, func(c *coordinator.Config) {
		c.Policy = store
		c.Logger = log
		withAudit(t, c, log)
	})
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}, features: sshFeatures, stream: sshAgent(nil, nil)})
	h.dialAgent(t, agentOpts{id: "n-b", labels: map[string]string{"env": "prod"}, features: sshFeatures, stream: sshAgent(nil, nil)})
	pipes := map[string]*natspipe.Pipe{}
	for _, node := range []string{"n-a", "n-b"} {
		e, p := streamAs(t, h.as("alice"), node, protocol.KindSSH, nil)
		if e != nil {
			t.Fatalf("%s: %v", node, e)
		}
		readDialOK(t, p)
		pipes[node] = p
	}
	// alice keeps ssh as nobody on prod nodes only.
	replacePolicy(t, path, `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "env=prod"
        operations: [ssh]
        run_as: nobody
`)
	if _, err := store.Reload(); err != nil {
		t.Fatal(err)
	}
	h.c.RecheckCallers()

	read := make(chan error, 1)
	go func() { _, err := io.ReadAll(pipes["n-a"]); read <- err }()
	select {
	case err := <-read:
		if err == nil || !strings.Contains(err.Error(), "no longer grants ssh") {
			t.Errorf("n-a's stream ended with %v, want the revocation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("n-a's stream still open 10 s after the reload")
	}
	b := pipes["n-b"]
	if _, err := b.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
	b.CloseWrite()
	if got, err := io.ReadAll(b); err != nil || string(got) != "still here" {
		t.Errorf("n-b's stream after the reload: %q, %v", got, err)
	}
	var ev map[string]any
	checkFor(t, defaultTestTimeout, func() error {
		for _, l := range auditLines(t, logs) {
			if l["operation"] == "ssh" && l["method"] == "connect" && l["nodes"] == "n-a" {
				ev = l
				return nil
			}
		}
		return errors.New("no connect event for n-a")
	})
	if ev["result"] != protocol.AuditFailed || ev["reason"] != protocol.AuditReasonRevoked || ev["identity"] != "nats:alice" ||
		!strings.Contains(fmt.Sprint(ev["error"]), "no longer grants ssh on n-a") {
		t.Errorf("n-a's connect event: %v", ev)
	}
}

// TestRelayRawStreamClientEndAudited: an ssh or dial stream (tether
// ssh-proxy, tether forward) ends when the client closes its end: after
// the agent closed its side (ssh exits once sshd hung up), or while the
// agent's side is still open (the forwarded connection was closed). That
// is the stream's normal end, audited ok with the bytes relayed, not
// failed (a fresh user's every ssh login was audited failed).
func TestRelayRawStreamClientEndAudited(t *testing.T) {
	for _, tc := range []struct {
		name        string
		kind        protocol.Kind
		agentCloses bool
		// exits: the client's process exits instead of closing the
		// stream (on the direct path its session ends; on NATS the
		// stream is closed as tether ssh-proxy's deferred Close does).
		exits bool
		// lost: the agent's tunnel is lost after the echo, a failure
		// that the client's close after it does not make ok.
		lost bool
	}{
		{"ssh agent closes first", protocol.KindSSH, true, false, false},
		{"ssh client closes first", protocol.KindSSH, false, false, false},
		{"ssh client exits", protocol.KindSSH, true, true, false},
		{"ssh tunnel lost", protocol.KindSSH, false, false, true},
		{"dial agent closes first", protocol.KindDial, true, false, false},
		{"dial client closes first", protocol.KindDial, false, false, false},
		{"dial client exits", protocol.KindDial, false, true, false},
		{"dial tunnel lost", protocol.KindDial, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &lockedBuffer{}
			log := slog.New(slog.NewJSONHandler(logs, nil))
			h, _ := newPolicyHarness(t, sshPolicy, func(c *coordinator.Config) {
				c.Logger = log
				withAudit(t, c, log)
			})
			// The agent answers dial-ok, echoes "hello", then hangs up
			// (agentCloses) or waits for the client's end.
			agent := h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}, features: sshFeatures,
				stream: func(a *fakeAgent, st *yamux.Stream, hd protocol.Header) {
					defer st.Close()
					if err := protocol.WriteFrame(st, protocol.FrameDialOK, nil); err != nil {
						return
					}
					b := make([]byte, 5)
					if _, err := io.ReadFull(st, b); err != nil {
						return
					}
					st.Write(b)
					if !tc.agentCloses {
						io.Copy(io.Discard, st)
					}
				}})
			cl := client.New(h.as("alice"))
			if directRun {
				cl.Direct = client.DirectOnly
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			var (
				s   *client.Stream
				err error
			)
			if tc.kind == protocol.KindSSH {
				s, err = cl.SSH(ctx, "n-a")
			} else {
				s, err = cl.Dial(ctx, "n-a", "openshell")
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 5)
			if _, err := io.ReadFull(s, b); err != nil || string(b) != "hello" {
				t.Fatalf("echo = %q, %v", b, err)
			}
			if tc.lost {
				agent.close()
				if _, err := s.Read(b); err == nil || err == io.EOF {
					t.Fatalf("read after the tunnel's loss = %v, want an error", err)
				}
			}
			if tc.agentCloses {
				if n, err := s.Read(b); n != 0 || err != io.EOF {
					t.Fatalf("read after the agent's close = %d, %v; want EOF", n, err)
				}
			}
			if tc.exits && directRun {
				cl.Close()
			} else {
				s.Close() // as tether ssh-proxy does once its stdout copy ended
			}
			var ev map[string]any
			checkFor(t, defaultTestTimeout, func() error {
				for _, e := range auditLines(t, logs) {
					if e["operation"] == relayOpName(tc.kind) && e["nodes"] == "n-a" {
						ev = e
						return nil
					}
				}
				return errors.New("no event for the stream")
			})
			if tc.lost {
				if ev["result"] != protocol.AuditFailed || ev["bytes_in"] != float64(5) {
					t.Errorf("event %v; want result failed, 5 bytes in", ev)
				}
				return
			}
			if ev["result"] != protocol.AuditOK || ev["error"] != nil || ev["reason"] != nil ||
				ev["bytes_in"] != float64(5) || ev["bytes_out"] == nil || ev["bytes_out"].(float64) < 5 {
				t.Errorf("event %v; want result ok, no error, 5 bytes in, dial-ok and 5 bytes out", ev)
			}
			if tc.kind == protocol.KindSSH && ev["method"] != "connect" {
				t.Errorf("method %v, want connect", ev["method"])
			}
			if strings.Contains(logs.String(), "relay aborted") {
				t.Error(`the client's end was logged as "relay aborted"`)
			}
		})
	}
}

// relayOpName is the audit operation of a stream of kind k.
func relayOpName(k protocol.Kind) string {
	if k == protocol.KindDial {
		return "forward"
	}
	return k.String()
}
