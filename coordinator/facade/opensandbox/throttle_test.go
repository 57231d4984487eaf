package opensandbox_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
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

// clientFrom returns an HTTP client whose connections leave from source
// (a loopback IP other than 127.0.0.1 makes another source IP).
func clientFrom(t *testing.T, source string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// throttledTotal returns tether_auth_throttled_total{listener} from reg
// (0 when absent).
func throttledTotal(t *testing.T, reg *prometheus.Registry, listener string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
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

// TestOpenSandboxTokenGuessesThrottled: wrong Tether-Tokens from one
// source IP are throttled after a burst of 10 (429 with Retry-After and
// the facade's error body), the token unchecked: a correct one is refused
// too, a WebSocket upgrade (PTY attach) as well; another source IP is
// unaffected; each refusal counts in
// tether_auth_throttled_total{listener="opensandbox"}; after the
// Retry-After the correct token works (review F15).
func TestOpenSandboxTokenGuessesThrottled(t *testing.T) {
	const good = "good-token-0123456789"
	clk := &testClock{t: time.Unix(1_000_000, 0)}
	e := newFacadeEnv(t, func(c *opensandbox.Config) {
		c.CheckToken = func(tok string) bool { return tok == good }
		opensandbox.SetAuthClock(c, clk.now)
	})
	for i := range 10 {
		code, _, body := e.do(t, "GET", "/health", map[string]string{opensandbox.HeaderToken: "wrong-" + strconv.Itoa(i)}, "")
		if code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d %s, want 401 (within the burst)", i, code, body)
		}
	}
	wantThrottled := func(what string, code int, hdr http.Header, body string) int {
		t.Helper()
		if code != http.StatusTooManyRequests {
			t.Fatalf("%s: %d %s, want 429", what, code, body)
		}
		n, err := strconv.Atoi(hdr.Get("Retry-After"))
		if err != nil || n < 1 {
			t.Fatalf("%s: Retry-After %q, want whole seconds >= 1", what, hdr.Get("Retry-After"))
		}
		var eb osb.ErrorBody
		if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.Code != opensandbox.CodeAuthThrottled || eb.Message == "" {
			t.Fatalf("%s: body %s (%v), want {code: %s, message}", what, body, err, opensandbox.CodeAuthThrottled)
		}
		return n
	}
	code, hdr, body := e.do(t, "GET", "/health", map[string]string{opensandbox.HeaderToken: "wrong-10"}, "")
	wantThrottled("the 11th wrong token", code, hdr, body)
	code, hdr, body = e.do(t, "GET", "/health", map[string]string{opensandbox.HeaderToken: good}, "")
	retry := wantThrottled("the correct token from the throttled IP", code, hdr, body)

	// A PTY attach authenticates the same way: refused before the upgrade.
	ws, resp, err := websocket.DefaultDialer.Dial("ws://"+e.host+"/sandboxes/sb1/proxy/44772/pty/s1/ws", http.Header{opensandbox.HeaderToken: {good}})
	if err == nil {
		ws.Close()
		t.Fatal("a WebSocket upgrade with the correct token from the throttled IP was accepted")
	}
	if resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		st := 0
		if resp != nil {
			st = resp.StatusCode
		}
		t.Fatalf("a WebSocket upgrade from the throttled IP: %v (HTTP %d), want 429 with Retry-After", err, st)
	}

	if got := throttledTotal(t, e.reg, "opensandbox"); got != 3 {
		t.Errorf(`tether_auth_throttled_total{listener="opensandbox"} = %v, want 3`, got)
	}

	// Another source IP: its correct token works.
	other := clientFrom(t, "127.0.0.2")
	req, err := http.NewRequestWithContext(context.Background(), "GET", e.url+"/health", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(opensandbox.HeaderToken, good)
	r2, err := other.Do(req)
	if err != nil {
		t.Fatalf("from 127.0.0.2: %v", err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusOK {
		t.Fatalf("the correct token from another IP (127.0.0.2): %d, want 200", r2.StatusCode)
	}

	clk.add(time.Duration(retry) * time.Second)
	if code, _, body := e.do(t, "GET", "/health", map[string]string{opensandbox.HeaderToken: good}, ""); code != http.StatusOK {
		t.Fatalf("the correct token after the Retry-After of %d s: %d %s, want 200", retry, code, body)
	}
}

// TestOpenSandboxThrottleKeysOnPeer: the throttled source is the TCP
// peer; X-Forwarded-For is never read, so a guesser cannot escape its
// bucket by naming another address, nor throttle another's.
func TestOpenSandboxThrottleKeysOnPeer(t *testing.T) {
	const good = "good-token-0123456789"
	clk := &testClock{t: time.Unix(1_000_000, 0)}
	e := newFacadeEnv(t, func(c *opensandbox.Config) {
		c.CheckToken = func(tok string) bool { return tok == good }
		opensandbox.SetAuthClock(c, clk.now)
	})
	for i := range 11 {
		e.do(t, "GET", "/health", map[string]string{opensandbox.HeaderToken: "wrong", "X-Forwarded-For": "203.0.113." + strconv.Itoa(i)}, "")
	}
	if code, _, body := e.do(t, "GET", "/health", map[string]string{opensandbox.HeaderToken: good, "X-Forwarded-For": "198.51.100.1"}, ""); code != http.StatusTooManyRequests {
		t.Fatalf("the correct token from the throttled peer naming another X-Forwarded-For: %d %s, want 429", code, body)
	}
	// No credential: not the limiter's business (401 as before).
	if code, _, body := e.do(t, "GET", "/health", nil, ""); code != http.StatusUnauthorized {
		t.Fatalf("no token from the throttled peer: %d %s, want 401", code, body)
	}
}
