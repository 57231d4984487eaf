package console

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/policy"
)

// TestLoginGuessesThrottled: wrong login tokens from one source IP are
// throttled after a burst (429 with Retry-After, the token unchecked:
// also a correct one), bearer tokens share the budget, another IP is
// unaffected, and after the Retry-After the correct login works (review
// F15: 600 guesses in 0.35 s).
func TestLoginGuessesThrottled(t *testing.T) {
	e := newEnv(t)
	login := func(remote, tok string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest("POST", "/console/login", strings.NewReader("token="+url.QueryEscape(tok)))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = remote
		req.TLS = nil
		if !strings.HasPrefix(remote, "127.") {
			req.TLS = &tls.ConnectionState{HandshakeComplete: true}
		}
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		return rec
	}
	const attacker, other = "198.51.100.9:4000", "198.51.100.10:4000"
	const good = "alice-token-0123456789"
	throttled := 0
	retry := 0
	for i := range 50 {
		rec := login(attacker, "wrong-token-"+strconv.Itoa(i))
		switch rec.Code {
		case http.StatusUnauthorized:
			if throttled > 0 {
				t.Fatalf("guess %d: 401 after %d throttled answers: guessing went on", i, throttled)
			}
		case http.StatusTooManyRequests:
			throttled++
			n, err := strconv.Atoi(rec.Header().Get("Retry-After"))
			if err != nil || n < 1 {
				t.Fatalf("guess %d: 429 with Retry-After %q, want whole seconds >= 1", i, rec.Header().Get("Retry-After"))
			}
			retry = max(retry, n)
		default:
			t.Fatalf("guess %d: %d", i, rec.Code)
		}
	}
	if throttled < 30 {
		t.Fatalf("%d of 50 wrong logins throttled, want all past a small burst", throttled)
	}
	if rec := login(attacker, good); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Set-Cookie") != "" {
		t.Fatalf("a correct login from the throttled IP: %d (cookie %q), want 429 without a session", rec.Code, rec.Header().Get("Set-Cookie"))
	}
	code, _ := e.getFrom(t, "/console/nodes", "admin-token-0123456789", attacker, true)
	if code != http.StatusTooManyRequests {
		t.Fatalf("a correct bearer token from the throttled IP: %d, want 429", code)
	}
	if rec := login(other, good); rec.Code != http.StatusSeeOther {
		t.Fatalf("a correct login from another IP: %d, want 303", rec.Code)
	}
	var sawThrottled bool
	for _, ev := range e.audit.take() {
		if ev.Reason == reasonThrottled {
			sawThrottled = true
		}
	}
	if !sawThrottled {
		t.Error("no audit event has reason throttled")
	}
	e.nowMu.Lock()
	e.now = e.now.Add(time.Duration(retry) * time.Second)
	e.nowMu.Unlock()
	if rec := login(attacker, good); rec.Code != http.StatusSeeOther {
		t.Fatalf("a correct login after the Retry-After of %d s: %d, want 303", retry, rec.Code)
	}
	// Successes took nothing: the budget is one failure again.
	if rec := login(attacker, "wrong-again-0123456789"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("a wrong login after the wait: %d, want 401", rec.Code)
	}
}

// TestBearerGuessesThrottled: wrong bearer tokens are throttled as logins
// are; a loopback caller without credentials is not.
func TestBearerGuessesThrottled(t *testing.T) {
	e := newEnv(t)
	for i := range 30 {
		e.get(t, "/console/nodes", "wrong-token-"+strconv.Itoa(i))
	}
	if code, _ := e.get(t, "/console/nodes", "admin-token-0123456789"); code != http.StatusTooManyRequests {
		t.Fatalf("a correct bearer token from loopback after 30 wrong ones: %d, want 429", code)
	}
	e.local = &policy.Identity{Kind: policy.KindToken, Name: "admin"}
	if code, _ := e.get(t, "/console/nodes", ""); code != http.StatusOK {
		t.Fatalf("the loopback identity without credentials: %d, want 200 (never throttled)", code)
	}
}
