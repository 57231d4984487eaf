package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// busyServer accepts TCP connections and answers each, once its
// ClientHello arrived, with a busy refusal asking for wait, written in two
// parts when split (as a slow network might deliver it).
func busyServer(t *testing.T, wait time.Duration, split bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Read(make([]byte, 4096))
			b := protocol.AppendBusyRefusal(nil, wait)
			if split {
				c.Write(b[:5])
				time.Sleep(50 * time.Millisecond)
				c.Write(b[5:])
			} else {
				c.Write(b)
			}
			c.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// A coordinator's busy refusal in place of its ServerHello comes out of
// DialTLS as an unauthenticated RetryAfterError with the wait it named,
// also when it arrives in pieces.
func TestDialTLSReadsBusyRefusal(t *testing.T) {
	client, _ := tlsConfigs(t)
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("split=%v", split), func(t *testing.T) {
			addr := busyServer(t, 1500*time.Millisecond, split)
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			_, err := DialTLS(ctx, addr, client)
			var ra *RetryAfterError
			if !errors.As(err, &ra) {
				t.Fatalf("DialTLS = %v, want a RetryAfterError", err)
			}
			if ra.After != 1500*time.Millisecond || ra.Authenticated {
				t.Fatalf("RetryAfterError %+v, want 1.5s, unauthenticated", ra)
			}
		})
	}
}

// dialLog records a Redialer's dials: when (on the bubble's clock), where
// and with what server name.
type dialLog struct {
	mu    sync.Mutex
	at    []time.Time
	addrs []string
	names []string
}

func (l *dialLog) add(ctx context.Context, addr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at = append(l.at, time.Now())
	l.addrs = append(l.addrs, addr)
	l.names = append(l.names, ServerNameFrom(ctx))
	return len(l.at)
}

func (l *dialLog) gaps() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var g []time.Duration
	for i := 1; i < len(l.at); i++ {
		g = append(g, l.at[i].Sub(l.at[i-1]))
	}
	return g
}

// runDials runs r with dial answering the n-th dial (from 1), until n
// dials happened; serve closes the connection and returns serveErr(n).
func runDials(t *testing.T, r *Redialer, log *dialLog, n int, dial func(n int) error, serveErr func(n int) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		k := log.add(ctx, addr)
		if k >= n {
			cancel()
		}
		if err := dial(k); err != nil {
			return nil, err
		}
		c, s := net.Pipe()
		s.Close()
		return c, nil
	}
	err := r.Run(ctx, func(ctx context.Context, conn net.Conn, addr string) error {
		conn.Close()
		log.mu.Lock()
		k := len(log.at)
		log.mu.Unlock()
		return serveErr(k)
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
}

// A busy refusal's retry-after replaces the backoff: the agent comes back
// to the same address after the wait asked, plus at most 1% of jitter, and
// the backoff does not grow meanwhile.
func TestRedialerHonoursRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log dialLog
		r := &Redialer{Addrs: []string{"a:1", "b:2"}, Backoff: Backoff{Base: 100 * time.Millisecond, Max: 30 * time.Second}}
		runDials(t, r, &log, 6, func(k int) error {
			if k <= 4 {
				return fmt.Errorf("dial: %w", &RetryAfterError{After: 3 * time.Second})
			}
			return errors.New("connection lost")
		}, func(int) error { return nil })
		for i, g := range log.gaps()[:4] {
			if g < 3*time.Second || g > 3*time.Second*101/100 {
				t.Errorf("wait %d after a 3 s retry-after: %v", i, g)
			}
		}
		if got := log.addrs[:5]; !slices.Equal(got, []string{"a:1", "a:1", "a:1", "a:1", "a:1"}) {
			t.Errorf("dials %v: a busy coordinator's agent must come back to it", got)
		}
		// The failure after the refusals backs off from the first window.
		if g := log.gaps()[4]; g >= 100*time.Millisecond {
			t.Errorf("backoff after 4 busy refusals: %v, want within the first 100 ms window", g)
		}
	})
}

// An unauthenticated retry-after cannot park an agent for longer than its
// backoff cap, nor make it spin; an authenticated one is taken as asked.
func TestRedialerBoundsRetryAfter(t *testing.T) {
	for _, c := range []struct {
		name     string
		err      *RetryAfterError
		min, max time.Duration
	}{
		{"a day, unauthenticated", &RetryAfterError{After: 24 * time.Hour}, 30 * time.Second, 30050 * time.Millisecond},
		{"none", &RetryAfterError{After: 0}, minRetryAfter, 2 * minRetryAfter},
		{"a minute, authenticated", &RetryAfterError{After: time.Minute, Authenticated: true}, time.Minute, time.Minute + 50*time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var log dialLog
				r := &Redialer{Addrs: []string{"a:1"}, Backoff: Backoff{Max: 30 * time.Second}}
				runDials(t, r, &log, 3, func(int) error { return c.err }, func(int) error { return nil })
				for _, g := range log.gaps() {
					if g < c.min || g > c.max {
						t.Errorf("waited %v, want within [%v, %v]", g, c.min, c.max)
					}
				}
			})
		})
	}
}

// A drained session moves the agent to the next address (or the one the
// drain prefers) after the drain's stagger, without backoff.
func TestRedialerMovesOnAfterDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log dialLog
		r := &Redialer{Addrs: []string{"a:1", "b:2", "c:3"}, Backoff: Backoff{Base: time.Hour, Max: time.Hour}}
		runDials(t, r, &log, 3, func(int) error { return nil }, func(k int) error {
			if k == 1 {
				return Moved(2*time.Second, "")
			}
			return Moved(0, "a:1")
		})
		if !slices.Equal(log.addrs, []string{"a:1", "b:2", "a:1"}) {
			t.Errorf("dials %v, want a:1, b:2 (the next), a:1 (preferred)", log.addrs)
		}
		g := log.gaps()
		if g[0] < 2*time.Second || g[0] > 2*time.Second*105/100 {
			t.Errorf("waited %v after a drain asking 2 s", g[0])
		}
		if g[1] > 2*time.Millisecond {
			t.Errorf("waited %v after a drain asking none", g[1])
		}
	})
}

// Refused dials (no coordinator listening: a restart) back off within
// RefusedMax, not the full exponential window; other failures do not.
func TestRedialerRefusedMax(t *testing.T) {
	for _, c := range []struct {
		name     string
		refused  time.Duration
		err      error
		maxLast  time.Duration
		wantSlow bool
	}{
		{"refused, default cap", 0, fmt.Errorf("dial: %w", syscall.ECONNREFUSED), time.Second, false},
		{"refused, no cap", -1, fmt.Errorf("dial: %w", syscall.ECONNREFUSED), 0, true},
		{"other failure", 0, errors.New("no route"), 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var log dialLog
				r := &Redialer{Addrs: []string{"a:1"}, RefusedMax: c.refused,
					Backoff: Backoff{Base: 500 * time.Millisecond, Max: 30 * time.Second, Rand: func() float64 { return 0.99 }}}
				runDials(t, r, &log, 9, func(int) error { return c.err }, func(int) error { return nil })
				last := log.gaps()[len(log.gaps())-1]
				if c.wantSlow && last < 10*time.Second {
					t.Errorf("8th wait %v: want the exponential window (about 30 s)", last)
				}
				if !c.wantSlow && last > c.maxLast {
					t.Errorf("8th wait %v: want within RefusedMax %v", last, c.maxLast)
				}
			})
		})
	}
}

// Agents given several addresses start on one their seed picks, spread
// evenly over the addresses, and, when theirs goes away, spread evenly
// over the others instead of all moving to the same next one. Seeds are
// fixed, so the counts are too; the bounds are five standard deviations
// wide.
func TestRedialerSpreadsBySeed(t *testing.T) {
	addrs := []string{"a:1", "b:2", "c:3"}
	first := map[string]int{}
	next := map[string]map[string]int{}
	for i := range 3000 {
		r := &Redialer{Addrs: addrs, Seed: fmt.Sprintf("node-%d", i)}
		eps := r.endpoints(context.Background())
		first[eps[0].addr]++
		if next[eps[0].addr] == nil {
			next[eps[0].addr] = map[string]int{}
		}
		next[eps[0].addr][eps[1].addr]++
	}
	for _, a := range addrs {
		if n := first[a]; n < 1000-5*26 || n > 1000+5*26 {
			t.Errorf("%d of 3000 agents start on %s, want about 1000: %v", n, a, first)
		}
		for b, n := range next[a] {
			if n < first[a]/2-5*18 || n > first[a]/2+5*18 {
				t.Errorf("%d of %s's %d agents move to %s, want about half: %v", n, a, first[a], b, next[a])
			}
		}
	}
	// Without a seed, the order given.
	r := &Redialer{Addrs: addrs}
	if eps := r.endpoints(context.Background()); eps[0].addr != "a:1" || eps[2].addr != "c:3" {
		t.Errorf("without Seed: %v, want the order given", eps)
	}
}

// A host name with several records is several coordinators: the agent
// tries each address, with the name as the TLS server name, and resolves
// the name again once it went round.
func TestRedialerTriesEveryRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log dialLog
		var lookups []string
		var mu sync.Mutex
		r := &Redialer{Addrs: []string{"coord.test:7443"}, Seed: "node-1",
			Backoff: Backoff{Base: time.Millisecond, Max: time.Millisecond},
			Resolve: func(ctx context.Context, host string) ([]string, error) {
				mu.Lock()
				defer mu.Unlock()
				lookups = append(lookups, host)
				return []string{"10.0.0.3", "10.0.0.1", "fd00::2"}, nil
			}}
		runDials(t, r, &log, 4, func(int) error { return errors.New("unreachable") }, func(int) error { return nil })
		tried := slices.Sorted(slices.Values(log.addrs[:3]))
		if want := []string{"10.0.0.1:7443", "10.0.0.3:7443", "[fd00::2]:7443"}; !slices.Equal(tried, want) {
			t.Errorf("first round dialed %v, want each record once: %v", log.addrs[:3], want)
		}
		for i, n := range log.names {
			if n != "coord.test" {
				t.Errorf("dial %d: server name %q, want coord.test", i, n)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(lookups) != 2 {
			t.Errorf("%d lookups for 4 dials of 3 records, want 2 (one a round)", len(lookups))
		}
	})
	// Agents spread over the records.
	counts := map[string]int{}
	for i := range 900 {
		r := &Redialer{Addrs: []string{"coord.test:7443"}, Seed: fmt.Sprintf("node-%d", i),
			Resolve: func(context.Context, string) ([]string, error) {
				return []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, nil
			}}
		counts[r.endpoints(context.Background())[0].addr]++
	}
	for a, n := range counts {
		if n < 300-5*14 || n > 300+5*14 {
			t.Errorf("%d of 900 agents start on %s, want about 300: %v", n, a, counts)
		}
	}
}

// A downtime's refusals do not grow the backoff: the first other failure
// after them (a handshake cut once the coordinator listens again) waits
// within a window of the order of RefusedMax, not the 30 s cap.
func TestRedialerRefusalsDoNotEscalate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log dialLog
		r := &Redialer{Addrs: []string{"a:1"},
			Backoff: Backoff{Base: 500 * time.Millisecond, Max: 30 * time.Second, Rand: func() float64 { return 0.99 }}}
		runDials(t, r, &log, 22, func(k int) error {
			if k <= 20 {
				return fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
			}
			return errors.New("TLS handshake: connection reset")
		}, func(int) error { return nil })
		if g := log.gaps()[20]; g > 2*time.Second {
			t.Errorf("wait after a failure that followed 20 refusals: %v, want within 2 s", g)
		}
	})
}

// Refusals that go on for longer than RefusedFor are no restart: the
// window grows from RefusedMax as after any failure, up to the cap,
// instead of a dial about every second forever. Within RefusedFor it
// stays within RefusedMax, so a restarted coordinator is found at once.
func TestRedialerLongRefusalsBackOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log dialLog
		r := &Redialer{Addrs: []string{"a:1"},
			Backoff: Backoff{Base: 500 * time.Millisecond, Max: 30 * time.Second, Rand: func() float64 { return 0.99 }}}
		start := time.Now()
		runDials(t, r, &log, 50, func(int) error { return fmt.Errorf("dial: %w", syscall.ECONNREFUSED) }, func(int) error { return nil })
		var slow int
		for i, g := range log.gaps() {
			at := log.at[i].Sub(start)
			switch {
			case at < DefaultRefusedFor && g > time.Second:
				t.Errorf("wait %d, %v into the refusals: %v, want within RefusedMax (1 s)", i, at, g)
			case g > 30*time.Second:
				t.Errorf("wait %d: %v, past the 30 s cap", i, g)
			case g >= 10*time.Second:
				slow++
			}
		}
		if slow == 0 {
			t.Errorf("no wait of 10 s or more in %d refusals over %v: want the backoff to grow once refusals last past %v", len(log.gaps()), log.at[len(log.at)-1].Sub(start), DefaultRefusedFor)
		}
		// RefusedFor negative: no bound, the cap holds throughout.
		log = dialLog{}
		r.RefusedFor = -1
		runDials(t, r, &log, 50, func(int) error { return fmt.Errorf("dial: %w", syscall.ECONNREFUSED) }, func(int) error { return nil })
		if g := slices.Max(log.gaps()); g > time.Second {
			t.Errorf("RefusedFor -1: a wait of %v, want all within RefusedMax", g)
		}
	})
}

// A proxy that refuses connections is down, not a coordinator restarting:
// the agent backs off from it as from any failure (a refused proxy used
// to be redialed about once a second forever). The error is a real one,
// from a WebSocketDialer pointed at a proxy port nothing listens on.
func TestRedialerRefusedProxyBacksOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyURL := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	ln.Close()
	client, _ := tlsConfigs(t)
	d := &WebSocketDialer{TLS: client, Proxy: func(*url.URL) (*url.URL, error) { return proxyURL, nil }, PingInterval: -1}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	_, proxyErr := d.Dial(ctx, "coord.test:7443")
	var pe *ProxyDialError
	if !errors.As(proxyErr, &pe) || !errors.Is(proxyErr, syscall.ECONNREFUSED) {
		t.Fatalf("dial through a closed proxy port: %v; want a *ProxyDialError wrapping ECONNREFUSED", proxyErr)
	}
	if isRefused(proxyErr) {
		t.Fatalf("a refused proxy counts as a refused coordinator: %v", proxyErr)
	}
	// As an agent with two transports reports it: tls refused by the
	// coordinator's host, wss by the proxy. Not every transport says the
	// coordinator restarts.
	refused := fmt.Errorf("tunnel: dial coord.test:7443: %w", syscall.ECONNREFUSED)
	if isRefused(errors.Join(fmt.Errorf("tls: %w", refused), fmt.Errorf("wss: %w", proxyErr))) {
		t.Error("tls refused and wss's proxy refused counts as a refused coordinator")
	}
	if !isRefused(errors.Join(fmt.Errorf("tls: %w", refused), fmt.Errorf("wss: %w", refused))) {
		t.Error("both transports refused by the coordinator's host does not count as a refusal")
	}
	synctest.Test(t, func(t *testing.T) {
		var log dialLog
		r := &Redialer{Addrs: []string{"coord.test:7443"},
			Backoff: Backoff{Base: 500 * time.Millisecond, Max: 30 * time.Second, Rand: func() float64 { return 0.99 }}}
		runDials(t, r, &log, 9, func(int) error { return proxyErr }, func(int) error { return nil })
		if last := log.gaps()[len(log.gaps())-1]; last < 10*time.Second {
			t.Errorf("8th wait after a refused proxy: %v, want the exponential window (about 30 s)", last)
		}
	})
}
