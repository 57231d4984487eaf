package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"time"
)

// DialTLS dials addr over TCP and completes a TLS handshake, both bounded by
// ctx. cfg must set ServerName or RootCAs suitable for addr; it is cloned.
func DialTLS(ctx context.Context, addr string, cfg *tls.Config) (net.Conn, error) {
	d := net.Dialer{KeepAlive: 15 * time.Second}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tunnel: dial %s: %w", addr, err)
	}
	c := cfg.Clone()
	if c.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			c.ServerName = host
		}
	}
	tc := tls.Client(Cork(raw), c)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("tunnel: TLS handshake with %s: %w", addr, err)
	}
	return tc, nil
}

// TunedTLS returns a copy of cfg with the settings tunnels want: TLS 1.3 and
// full-size records from the first byte (Go otherwise starts each burst with
// small records, which costs bulk throughput through yamux).
func TunedTLS(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	if c.MinVersion < tls.VersionTLS13 {
		c.MinVersion = tls.VersionTLS13
	}
	c.DynamicRecordSizingDisabled = true
	return c
}

// Backoff is capped exponential backoff with full jitter: the n-th wait
// (from 0) is uniform in [0, min(Max, Base·2ⁿ)). Full jitter spreads a
// thousand agents that lost the same coordinator over the whole window
// instead of letting them reconnect in lockstep.
type Backoff struct {
	Base time.Duration // first window; default 500 ms
	Max  time.Duration // cap on the window; default 30 s
	// Rand returns a float in [0,1); nil uses math/rand/v2. Tests inject it.
	Rand func() float64
}

// Window returns the jitter window of attempt n.
func (b Backoff) Window(n int) time.Duration {
	base, maxd := b.Base, b.Max
	if base <= 0 {
		base = 500 * time.Millisecond
	}
	if maxd <= 0 {
		maxd = 30 * time.Second
	}
	w := base
	for i := 0; i < n && w < maxd; i++ {
		w *= 2
	}
	return min(w, maxd)
}

// Delay returns the wait before attempt n+1.
func (b Backoff) Delay(n int) time.Duration {
	r := b.Rand
	if r == nil {
		r = rand.Float64
	}
	return time.Duration(r() * float64(b.Window(n)))
}

// Redialer keeps a connection to one of several addresses, redialing with
// Backoff after every failure or disconnect.
type Redialer struct {
	// Addrs are tried in turn, starting with the first; required.
	Addrs []string
	// Dial opens a connection to addr; required.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Backoff paces attempts.
	Backoff Backoff
	// StableAfter is how long a connection must have lasted for the backoff
	// to start over from Base. Default 10 s.
	StableAfter time.Duration
	// Logger receives one line per failed attempt; nil discards.
	Logger *slog.Logger
	// OnRetry, if set, is called before each wait (for metrics).
	OnRetry func(attempt int, err error)
}

// Permanent marks err, returned by a Redialer's serve, as one that no
// redial can cure: Run stops and returns err (unwrapped from the mark).
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Run dials until ctx ends. For each connection it calls serve, which owns
// the connection and blocks until it is done with it; then Run waits out the
// backoff and dials again, moving to the next address after a failure. Run
// returns ctx's error, or the error serve marked Permanent (at once, without
// redialing). It runs in the caller's goroutine.
func (r *Redialer) Run(ctx context.Context, serve func(ctx context.Context, conn net.Conn, addr string) error) error {
	if len(r.Addrs) == 0 || r.Dial == nil {
		return errors.New("tunnel: redialer needs Addrs and Dial")
	}
	stable := r.StableAfter
	if stable <= 0 {
		stable = 10 * time.Second
	}
	log := r.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	attempt, idx := 0, 0
	for {
		addr := r.Addrs[idx%len(r.Addrs)]
		conn, err := r.Dial(ctx, addr)
		if err == nil {
			start := time.Now()
			err = serve(ctx, conn, addr)
			if time.Since(start) >= stable {
				attempt = 0
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if pe := (*permanentError)(nil); errors.As(err, &pe) {
			return pe.err
		}
		if err != nil {
			idx++
		}
		delay := r.Backoff.Delay(attempt)
		if err == nil {
			// serve ended the session on purpose (an enrollment done: the
			// next dial presents the new certificate).
			log.Info("tunnel session ended; redialing", "addr", addr, "attempt", attempt+1, "delay", delay.Round(time.Millisecond))
		} else {
			log.Warn("tunnel disconnected; redialing", "addr", addr, "err", err, "attempt", attempt+1, "delay", delay.Round(time.Millisecond))
		}
		if r.OnRetry != nil {
			r.OnRetry(attempt, err)
		}
		attempt++
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
