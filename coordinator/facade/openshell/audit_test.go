package openshell_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	osh "github.com/tetherfleet/tether/protocol/openshell"
)

// events is an Auditor that keeps what it is given.
type events struct {
	mu  sync.Mutex
	evs []protocol.AuditEvent
}

func (e *events) Record(ev *protocol.AuditEvent) {
	e.mu.Lock()
	e.evs = append(e.evs, *ev)
	e.mu.Unlock()
}

func (e *events) all() []protocol.AuditEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]protocol.AuditEvent(nil), e.evs...)
}

// TestAuditEveryAnsweredCall: each call is one event (identity, method,
// sandbox, node, result), a caller refused for its token too; the token
// and the request's contents never appear.
func TestAuditEveryAnsweredCall(t *testing.T) {
	const token = "audit-token-0123456789"
	rec := &events{}
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) {
		c.CheckToken = func(tok string) bool { return tok == token }
		c.TokenName = func(string) string { return "alice" }
		c.Audit = rec
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.list(ctx, &osh.ListSandboxesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("list without a token: %v", err)
	}
	bad := metadata.AppendToOutgoingContext(ctx, "tether-token", "wrong-token-0123456789")
	if _, err := e.list(bad, &osh.ListSandboxesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("list with a wrong token: %v", err)
	}
	ok := metadata.AppendToOutgoingContext(ctx, "tether-token", token)
	if _, err := e.create(ok, &osh.CreateSandboxRequest{Name: "sb1", Spec: &osh.SandboxSpec{Environment: map[string]string{"K": "secret-value"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.del(ok, "", "sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.get(ok, "", "sb1"); status.Code(err) != codes.NotFound {
		t.Fatalf("get after delete: %v", err)
	}
	type row struct{ identity, op, method, sandbox, nodes, result, reason, code string }
	want := []row{
		{"", "forward", "ListSandboxes", "", "", protocol.AuditRefused, "unauthenticated", "Unauthenticated"},
		{"", "forward", "ListSandboxes", "", "", protocol.AuditRefused, "unauthenticated", "Unauthenticated"},
		{"token:alice", "forward", "CreateSandbox", "default/sb1", "node-a", protocol.AuditOK, "", ""},
		{"token:alice", "sandboxes.reap", "DeleteSandbox", "default/sb1", "node-a", protocol.AuditOK, "", ""},
		{"token:alice", "sandboxes.list", "GetSandbox", "default/sb1", "node-a", protocol.AuditFailed, "", "NotFound"},
	}
	got := rec.all()
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(got), len(want), got)
	}
	for i, ev := range got {
		r := row{ev.Identity, ev.Operation, ev.Method, ev.Sandbox, strings.Join(ev.Nodes, ","), ev.Result, ev.Reason, ev.ErrorCode}
		if r != want[i] || ev.Facade != "openshell" {
			t.Errorf("event %d: %+v (facade %q)\nwant %+v", i, r, ev.Facade, want[i])
		}
		raw, _ := json.Marshal(ev)
		for _, s := range []string{token, "wrong-token", "secret-value"} {
			if strings.Contains(string(raw), s) {
				t.Errorf("event %d holds %q: %s", i, s, raw)
			}
		}
	}
}

// TestLocalNamesTheCallerByItsUID: without tokens, Config.Local is given
// the uid owning the caller's socket (here the test's own).
func TestLocalNamesTheCallerByItsUID(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the socket's owner is known on Linux only")
	}
	rec := &events{}
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) {
		c.Local = func(uid uint32) policy.Identity { return peeruid.Identity(uid) }
		c.Audit = rec
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 { // one lookup serves the connection's calls
		if _, err := e.list(ctx, &osh.ListSandboxesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	want := peeruid.Identity(uint32(os.Geteuid())).String()
	for _, ev := range rec.all() {
		if ev.Identity != want || ev.Result != protocol.AuditOK {
			t.Errorf("event %+v, want identity %s, ok", ev, want)
		}
	}
}

// TestAuditSourceIsTheTCPPeer: a refused call's event names where it came
// from, the client's IP and port as the facade's listener saw them
// (peer.FromContext), for a wrong token (UNAUTHENTICATED) and a throttled
// one alike; an x-forwarded-for the caller sent is not it.
func TestAuditSourceIsTheTCPPeer(t *testing.T) {
	const good = "good-token-0123456789"
	rec := &events{}
	clk := &testClock{t: time.Unix(1_000_000, 0)}
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) {
		c.CheckToken = func(tok string) bool { return tok == good }
		c.Audit = rec
		facade.SetAuthClock(c, clk.now)
	}})
	var mu sync.Mutex
	local := ""
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.7")}}
	cc := dialFacade(t, e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				mu.Lock()
				local = c.LocalAddr().String()
				mu.Unlock()
			}
			return c, err
		}))
	for i := range 11 {
		ctx := testCtx(t, facade.MetaToken, "wrong-"+strconv.Itoa(i), "x-forwarded-for", "203.0.113.9")
		_, err := unary[osh.ListSandboxesResponse](ctx, cc, osh.MethodListSandboxes, &osh.ListSandboxesRequest{})
		want := codes.Unauthenticated
		if i == 10 {
			want = codes.ResourceExhausted
		}
		if status.Code(err) != want {
			t.Fatalf("call %d: %v, want %v", i, err, want)
		}
	}
	mu.Lock()
	want := local
	mu.Unlock()
	if !strings.HasPrefix(want, "127.0.0.7:") {
		t.Fatalf("the client's local address is %q, want 127.0.0.7:PORT", want)
	}
	evs := rec.all()
	if len(evs) != 11 {
		t.Fatalf("%d events, want 11: %+v", len(evs), evs)
	}
	for i, ev := range evs {
		wantReason := "unauthenticated"
		if i == 10 {
			wantReason = "throttled"
		}
		if ev.Reason != wantReason || ev.Source != want {
			t.Errorf("event %d: reason %q, source %q; want %q from %q", i, ev.Reason, ev.Source, wantReason, want)
		}
	}
}
