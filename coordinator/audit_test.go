package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/audit"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// auditFleet starts a fleet whose coordinator records an audit log; its
// logs go to the returned buffer too. mutate, if set, adjusts the
// coordinator's config further.
func auditFleet(t *testing.T, mutate func(*coordinator.Config)) (*fleettest.Fleet, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	f := fleettest.Start(t, fleettest.Options{Logger: testLogger(t), Coordinator: func(c *coordinator.Config) {
		c.Logger = log
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		rec, err := audit.New(ctx, audit.Config{NATS: c.NATS, Coordinator: c.ID, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			rec.Close(ctx)
		})
		c.Audit = rec
		if mutate != nil {
			mutate(c)
		}
	}})
	return f, logs
}

// auditEvents waits until the audit log (read through the API as the
// fleet's client) holds an event for which match is true, and returns it.
func auditEvents(t *testing.T, nc *nats.Conn, hdr nats.Header, q protocol.AuditQueryRequest, match func(*protocol.AuditEvent) bool) *protocol.AuditEvent {
	t.Helper()
	var found *protocol.AuditEvent
	checkFor(t, defaultTestTimeout, func() error {
		resp, err := auditQuery(nc, hdr, q)
		if err != nil {
			return err
		}
		for i := range resp.Events {
			if match(&resp.Events[i]) {
				found = &resp.Events[i]
				return nil
			}
		}
		return fmt.Errorf("no matching event among %d", len(resp.Events))
	})
	return found
}

func auditQuery(nc *nats.Conn, hdr nats.Header, q protocol.AuditQueryRequest) (*protocol.AuditQueryResponse, error) {
	body, _ := json.Marshal(q)
	m, err := nc.RequestMsg(&nats.Msg{Subject: protocol.SubjectAuditQuery, Data: body, Header: hdr}, defaultTestTimeout)
	if err != nil {
		return nil, err
	}
	if m.Header.Get("Nats-Service-Error-Code") != "" {
		var e protocol.APIError
		json.Unmarshal(m.Data, &e)
		return nil, &e
	}
	var resp protocol.AuditQueryResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

func TestAuditExecJob(t *testing.T) {
	f, logs := auditFleet(t, nil)
	const secret = "s3cr3t-env-value-42"
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	argv := []string{"sh", "-c", `printf out; exit 3`}
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{
		ID: "audited-1", Target: protocol.Target{Node: "node-0"}, Argv: argv,
		Env: map[string]string{"DB_PASSWORD": secret}, Stdin: []byte(secret),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Results[0].ExitCode != 3 {
		t.Fatalf("exit %d, want 3", res.Results[0].ExitCode)
	}
	ev := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{JobID: "audited-1"}, func(*protocol.AuditEvent) bool { return true })
	sum, _ := protocol.CommandDigest("", argv)
	if ev.Operation != "exec" || ev.Result != protocol.AuditFailed || ev.ExitCode == nil || *ev.ExitCode != 3 ||
		len(ev.Nodes) != 1 || ev.Nodes[0] != "node-0" || ev.NodesFailed != 1 || ev.Subject != protocol.SubjectExec ||
		ev.Command == nil || ev.Command.SHA256 != sum || ev.Command.Program != "sh" || ev.BytesIn != int64(len(secret)) || ev.BytesOut != 3 ||
		ev.DurationMS <= 0 || ev.Coordinator == "" {
		t.Errorf("event = %+v, command %+v", ev, ev.Command)
	}
	// The audit query itself is an event, too.
	auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "admin"}, func(e *protocol.AuditEvent) bool {
		return e.Subject == protocol.SubjectAuditQuery && e.Result == protocol.AuditOK
	})
	all, err := auditQuery(f.NC, nil, protocol.AuditQueryRequest{Limit: protocol.MaxAuditLimit})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(all)
	if strings.Contains(string(body), secret) {
		t.Errorf("the secret env value or stdin is in the audit events:\n%s", body)
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the secret env value or stdin is in the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), `"msg":"audit"`) || !strings.Contains(logs.String(), `"command_sha256":"`+sum+`"`) {
		t.Errorf("the log lacks the exec's audit line:\n%s", logs.String())
	}
}

func TestAuditRequestOutcomes(t *testing.T) {
	f, _ := auditFleet(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if _, err := f.Client.Nodes(ctx, ""); err != nil {
		t.Fatal(err)
	}
	_, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: "to-ghost", Target: protocol.Target{Node: "ghost"}, Argv: []string{"true"}}, nil)
	if !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeUnknownNode}) {
		t.Fatalf("exec on a ghost: %v", err)
	}
	if _, err := f.Client.Cancel(ctx, "no-such-job"); err == nil {
		t.Fatal("cancel of no job succeeded")
	}
	auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "nodes.list"}, func(e *protocol.AuditEvent) bool { return e.Result == protocol.AuditOK })
	ghost := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{JobID: "to-ghost"}, func(*protocol.AuditEvent) bool { return true })
	if ghost.Result != protocol.AuditError || ghost.ErrorCode != protocol.ErrCodeUnknownNode || ghost.Status != 404 ||
		len(ghost.Nodes) != 1 || ghost.Nodes[0] != "ghost" || ghost.Error != "" {
		t.Errorf("exec on a ghost: event %+v", ghost)
	}
	cancelled := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "job.cancel"}, func(*protocol.AuditEvent) bool { return true })
	if cancelled.Result != protocol.AuditError || cancelled.ErrorCode != protocol.ErrCodeNotFound || cancelled.JobID != "no-such-job" {
		t.Errorf("cancel: event %+v", cancelled)
	}

	// A stream relay: an interactive exec with stdin, its bytes counted
	// both ways and its exit status read from the agent's exit frame.
	st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindExec, protocol.ExecParams{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	protocol.WriteFrame(st, protocol.FrameStdin, []byte("hello"))
	protocol.WriteFrame(st, protocol.FrameStdinClose, nil)
	st.CloseWrite()
	if out, es := readExec(t, st); out != "hello" || es.ExitCode != 0 {
		t.Fatalf("relay: %q, exit %d", out, es.ExitCode)
	}
	st.Close()
	rel := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "exec"}, func(e *protocol.AuditEvent) bool { return e.Subject == protocol.SubjectStream })
	if rel.Result != protocol.AuditOK || rel.ExitCode == nil || *rel.ExitCode != 0 || rel.Command == nil || rel.Command.Program != "cat" ||
		rel.BytesIn < 5 || rel.BytesOut < 5 || len(rel.Nodes) != 1 || rel.Nodes[0] != "node-0" {
		t.Errorf("relay: event %+v", rel)
	}
}

// testIdentity is the header the tests' Identify reads: the tests stand
// in for natsauth, which reads what the NATS server stamped.
const testIdentity = "Test-Identity"

func identifyFromHeader(h nats.Header) (policy.Identity, error) {
	name := h.Get(testIdentity)
	if name == "" {
		return policy.Identity{}, errors.New("no identity stamped")
	}
	return policy.Identity{Kind: policy.KindNATS, Name: name, Key: "UKEY" + name, Account: "CLIENTS"}, nil
}

func as(name string) nats.Header { return nats.Header{testIdentity: []string{name}} }

func TestAuditRefusals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(`version: 1
identities:
  nats:alice:
    rules:
      - nodes: "*"
        operations: [nodes.list]
  nats:root:
    rules:
      - operations: [admin]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := auditFleet(t, func(c *coordinator.Config) {
		c.Identify = identifyFromHeader
		c.Policy = store
	})

	// Unidentified: 401, recorded as refused.
	if _, err := auditQuery(f.NC, nil, protocol.AuditQueryRequest{}); !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeUnauthenticated}) {
		t.Fatalf("unidentified audit query: %v", err)
	}
	// alice may not read the audit log: 403, recorded once, with the
	// policy's reason and message.
	if _, err := auditQuery(f.NC, as("alice"), protocol.AuditQueryRequest{}); !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeForbidden}) {
		t.Fatalf("alice's audit query: %v", err)
	}
	root := as("root")
	forbidden := auditEvents(t, f.NC, root, protocol.AuditQueryRequest{Identity: "nats:alice", Result: protocol.AuditRefused}, func(*protocol.AuditEvent) bool { return true })
	if forbidden.Operation != "admin" || forbidden.Reason != policy.ReasonNoRule.String() || forbidden.Status != 403 ||
		!strings.Contains(forbidden.Error, "nats:alice") || forbidden.IdentityKey != "UKEYalice" || forbidden.Account != "CLIENTS" {
		t.Errorf("alice's refusal: event %+v", forbidden)
	}
	unauth := auditEvents(t, f.NC, root, protocol.AuditQueryRequest{Result: protocol.AuditRefused}, func(e *protocol.AuditEvent) bool { return e.Identity == "" })
	if unauth.Reason != protocol.ErrCodeUnauthenticated || unauth.Status != 401 || unauth.Operation != "admin" {
		t.Errorf("unidentified refusal: event %+v", unauth)
	}
	resp, err := auditQuery(f.NC, root, protocol.AuditQueryRequest{Identity: "nats:alice"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Events) != 1 {
		t.Errorf("alice's one refused request is %d events: %+v", len(resp.Events), resp.Events)
	}
	// root's own reads are recorded, with the rule that allowed them.
	ok := auditEvents(t, f.NC, root, protocol.AuditQueryRequest{Identity: "nats:root", Result: protocol.AuditOK}, func(*protocol.AuditEvent) bool { return true })
	if !strings.Contains(ok.Rule, "policy.yaml") {
		t.Errorf("root's query: rule %q, want the policy rule", ok.Rule)
	}
	// A continued read is not recorded again; a new one is. (The node
	// filter marks each read's event.)
	if _, err := auditQuery(f.NC, root, protocol.AuditQueryRequest{Node: "page-2", Cursor: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := auditQuery(f.NC, root, protocol.AuditQueryRequest{Node: "page-1"}); err != nil {
		t.Fatal(err)
	}
	auditEvents(t, f.NC, root, protocol.AuditQueryRequest{Node: "page-1"}, func(*protocol.AuditEvent) bool { return true })
	if resp, err := auditQuery(f.NC, root, protocol.AuditQueryRequest{Node: "page-2"}); err != nil || len(resp.Events) != 0 {
		t.Errorf("a continued read was recorded: %v %+v", err, resp)
	}
}

func TestAuditQueryWithoutRecorder(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Logger: testLogger(t)})
	_, err := auditQuery(f.NC, nil, protocol.AuditQueryRequest{})
	if !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeUnavailable}) || !strings.Contains(err.Error(), "audit") {
		t.Fatalf("audit query without a recorder: %v", err)
	}
}
