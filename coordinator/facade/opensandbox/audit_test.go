package opensandbox_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// auditEvents is an Auditor that keeps what it is given.
type auditEvents struct {
	mu  sync.Mutex
	evs []protocol.AuditEvent
}

func (e *auditEvents) Record(ev *protocol.AuditEvent) {
	e.mu.Lock()
	e.evs = append(e.evs, *ev)
	e.mu.Unlock()
}

func (e *auditEvents) all() []protocol.AuditEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]protocol.AuditEvent(nil), e.evs...)
}

// wait returns the events once there are n (a request's event is recorded
// when its handler returns, which may be after the caller read the
// answer), or what there is after the failure bound.
func (e *auditEvents) wait(n int) []protocol.AuditEvent {
	deadline := time.Now().Add(defaultTestTimeout)
	for {
		evs := e.all()
		if len(evs) >= n || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAuditEveryAnsweredRequest: each request is one event (identity,
// method, sandbox, node, result), a caller refused for its token too; the
// token, the body and the query never appear.
func TestAuditEveryAnsweredRequest(t *testing.T) {
	const token = "audit-token-0123456789"
	rec := &auditEvents{}
	e := newFacadeEnv(t, func(c *opensandbox.Config) {
		c.CheckToken = func(tok string) bool { return tok == token }
		c.TokenName = func(string) string { return "alice" }
		c.Audit = rec
	})
	e.startNode(t, "node-a", nil, opensandboxtest.Config{})
	if code, _, body := e.do(t, "GET", "/v1/sandboxes", map[string]string{"Tether-Token": "wrong-token-0123456789"}, ""); code != http.StatusUnauthorized {
		t.Fatalf("list with a wrong token: %d %s", code, body)
	}
	hdr := map[string]string{"Tether-Token": token}
	id := e.create(t, hdr, map[string]string{"k": "secret-value"})
	if code, _, body := e.do(t, "GET", "/v1/sandboxes?metadata=q%3Dsecret-query", hdr, ""); code != http.StatusOK {
		t.Fatalf("list: %d %s", code, body)
	}
	if code, _, body := e.do(t, "DELETE", "/v1/sandboxes/"+id, hdr, ""); code >= 300 {
		t.Fatalf("delete: %d %s", code, body)
	}
	type row struct {
		identity, op, method, sandbox, nodes, result, reason string
		status                                               int
	}
	want := []row{
		{"", "forward", "GET list", "", "", protocol.AuditRefused, "unauthenticated", 401},
		{"token:alice", "forward", "POST create", id, "node-a", protocol.AuditOK, "", 0},
		{"token:alice", "sandboxes.list", "GET list", "", "node-a", protocol.AuditOK, "", 0},
		{"token:alice", "sandboxes.reap", "DELETE sandbox", id, "node-a", protocol.AuditOK, "", 0},
	}
	got := rec.wait(len(want))
	if len(got) != len(want) {
		t.Fatalf("%d auditEvents, want %d: %+v", len(got), len(want), got)
	}
	for i, ev := range got {
		r := row{ev.Identity, ev.Operation, ev.Method, ev.Sandbox, strings.Join(ev.Nodes, ","), ev.Result, ev.Reason, ev.Status}
		if r != want[i] || ev.Facade != "opensandbox" {
			t.Errorf("event %d: %+v (facade %q)\nwant %+v", i, r, ev.Facade, want[i])
		}
		raw, _ := json.Marshal(ev)
		for _, s := range []string{token, "wrong-token", "secret-value", "secret-query", "python:3.12"} {
			if strings.Contains(string(raw), s) {
				t.Errorf("event %d holds %q: %s", i, s, raw)
			}
		}
	}
}

// TestLocalNamesTheCallerByItsUID: without tokens, Config.Local is given
// the uid owning the caller's socket (here the test's own), looked up per
// connection by HTTPServer's ConnContext.
func TestLocalNamesTheCallerByItsUID(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the socket's owner is known on Linux only")
	}
	rec := &auditEvents{}
	e := newFacadeEnv(t, func(c *opensandbox.Config) {
		c.Local = func(uid uint32) policy.Identity { return peeruid.Identity(uid) }
		c.Audit = rec
	})
	for range 2 {
		if code, _, body := e.do(t, "GET", "/v1/sandboxes", nil, ""); code != http.StatusOK {
			t.Fatalf("list: %d %s", code, body)
		}
	}
	want := peeruid.Identity(uint32(os.Geteuid())).String()
	evs := rec.wait(2)
	if len(evs) != 2 {
		t.Fatalf("%d auditEvents, want 2", len(evs))
	}
	for _, ev := range evs {
		if ev.Identity != want || ev.Result != protocol.AuditOK {
			t.Errorf("event %+v, want identity %s, ok", ev, want)
		}
	}
}

// sourceClient returns an HTTP client whose connections leave from ip (a
// loopback IP other than 127.0.0.1), and a function returning the local
// address of its last connection: what the facade sees as the TCP peer.
func sourceClient(t *testing.T, ip string) (*http.Client, func() string) {
	t.Helper()
	var mu sync.Mutex
	last := ""
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			mu.Lock()
			last = c.LocalAddr().String()
			mu.Unlock()
		}
		return c, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, func() string { mu.Lock(); defer mu.Unlock(); return last }
}

// TestAuditSourceIsTheTCPPeer: a refused call's event names where it came
// from, the client's IP and port as the facade's listener saw them, for a
// wrong token (unauthenticated) and a throttled one alike; an
// X-Forwarded-For the caller wrote is not it.
func TestAuditSourceIsTheTCPPeer(t *testing.T) {
	const good = "good-token-0123456789"
	rec := &auditEvents{}
	clk := &testClock{t: time.Unix(1_000_000, 0)}
	e := newFacadeEnv(t, func(c *opensandbox.Config) {
		c.CheckToken = func(tok string) bool { return tok == good }
		c.Audit = rec
		opensandbox.SetAuthClock(c, clk.now)
	})
	cl, local := sourceClient(t, "127.0.0.7")
	for i := range 11 {
		req, err := http.NewRequestWithContext(context.Background(), "GET", e.url+"/v1/sandboxes", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(opensandbox.HeaderToken, "wrong-"+strconv.Itoa(i))
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	evs := rec.wait(11)
	if len(evs) != 11 {
		t.Fatalf("%d events, want 11: %+v", len(evs), evs)
	}
	want := local()
	if !strings.HasPrefix(want, "127.0.0.7:") {
		t.Fatalf("the client's local address is %q, want 127.0.0.7:PORT", want)
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
