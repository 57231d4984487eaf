package openshelltest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
)

// The tests replay wire-facts §5.1 (OS-1..OS-17, OS-20) against the fake
// over a real gRPC connection, with the generated messages and full method
// paths, as any client of a gateway would.

func start(t *testing.T, opts openshelltest.Options) (*openshelltest.Gateway, *grpc.ClientConn) {
	t.Helper()
	g := openshelltest.New(opts)
	addr, err := g.Start()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Close()
	})
	return g, conn
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// call invokes a unary method and returns the typed response.
func call[Resp any, P interface {
	*Resp
	proto.Message
}](t *testing.T, conn grpc.ClientConnInterface, method string, req proto.Message, opts ...grpc.CallOption) (P, error) {
	t.Helper()
	resp := P(new(Resp))
	err := conn.Invoke(ctxT(t), method, req, resp, opts...)
	return resp, err
}

func create(t *testing.T, conn grpc.ClientConnInterface, req *openshell.CreateSandboxRequest, opts ...grpc.CallOption) (*openshell.Sandbox, error) {
	t.Helper()
	if req.Spec == nil {
		req.Spec = &openshell.SandboxSpec{Environment: map[string]string{}}
	}
	resp, err := call[openshell.SandboxResponse](t, conn, openshell.MethodCreateSandbox, req, opts...)
	return resp.GetSandbox(), err
}

func mustCreate(t *testing.T, conn grpc.ClientConnInterface, req *openshell.CreateSandboxRequest) *openshell.Sandbox {
	t.Helper()
	sb, err := create(t, conn, req)
	if err != nil {
		t.Fatalf("create %q: %v", req.GetName(), err)
	}
	return sb
}

func get(t *testing.T, conn grpc.ClientConnInterface, ws, name string) (*openshell.Sandbox, error) {
	t.Helper()
	resp, err := call[openshell.SandboxResponse](t, conn, openshell.MethodGetSandbox, &openshell.GetSandboxRequest{Name: name, Workspace: ws})
	return resp.GetSandbox(), err
}

func del(t *testing.T, conn grpc.ClientConnInterface, ws, name string) (bool, error) {
	t.Helper()
	resp, err := call[openshell.DeleteSandboxResponse](t, conn, openshell.MethodDeleteSandbox, &openshell.DeleteSandboxRequest{Name: name, Workspace: ws})
	return resp.GetDeleted(), err
}

func list(t *testing.T, conn grpc.ClientConnInterface, req *openshell.ListSandboxesRequest) ([]*openshell.Sandbox, error) {
	t.Helper()
	resp, err := call[openshell.ListSandboxesResponse](t, conn, openshell.MethodListSandboxes, req)
	return resp.GetSandboxes(), err
}

// execResult is what an ExecSandbox stream delivered.
type execResult struct {
	stdout, stderr []byte
	exits          []int32
}

// execStream runs ExecSandbox and reads the stream to its end; err is the
// stream's final status (nil for a normal end).
func execStream(ctx context.Context, conn grpc.ClientConnInterface, req *openshell.ExecSandboxRequest, opts ...grpc.CallOption) (execResult, error) {
	var res execResult
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, openshell.MethodExecSandbox, opts...)
	if err != nil {
		return res, err
	}
	if err := s.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		return res, err
	}
	if err := s.CloseSend(); err != nil {
		return res, err
	}
	for {
		ev := new(openshell.ExecSandboxEvent)
		if err := s.RecvMsg(ev); err != nil {
			if errors.Is(err, io.EOF) {
				return res, nil
			}
			return res, err
		}
		switch p := ev.Payload.(type) {
		case *openshell.ExecSandboxEvent_Stdout:
			res.stdout = append(res.stdout, p.Stdout.GetData()...)
		case *openshell.ExecSandboxEvent_Stderr:
			res.stderr = append(res.stderr, p.Stderr.GetData()...)
		case *openshell.ExecSandboxEvent_Exit:
			res.exits = append(res.exits, p.Exit.GetExitCode())
		}
	}
}

// mustExit checks that an exec ended normally with exactly one exit event
// of code want.
func mustExit(t *testing.T, res execResult, err error, want int32) {
	t.Helper()
	if err != nil {
		t.Fatalf("exec: %v (stderr %q)", err, res.stderr)
	}
	if len(res.exits) != 1 || res.exits[0] != want {
		t.Fatalf("exit events %v, want exactly [%d] (stderr %q)", res.exits, want, res.stderr)
	}
}

func wantCode(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
	if msg != "" && st.Message() != msg {
		t.Fatalf("%s: message %q, want %q", what, st.Message(), msg)
	}
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestOS1CreateDefaults(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	sb := mustCreate(t, conn, &openshell.CreateSandboxRequest{Spec: &openshell.SandboxSpec{Environment: map[string]string{}}, Labels: map[string]string{}})
	md := sb.GetMetadata()
	if md.GetWorkspace() != "default" {
		t.Errorf("workspace %q", md.GetWorkspace())
	}
	if err := openshell.ValidateName(md.GetName()); err != nil {
		t.Errorf("generated name %q: %v", md.GetName(), err)
	}
	if !uuidV4.MatchString(md.GetId()) {
		t.Errorf("id %q is not a UUIDv4", md.GetId())
	}
	if md.GetCreatedAtMs() == 0 {
		t.Error("created_at_ms not set")
	}
	if sb.GetStatus().GetPhase() != openshell.SandboxPhase_SANDBOX_PHASE_PROVISIONING {
		t.Errorf("phase %v", sb.GetStatus().GetPhase())
	}
	spec := sb.GetSpec()
	if strings.Join(spec.GetCommand(), " ") != "/bin/bash -l" || !spec.GetTty() {
		t.Errorf("command %q tty %v", spec.GetCommand(), spec.GetTty())
	}
	if spec.GetTemplate().GetImage() != openshelltest.DefaultImage {
		t.Errorf("image %q", spec.GetTemplate().GetImage())
	}
	// ReadyAfter 0: READY from the next call on.
	again, err := get(t, conn, "", md.GetName())
	if err != nil || again.GetStatus().GetPhase() != openshell.SandboxPhase_SANDBOX_PHASE_READY || again.GetMetadata().GetId() != md.GetId() {
		t.Fatalf("get: %v %v", again, err)
	}
	// A caller's command and image are kept.
	sb = mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "own", Spec: &openshell.SandboxSpec{Command: []string{"sleep", "inf"}, Template: &openshell.SandboxTemplate{Image: "img:1"}}})
	if sb.GetSpec().GetTty() || sb.GetSpec().GetCommand()[0] != "sleep" || sb.GetSpec().GetTemplate().GetImage() != "img:1" {
		t.Errorf("caller's spec changed: %v", sb.GetSpec())
	}
}

func TestCreateNeedsSpecAndWorkspace(t *testing.T) {
	g, conn := start(t, openshelltest.Options{})
	_, err := call[openshell.SandboxResponse](t, conn, openshell.MethodCreateSandbox, &openshell.CreateSandboxRequest{Name: "a"})
	wantCode(t, "no spec", err, codes.InvalidArgument, "")
	_, err = create(t, conn, &openshell.CreateSandboxRequest{Name: "a", Workspace: "team-x"})
	wantCode(t, "unknown workspace", err, codes.NotFound, "workspace 'team-x' not found")
	g.AddWorkspace("team-x")
	sb := mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a", Workspace: "team-x"})
	if sb.GetMetadata().GetWorkspace() != "team-x" {
		t.Fatal(sb.GetMetadata())
	}
	// Same name, other workspace: fine.
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a"})
	// Providers must exist in the workspace.
	_, err = create(t, conn, &openshell.CreateSandboxRequest{Name: "b", Spec: &openshell.SandboxSpec{Providers: []string{"nvidia"}}})
	wantCode(t, "unknown provider", err, codes.FailedPrecondition, "provider 'nvidia' not found")
	if err := g.AddProvider("", "nvidia"); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "b", Spec: &openshell.SandboxSpec{Providers: []string{"nvidia"}}})
}

func TestOS2NameTooLong(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	_, err := create(t, conn, &openshell.CreateSandboxRequest{Name: "nemo-gym-0123456789abcdef0123456789abcdef"})
	wantCode(t, "41-char name", err, codes.InvalidArgument, "name exceeds maximum length (41 > 19)")
}

func TestOS3DuplicateThenAdopt(t *testing.T) {
	g, conn := start(t, openshelltest.Options{})
	first := mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "ng-0123456789abcdef"})
	_, err := create(t, conn, &openshell.CreateSandboxRequest{Name: "ng-0123456789abcdef"})
	wantCode(t, "second create", err, codes.AlreadyExists, "sandbox 'ng-0123456789abcdef' already exists")
	adopted, err := get(t, conn, "default", "ng-0123456789abcdef")
	if err != nil || adopted.GetMetadata().GetId() != first.GetMetadata().GetId() {
		t.Fatalf("adopt: %v %v", adopted, err)
	}
	if n := g.Creates("", "ng-0123456789abcdef"); n != 1 {
		t.Errorf("Creates = %d, want 1", n)
	}
	if n := g.Calls(openshell.MethodCreateSandbox); n != 2 {
		t.Errorf("Calls(create) = %d, want 2", n)
	}
}

func TestOS4BadNames(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	for _, name := range []string{"Ng-1", "ng--1", "-ng1"} {
		_, err := create(t, conn, &openshell.CreateSandboxRequest{Name: name})
		wantCode(t, name, err, codes.InvalidArgument, "")
	}
}

func TestOS5Labels(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	sb := mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a", Labels: map[string]string{"sandbox-api": "openshell-grpc", "nemo-gym.sandbox": "1"}})
	if sb.GetMetadata().GetLabels()["nemo-gym.sandbox"] != "1" {
		t.Errorf("labels %v", sb.GetMetadata().GetLabels())
	}
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "b", Labels: map[string]string{"team": ""}})
	for _, l := range []map[string]string{{"workload": "configs/x.yaml"}, {"Team/x": "a"}} {
		_, err := create(t, conn, &openshell.CreateSandboxRequest{Name: "c", Labels: l})
		wantCode(t, fmt.Sprint(l), err, codes.InvalidArgument, "")
	}
}

func TestOS6OS7Selectors(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "both", Labels: map[string]string{"nemo-gym.sandbox": "1", "team": "a"}})
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "marker", Labels: map[string]string{"nemo-gym.sandbox": "1"}})
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "other-team", Labels: map[string]string{"nemo-gym.sandbox": "1", "team": "b"}})
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "empty-team", Labels: map[string]string{"team": ""}})
	names := func(sel string) string {
		t.Helper()
		sbs, err := list(t, conn, &openshell.ListSandboxesRequest{LabelSelector: sel})
		if err != nil {
			t.Fatalf("list %q: %v", sel, err)
		}
		var out []string
		for _, sb := range sbs {
			out = append(out, sb.GetMetadata().GetName())
		}
		return strings.Join(out, ",")
	}
	for sel, want := range map[string]string{
		"nemo-gym.sandbox=1, team = a ,": "both",
		"nemo-gym.sandbox=1":             "both,marker,other-team",
		"":                               "both,marker,other-team,empty-team",
		"team=":                          "empty-team",
		"team=b,team=a":                  "both",
	} {
		if got := names(sel); got != want {
			t.Errorf("selector %q: got %s, want %s", sel, got, want)
		}
	}
	pairs := strings.TrimSuffix(strings.Repeat("a=1,", 65), ",")
	for _, sel := range []string{"team", "=a", "a==b", "a!=b", pairs} {
		_, err := list(t, conn, &openshell.ListSandboxesRequest{LabelSelector: sel})
		wantCode(t, "selector "+sel, err, codes.InvalidArgument, "")
	}
}

func TestOS8Paging(t *testing.T) {
	g, conn := start(t, openshelltest.Options{})
	g.AddWorkspace("w")
	for i := range 1100 {
		if _, err := g.Create(&openshell.CreateSandboxRequest{Name: fmt.Sprintf("sb-%d", i), Spec: &openshell.SandboxSpec{}}); err != nil {
			t.Fatal(err)
		}
	}
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "in-w", Workspace: "w"})
	for limit, want := range map[uint32]int{0: 100, 5000: 1000, 7: 7} {
		sbs, err := list(t, conn, &openshell.ListSandboxesRequest{Limit: limit})
		if err != nil || len(sbs) != want {
			t.Errorf("limit %d: %d rows, %v; want %d", limit, len(sbs), err, want)
		}
	}
	_, err := list(t, conn, &openshell.ListSandboxesRequest{Workspace: "w", AllWorkspaces: true})
	wantCode(t, "workspace+all_workspaces", err, codes.InvalidArgument, "")
	_, err = list(t, conn, &openshell.ListSandboxesRequest{Workspace: "nope"})
	wantCode(t, "unknown workspace", err, codes.NotFound, "workspace 'nope' not found")

	// Paging with offset until a short page sees every row once, in order.
	seen := map[string]bool{}
	for offset := uint32(0); ; offset += 300 {
		sbs, err := list(t, conn, &openshell.ListSandboxesRequest{Limit: 300, Offset: offset})
		if err != nil {
			t.Fatal(err)
		}
		for i, sb := range sbs {
			if want := fmt.Sprintf("sb-%d", int(offset)+i); sb.GetMetadata().GetName() != want {
				t.Fatalf("row %d is %s, want %s", int(offset)+i, sb.GetMetadata().GetName(), want)
			}
			seen[sb.GetMetadata().GetName()] = true
		}
		if len(sbs) < 300 {
			break
		}
	}
	if len(seen) != 1100 {
		t.Fatalf("paged %d distinct rows, want 1100", len(seen))
	}
	all, err := list(t, conn, &openshell.ListSandboxesRequest{AllWorkspaces: true, Limit: 1000, Offset: 1000})
	if err != nil || len(all) != 101 || all[100].GetMetadata().GetWorkspace() != "w" {
		t.Fatalf("all workspaces, last page: %d rows, %v", len(all), err)
	}
}

func TestOS9ExecNotReady(t *testing.T) {
	g, conn := start(t, openshelltest.Options{ReadyAfter: -1})
	sb := mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "slow"})
	req := &openshell.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"/bin/sh", "-c", "printf ok"}}
	_, err := execStream(ctxT(t), conn, req)
	wantCode(t, "exec on PROVISIONING", err, codes.FailedPrecondition, "sandbox is not ready")
	if err := g.SetPhase("", "slow", openshell.SandboxPhase_SANDBOX_PHASE_READY); err != nil {
		t.Fatal(err)
	}
	res, err := execStream(ctxT(t), conn, req)
	mustExit(t, res, err, 0)
	if string(res.stdout) != "ok" {
		t.Fatalf("stdout %q", res.stdout)
	}
}

func ready(t *testing.T, conn grpc.ClientConnInterface, name string) string {
	t.Helper()
	id := mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: name}).GetMetadata().GetId()
	if sb, err := get(t, conn, "", name); err != nil || sb.GetStatus().GetPhase() != openshell.SandboxPhase_SANDBOX_PHASE_READY {
		t.Fatalf("sandbox %s not READY: %v %v", name, sb, err)
	}
	return id
}

func TestOS10ExecTimeout(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	id := ready(t, conn, "a")
	began := time.Now()
	res, err := execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "printf before; sleep 5"}, TimeoutSeconds: 1})
	mustExit(t, res, err, 124)
	if string(res.stdout) != "before" {
		t.Errorf("stdout %q", res.stdout)
	}
	if d := time.Since(began); d > 4*time.Second {
		t.Errorf("timeout took %v", d)
	}
}

func TestOS11StdinThenEOF(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	id := ready(t, conn, "a")
	data := bytes.Repeat([]byte("0123456789abcdef"), 524288/16)
	res, err := execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "mkdir -p d && cat > d/f"}, Stdin: data, TimeoutSeconds: 30})
	mustExit(t, res, err, 0)
	res, err = execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "cat d/f"}})
	mustExit(t, res, err, 0)
	if !bytes.Equal(res.stdout, data) {
		t.Fatalf("read back %d bytes, want %d equal", len(res.stdout), len(data))
	}
	// Over the gateway's 1 MiB decode limit: refused by gRPC itself.
	_, err = execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}, Stdin: make([]byte, openshell.MaxMessageSize+1)})
	wantCode(t, "2 MiB message", err, codes.ResourceExhausted, "")
}

func TestOS12OS13ExecValidation(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	id := ready(t, conn, "a")
	for what, req := range map[string]*openshell.ExecSandboxRequest{
		"bad env key": {SandboxId: id, Command: []string{"true"}, Environment: map[string]string{"1BAD": "x"}},
		"no id":       {Command: []string{"true"}},
		"no command":  {SandboxId: id},
	} {
		_, err := execStream(ctxT(t), conn, req)
		wantCode(t, what, err, codes.InvalidArgument, "")
	}
	_, err := execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: "00000000-0000-4000-8000-000000000000", Command: []string{"true"}})
	wantCode(t, "unknown id", err, codes.NotFound, "sandbox not found")
}

func TestOS14StreamWithoutExit(t *testing.T) {
	_, conn := start(t, openshelltest.Options{Exec: func(ctx context.Context, x *openshelltest.Exec) (int32, error) {
		io.WriteString(x.Stdout, "partial")
		return 0, openshelltest.ErrNoExit
	}})
	id := ready(t, conn, "a")
	res, err := execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"x"}})
	if err != nil || len(res.exits) != 0 || string(res.stdout) != "partial" {
		t.Fatalf("got %+v, %v; want output, no exit, OK end", res, err)
	}
}

func TestExecOutputEnvWorkdir(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	id := mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a", Spec: &openshell.SandboxSpec{Environment: map[string]string{"FROM_SPEC": "s", "BOTH": "spec"}}}).GetMetadata().GetId()
	res, err := execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{
		SandboxId:   id,
		Command:     []string{"/bin/sh", "-c", `mkdir -p sub && cd sub && printf '%s %s %s' "$FROM_SPEC" "$BOTH" "$CALL"; printf err >&2; exit 3`},
		Environment: map[string]string{"BOTH": "call", "CALL": "c"},
	})
	mustExit(t, res, err, 3)
	if string(res.stdout) != "s call c" || string(res.stderr) != "err" {
		t.Fatalf("stdout %q stderr %q", res.stdout, res.stderr)
	}
	res, err = execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "basename $(pwd)"}, Workdir: "sub"})
	mustExit(t, res, err, 0)
	if string(res.stdout) != "sub\n" {
		t.Fatalf("workdir: stdout %q", res.stdout)
	}
	res, err = execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}, Workdir: "missing"})
	mustExit(t, res, err, 2)
	res, err = execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"no-such-command-xyz"}})
	mustExit(t, res, err, 127)
	res, err = execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "kill -TERM $$"}})
	mustExit(t, res, err, 128+15)
}

func TestOS15DeleteMissing(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	_, err := del(t, conn, "", "missing")
	wantCode(t, "delete missing", err, codes.NotFound, "sandbox not found")
	_, err = del(t, conn, "nope", "missing")
	wantCode(t, "delete in unknown workspace", err, codes.NotFound, "workspace 'nope' not found")
	_, err = get(t, conn, "", "missing")
	wantCode(t, "get missing", err, codes.NotFound, "sandbox not found")
}

func TestOS16ComputeVanished(t *testing.T) {
	g, conn := start(t, openshelltest.Options{DeleteLinger: -1})
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a"})
	if err := g.VanishCompute("", "a"); err != nil {
		t.Fatal(err)
	}
	deleted, err := del(t, conn, "", "a")
	if err != nil || deleted {
		t.Fatalf("delete: deleted=%v, %v; want false, nil", deleted, err)
	}
	_, err = get(t, conn, "", "a")
	wantCode(t, "get after", err, codes.NotFound, "sandbox not found")
}

func TestOS17DeleteNormal(t *testing.T) {
	g, conn := start(t, openshelltest.Options{DeleteLinger: -1})
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a"})
	deleted, err := del(t, conn, "", "a")
	if err != nil || !deleted {
		t.Fatalf("delete: %v %v", deleted, err)
	}
	sb, err := get(t, conn, "", "a")
	if err != nil || sb.GetStatus().GetPhase() != openshell.SandboxPhase_SANDBOX_PHASE_DELETING || sb.GetMetadata().GetDeletionTimestampMs() == 0 {
		t.Fatalf("get while deleting: %v %v", sb, err)
	}
	// A second delete while DELETING says deleted=true at once.
	if deleted, err := del(t, conn, "", "a"); err != nil || !deleted {
		t.Fatalf("second delete: %v %v", deleted, err)
	}
	// Exec is refused, and the name stays taken, while it is DELETING.
	_, err = execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"true"}})
	wantCode(t, "exec while deleting", err, codes.FailedPrecondition, "sandbox is not ready")
	_, err = create(t, conn, &openshell.CreateSandboxRequest{Name: "a"})
	wantCode(t, "reuse while deleting", err, codes.AlreadyExists, "")
	if err := g.Drop("", "a"); err != nil {
		t.Fatal(err)
	}
	_, err = get(t, conn, "", "a")
	wantCode(t, "get after drop", err, codes.NotFound, "sandbox not found")
}

func TestDeleteLingerZero(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a"})
	if deleted, err := del(t, conn, "", "a"); err != nil || !deleted {
		t.Fatalf("delete: %v %v", deleted, err)
	}
	_, err := get(t, conn, "", "a")
	wantCode(t, "get after delete", err, codes.NotFound, "sandbox not found")
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a"}) // the name is free again
}

func TestOS20BearerToken(t *testing.T) {
	_, conn := start(t, openshelltest.Options{Token: "s3cret"})
	h, err := call[openshell.HealthResponse](t, conn, openshell.MethodHealth, &openshell.HealthRequest{})
	if err != nil || h.GetStatus() != openshell.ServiceStatus_SERVICE_STATUS_HEALTHY {
		t.Fatalf("health without token: %v %v", h, err)
	}
	_, err = create(t, conn, &openshell.CreateSandboxRequest{Name: "a"})
	wantCode(t, "no token", err, codes.Unauthenticated, "")
	bad := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer nope")
	err = conn.Invoke(bad, openshell.MethodCreateSandbox, &openshell.CreateSandboxRequest{Name: "a", Spec: &openshell.SandboxSpec{}}, new(openshell.SandboxResponse))
	wantCode(t, "wrong token", err, codes.Unauthenticated, "")
	good := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer s3cret")
	resp := new(openshell.SandboxResponse)
	if err := conn.Invoke(good, openshell.MethodCreateSandbox, &openshell.CreateSandboxRequest{Name: "a", Spec: &openshell.SandboxSpec{}}, resp); err != nil {
		t.Fatalf("with token: %v", err)
	}
	_, err = execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: resp.GetSandbox().GetMetadata().GetId(), Command: []string{"true"}})
	wantCode(t, "exec without token", err, codes.Unauthenticated, "")
	res, err := execStream(good, conn, &openshell.ExecSandboxRequest{SandboxId: resp.GetSandbox().GetMetadata().GetId(), Command: []string{"true"}})
	mustExit(t, res, err, 0)
}

func TestInjectedFaults(t *testing.T) {
	g, conn := start(t, openshelltest.Options{})
	g.Inject(openshell.MethodCreateSandbox, openshelltest.Fault{Err: status.Error(codes.Unavailable, "try again"), Times: 2})
	for i := range 2 {
		_, err := create(t, conn, &openshell.CreateSandboxRequest{Name: "a"})
		wantCode(t, fmt.Sprint("attempt ", i), err, codes.Unavailable, "try again")
	}
	mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a"})
	if g.Creates("", "a") != 1 || g.Calls(openshell.MethodCreateSandbox) != 3 {
		t.Fatalf("creates %d calls %d", g.Creates("", "a"), g.Calls(openshell.MethodCreateSandbox))
	}
	// A lost response: the create commits, the caller sees DEADLINE_EXCEEDED,
	// its retry with the same name gets ALREADY_EXISTS.
	g.Inject(openshell.MethodCreateSandbox, openshelltest.Fault{Err: status.Error(codes.DeadlineExceeded, "lost"), AfterCommit: true})
	_, err := create(t, conn, &openshell.CreateSandboxRequest{Name: "b"})
	wantCode(t, "lost response", err, codes.DeadlineExceeded, "lost")
	_, err = create(t, conn, &openshell.CreateSandboxRequest{Name: "b"})
	wantCode(t, "retry", err, codes.AlreadyExists, "sandbox 'b' already exists")
	if g.Creates("", "b") != 1 {
		t.Fatalf("creates of b: %d", g.Creates("", "b"))
	}
	// Streams too.
	g.Inject(openshell.MethodExecSandbox, openshelltest.Fault{Err: status.Error(codes.Unavailable, "supervisor relay failed: x")})
	sb, _ := g.Sandbox("", "a")
	_, err = execStream(ctxT(t), conn, &openshell.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"true"}})
	wantCode(t, "exec fault", err, codes.Unavailable, "supervisor relay failed: x")
}

func TestRestartKeepsSandboxesAndCutsStreams(t *testing.T) {
	g, conn := start(t, openshelltest.Options{})
	id := ready(t, conn, "a")
	errc := make(chan error, 1)
	ctx := ctxT(t)
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, openshell.MethodExecSandbox)
	if err != nil {
		t.Fatal(err)
	}
	s.SendMsg(&openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "echo started; sleep 30"}})
	s.CloseSend()
	ev := new(openshell.ExecSandboxEvent)
	if err := s.RecvMsg(ev); err != nil || string(ev.GetStdout().GetData()) != "started\n" {
		t.Fatalf("first event %v %v", ev, err)
	}
	go func() { errc <- s.RecvMsg(new(openshell.ExecSandboxEvent)) }()
	g.Restart()
	wantCode(t, "exec across restart", <-errc, codes.Unavailable, "")
	// The client reconnects; the sandbox is still there.
	sb, err := get(t, conn, "", "a")
	if err != nil || sb.GetMetadata().GetId() != id {
		t.Fatalf("after restart: %v %v", sb, err)
	}
}

func TestWatchFollowsPhases(t *testing.T) {
	g, conn := start(t, openshelltest.Options{ReadyAfter: -1})
	id := mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a"}).GetMetadata().GetId()
	s, err := conn.NewStream(ctxT(t), &grpc.StreamDesc{ServerStreams: true}, openshell.MethodWatchSandbox)
	if err != nil {
		t.Fatal(err)
	}
	s.SendMsg(&openshell.WatchSandboxRequest{Id: id, FollowStatus: true, StopOnTerminal: true})
	s.CloseSend()
	recvPhase := func() openshell.SandboxPhase {
		ev := new(openshell.SandboxStreamEvent)
		if err := s.RecvMsg(ev); err != nil {
			t.Fatal(err)
		}
		return ev.GetSandbox().GetStatus().GetPhase()
	}
	if p := recvPhase(); p != openshell.SandboxPhase_SANDBOX_PHASE_PROVISIONING {
		t.Fatalf("first %v", p)
	}
	g.SetPhase("", "a", openshell.SandboxPhase_SANDBOX_PHASE_READY)
	if p := recvPhase(); p != openshell.SandboxPhase_SANDBOX_PHASE_READY {
		t.Fatalf("second %v", p)
	}
	if err := s.RecvMsg(new(openshell.SandboxStreamEvent)); !errors.Is(err, io.EOF) {
		t.Fatalf("after terminal: %v", err)
	}
}

func TestWatchWakesOnReadyAfter(t *testing.T) {
	_, conn := start(t, openshelltest.Options{ReadyAfter: 100 * time.Millisecond})
	id := mustCreate(t, conn, &openshell.CreateSandboxRequest{Name: "a"}).GetMetadata().GetId()
	s, err := conn.NewStream(ctxT(t), &grpc.StreamDesc{ServerStreams: true}, openshell.MethodWatchSandbox)
	if err != nil {
		t.Fatal(err)
	}
	s.SendMsg(&openshell.WatchSandboxRequest{Id: id, FollowStatus: true, StopOnTerminal: true})
	s.CloseSend()
	var phases []openshell.SandboxPhase
	for {
		ev := new(openshell.SandboxStreamEvent)
		if err := s.RecvMsg(ev); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		phases = append(phases, ev.GetSandbox().GetStatus().GetPhase())
	}
	if len(phases) != 2 || phases[1] != openshell.SandboxPhase_SANDBOX_PHASE_READY {
		t.Fatalf("phases %v", phases)
	}
}

func TestExecInteractive(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	id := ready(t, conn, "a")
	s, err := conn.NewStream(ctxT(t), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, openshell.MethodExecSandboxInteractive)
	if err != nil {
		t.Fatal(err)
	}
	send := func(in *openshell.ExecSandboxInput) {
		if err := s.SendMsg(in); err != nil {
			t.Fatal(err)
		}
	}
	send(&openshell.ExecSandboxInput{Payload: &openshell.ExecSandboxInput_Start{Start: &openshell.ExecSandboxRequest{SandboxId: id, Command: []string{"cat"}, Stdin: []byte("one ")}}})
	send(&openshell.ExecSandboxInput{Payload: &openshell.ExecSandboxInput_Resize{Resize: &openshell.ExecSandboxWindowResize{Cols: 80, Rows: 24}}})
	send(&openshell.ExecSandboxInput{Payload: &openshell.ExecSandboxInput_Stdin{Stdin: []byte("two")}})
	s.CloseSend()
	var out []byte
	var exits []int32
	for {
		ev := new(openshell.ExecSandboxEvent)
		if err := s.RecvMsg(ev); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		out = append(out, ev.GetStdout().GetData()...)
		if ev.GetExit() != nil {
			exits = append(exits, ev.GetExit().GetExitCode())
		}
	}
	if string(out) != "one two" || len(exits) != 1 || exits[0] != 0 {
		t.Fatalf("out %q exits %v", out, exits)
	}

	s, err = conn.NewStream(ctxT(t), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, openshell.MethodExecSandboxInteractive)
	if err != nil {
		t.Fatal(err)
	}
	s.SendMsg(&openshell.ExecSandboxInput{Payload: &openshell.ExecSandboxInput_Stdin{Stdin: []byte("x")}})
	s.CloseSend()
	wantCode(t, "stdin first", s.RecvMsg(new(openshell.ExecSandboxEvent)), codes.InvalidArgument, "first message must be start")
}

func TestStopStartAndUnknownMethod(t *testing.T) {
	_, conn := start(t, openshelltest.Options{})
	ready(t, conn, "a")
	resp, err := call[openshell.SandboxResponse](t, conn, openshell.MethodStopSandbox, &openshell.StopSandboxRequest{Name: "a"})
	if err != nil || resp.GetSandbox().GetStatus().GetPhase() != openshell.SandboxPhase_SANDBOX_PHASE_STOPPED {
		t.Fatalf("stop: %v %v", resp, err)
	}
	_, err = call[openshell.SandboxResponse](t, conn, openshell.MethodStopSandbox, &openshell.StopSandboxRequest{Name: "a"})
	wantCode(t, "stop twice", err, codes.FailedPrecondition, "")
	resp, err = call[openshell.SandboxResponse](t, conn, openshell.MethodStartSandbox, &openshell.StartSandboxRequest{Name: "a"})
	if err != nil || resp.GetSandbox().GetStatus().GetPhase() != openshell.SandboxPhase_SANDBOX_PHASE_READY {
		t.Fatalf("start: %v %v", resp, err)
	}
	err = conn.Invoke(ctxT(t), "/openshell.v1.OpenShell/ListProviders", &openshell.HealthRequest{}, new(openshell.HealthResponse))
	wantCode(t, "undeclared method", err, codes.Unimplemented, "")
}

// A Fault with Delay holds a committed create's answer: the sandbox exists
// before the caller hears of it.
func TestFaultDelayHoldsCommittedAnswer(t *testing.T) {
	g := openshelltest.New(openshelltest.Options{})
	addr, err := g.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.Inject(openshell.MethodCreateSandbox, openshelltest.Fault{AfterCommit: true, Delay: 2 * time.Second})
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var resp openshell.SandboxResponse
	err = cc.Invoke(ctx, openshell.MethodCreateSandbox, &openshell.CreateSandboxRequest{Name: "slow-1", Spec: &openshell.SandboxSpec{}}, &resp)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("create with a 2 s delay and a 300 ms deadline: %v, want DEADLINE_EXCEEDED", err)
	}
	if len(g.Sandboxes("default")) != 1 {
		t.Fatalf("sandboxes after the cut-off create: %d, want 1 (it committed)", len(g.Sandboxes("default")))
	}
}
