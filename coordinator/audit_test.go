package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/audit"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// auditFleet starts a fleet whose coordinator records an audit log; its
// logs go to the returned buffer too. mutate, if set, adjusts the
// coordinator's config further.
func auditFleet(t *testing.T, mutate func(*coordinator.Config)) (*fleettest.Fleet, *lockedBuffer) {
	t.Helper()
	return auditFleetOpts(t, fleettest.Options{}, mutate)
}

// withAudit gives c an audit recorder on its NATS server that logs to
// log, closed when the test ends.
func withAudit(t *testing.T, c *coordinator.Config, log *slog.Logger) {
	t.Helper()
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
}

// auditFleetOpts is auditFleet with more fleet options.
func auditFleetOpts(t *testing.T, opts fleettest.Options, mutate func(*coordinator.Config)) (*fleettest.Fleet, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	opts.Logger = testLogger(t)
	opts.Coordinator = func(c *coordinator.Config) {
		c.Logger = log
		withAudit(t, c, log)
		if mutate != nil {
			mutate(c)
		}
	}
	return fleettest.Start(t, opts), logs
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

// A decision about a caller that is not a NATS request (a facade call)
// is recorded when it refuses.
func TestAuditRefusalWithoutRequest(t *testing.T) {
	f, _ := auditFleet(t, nil)
	obs := coordinator.AuthorizerForTest(f.Coordinator).Observe
	if obs == nil {
		t.Fatal("the coordinator's Authorizer observes nothing")
	}
	id := policy.Identity{Kind: policy.KindCert, Name: "ops.example.com"}
	obs(caller.Decision{Identity: id, Identified: true, Op: policy.OpForward, Node: policy.Node{ID: "node-0"},
		Object: policy.Object{Target: "openshell"}, Err: protocol.NewAPIError(403, protocol.ErrCodeForbidden, "cert:ops.example.com may not forward"),
		Source: "127.0.0.7:4100"})
	obs(caller.Decision{Identity: id, Identified: true, Op: policy.OpForward}) // allowed: no event
	ev := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Identity: "cert:ops.example.com"}, func(*protocol.AuditEvent) bool { return true })
	if ev.Operation != "forward" || ev.Result != protocol.AuditRefused || ev.Target != "openshell" || len(ev.Nodes) != 1 || ev.Nodes[0] != "node-0" || ev.Status != 403 ||
		ev.Source != "127.0.0.7:4100" {
		t.Errorf("event %+v", ev)
	}
	resp, err := auditQuery(f.NC, nil, protocol.AuditQueryRequest{Identity: "cert:ops.example.com"})
	if err != nil || len(resp.Events) != 1 {
		t.Errorf("%v: %d events of the facade caller, want 1", err, len(resp.Events))
	}
}

// The endpoints other packages add (the ledger's) are audited like the
// coordinator's own.
func TestAuditLedgerEndpoints(t *testing.T) {
	f, _ := auditFleetOpts(t, fleettest.Options{Gateways: &fleettest.GatewayOptions{}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if _, err := f.Client.OpenLease(ctx, "run-7", time.Minute, "me"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.RenewLease(ctx, "no-such-run"); err == nil {
		t.Fatal("renewing no lease succeeded")
	}
	ok := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "sandboxes.lease", Result: protocol.AuditOK}, func(*protocol.AuditEvent) bool { return true })
	if ok.Run != "run-7" || ok.Subject != protocol.SubjectLeaseOpen {
		t.Errorf("lease open: event %+v", ok)
	}
	bad := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "sandboxes.lease", Result: protocol.AuditError}, func(*protocol.AuditEvent) bool { return true })
	if bad.Run != "no-such-run" || bad.ErrorCode != protocol.ErrCodeNotFound || bad.Subject != protocol.SubjectLeaseRenew {
		t.Errorf("lease renew: event %+v", bad)
	}
}

// A copy's event says how it ended: a copy the receiver committed is ok
// (push: the agent's FrameCopyDone; pull: the client's), one with skipped
// entries (the CLI's exit 23) failed with ErrCodeCopyPartial, one the
// node's local policy refused is refused with its reason.
func TestAuditCopyOutcomes(t *testing.T) {
	f, _ := auditFleet(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	root := f.DataDir("node-0")
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	copyOnce := func(params protocol.CopyParams, local string) (*protocol.CopyResult, error) {
		st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindCopy, &params)
		if err != nil {
			return nil, err
		}
		defer st.Close()
		var res *protocol.CopyResult
		if params.Direction == protocol.CopyPush {
			res, err = mirror.Send(ctx, local, st, mirror.Options{})
		} else {
			res, err = mirror.Receive(ctx, local, st, mirror.Options{})
		}
		if err == nil {
			// As tether cp ends a copy: its eof, then the agent's.
			st.CloseWrite()
			io.Copy(io.Discard, st)
		}
		return res, err
	}
	event := func(path string) *protocol.AuditEvent {
		return auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{}, func(e *protocol.AuditEvent) bool {
			return e.Subject == protocol.SubjectStream && len(e.Paths) == 1 && e.Paths[0] == path
		})
	}

	pushed := filepath.Join(root, "pushed")
	if res, err := copyOnce(protocol.CopyParams{Direction: protocol.CopyPush, Path: pushed}, src); err != nil || res.FilesWritten != 1 {
		t.Fatalf("push: %v %+v", err, res)
	}
	if ev := event(pushed); ev.Operation != "cp.write" || ev.Result != protocol.AuditOK || ev.ErrorCode != "" {
		t.Errorf("push: event %+v", ev)
	}
	pulled := filepath.Join(t.TempDir(), "pulled")
	if res, err := copyOnce(protocol.CopyParams{Direction: protocol.CopyPull, Path: pushed}, pulled); err != nil || res.FilesWritten != 1 {
		t.Fatalf("pull: %v %+v", err, res)
	}
	if ev := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "cp.read"}, func(*protocol.AuditEvent) bool { return true }); ev.Result != protocol.AuditOK || ev.ErrorCode != "" {
		t.Errorf("pull: event %+v", ev)
	}

	// A partial push: the sender skips a named pipe.
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	partial := filepath.Join(root, "partial")
	if res, err := copyOnce(protocol.CopyParams{Direction: protocol.CopyPush, Path: partial}, src); err != nil || res.Skipped != 1 {
		t.Fatalf("partial push: %v %+v", err, res)
	}
	if ev := event(partial); ev.Result != protocol.AuditFailed || ev.ErrorCode != protocol.ErrCodeCopyPartial {
		t.Errorf("partial push: event %+v", ev)
	}
	// A partial pull: the agent skips it.
	if err := syscall.Mkfifo(filepath.Join(root, "pushed", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err := copyOnce(protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(root, "pushed")}, filepath.Join(t.TempDir(), "pulled2")); err != nil || res.Skipped != 1 {
		t.Fatalf("partial pull: %v %+v", err, res)
	}
	auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "cp.read", Result: protocol.AuditFailed}, func(e *protocol.AuditEvent) bool {
		return e.ErrorCode == protocol.ErrCodeCopyPartial
	})
	// A pushing client cannot claim the copy done: only the receiver's
	// FrameCopyDone counts (the agent answers this one with an error).
	forged := filepath.Join(root, "forged")
	st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindCopy, &protocol.CopyParams{Direction: protocol.CopyPush, Path: forged})
	if err != nil {
		t.Fatal(err)
	}
	protocol.WriteJSONFrame(st, protocol.FrameCopyDone, &protocol.CopyResult{FilesWritten: 1})
	st.CloseWrite()
	io.Copy(io.Discard, st)
	st.Close()
	if ev := event(forged); ev.Result != protocol.AuditFailed || ev.ErrorCode == "" {
		t.Errorf("forged copy-done: event %+v", ev)
	}
	// A copy that failed on its path is failed with the agent's code.
	missing := filepath.Join(root, "missing")
	if _, err := copyOnce(protocol.CopyParams{Direction: protocol.CopyPull, Path: missing}, filepath.Join(t.TempDir(), "x")); err == nil {
		t.Fatal("pulling a missing path succeeded")
	}
	if ev := event(missing); ev.Result != protocol.AuditFailed || ev.ErrorCode == "" {
		t.Errorf("missing pull: event %+v", ev)
	}
}

// What a node's local policy refuses (the agent's forbidden) is refused,
// not failed, with the local policy as its reason: an exec job, an exec
// stream and a copy.
func TestAuditLocalPolicyRefusals(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	allowed := t.TempDir()
	lp, err := localpolicy.Parse("/etc/tether/policy.yaml", []byte(fmt.Sprintf("version: 1\nusers:\n  - uid: %s\ncopy_roots: [%s]\nexec: false\n", me.Uid, allowed)))
	if err != nil {
		t.Fatal(err)
	}
	f, _ := auditFleetOpts(t, fleettest.Options{Agent: func(_ int, c *agent.Config) { c.LocalPolicy = lp }}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: "local-refused", Target: protocol.Target{Node: "node-0"}, Argv: []string{"id"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Results[0].ErrorCode != protocol.CodeForbidden {
		t.Fatalf("exec under exec: false: %+v", res.Results[0])
	}
	checkRefused := func(what string, ev *protocol.AuditEvent) {
		t.Helper()
		if ev.Result != protocol.AuditRefused || ev.Reason != protocol.AuditReasonLocalPolicy || ev.ErrorCode != protocol.CodeForbidden ||
			!strings.Contains(ev.Error, "/etc/tether/policy.yaml") {
			t.Errorf("%s: event %+v", what, ev)
		}
	}
	checkRefused("exec job", auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{JobID: "local-refused"}, func(*protocol.AuditEvent) bool { return true }))

	st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindExec, protocol.ExecParams{Argv: []string{"id"}})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, st)
	st.Close()
	checkRefused("exec stream", auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "exec", Result: protocol.AuditRefused}, func(e *protocol.AuditEvent) bool {
		return e.Subject == protocol.SubjectStream
	}))

	outside := filepath.Join(f.DataDir("node-0"), "outside")
	st, err = f.Client.OpenStream(ctx, "node-0", protocol.KindCopy, &protocol.CopyParams{Direction: protocol.CopyPull, Path: outside})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mirror.Receive(ctx, filepath.Join(t.TempDir(), "x"), st, mirror.Options{}); err == nil {
		t.Fatal("a pull outside the local policy's copy roots succeeded")
	}
	st.Close()
	checkRefused("copy", auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "cp.read"}, func(*protocol.AuditEvent) bool { return true }))

	// tether audit --result refused finds all three.
	resp, err := auditQuery(f.NC, nil, protocol.AuditQueryRequest{Result: protocol.AuditRefused})
	if err != nil || len(resp.Events) != 3 {
		t.Errorf("%v: %d refused events, want 3", err, len(resp.Events))
	}
}

// An exec job's event names the user it ran as: the policy grant's run_as
// (which replaces the request's user), and for a fan-out whose nodes ran
// as different users, each of them (protocol.AuditEvent.RunAs).
func TestAuditExecRunAs(t *testing.T) {
	self := runAsSelf(t)
	other := "nobody"
	if _, err := user.Lookup(other); err != nil || self == other {
		t.Skipf("no second account to run as: %v", err)
	}
	store, _ := writePolicy(t, `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "index=0"
        operations: [exec]
        run_as: `+self+`
      - nodes: "index=1"
        operations: [exec]
        run_as: `+other+`
  nats:root:
    rules:
      - operations: [admin]
`)
	f, _ := auditFleetOpts(t, fleettest.Options{Agents: 2}, func(c *coordinator.Config) { c.Policy = store })
	alice := fleetAs(t, f, "alice")
	if r := execAs(t, alice, protocol.ExecRequest{ID: "as-other", Target: protocol.Target{Node: "node-1"}, Argv: []string{"id"}}); r.err != nil {
		t.Fatalf("exec on node-1: %v", r.err)
	}
	if r := execAs(t, alice, protocol.ExecRequest{ID: "as-both", Target: protocol.Target{All: true}, Argv: []string{"id"}}); r.err != nil {
		t.Fatalf("exec on all: %v", r.err)
	}
	root := fleetAs(t, f, "root")
	one := auditEvents(t, root, nil, protocol.AuditQueryRequest{JobID: "as-other"}, func(*protocol.AuditEvent) bool { return true })
	if one.RunAs != other || one.Rule == "" {
		t.Errorf("exec on node-1: run_as %q rule %q, want %q", one.RunAs, one.Rule, other)
	}
	both := auditEvents(t, root, nil, protocol.AuditQueryRequest{JobID: "as-both"}, func(*protocol.AuditEvent) bool { return true })
	want := []string{self, other}
	slices.Sort(want)
	if both.RunAs != strings.Join(want, ", ") {
		t.Errorf("exec on all: run_as %q, want %q", both.RunAs, strings.Join(want, ", "))
	}
}

// TestAuditEndpointOperations: every endpoint the coordinator serves is
// audited under a named operation, and every such name is a policy
// operation or one of protocol.AuditOtherOperations: the list tether audit
// --operation accepts.
func TestAuditEndpointOperations(t *testing.T) {
	h := newHarness(t, nil)
	m, err := h.coordNC.Request("$SRV.INFO."+protocol.ServiceName, nil, defaultTestTimeout)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatal(err)
	}
	ops := coordinator.EndpointOps()
	for _, e := range info.Endpoints {
		if _, ok := ops[e.Subject]; !ok {
			t.Errorf("endpoint %s (%s) has no audit operation", e.Name, e.Subject)
		}
	}
	for subject, op := range ops {
		if _, err := policy.ParseOperation(op); err != nil && !slices.Contains(protocol.AuditOtherOperations(), op) {
			t.Errorf("%s is audited as %q: neither a policy operation nor in protocol.AuditOtherOperations", subject, op)
		}
	}
}

// TestAuditCopyPathNotUTF8: a copy path that is not UTF-8 is recorded
// with its bytes, quoted as protocol.AuditPath quotes (it was recorded
// with U+FFFD for each such byte, so the audit could not tell which file
// was touched: /srv/caf\xe9 and /srv/caf\xe8 were the same path there).
func TestAuditCopyPathNotUTF8(t *testing.T) {
	f, _ := auditFleet(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(f.DataDir("node-0"), "caf\xe9")
	st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindCopy, &protocol.CopyParams{Direction: protocol.CopyPush, Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mirror.Send(ctx, src, st, mirror.Options{}); err != nil {
		t.Fatal(err)
	}
	st.CloseWrite()
	io.Copy(io.Discard, st)
	st.Close()
	want := strconv.Quote(path)
	ev := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{Operation: "cp.write"}, func(*protocol.AuditEvent) bool { return true })
	if len(ev.Paths) != 1 || ev.Paths[0] != want {
		t.Errorf("paths = %q, want [%s]", ev.Paths, want)
	}
}
