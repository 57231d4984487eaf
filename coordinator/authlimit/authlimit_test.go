package authlimit_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/coordinator/authlimit"
)

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestLimiterBurstThenThrottled(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	l := authlimit.New(authlimit.Config{Listener: "test", Now: c.now})
	reg := prometheus.NewRegistry()
	if err := l.Register(reg); err != nil {
		t.Fatal(err)
	}
	for i := range authlimit.DefaultBurst {
		if _, ok := l.Check("192.0.2.1"); !ok {
			t.Fatalf("failure %d refused: the burst is %d", i, authlimit.DefaultBurst)
		}
		l.Fail("192.0.2.1")
	}
	wait, ok := l.Check("192.0.2.1")
	if ok || wait < time.Second {
		t.Fatalf("after the burst: ok=%v wait=%v, want throttled with a wait of >= 1s", ok, wait)
	}
	if _, ok := l.Check("192.0.2.2"); !ok {
		t.Fatal("another IP is throttled too")
	}
	c.t = c.t.Add(wait)
	if _, ok := l.Check("192.0.2.1"); !ok {
		t.Fatalf("still throttled after the Retry-After of %v", wait)
	}
	if got := testutil.ToFloat64(l.Throttled()); got != 1 {
		t.Fatalf("tether_auth_throttled_total = %v, want 1", got)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP tether_auth_throttled_total `+helpOf(t, reg)+`
# TYPE tether_auth_throttled_total counter
tether_auth_throttled_total{listener="test"} 1
`), "tether_auth_throttled_total"); err != nil {
		t.Fatal(err)
	}
}

func helpOf(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v, %d families", err, len(mfs))
	}
	return mfs[0].GetHelp()
}

// TestLimiterMemoryBound: failures from many more IPs than MaxTracked
// keep at most MaxTracked tracked, and refilled entries expire.
func TestLimiterMemoryBound(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	l := authlimit.New(authlimit.Config{Listener: "test", Now: c.now})
	for i := range 3 * authlimit.DefaultMaxTracked {
		l.Fail(fmt.Sprintf("2001:db8::%x", i))
		if n := l.Tracked(); n > authlimit.DefaultMaxTracked {
			t.Fatalf("after %d IPs: %d tracked, want <= %d", i+1, n, authlimit.DefaultMaxTracked)
		}
	}
	// The most recent failer is tracked still.
	last := fmt.Sprintf("2001:db8::%x", 3*authlimit.DefaultMaxTracked-1)
	for range authlimit.DefaultBurst {
		l.Fail(last)
	}
	if _, ok := l.Check(last); ok {
		t.Fatal("the most recently failing IP was forgotten")
	}
	// Once every bucket refilled, new failures let the old entries expire.
	c.t = c.t.Add(time.Hour)
	for i := range authlimit.DefaultMaxTracked {
		l.Fail(fmt.Sprintf("198.51.100.%d", i%250))
	}
	if n := l.Tracked(); n > 250 {
		t.Fatalf("%d tracked after the old entries refilled, want <= 250 (only the new IPs)", n)
	}
}

// TestKey: one bucket per IPv4 address, and per IPv6 /64 (one host is
// routinely given a whole /64: keyed per address, a guesser with one
// would get 2^64 fresh buckets); an IPv4-mapped IPv6 address is its IPv4
// address; a remote that is no IP (a Unix socket) is itself.
func TestKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1:5555":               "192.0.2.1",
		"[2001:db8::1]:80":             "2001:db8::/64",
		"[2001:db8:0:0:ffff:1:2:3]:80": "2001:db8::/64",
		"[2001:db8:0:1::1]:80":         "2001:db8:0:1::/64",
		"[fe80::1%eth0]:80":            "fe80::/64",
		"[::ffff:192.0.2.7]:443":       "192.0.2.7",
		"@":                            "@",
		"":                             "",
		"not an address":               "not an address",
	} {
		if got := authlimit.Key(in); got != want {
			t.Errorf("Key(%q) = %q, want %q", in, got, want)
		}
	}
}
