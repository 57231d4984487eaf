package openshell_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osh "github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
)

// nodeOf returns the node whose gateway holds sandbox sb (its workspace,
// name and id), or "". The id decides: names are unique per gateway only,
// and the fake gateways draw generated names from 400 pet names, so another
// gateway may hold a sandbox of the same name (a name alone picked the
// gateway in map order: TestPlacement failed 13 runs in 1500).
func (e *env) nodeOf(sb *osh.Sandbox) string {
	md := sb.GetMetadata()
	for id, gw := range e.gws {
		if got, ok := gw.Sandbox(md.GetWorkspace(), md.GetName()); ok && got.GetMetadata().GetId() == md.GetId() {
			return id
		}
	}
	return ""
}

// TestCreateRetryAfterAmbiguousFailure replays NeMo Gym's recovery
// (wire-facts §1.5, OS-3): the gateway creates the sandbox but the answer is
// lost (UNAVAILABLE); the retry with the same name must reach the same
// gateway even though the load now points elsewhere, get ALREADY_EXISTS,
// and the GetSandbox that follows adopts the very sandbox the first attempt
// made, which the ledger then records as the facade's.
func TestCreateRetryAfterAmbiguousFailure(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}})
	ctx := testCtx(t, facade.MetaRun, "run-7")
	// Ties go to node-a; its first create commits and then fails.
	e.gws["node-a"].Inject(osh.MethodCreateSandbox, openshelltest.Fault{Err: status.Error(codes.Unavailable, "connection reset"), AfterCommit: true})
	req := &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-0123456789abcdef", Labels: map[string]string{"nemo-gym.sandbox": "1"}}
	_, err := e.create(ctx, req)
	wantCode(t, "first create", err, codes.Unavailable, "connection reset")
	made, ok := e.gws["node-a"].Sandbox("", req.Name)
	if !ok {
		t.Fatal("the first create did not commit on node-a")
	}
	// node-a is now the busiest node: least-loaded placement would pick node-b.
	for i := range 5 {
		e.ledger.seed(ledger.Record{Provider: protocol.ProviderOpenShell, Node: "node-a", ID: fmt.Sprintf("busy-%d", i), Name: fmt.Sprintf("busy-%d", i), Workspace: "default"})
	}
	_, err = e.create(ctx, req)
	wantCode(t, "retry", err, codes.AlreadyExists, "already exists")
	if n := e.gws["node-b"].Calls(osh.MethodCreateSandbox); n != 0 {
		t.Fatalf("node-b got %d creates; the retry must go where the first attempt landed", n)
	}
	sb, err := e.get(ctx, "default", req.Name)
	if err != nil {
		t.Fatal(err)
	}
	if sb.GetMetadata().GetId() != made.GetMetadata().GetId() {
		t.Fatalf("adopted %s, the first attempt made %s", sb.GetMetadata().GetId(), made.GetMetadata().GetId())
	}
	r, ok := e.ledger.record(made.GetMetadata().GetId())
	if !ok || r.Node != "node-a" || !r.Managed || r.Owner != "run-7" || r.State != ledger.StateLive {
		t.Fatalf("ledger after adoption: %+v, %v", r, ok)
	}
	if got := e.gws["node-a"].Creates("", req.Name) + e.gws["node-b"].Creates("", req.Name); got != 1 {
		t.Fatalf("%d sandboxes made under the name, want 1", got)
	}
}

// TestPlacement covers the ways CreateSandbox picks a node.
func TestPlacement(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{}})
	e.addGateway("node-a", openshelltest.Options{}, map[string]string{"gpu": "h100"})
	e.addGateway("node-b", openshelltest.Options{}, map[string]string{"gpu": "a100"})
	e.addGateway("node-c", openshelltest.Options{}, map[string]string{"gpu": "a100"})
	create := func(t *testing.T, labels map[string]string, kv ...string) (string, error) {
		t.Helper()
		sb, err := e.create(testCtx(t, kv...), &osh.CreateSandboxRequest{Spec: spec(), Labels: labels})
		if err != nil {
			return "", err
		}
		if !cmp.Equal(sb.GetMetadata().GetLabels(), labels, cmp.Comparer(func(a, b map[string]string) bool { return maps.Equal(a, b) })) {
			t.Errorf("labels %v came back as %v: they must pass verbatim", labels, sb.GetMetadata().GetLabels())
		}
		return e.nodeOf(sb), nil
	}

	t.Run("label", func(t *testing.T) {
		for range 2 {
			if node, err := create(t, map[string]string{facade.LabelNode: "node-c", "team": "a"}); err != nil || node != "node-c" {
				t.Fatalf("placed on %q, %v", node, err)
			}
		}
		_, err := create(t, map[string]string{facade.LabelNode: "node-z"})
		wantCode(t, "unknown node label", err, codes.FailedPrecondition, "tether.node=node-z")
	})
	t.Run("metadata node", func(t *testing.T) {
		if node, err := create(t, nil, facade.MetaNode, "node-c"); err != nil || node != "node-c" {
			t.Fatalf("placed on %q, %v", node, err)
		}
	})
	t.Run("least loaded", func(t *testing.T) {
		// node-c holds 3 now; node-a and node-b none: node-a wins the tie by
		// id, unless it runs more execs.
		e.fleet.setExecs("node-a", 2)
		if node, err := create(t, nil); err != nil || node != "node-b" {
			t.Fatalf("placed on %q, %v; want node-b (tie with node-a, fewer execs)", node, err)
		}
		e.fleet.setExecs("node-a", 0)
		if node, err := create(t, nil); err != nil || node != "node-a" {
			t.Fatalf("placed on %q, %v; want node-a", node, err)
		}
	})
	t.Run("selector", func(t *testing.T) {
		// a100: node-b (1) and node-c (3).
		if node, err := create(t, nil, facade.MetaNodeSelector, "gpu=a100"); err != nil || node != "node-b" {
			t.Fatalf("placed on %q, %v", node, err)
		}
		_, err := create(t, nil, facade.MetaNodeSelector, "gpu=b200")
		wantCode(t, "no match", err, codes.FailedPrecondition, "gpu=b200")
		_, err = create(t, nil, facade.MetaNodeSelector, "gpu in (")
		wantCode(t, "bad selector", err, codes.InvalidArgument, facade.MetaNodeSelector)
	})
	t.Run("ttl", func(t *testing.T) {
		for v, want := range map[string]time.Duration{"": time.Hour, "120": 2 * time.Minute, "1h30m": 90 * time.Minute, "0": 0} {
			kv := []string{}
			if v != "" {
				kv = []string{facade.MetaTTL, v}
			}
			sb, err := e.create(testCtx(t, kv...), &osh.CreateSandboxRequest{Spec: spec()})
			if err != nil {
				t.Fatal(err)
			}
			if r, _ := e.ledger.record(sb.GetMetadata().GetId()); r.TTL != want {
				t.Errorf("tether-ttl %q: TTL %v, want %v", v, r.TTL, want)
			}
		}
		_, err := create(t, nil, facade.MetaTTL, "soon")
		wantCode(t, "bad ttl", err, codes.InvalidArgument, facade.MetaTTL)
	})
	t.Run("no gateway", func(t *testing.T) {
		for _, id := range []string{"node-a", "node-b", "node-c"} {
			e.fleet.remove(id)
		}
		_, err := create(t, nil)
		wantCode(t, "no nodes", err, codes.Unavailable, "no connected node has an openshell gateway")
	})
}

// TestRoutingByName finds sandboxes the facade never saw (made directly on
// a gateway) and follows a stale hint to where the sandbox really is.
func TestRoutingByName(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b", "node-c"}})
	ctx := testCtx(t)
	made, err := e.gws["node-b"].Create(&osh.CreateSandboxRequest{Spec: spec(), Name: "direct"})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := e.get(ctx, "", "direct")
	if err != nil || sb.GetMetadata().GetId() != made.GetMetadata().GetId() {
		t.Fatalf("get: %v, %v", sb, err)
	}
	if _, err := unary[osh.SandboxResponse](ctx, e.cc, osh.MethodStopSandbox, &osh.StopSandboxRequest{Name: "direct"}); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if got, _ := e.gws["node-b"].Sandbox("", "direct"); got.GetStatus().GetPhase() != osh.SandboxPhase_SANDBOX_PHASE_STOPPED {
		t.Fatalf("phase after stop: %v", got.GetStatus().GetPhase())
	}
	if _, err := unary[osh.SandboxResponse](ctx, e.cc, osh.MethodStartSandbox, &osh.StartSandboxRequest{Name: "direct"}); err != nil {
		t.Fatalf("start: %v", err)
	}

	// tether-node overrides the routing: node-a's gateway answers for itself.
	_, err = e.get(metadataCtx(ctx, facade.MetaNode, "node-a"), "", "direct")
	wantCode(t, "get on node-a", err, codes.NotFound, "sandbox not found")

	// A stale hint: the ledger says node-a, the sandbox is on node-c.
	moved, err := e.gws["node-c"].Create(&osh.CreateSandboxRequest{Spec: spec(), Name: "moved"})
	if err != nil {
		t.Fatal(err)
	}
	e.ledger.seed(ledger.Record{Provider: protocol.ProviderOpenShell, Node: "node-a", ID: "old-id", Workspace: "default", Name: "moved"})
	if sb, err := e.get(ctx, "", "moved"); err != nil || sb.GetMetadata().GetId() != moved.GetMetadata().GetId() {
		t.Fatalf("get with a stale hint: %v, %v", sb, err)
	}
	if deleted, err := e.del(ctx, "", "moved"); err != nil || !deleted {
		t.Fatalf("delete with a stale hint: %v, %v", deleted, err)
	}
	if r, _ := e.ledger.record("old-id"); r.State != ledger.StateDeleted {
		t.Errorf("stale record state %q: node-a said NOT_FOUND, so it is gone there", r.State)
	}

	// Not found where nodes answered, and one node could not be asked: the
	// sandbox may be there, so no NOT_FOUND.
	e.gws["node-a"].Inject(osh.MethodGetSandbox, openshelltest.Fault{Err: status.Error(codes.Unavailable, "relay down")})
	_, err = e.del(ctx, "", "nowhere")
	wantCode(t, "delete with a node down", err, codes.Unavailable, "node node-a")
	if n := e.gws["node-b"].Calls(osh.MethodDeleteSandbox) + e.gws["node-c"].Calls(osh.MethodDeleteSandbox); n != 1 {
		t.Errorf("%d deletes reached gateways, want 1 (the stale-hint one)", n)
	}

	// The ledger names a node that is not connected.
	e.ledger.seed(ledger.Record{Provider: protocol.ProviderOpenShell, Node: "node-gone", ID: "gone-id", Workspace: "default", Name: "offline"})
	_, err = e.get(ctx, "", "offline")
	wantCode(t, "get on a disconnected node", err, codes.Unavailable, "node-gone")

	// Empty name: every gateway refuses it the same way.
	_, err = e.get(ctx, "", "")
	wantCode(t, "empty name", err, codes.InvalidArgument, "name is required")

}

func metadataCtx(ctx context.Context, kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// TestRoutingByID runs execs on sandboxes the facade did not create: found
// by listing every gateway once, then by the index.
func TestRoutingByID(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}, noLedger: true, gw: openshelltest.Options{
		Exec: func(_ context.Context, x *openshelltest.Exec) (int32, error) {
			fmt.Fprintf(x.Stdout, "on %s", x.Sandbox.GetMetadata().GetName())
			return 3, nil
		},
	}})
	ctx := testCtx(t)
	e.gws["node-a"].AddWorkspace("w")
	e.gws["node-b"].AddWorkspace("w")
	made, err := e.gws["node-b"].Create(&osh.CreateSandboxRequest{Spec: spec(), Name: "x", Workspace: "w"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		evs, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: made.GetMetadata().GetId(), Command: []string{"true"}})
		r := summarize(evs)
		if err != nil || r.stdout != "on x" || r.exits != 1 || r.code != 3 {
			t.Fatalf("exec: %+v, %v", r, err)
		}
	}
	if n := e.gws["node-b"].Calls(osh.MethodListSandboxes); n != 1 {
		t.Errorf("node-b was listed %d times, want 1 (then the index knows)", n)
	}
	if n := e.gws["node-a"].Calls(osh.MethodExecSandbox); n != 0 {
		t.Errorf("node-a got %d execs", n)
	}

	// Watch is routed the same way.
	cs, err := e.cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, osh.MethodWatchSandbox)
	if err != nil {
		t.Fatal(err)
	}
	cs.SendMsg(&osh.WatchSandboxRequest{Id: made.GetMetadata().GetId(), FollowStatus: true, StopOnTerminal: true})
	cs.CloseSend()
	var ev osh.SandboxStreamEvent
	if err := cs.RecvMsg(&ev); err != nil || ev.GetSandbox().GetMetadata().GetId() != made.GetMetadata().GetId() {
		t.Fatalf("watch: %v, %v", &ev, err)
	}
	for cs.RecvMsg(&ev) == nil {
	}
}

// TestExecEndsWithOneExitOrAnError checks that exec output streams through
// as it comes, ends with exactly one exit event, and that a gateway that
// goes away mid-stream ends the caller's stream with an error, never OK.
func TestExecEndsWithOneExitOrAnError(t *testing.T) {
	started := make(chan struct{}, 1)
	e := newEnv(t, envConfig{gw: openshelltest.Options{
		Exec: func(ctx context.Context, x *openshelltest.Exec) (int32, error) {
			for i := range 50 {
				fmt.Fprintf(x.Stdout, "line %d\n", i)
			}
			x.Stderr.Write([]byte("warn\n"))
			if slices.Contains(x.Request.GetCommand(), "hang") {
				started <- struct{}{}
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 7, nil
		},
	}})
	ctx := testCtx(t)
	sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-exit"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetMetadata().GetId()
	evs, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"run"}})
	r := summarize(evs)
	if err != nil || r.exits != 1 || r.code != 7 || r.afterExit || !strings.HasPrefix(r.stdout, "line 0\n") || r.stderr != "warn\n" {
		t.Fatalf("exec: %+v, %v", r, err)
	}
	if _, ok := evs[len(evs)-1].GetPayload().(*osh.ExecSandboxEvent_Exit); !ok {
		t.Fatal("the last event is not the exit")
	}

	done := make(chan error, 1)
	go func() {
		evs, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"hang"}})
		if r := summarize(evs); r.exits != 0 {
			err = errors.Join(err, fmt.Errorf("%d exit events", r.exits))
		}
		done <- err
	}()
	<-started
	e.gws["node-a"].Restart()
	err = <-done
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("exec cut by a gateway restart ended with %v, want UNAVAILABLE", err)
	}
}

// TestInteractiveExec relays the bidi ExecSandboxInteractive stream and
// refuses an input over the gateway's message limit.
func TestInteractiveExec(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}, gw: openshelltest.Options{
		Exec: func(ctx context.Context, x *openshelltest.Exec) (int32, error) {
			n, err := io.Copy(x.Stdout, x.Stdin)
			if err != nil {
				return 0, status.Error(codes.Aborted, err.Error())
			}
			fmt.Fprintf(x.Stderr, "%d bytes", n)
			return 0, nil
		},
	}})
	ctx := testCtx(t)
	sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-tty"})
	if err != nil {
		t.Fatal(err)
	}
	open := func() grpc.ClientStream {
		cs, err := e.cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, osh.MethodExecSandboxInteractive)
		if err != nil {
			t.Fatal(err)
		}
		start := &osh.ExecSandboxInput{Payload: &osh.ExecSandboxInput_Start{Start: &osh.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"cat"}}}}
		if err := cs.SendMsg(start); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	recvAll := func(cs grpc.ClientStream) ([]*osh.ExecSandboxEvent, error) {
		var evs []*osh.ExecSandboxEvent
		for {
			ev := new(osh.ExecSandboxEvent)
			if err := cs.RecvMsg(ev); err != nil {
				if errors.Is(err, io.EOF) {
					return evs, nil
				}
				return evs, err
			}
			evs = append(evs, ev)
		}
	}

	cs := open()
	for _, s := range []string{"hello ", "world"} {
		cs.SendMsg(&osh.ExecSandboxInput{Payload: &osh.ExecSandboxInput_Stdin{Stdin: []byte(s)}})
	}
	cs.SendMsg(&osh.ExecSandboxInput{Payload: &osh.ExecSandboxInput_Resize{Resize: &osh.ExecSandboxWindowResize{Cols: 80, Rows: 24}}})
	cs.CloseSend()
	evs, err := recvAll(cs)
	r := summarize(evs)
	if err != nil || r.stdout != "hello world" || r.stderr != "11 bytes" || r.exits != 1 {
		t.Fatalf("interactive: %+v, %v", r, err)
	}

	cs = open()
	cs.SendMsg(&osh.ExecSandboxInput{Payload: &osh.ExecSandboxInput_Stdin{Stdin: make([]byte, osh.MaxMessageSize+1)}})
	_, err = recvAll(cs)
	wantCode(t, "oversized stdin", err, codes.ResourceExhausted, "limit of 1048576 bytes")
}

// TestListMergesAndPages pages through two nodes' sandboxes: every sandbox
// once, in one deterministic order, whatever order each gateway lists in.
func TestListMergesAndPages(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}})
	ctx := testCtx(t)
	var want []string
	for i := range 1250 {
		gw := e.gws[[]string{"node-a", "node-b"}[i%3%2]]
		name := fmt.Sprintf("s-%04d", (i*7919)%10000) // names out of creation order
		if _, err := gw.Create(&osh.CreateSandboxRequest{Spec: spec(), Name: name, Labels: map[string]string{"nemo-gym.sandbox": "1"}}); err != nil {
			t.Fatal(err)
		}
		want = append(want, name)
	}
	// Something the selector excludes.
	e.gws["node-b"].Create(&osh.CreateSandboxRequest{Spec: spec(), Name: "other"})

	var all []*osh.Sandbox
	for offset := uint32(0); ; offset += 300 {
		page, err := e.list(ctx, &osh.ListSandboxesRequest{Limit: 300, Offset: offset, LabelSelector: "nemo-gym.sandbox=1"})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < 300 {
			break
		}
	}
	var got []string
	for i, sb := range all {
		got = append(got, sb.GetMetadata().GetName())
		if i > 0 {
			a, b := all[i-1].GetMetadata(), sb.GetMetadata()
			if a.GetCreatedAtMs() > b.GetCreatedAtMs() || a.GetCreatedAtMs() == b.GetCreatedAtMs() && a.GetName() >= b.GetName() {
				t.Fatalf("rows %d and %d out of order: %v then %v", i-1, i, a, b)
			}
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("paged list (-want +got):\n%s", d)
	}

	t.Run("workspace on one node", func(t *testing.T) {
		e.gws["node-b"].AddWorkspace("team")
		e.gws["node-b"].Create(&osh.CreateSandboxRequest{Spec: spec(), Name: "t1", Workspace: "team"})
		got, err := e.list(ctx, &osh.ListSandboxesRequest{Workspace: "team"})
		if err != nil || len(got) != 1 || got[0].GetMetadata().GetName() != "t1" {
			t.Fatalf("list team: %v, %v", got, err)
		}
		_, err = e.list(ctx, &osh.ListSandboxesRequest{Workspace: "nobody"})
		wantCode(t, "workspace on no node", err, codes.NotFound, "workspace 'nobody' not found")
	})
	t.Run("node fails", func(t *testing.T) {
		e.gws["node-b"].Inject(osh.MethodListSandboxes, openshelltest.Fault{Err: status.Error(codes.Internal, "db down")})
		_, err := e.list(ctx, &osh.ListSandboxesRequest{})
		wantCode(t, "list", err, codes.Unavailable, "node node-b")
	})
	t.Run("holder disconnected", func(t *testing.T) {
		e.ledger.seed(ledger.Record{Provider: protocol.ProviderOpenShell, Node: "node-z", ID: "z1"})
		_, err := e.list(ctx, &osh.ListSandboxesRequest{})
		wantCode(t, "list", err, codes.Unavailable, "node-z")
	})
}

// TestHealth answers from the first node that can.
func TestHealth(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}, gw: openshelltest.Options{Version: "v9"}})
	e.gws["node-a"].Inject(osh.MethodHealth, openshelltest.Fault{Err: status.Error(codes.Unavailable, "restarting")})
	h, err := unary[osh.HealthResponse](testCtx(t), e.cc, osh.MethodHealth, &osh.HealthRequest{})
	if err != nil || h.GetVersion() != "v9" || h.GetStatus() != osh.ServiceStatus_SERVICE_STATUS_HEALTHY {
		t.Fatalf("health: %v, %v", h, err)
	}
	e.fleet.remove("node-a")
	e.fleet.remove("node-b")
	_, err = unary[osh.HealthResponse](testCtx(t), e.cc, osh.MethodHealth, &osh.HealthRequest{})
	wantCode(t, "health without nodes", err, codes.Unavailable, "no connected node")
}

// TestLedgerFailureKeepsTheCreate: the caller's create succeeds when the
// ledger write fails; the failure is counted.
func TestLedgerFailureKeepsTheCreate(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.ledger.failWith = errors.New("kv unavailable")
	sb, err := e.create(testCtx(t), &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-kv"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	want := `
# HELP tether_openshell_facade_ledger_errors_total Ledger writes that failed after a gateway answered (the caller's call still succeeds; inventory repairs the record), by operation.
# TYPE tether_openshell_facade_ledger_errors_total counter
tether_openshell_facade_ledger_errors_total{op="created"} 1
tether_openshell_facade_ledger_errors_total{op="deleted"} 0
tether_openshell_facade_ledger_errors_total{op="deleting"} 0
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), "tether_openshell_facade_ledger_errors_total"); err != nil {
		t.Fatal(err)
	}
	// The index still routes the exec.
	evs, err := execStream(testCtx(t), e.cc, &osh.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"/bin/sh", "-c", "exit 4"}})
	if r := summarize(evs); err != nil || r.code != 4 || r.exits != 1 {
		t.Fatalf("exec: %+v, %v", r, err)
	}
	if n := e.gws["node-a"].Calls(osh.MethodListSandboxes); n != 0 {
		t.Errorf("the exec needed %d lists; the index knew the id", n)
	}
}

// TestTooBig refuses a message the gateway would refuse, before sending it.
func TestTooBig(t *testing.T) {
	e := newEnv(t, envConfig{})
	_, err := e.create(testCtx(t), &osh.CreateSandboxRequest{Spec: spec(), Annotations: map[string]string{"big": strings.Repeat("x", osh.MaxMessageSize)}})
	wantCode(t, "create", err, codes.ResourceExhausted, "over the OpenShell gateway's limit of 1048576 bytes")
	if n := e.gws["node-a"].Calls(osh.MethodCreateSandbox); n != 0 {
		t.Fatalf("the gateway got %d creates", n)
	}
}

// TestConnPerSession: one connection per node and tunnel session.
func TestConnPerSession(t *testing.T) {
	e := newEnv(t, envConfig{})
	ctx := testCtx(t)
	for range 5 {
		if _, err := e.list(ctx, &osh.ListSandboxesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.fleet.dialCount("node-a"); n != 1 {
		t.Fatalf("%d dials for 5 calls, want 1", n)
	}
	e.fleet.reconnect("node-a")
	if _, err := e.list(ctx, &osh.ListSandboxesRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := e.fleet.dialCount("node-a"); n != 2 {
		t.Fatalf("%d dials after a new session, want 2", n)
	}
	e.fleet.remove("node-a")
	_, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Labels: map[string]string{facade.LabelNode: "node-a"}})
	wantCode(t, "create on a gone node", err, codes.FailedPrecondition, "node-a")
}

// TestWithoutLedger: with no ledger, creates, name and id routes and
// deletes work from the facade's own index.
func TestWithoutLedger(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}, noLedger: true})
	ctx := testCtx(t)
	sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-free"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if deleted, err := e.del(ctx, "", "ng-free"); err != nil || !deleted {
		t.Fatalf("delete: %v, %v", deleted, err)
	}
	calls := 0
	for _, gw := range e.gws {
		calls += gw.Calls(osh.MethodGetSandbox) + gw.Calls(osh.MethodListSandboxes)
	}
	if calls != 0 {
		t.Errorf("%d lookups on gateways; the index knew", calls)
	}
}

// echo is a gRPC backend standing in for a gateway with methods the facade
// does not know, recording the metadata it receives.
type echo struct {
	mu   sync.Mutex
	md   []metadata.MD
	addr string
}

func startEcho(t *testing.T) *echo {
	e := &echo{}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		e.mu.Lock()
		e.md = append(e.md, md)
		e.mu.Unlock()
		method, _ := grpc.MethodFromServerStream(ss)
		switch {
		case strings.HasSuffix(method, "/Fail"):
			st, _ := status.New(codes.Aborted, "name changed during delete").WithDetails(wrapperspb.String("detail"))
			return st.Err() // trailers-only
		case strings.HasSuffix(method, "/Sum"): // client streaming
			var sum []string
			for {
				var in wrapperspb.StringValue
				if err := ss.RecvMsg(&in); err != nil {
					if errors.Is(err, io.EOF) {
						break
					}
					return err
				}
				sum = append(sum, in.GetValue())
			}
			return ss.SendMsg(wrapperspb.String(strings.Join(sum, "+")))
		}
		// Echo (bidi): header, every message back, trailer, a status with details.
		ss.SendHeader(metadata.Pairs("x-hdr", "h1", "x-raw-bin", "\x00\x01"))
		for {
			var in wrapperspb.StringValue
			if err := ss.RecvMsg(&in); err != nil {
				if !errors.Is(err, io.EOF) {
					return err
				}
				break
			}
			if err := ss.SendMsg(wrapperspb.String("echo " + in.GetValue())); err != nil {
				return err
			}
		}
		ss.SetTrailer(metadata.Pairs("x-trl", "t1"))
		st, _ := status.New(codes.OutOfRange, "done").WithDetails(wrapperspb.String("why"))
		return st.Err()
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return e
}

// TestRelayVerbatim relays methods the facade does not know, of every
// stream kind, with metadata, headers, trailers and statuses verbatim.
func TestRelayVerbatim(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{}})
	be := startEcho(t)
	e.fleet.add("node-a", be.addr, nil)
	const svc = "/openshell.v1.OpenShell/"
	ctx := testCtx(t, "authorization", "Bearer gw-token", "x-custom", "v", "x-thing-bin", "\x00\xff",
		facade.MetaToken, "secret", facade.MetaRun, "r1")

	// Bidi, with header and trailer metadata and a status with details.
	cs, err := e.cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, svc+"Echo")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a", "b"} {
		cs.SendMsg(wrapperspb.String(s))
	}
	cs.CloseSend()
	var got []string
	var err2 error
	for {
		var out wrapperspb.StringValue
		if err2 = cs.RecvMsg(&out); err2 != nil {
			break
		}
		got = append(got, out.GetValue())
	}
	hdr, _ := cs.Header()
	st := status.Convert(err2)
	if !slices.Equal(got, []string{"echo a", "echo b"}) || st.Code() != codes.OutOfRange || st.Message() != "done" ||
		len(st.Details()) != 1 || !proto.Equal(st.Details()[0].(proto.Message), wrapperspb.String("why")) {
		t.Fatalf("echo: %v, %v %v", got, st, st.Details())
	}
	if !slices.Equal(hdr.Get("x-hdr"), []string{"h1"}) || !slices.Equal(hdr.Get("x-raw-bin"), []string{"\x00\x01"}) ||
		!slices.Equal(cs.Trailer().Get("x-trl"), []string{"t1"}) {
		t.Fatalf("header %v, trailer %v", hdr, cs.Trailer())
	}
	be.mu.Lock()
	md := be.md[0]
	be.mu.Unlock()
	if !slices.Equal(md.Get("authorization"), []string{"Bearer gw-token"}) || !slices.Equal(md.Get("x-custom"), []string{"v"}) ||
		!slices.Equal(md.Get("x-thing-bin"), []string{"\x00\xff"}) {
		t.Fatalf("metadata at the gateway: %v", md)
	}
	for k := range md {
		if strings.HasPrefix(k, "tether-") {
			t.Fatalf("%s reached the gateway", k)
		}
	}

	// Client streaming.
	cs, err = e.cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, svc+"Sum")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"1", "2", "3"} {
		cs.SendMsg(wrapperspb.String(s))
	}
	cs.CloseSend()
	var sum wrapperspb.StringValue
	if err := cs.RecvMsg(&sum); err != nil || sum.GetValue() != "1+2+3" {
		t.Fatalf("sum: %v, %v", sum.GetValue(), err)
	}

	// Unary, trailers-only error with details.
	var out wrapperspb.StringValue
	var header metadata.MD
	err = e.cc.Invoke(ctx, svc+"Fail", wrapperspb.String("x"), &out, grpc.Header(&header))
	st = status.Convert(err)
	if st.Code() != codes.Aborted || st.Message() != "name changed during delete" || len(st.Details()) != 1 || len(header) != 0 {
		t.Fatalf("fail: %v %v, header %v", st, st.Details(), header)
	}

	// Another service is not the facade's.
	err = e.cc.Invoke(ctx, "/other.v1.Svc/M", wrapperspb.String("x"), &out)
	wantCode(t, "other service", err, codes.Unimplemented, "unknown service other.v1.Svc")

	// With two nodes the facade needs to be told which.
	e.fleet.add("node-b", be.addr, nil)
	err = e.cc.Invoke(ctx, svc+"Sum", wrapperspb.String("x"), &out)
	wantCode(t, "two nodes", err, codes.FailedPrecondition, facade.MetaNode)
	if err := e.cc.Invoke(metadata.AppendToOutgoingContext(ctx, facade.MetaNode, "node-b"), svc+"Sum", wrapperspb.String("x"), &out); err != nil || out.GetValue() != "x" {
		t.Fatalf("with tether-node: %v, %v", out.GetValue(), err)
	}
}

// TestConcurrentCreatesSpread: creates in flight count as load, so a burst
// spreads over the nodes before the ledger knows any of them.
func TestConcurrentCreatesSpread(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}})
	for _, gw := range e.gws {
		gw.Inject(osh.MethodCreateSandbox, openshelltest.Fault{AfterCommit: true, Delay: 300 * time.Millisecond, Times: 20})
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			_, err := e.create(testCtx(t), &osh.CreateSandboxRequest{Spec: spec()})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	a, b := len(e.gws["node-a"].Sandboxes("")), len(e.gws["node-b"].Sandboxes(""))
	if a != 10 || b != 10 {
		t.Fatalf("burst of 20 placed %d on node-a, %d on node-b; want 10 and 10", a, b)
	}
}
