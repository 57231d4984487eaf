package openshell_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	osh "github.com/tetherfleet/tether/protocol/openshell"
)

// testClock is a settable clock for the facade's limiter.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// throttledTotal returns tether_auth_throttled_total{listener} (0 when
// absent).
func throttledTotal(t *testing.T, e *env, listener string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tether_auth_throttled_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "listener" && lp.GetValue() == listener {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestOpenShellTokenGuessesThrottled: wrong tether-tokens from one source
// IP are throttled after a burst of 10 (RESOURCE_EXHAUSTED with a
// retry-after trailer), the token unchecked: a correct one is refused
// too, on a stream as on a unary call; another source IP is unaffected;
// each refusal counts in tether_auth_throttled_total{listener="openshell"};
// after the retry-after the correct token works (review F15).
func TestOpenShellTokenGuessesThrottled(t *testing.T) {
	const good = "good-token-0123456789"
	clk := &testClock{t: time.Unix(1_000_000, 0)}
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) {
		c.CheckToken = func(tok string) bool { return tok == good }
		facade.SetAuthClock(c, clk.now)
	}})
	list := func(cc *grpc.ClientConn, tok string, opts ...grpc.CallOption) error {
		_, err := unary[osh.ListSandboxesResponse](testCtx(t, facade.MetaToken, tok), cc, osh.MethodListSandboxes, &osh.ListSandboxesRequest{}, opts...)
		return err
	}
	for i := range 10 {
		wantCode(t, "wrong token "+strconv.Itoa(i), list(e.cc, "wrong-"+strconv.Itoa(i)), codes.Unauthenticated, "invalid tether-token")
	}
	wantThrottled := func(what string, err error, tr metadata.MD) int {
		t.Helper()
		wantCode(t, what, err, codes.ResourceExhausted, "too many failed")
		v := tr.Get("retry-after")
		n := 0
		if len(v) == 1 {
			n, _ = strconv.Atoi(v[0])
		}
		if n < 1 {
			t.Fatalf("%s: trailer retry-after %q, want whole seconds >= 1", what, v)
		}
		return n
	}
	var tr metadata.MD
	wantThrottled("the 11th wrong token", list(e.cc, "wrong-10", grpc.Trailer(&tr)), tr)
	tr = nil
	retry := wantThrottled("the correct token from the throttled IP", list(e.cc, good, grpc.Trailer(&tr)), tr)
	if n := e.gws["node-a"].Calls(osh.MethodListSandboxes); n != 0 {
		t.Fatalf("the gateway got %d lists, want 0", n)
	}
	// A stream authenticates the same way.
	_, err := execStream(testCtx(t, facade.MetaToken, good), e.cc, &osh.ExecSandboxRequest{SandboxId: "sb-1", Command: []string{"true"}})
	wantCode(t, "an exec stream with the correct token from the throttled IP", err, codes.ResourceExhausted, "too many failed")
	if got := throttledTotal(t, e, "openshell"); got != 3 {
		t.Errorf(`tether_auth_throttled_total{listener="openshell"} = %v, want 3`, got)
	}

	// Another source IP (127.0.0.2: all of 127.0.0.0/8 is loopback on
	// Linux): its correct token works.
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	other := dialFacade(t, e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err := list(other, good); err != nil {
		t.Fatalf("the correct token from another IP (127.0.0.2): %v, want OK", err)
	}

	clk.add(time.Duration(retry) * time.Second)
	if err := list(e.cc, good); err != nil {
		t.Fatalf("the correct token after the retry-after of %d s: %v, want OK", retry, err)
	}
	// No credential: not the limiter's business (UNAUTHENTICATED as before).
	for range 12 {
		list(e.cc, "wrong")
	}
	_, err = unary[osh.ListSandboxesResponse](testCtx(t), e.cc, osh.MethodListSandboxes, &osh.ListSandboxesRequest{})
	wantCode(t, "no token from the throttled IP", err, codes.Unauthenticated, "")
}

// TestOpenShellThrottleKeysOnPeer: the throttled source is the TCP peer;
// x-forwarded-for is never read.
func TestOpenShellThrottleKeysOnPeer(t *testing.T) {
	const good = "good-token-0123456789"
	clk := &testClock{t: time.Unix(1_000_000, 0)}
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) {
		c.CheckToken = func(tok string) bool { return tok == good }
		facade.SetAuthClock(c, clk.now)
	}})
	for i := range 11 {
		unary[osh.ListSandboxesResponse](testCtx(t, facade.MetaToken, "wrong", "x-forwarded-for", "203.0.113."+strconv.Itoa(i)), e.cc, osh.MethodListSandboxes, &osh.ListSandboxesRequest{})
	}
	_, err := unary[osh.ListSandboxesResponse](testCtx(t, facade.MetaToken, good, "x-forwarded-for", "198.51.100.1"), e.cc, osh.MethodListSandboxes, &osh.ListSandboxesRequest{})
	wantCode(t, "the correct token from the throttled peer naming another x-forwarded-for", err, codes.ResourceExhausted, "")
}
