package openshell_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osh "github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// wantCode checks err's status code and, if msg is not "", that its
// message contains msg.
func wantCode(t testing.TB, what string, err error, code codes.Code, msg string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("%s: got %v %q, want %v containing %q", what, st.Code(), st.Message(), code, msg)
	}
}

// spec is the spec NeMo Gym always sends (environment, possibly empty).
func spec() *osh.SandboxSpec { return &osh.SandboxSpec{Environment: map[string]string{}} }

// TestVectorsThroughFacade replays wire-facts §5.1 (OS-1..OS-17, OS-20)
// through the facade against fake gateways on two nodes.
func TestVectorsThroughFacade(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}})

	t.Run("OS-1 create with defaults", func(t *testing.T) {
		ctx := testCtx(t, facade.MetaRun, "run-1", facade.MetaTTL, "90m")
		sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Labels: map[string]string{}})
		if err != nil {
			t.Fatal(err)
		}
		m := sb.GetMetadata()
		if m.GetWorkspace() != "default" || osh.ValidateName(m.GetName()) != nil || !uuidV4.MatchString(m.GetId()) {
			t.Errorf("metadata = %v", m)
		}
		if sb.GetStatus().GetPhase() != osh.SandboxPhase_SANDBOX_PHASE_PROVISIONING {
			t.Errorf("phase = %v", sb.GetStatus().GetPhase())
		}
		if d := cmp.Diff([]string{"/bin/bash", "-l"}, sb.GetSpec().GetCommand()); d != "" || !sb.GetSpec().GetTty() {
			t.Errorf("command/tty: %s %v", d, sb.GetSpec().GetTty())
		}
		if sb.GetSpec().GetTemplate().GetImage() != openshelltest.DefaultImage {
			t.Errorf("image = %q", sb.GetSpec().GetTemplate().GetImage())
		}
		r, ok := e.ledger.record(m.GetId())
		if !ok {
			t.Fatal("create not recorded in the ledger")
		}
		want := ledger.Record{Provider: protocol.ProviderOpenShell, Node: r.Node, Workspace: "default", Name: m.GetName(), ID: m.GetId(),
			Managed: true, Owner: "run-1", TTL: 90 * time.Minute, State: ledger.StateLive, Source: ledger.SourceFacade}
		got := r
		got.Labels, got.CreatedAt, got.LastSeen = nil, time.Time{}, time.Time{}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("ledger record (-want +got):\n%s", d)
		}
		if r.CreatedAt.UnixMilli() != m.GetCreatedAtMs() {
			t.Errorf("CreatedAt %v, created_at_ms %d", r.CreatedAt, m.GetCreatedAtMs())
		}
	})

	t.Run("OS-2 41-char name", func(t *testing.T) {
		_, err := e.create(testCtx(t), &osh.CreateSandboxRequest{Spec: spec(), Name: "nemo-gym-0123456789abcdef0123456789abcdef"})
		wantCode(t, "create", err, codes.InvalidArgument, "name exceeds maximum length (41 > 19)")
	})

	t.Run("OS-3 same name twice", func(t *testing.T) {
		ctx := testCtx(t)
		req := &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-0123456789abcdef", Labels: map[string]string{"nemo-gym.sandbox": "1"}}
		sb, err := e.create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		// However the load shifts, the second create meets the first.
		for range 3 {
			_, err = e.create(ctx, req)
			wantCode(t, "second create", err, codes.AlreadyExists, "sandbox 'ng-0123456789abcdef' already exists")
		}
		got, err := e.get(ctx, "default", req.Name)
		if err != nil || got.GetMetadata().GetId() != sb.GetMetadata().GetId() {
			t.Fatalf("get after ALREADY_EXISTS: %v, %v", got, err)
		}
	})

	t.Run("OS-4 invalid names", func(t *testing.T) {
		for _, name := range []string{"Ng-1", "ng--1", "-ng1"} {
			_, err := e.create(testCtx(t), &osh.CreateSandboxRequest{Spec: spec(), Name: name})
			wantCode(t, name, err, codes.InvalidArgument, "")
		}
	})

	t.Run("OS-5 labels", func(t *testing.T) {
		for _, tc := range []struct {
			labels map[string]string
			code   codes.Code
		}{
			{map[string]string{"sandbox-api": "openshell-grpc", "nemo-gym.sandbox": "1"}, codes.OK},
			{map[string]string{"workload": "configs/x.yaml"}, codes.InvalidArgument},
			{map[string]string{"Team/x": "a"}, codes.InvalidArgument},
			{map[string]string{"team": ""}, codes.OK},
		} {
			sb, err := e.create(testCtx(t), &osh.CreateSandboxRequest{Spec: spec(), Labels: tc.labels})
			wantCode(t, fmt.Sprint(tc.labels), err, tc.code, "")
			if err == nil && !cmp.Equal(sb.GetMetadata().GetLabels(), tc.labels) {
				t.Errorf("labels %v came back as %v", tc.labels, sb.GetMetadata().GetLabels())
			}
		}
	})

	t.Run("OS-6 selector trimmed", func(t *testing.T) {
		ctx := testCtx(t)
		want := map[string]bool{}
		for i, labels := range []map[string]string{
			{"nemo-gym.sandbox": "1", "team": "a"},
			{"nemo-gym.sandbox": "1", "team": "b"},
			{"team": "a"},
			{"nemo-gym.sandbox": "1", "team": "a", "x": "y"},
		} {
			labels["os6"] = "1"
			sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Labels: labels})
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 || i == 3 {
				// By id: generated names may repeat across gateways.
				want[sb.GetMetadata().GetId()] = true
			}
		}
		got, err := e.list(ctx, &osh.ListSandboxesRequest{LabelSelector: "nemo-gym.sandbox=1, team = a , os6=1,"})
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, sb := range got {
			ids[sb.GetMetadata().GetId()] = true
		}
		if d := cmp.Diff(want, ids); d != "" {
			t.Errorf("listed (-want +got):\n%s", d)
		}
	})

	t.Run("OS-7 invalid selectors", func(t *testing.T) {
		pairs := make([]string, 65)
		for i := range pairs {
			pairs[i] = fmt.Sprintf("k%d=v", i)
		}
		for _, sel := range []string{"team", "=a", "a==b", "a!=b", strings.Join(pairs, ",")} {
			_, err := e.list(testCtx(t), &osh.ListSandboxesRequest{LabelSelector: sel})
			wantCode(t, sel, err, codes.InvalidArgument, "")
		}
	})

	t.Run("OS-8 limits", func(t *testing.T) {
		ctx := testCtx(t)
		for i := range 1100 {
			gw := e.gws[[]string{"node-a", "node-b"}[i%2]]
			if _, err := gw.Create(&osh.CreateSandboxRequest{Spec: spec(), Name: fmt.Sprintf("os8-%04d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range []struct {
			limit uint32
			want  int
		}{{0, 100}, {5000, 1000}} {
			got, err := e.list(ctx, &osh.ListSandboxesRequest{Limit: tc.limit})
			if err != nil || len(got) != tc.want {
				t.Errorf("limit %d: %d rows, %v; want %d", tc.limit, len(got), err, tc.want)
			}
		}
		_, err := e.list(ctx, &osh.ListSandboxesRequest{Workspace: "w", AllWorkspaces: true})
		wantCode(t, "workspace and all_workspaces", err, codes.InvalidArgument, "")
	})

	t.Run("OS-13 unknown id", func(t *testing.T) {
		_, err := execStream(testCtx(t), e.cc, &osh.ExecSandboxRequest{SandboxId: "00000000-0000-4000-8000-000000000000", Command: []string{"true"}})
		wantCode(t, "exec", err, codes.NotFound, "sandbox not found")
	})

	t.Run("OS-15 delete missing", func(t *testing.T) {
		_, err := e.del(testCtx(t), "", "missing")
		wantCode(t, "delete", err, codes.NotFound, "sandbox not found")
	})
}

// TestExecVectorsThroughFacade replays the exec vectors OS-9..OS-12 and
// OS-14 through the facade, with real commands on the host.
func TestExecVectorsThroughFacade(t *testing.T) {
	var noExit atomic.Bool
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}, gw: openshelltest.Options{
		Exec: func(ctx context.Context, x *openshelltest.Exec) (int32, error) {
			if noExit.Load() {
				x.Stdout.Write([]byte("partial"))
				return 0, openshelltest.ErrNoExit
			}
			return openshelltest.DefaultExec(ctx, x)
		},
	}})
	ctx := testCtx(t)
	sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-exec"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetMetadata().GetId()

	t.Run("OS-18 probe output and one exit", func(t *testing.T) {
		evs, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "printf openshell-sandbox-ready"}})
		r := summarize(evs)
		if err != nil || r.stdout != "openshell-sandbox-ready" || r.exits != 1 || r.code != 0 || r.afterExit {
			t.Fatalf("exec: %+v, %v", r, err)
		}
	})

	t.Run("OS-10 timeout", func(t *testing.T) {
		evs, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "sleep 5"}, TimeoutSeconds: 1})
		r := summarize(evs)
		if err != nil || r.exits != 1 || r.code != osh.ExecTimeoutExitCode || r.afterExit {
			t.Fatalf("exec: %+v, %v; want exit 124 then OK", r, err)
		}
	})

	t.Run("OS-11 stdin then EOF", func(t *testing.T) {
		stdin := make([]byte, 524288)
		for i := range stdin {
			stdin[i] = byte(i)
		}
		evs, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "cat > f && wc -c < f"}, Stdin: stdin})
		r := summarize(evs)
		if err != nil || strings.TrimSpace(r.stdout) != "524288" || r.exits != 1 || r.code != 0 {
			t.Fatalf("exec: %+v, %v", r, err)
		}
	})

	t.Run("OS-12 bad env key", func(t *testing.T) {
		_, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}, Environment: map[string]string{"1BAD": "x"}})
		wantCode(t, "exec", err, codes.InvalidArgument, "")
	})

	t.Run("OS-14 no exit event", func(t *testing.T) {
		noExit.Store(true)
		defer noExit.Store(false)
		evs, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}})
		r := summarize(evs)
		if err != nil || r.exits != 0 || r.stdout != "partial" {
			t.Fatalf("exec: %+v, %v; want the stream to end OK without exit, as the gateway ended it", r, err)
		}
	})

	t.Run("OS-9 not ready", func(t *testing.T) {
		node := ""
		for id, gw := range e.gws {
			if _, ok := gw.Sandbox("", "ng-exec"); ok {
				node = id
			}
		}
		if err := e.gws[node].SetPhase("", "ng-exec", osh.SandboxPhase_SANDBOX_PHASE_PROVISIONING); err != nil {
			t.Fatal(err)
		}
		_, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}})
		wantCode(t, "exec", err, codes.FailedPrecondition, "sandbox is not ready")
	})
}

// TestDeleteVectorsThroughFacade replays OS-15..OS-17 and checks what the
// ledger learns.
func TestDeleteVectorsThroughFacade(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}, gw: openshelltest.Options{DeleteLinger: -1}})
	ctx := testCtx(t)
	mk := func(name string) (string, string) {
		sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Name: name})
		if err != nil {
			t.Fatal(err)
		}
		r, _ := e.ledger.record(sb.GetMetadata().GetId())
		return sb.GetMetadata().GetId(), r.Node
	}

	t.Run("OS-17 normal delete", func(t *testing.T) {
		id, node := mk("ng-del")
		deleted, err := e.del(ctx, "", "ng-del")
		if err != nil || !deleted {
			t.Fatalf("delete: %v, %v", deleted, err)
		}
		if r, _ := e.ledger.record(id); r.State != ledger.StateDeleting {
			t.Errorf("ledger state %q after deleted=true, want deleting", r.State)
		}
		sb, err := e.get(ctx, "", "ng-del")
		if err != nil || sb.GetStatus().GetPhase() != osh.SandboxPhase_SANDBOX_PHASE_DELETING {
			t.Fatalf("get while deleting: %v, %v", sb, err)
		}
		e.gws[node].Drop("", "ng-del")
		_, err = e.get(ctx, "", "ng-del")
		wantCode(t, "get after drop", err, codes.NotFound, "sandbox not found")
		// A second delete meets NOT_FOUND, which confirms it gone.
		_, err = e.del(ctx, "", "ng-del")
		wantCode(t, "second delete", err, codes.NotFound, "sandbox not found")
		if r, _ := e.ledger.record(id); r.State != ledger.StateDeleted {
			t.Errorf("ledger state %q after NOT_FOUND, want deleted", r.State)
		}
	})

	t.Run("OS-16 compute vanished", func(t *testing.T) {
		id, node := mk("ng-vanish")
		e.gws[node].VanishCompute("", "ng-vanish")
		deleted, err := e.del(ctx, "", "ng-vanish")
		if err != nil || deleted {
			t.Fatalf("delete: %v, %v; want deleted=false", deleted, err)
		}
		if r, _ := e.ledger.record(id); r.State != ledger.StateDeleted {
			t.Errorf("ledger state %q after deleted=false, want deleted", r.State)
		}
	})

	t.Run("OS-15 delete missing", func(t *testing.T) {
		_, err := e.del(ctx, "", "missing")
		wantCode(t, "delete", err, codes.NotFound, "sandbox not found")
	})
}

// TestBearerThroughFacade replays OS-20: the gateway's own authorization
// metadata passes through the facade untouched.
func TestBearerThroughFacade(t *testing.T) {
	e := newEnv(t, envConfig{gw: openshelltest.Options{Token: "s3cret"}})
	_, err := e.create(testCtx(t), &osh.CreateSandboxRequest{Spec: spec()})
	wantCode(t, "create without authorization", err, codes.Unauthenticated, "")
	h, err := unary[osh.HealthResponse](testCtx(t), e.cc, osh.MethodHealth, &osh.HealthRequest{})
	if err != nil || h.GetStatus() != osh.ServiceStatus_SERVICE_STATUS_HEALTHY {
		t.Fatalf("health without authorization: %v, %v", h, err)
	}
	ctx := testCtx(t, "authorization", "Bearer s3cret")
	sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-auth"})
	if err != nil {
		t.Fatalf("create with authorization: %v", err)
	}
	if _, err := e.get(ctx, "", "ng-auth"); err != nil {
		t.Fatalf("get with authorization: %v", err)
	}
	if _, err := execStream(testCtx(t), e.cc, &osh.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"true"}}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("exec without authorization: %v", err)
	}
}
