package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
)

func startOpenShell(t *testing.T, opts openshelltest.Options) (*openshelltest.Gateway, *grpc.ClientConn) {
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

func seed(t *testing.T, g *openshelltest.Gateway, ws, name string, labels map[string]string) *openshell.Sandbox {
	t.Helper()
	sb, err := g.Create(&openshell.CreateSandboxRequest{Workspace: ws, Name: name, Labels: labels, Spec: &openshell.SandboxSpec{}})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestOpenShellListPagesWorkspacesAndSelector(t *testing.T) {
	g, conn := startOpenShell(t, openshelltest.Options{})
	g.AddWorkspace("team-b")
	marker := map[string]string{"nemo-gym.sandbox": "1", "run": "r1"}
	want := map[string]bool{}
	for i := range 1234 {
		ws := "default"
		if i%3 == 0 {
			ws = "team-b"
		}
		name := fmt.Sprintf("sb-%d", i)
		seed(t, g, ws, name, marker)
		want[ws+"/"+name] = true
	}
	seed(t, g, "", "unmarked", nil)

	o := &gateway.OpenShell{Conn: conn, Workspaces: []string{"default", "team-b"}, Selector: "nemo-gym.sandbox=1"}
	got, err := o.List(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("listed %d, want %d", len(got), len(want))
	}
	for _, s := range got {
		key := s.Workspace + "/" + s.Name
		if !want[key] {
			t.Fatalf("unexpected or repeated %s", key)
		}
		delete(want, key)
		if s.Provider != protocol.ProviderOpenShell || s.ID == "" || s.Labels["run"] != "r1" || s.State != "SANDBOX_PHASE_READY" || s.CreatedAt.IsZero() || s.Deleting {
			t.Fatalf("bad mapping %+v", s)
		}
	}
	// Defaults: workspace "default", no selector.
	all, err := (&gateway.OpenShell{Conn: conn}).List(ctxFor(t))
	if err != nil || len(all) != 1234-412+1 {
		t.Fatalf("default listing: %d, %v", len(all), err)
	}
	// An unknown workspace fails the listing, naming it, with what came before.
	part, err := (&gateway.OpenShell{Conn: conn, Workspaces: []string{"team-b", "nope"}}).List(ctxFor(t))
	if status.Code(err) != codes.NotFound || len(part) != 412 {
		t.Fatalf("unknown workspace: %d rows, %v", len(part), err)
	}
}

// churnConn changes the gateway between ListSandboxes pages: it drops the
// first `drop` sandboxes still present and creates `add` new ones, for the
// first `rounds` list calls.
type churnConn struct {
	grpc.ClientConnInterface
	g         *openshelltest.Gateway
	drop, add int
	mu        sync.Mutex
	rounds    int
	dropped   map[string]bool
	created   int
}

func (c *churnConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	err := c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
	if method != openshell.MethodListSandboxes {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rounds == 0 {
		return err
	}
	c.rounds--
	for _, sb := range c.g.Sandboxes("")[:c.drop] {
		c.g.Drop("", sb.GetMetadata().GetName())
		c.dropped[sb.GetMetadata().GetName()] = true
	}
	for range c.add {
		c.created++
		c.g.Create(&openshell.CreateSandboxRequest{Name: fmt.Sprintf("new-%d", c.created), Spec: &openshell.SandboxSpec{}})
	}
	return err
}

func TestOpenShellListSurvivesChurnBetweenPages(t *testing.T) {
	g, conn := startOpenShell(t, openshelltest.Options{})
	for i := range 1600 {
		seed(t, g, "", fmt.Sprintf("sb-%d", i), nil)
	}
	// 30 deletions before the cursor and 10 creations per page: within the
	// overlap, so one pass suffices.
	c := &churnConn{ClientConnInterface: conn, g: g, drop: 30, add: 10, rounds: 100, dropped: map[string]bool{}}
	got, err := (&gateway.OpenShell{Conn: c}).List(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range got {
		if seen[s.Name] {
			t.Fatalf("%s listed twice", s.Name)
		}
		seen[s.Name] = true
	}
	for i := range 1600 {
		if name := fmt.Sprintf("sb-%d", i); !c.dropped[name] && !seen[name] {
			t.Fatalf("%s existed throughout but was not listed", name)
		}
	}
	if n := g.Calls(openshell.MethodListSandboxes); n != 4 {
		t.Errorf("%d list calls, want 4 (one pass)", n)
	}

	// A shift larger than the overlap restarts the workspace; when it
	// keeps happening the listing fails instead of guessing.
	c = &churnConn{ClientConnInterface: conn, g: g, drop: 120, rounds: 1, dropped: map[string]bool{}}
	if _, err := (&gateway.OpenShell{Conn: c}).List(ctxFor(t)); err != nil {
		t.Fatalf("one large shift: %v", err)
	}
	c = &churnConn{ClientConnInterface: conn, g: g, drop: 120, rounds: 100, dropped: map[string]bool{}}
	if _, err := (&gateway.OpenShell{Conn: c}).List(ctxFor(t)); err == nil {
		t.Fatal("persistent large shifts: listing succeeded")
	}
}

func TestOpenShellGetDelete(t *testing.T) {
	g, conn := startOpenShell(t, openshelltest.Options{DeleteLinger: -1})
	created := seed(t, g, "", "a", map[string]string{"team": "x"})
	o := &gateway.OpenShell{Conn: conn}
	ctx := ctxFor(t)

	s, err := o.Get(ctx, "", "a")
	if err != nil {
		t.Fatal(err)
	}
	want := protocol.Sandbox{
		Provider: "openshell", ID: created.GetMetadata().GetId(), Name: "a", Workspace: "default",
		Labels: map[string]string{"team": "x"}, State: "SANDBOX_PHASE_READY",
		CreatedAt: time.UnixMilli(created.GetMetadata().GetCreatedAtMs()).UTC(),
	}
	if fmt.Sprint(s) != fmt.Sprint(want) {
		t.Fatalf("Get = %+v\nwant  %+v", s, want)
	}

	deleted, err := o.Delete(ctx, "default", "a")
	if err != nil || !deleted {
		t.Fatalf("Delete = %v, %v", deleted, err)
	}
	s, err = o.Get(ctx, "", "a")
	if err != nil || !s.Deleting || s.State != "SANDBOX_PHASE_DELETING" {
		t.Fatalf("Get while deleting = %+v, %v", s, err)
	}
	g.Drop("", "a")
	if _, err := o.Get(ctx, "", "a"); !errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("Get after drop: %v", err)
	}
	if _, err := o.Delete(ctx, "", "a"); !errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("Delete of missing: %v", err)
	}
	if _, err := o.Delete(ctx, "nope", "a"); !errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("Delete in missing workspace: %v", err)
	}

	seed(t, g, "", "b", nil)
	g.VanishCompute("", "b")
	if deleted, err := o.Delete(ctx, "", "b"); err != nil || deleted {
		t.Fatalf("Delete of vanished = %v, %v; want false, nil", deleted, err)
	}

	seed(t, g, "", "c", nil)
	g.Inject(openshell.MethodDeleteSandbox, openshelltest.Fault{Err: status.Error(codes.Internal, "delete sandbox failed: driver")})
	_, err = o.Delete(ctx, "", "c")
	if status.Code(err) != codes.Internal || errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("driver failure: %v", err)
	}
}

func TestOpenShellToken(t *testing.T) {
	g, conn := startOpenShell(t, openshelltest.Options{Token: "t0k"})
	seed(t, g, "", "a", nil)
	if _, err := (&gateway.OpenShell{Conn: conn}).List(ctxFor(t)); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without token: %v", err)
	}
	o := &gateway.OpenShell{Conn: conn, Token: "t0k"}
	if got, err := o.List(ctxFor(t)); err != nil || len(got) != 1 {
		t.Fatalf("with token: %v, %v", got, err)
	}
	if _, err := o.Get(ctxFor(t), "", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Delete(ctxFor(t), "", "a"); err != nil {
		t.Fatal(err)
	}
}

func TestOpenShellSandboxMapping(t *testing.T) {
	s := gateway.OpenShellSandbox(&openshell.Sandbox{
		Metadata: &openshell.ObjectMeta{Id: "i", Name: "n", DeletionTimestampMs: 5},
		Status:   &openshell.SandboxStatus{Phase: openshell.SandboxPhase_SANDBOX_PHASE_READY},
	}, "")
	if s.Workspace != "default" || !s.Deleting || s.State != "SANDBOX_PHASE_READY" || !s.CreatedAt.IsZero() || s.Labels != nil {
		t.Fatalf("%+v", s)
	}
	if s := gateway.OpenShellSandbox(&openshell.Sandbox{}, "w"); s.Workspace != "w" || s.State != "SANDBOX_PHASE_UNSPECIFIED" {
		t.Fatalf("%+v", s)
	}
}

// TestOpenShellListUnreachableInUserTerms: a gateway that refuses the
// connection is named as not reachable, with the dial's own error once,
// not grpc's "rpc error: code = Unavailable desc = ... transport: Error
// while dialing"; the error still carries the UNAVAILABLE status.
func TestOpenShellListUnreachableInUserTerms(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = (&gateway.OpenShell{Conn: conn}).List(ctxFor(t))
	want := "openshell: list workspace default: gateway not reachable: dial tcp " + addr + ": connect: connection refused"
	if err == nil || err.Error() != want {
		t.Fatalf("List of a closed port: %v; want %q", err, want)
	}
	if status.Code(errors.Unwrap(err)) != codes.Unavailable {
		t.Errorf("List's error lost its UNAVAILABLE status: %v", status.Code(errors.Unwrap(err)))
	}
}
