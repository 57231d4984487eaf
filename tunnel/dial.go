package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// DialTLS dials addr over TCP and completes a TLS handshake, both bounded by
// ctx. cfg must set ServerName or RootCAs suitable for addr; it is cloned.
// An empty ServerName is the one the Redialer put in ctx for a resolved
// address (ServerNameFrom), else addr's host.
//
// A coordinator that admits agents at a bounded rate may answer, instead
// of its TLS ServerHello, with a busy refusal (protocol.ParseBusyRefusal):
// DialTLS then returns a *RetryAfterError, not authenticated, which the
// Redialer honours.
func DialTLS(ctx context.Context, addr string, cfg *tls.Config) (net.Conn, error) {
	d := net.Dialer{KeepAlive: 15 * time.Second}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tunnel: dial %s: %w", addr, err)
	}
	return HandshakeTLS(ctx, raw, addr, cfg)
}

// HandshakeTLS is DialTLS's second half: the TLS client handshake over
// raw, a connection to addr, bounded by ctx, with DialTLS's server name
// and busy refusal handling. It owns raw: on failure raw is closed.
func HandshakeTLS(ctx context.Context, raw net.Conn, addr string, cfg *tls.Config) (net.Conn, error) {
	c := cfg.Clone()
	if c.ServerName == "" {
		c.ServerName = ServerNameFrom(ctx)
	}
	if c.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			c.ServerName = host
		}
	}
	rec := &firstBytes{Conn: raw}
	tc := tls.Client(Cork(rec), c)
	if err := tc.HandshakeContext(ctx); err != nil {
		defer raw.Close()
		if rerr := readBusyRefusal(ctx, rec, err); rerr != nil {
			return nil, fmt.Errorf("tunnel: TLS handshake with %s: %w", addr, rerr)
		}
		return nil, fmt.Errorf("tunnel: TLS handshake with %s: %w", addr, err)
	}
	return tc, nil
}

// firstBytes records the first bytes read from a connection, for the busy
// refusal that may stand in for a TLS ServerHello.
type firstBytes struct {
	net.Conn
	buf []byte
}

func (f *firstBytes) Read(p []byte) (int, error) {
	n, err := f.Conn.Read(p)
	if room := protocol.BusyRefusalSize - len(f.buf); room > 0 && n > 0 {
		f.buf = append(f.buf, p[:min(n, room)]...)
	}
	return n, err
}

// readBusyRefusal returns the *RetryAfterError of a handshake that failed
// with herr because the server sent a busy refusal, or nil. It reads what
// is missing of the refusal within a second (and ctx).
func readBusyRefusal(ctx context.Context, rec *firstBytes, herr error) error {
	var rh tls.RecordHeaderError
	if !errors.As(herr, &rh) || !protocol.IsBusyRefusalPrefix(rh.RecordHeader[:]) {
		return nil
	}
	b := rec.buf
	if len(b) < protocol.BusyRefusalSize {
		dl := time.Now().Add(time.Second)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		rec.Conn.SetReadDeadline(dl)
		rest := make([]byte, protocol.BusyRefusalSize-len(b))
		if _, err := io.ReadFull(rec.Conn, rest); err != nil {
			return nil
		}
		b = append(b, rest...)
	}
	d, err := protocol.ParseBusyRefusal(b)
	if err != nil {
		return nil
	}
	return &RetryAfterError{After: d}
}

// RetryAfterError is a coordinator's refusal to take a connection now,
// asking the agent to come back after After. Authenticated is false for a
// busy refusal before TLS: the Redialer then bounds After by its backoff
// cap.
type RetryAfterError struct {
	After         time.Duration
	Authenticated bool
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("coordinator busy: retry after %v", e.After)
}

type serverNameKey struct{}

// WithServerName returns ctx carrying name, the TLS server name of the
// address being dialed (a host name the Redialer resolved to that
// address).
func WithServerName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, serverNameKey{}, name)
}

// ServerNameFrom returns the server name WithServerName put in ctx, or "".
func ServerNameFrom(ctx context.Context) string {
	s, _ := ctx.Value(serverNameKey{}).(string)
	return s
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
//
// Order: Addrs, each host name expanded into its addresses by Resolve, are
// tried in an order of the Redialer's own: with Seed set, a permutation of
// them that Seed's hash picks (so a fleet's agents start on different
// coordinators and, when one goes away, spread over the others instead of
// all moving to the next one in the list); without Seed, in the order
// given. Run moves on to the next after a failed dial, a failed session and
// the end of a session, and resolves the names again each time it went
// round.
//
// Waits: after a failure Run waits out Backoff (its window capped by
// RefusedMax while dials are refused outright, for up to RefusedFor);
// after a busy refusal
// (*RetryAfterError) it waits what the coordinator asked, with a little
// jitter (1%), and dials the same address again; after a drain (Moved) it waits
// the drain's stagger and dials the next address, without backoff.
type Redialer struct {
	// Addrs are the coordinators' addresses (host:port); required.
	Addrs []string
	// Dial opens a connection to addr; required. For an address that
	// Resolve produced from a host name, ctx carries that name
	// (ServerNameFrom), which DialTLS verifies the certificate against.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Resolve, if set, looks up a host name of Addrs (not an IP address)
	// and returns its addresses (IPv4 or IPv6, without port), as
	// net.Resolver.LookupHost does; Run dials each. A failed lookup
	// leaves the name as it is, for Dial to fail on. Nil: names are
	// dialed as given (Dial resolves them, trying the records in the
	// resolver's order).
	Resolve func(ctx context.Context, host string) ([]string, error)
	// Seed, if set, picks the order of the addresses (see Redialer): the
	// agent's node id.
	Seed string
	// Backoff paces attempts after failures. Its Max also bounds the wait
	// an unauthenticated busy refusal may ask for.
	Backoff Backoff
	// RefusedMax caps the backoff window after a dial refused outright
	// (ECONNREFUSED: the host is up, no coordinator listens yet, as during
	// its restart), which costs the coordinator's host nothing; once it
	// listens, it paces admissions itself. So agents find a restarted
	// coordinator within RefusedMax. Refusals do not grow the backoff past
	// that window either, so the first other failure after them backs off
	// from there. A refused HTTP proxy (*ProxyDialError) is not such a
	// refusal. Default 1 s; negative: no cap (each refusal backs off like
	// any failure).
	RefusedMax time.Duration
	// RefusedFor bounds how long refusals in a row keep the window within
	// RefusedMax: a coordinator refused for longer is not restarting but
	// gone (or never there), and is then backed off from as after any
	// failure (the window doubling from RefusedMax up to Backoff.Max).
	// The streak ends at any other outcome. Default 30 s; negative: no
	// bound.
	RefusedFor time.Duration
	// StableAfter is how long a connection must have lasted for the backoff
	// to start over from Base. Default 10 s.
	StableAfter time.Duration
	// Logger receives one line per failed attempt; nil discards.
	Logger *slog.Logger
	// OnRetry, if set, is called before each wait (for metrics).
	OnRetry func(attempt int, err error)
}

// DefaultRefusedFor is Redialer.RefusedFor's default: longer than a
// coordinator's restart takes.
const DefaultRefusedFor = 30 * time.Second

// minRetryAfter floors the wait of a busy refusal, so that one asking for
// none cannot make the agent spin.
const minRetryAfter = 20 * time.Millisecond

// MovedError is what a Redialer's serve returns when the coordinator
// drained the session (Moved).
type MovedError struct {
	// After is the wait before the next dial.
	After time.Duration
	// Prefer is the address to dial next, if it is one of the Redialer's;
	// else the next one is.
	Prefer string
}

func (e *MovedError) Error() string {
	return fmt.Sprintf("coordinator drained the session: moving on after %v", e.After)
}

// Moved returns the error serve returns for a session the coordinator
// drained (protocol.Drain): Run dials the next address (prefer, if it is
// one of its own) after the wait, without backoff. The drained session
// may go on while its streams finish: serve hands it to a goroutine of
// its own and returns Moved at once.
func Moved(after time.Duration, prefer string) error {
	return &MovedError{After: after, Prefer: prefer}
}

// endpoint is one address Run dials: addr, and the host name it was
// resolved from ("" when addr is as configured).
type endpoint struct{ addr, name string }

// endpoints expands Addrs (Resolve) and orders them (Seed).
func (r *Redialer) endpoints(ctx context.Context) []endpoint {
	var eps []endpoint
	names := slices.Clone(r.Addrs)
	r.permute(names, "")
	for _, a := range names {
		host, port, err := net.SplitHostPort(a)
		if err != nil || r.Resolve == nil || net.ParseIP(host) != nil {
			eps = append(eps, endpoint{addr: a})
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ips, err := r.Resolve(rctx, host)
		cancel()
		if err != nil || len(ips) == 0 {
			if r.Logger != nil && ctx.Err() == nil {
				r.Logger.Warn("resolve coordinator address", "addr", a, "err", err)
			}
			eps = append(eps, endpoint{addr: a})
			continue
		}
		ips = slices.Compact(slices.Sorted(slices.Values(ips)))
		r.permute(ips, a)
		for _, ip := range ips {
			eps = append(eps, endpoint{addr: net.JoinHostPort(ip, port), name: host})
		}
	}
	return eps
}

// permute shuffles l in the order Seed (and salt) picks; without Seed it
// leaves l alone.
func (r *Redialer) permute(l []string, salt string) {
	if r.Seed == "" || len(l) < 2 {
		return
	}
	h := fnv.New64a()
	h.Write([]byte(r.Seed))
	h.Write([]byte{0})
	h.Write([]byte(salt))
	rng := rand.New(rand.NewPCG(h.Sum64(), 0x7e7e))
	rng.Shuffle(len(l), func(i, j int) { l[i], l[j] = l[j], l[i] })
}

// random returns a float in [0,1) from Backoff.Rand or math/rand/v2.
func (r *Redialer) random() float64 {
	if r.Backoff.Rand != nil {
		return r.Backoff.Rand()
	}
	return rand.Float64()
}

// retryAfter is the wait for a busy refusal: what it asked, bounded by
// Backoff's cap when not authenticated, floored at minRetryAfter, plus up
// to 1% (at most 50 ms) of jitter. The coordinator already gives each
// refused agent a slot of its own, 1/rate apart; more jitter would only
// make agents miss their slots (a token not taken in time is lost once the
// bucket is full, and the agent queues again at the end).
func (r *Redialer) retryAfter(e *RetryAfterError) time.Duration {
	d := e.After
	if !e.Authenticated {
		d = min(d, r.Backoff.Window(1<<10))
	}
	d = max(d, minRetryAfter)
	return d + time.Duration(r.random()*float64(min(d/100, 50*time.Millisecond)))
}

// isRefused reports whether err is a coordinator's host refusing the TCP
// connection outright (ECONNREFUSED: nothing listens, as during a
// restart). A refused proxy (*ProxyDialError) is not: it is down, and the
// coordinator's state unknown. An error that joins several (one per
// transport: errors.Join) is a refusal only if each of them is.
func isRefused(err error) bool {
	switch e := err.(type) {
	case nil:
		return false
	case *ProxyDialError:
		return false
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		for _, x := range errs {
			if !isRefused(x) {
				return false
			}
		}
		return len(errs) > 0
	case interface{ Unwrap() error }:
		return isRefused(e.Unwrap())
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// ErrHandover is what a Redialer's serve returns (or wraps) when it ended
// its session on purpose, for the next dial to carry on: an agent's
// enrollment session, its certificate stored, hands over to its first
// session with that certificate. Run then dials again as after a session
// that ended (the same wait, the next address), but logs it at debug level
// only, for it is no reconnect to report.
var ErrHandover = errors.New("tunnel: session handed over to the next dial")

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
// the connection and blocks until it is done with it (or returns Moved);
// then Run waits (see Redialer) and dials again. Run returns ctx's error,
// or the error serve marked Permanent (at once, without redialing). It
// runs in the caller's goroutine.
func (r *Redialer) Run(ctx context.Context, serve func(ctx context.Context, conn net.Conn, addr string) error) error {
	if len(r.Addrs) == 0 || r.Dial == nil {
		return errors.New("tunnel: redialer needs Addrs and Dial")
	}
	stable := r.StableAfter
	if stable <= 0 {
		stable = 10 * time.Second
	}
	refusedMax := r.RefusedMax
	if refusedMax == 0 {
		refusedMax = time.Second
	}
	refusedFor := r.RefusedFor
	if refusedFor == 0 {
		refusedFor = DefaultRefusedFor
	}
	// refusedSince is when the current streak of refused dials began
	// (zero: none); refusedN counts its dials.
	var refusedSince time.Time
	refusedN := 0
	log := r.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var eps []endpoint
	attempt, idx := 0, 0
	for {
		if idx >= len(eps) {
			eps, idx = r.endpoints(ctx), 0
		}
		ep := eps[idx]
		dctx := ctx
		if ep.name != "" {
			dctx = WithServerName(ctx, ep.name)
		}
		conn, err := r.Dial(dctx, ep.addr)
		if err == nil {
			start := time.Now()
			err = serve(ctx, conn, ep.addr)
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
		var (
			delay time.Duration
			moved *MovedError
			busy  *RetryAfterError
		)
		refused := isRefused(err)
		if !refused {
			refusedSince, refusedN = time.Time{}, 0
		} else {
			if refusedSince.IsZero() {
				refusedSince = time.Now()
			}
			refusedN++
		}
		switch {
		case errors.As(err, &moved):
			idx++
			if i := slices.IndexFunc(eps, func(e endpoint) bool { return e.addr == moved.Prefer }); moved.Prefer != "" && i >= 0 {
				// The preferred address next, then the rest of the round.
				eps, idx = append([]endpoint{eps[i]}, slices.Delete(slices.Clone(eps), i, i+1)...), 0
			}
			attempt = 0
			delay = moved.After + time.Duration(r.random()*float64(min(moved.After/20+time.Millisecond, 500*time.Millisecond)))
			log.Info("coordinator drained the session; moving on", "addr", ep.addr, "delay", delay.Round(time.Millisecond))
		case errors.As(err, &busy):
			// The coordinator promised this agent a slot: come back to
			// the same address for it.
			delay = r.retryAfter(busy)
			log.Debug("coordinator busy; coming back when it asked", "addr", ep.addr, "delay", delay.Round(time.Millisecond))
		default:
			idx++
			w := r.Backoff.Window(attempt)
			grow := true
			if refused && refusedMax > 0 && (refusedFor < 0 || time.Since(refusedSince) < refusedFor) {
				// Refusals do not escalate the backoff past RefusedMax
				// either: the first failure once the coordinator
				// listens again (a handshake cut by its load) must not
				// wait out a window the downtime grew.
				grow = w < refusedMax
				w = min(w, refusedMax)
			}
			delay = time.Duration(r.random() * float64(w))
			switch {
			case errors.Is(err, ErrHandover):
				// An enrollment done: the next dial presents the new
				// certificate. Expected at every first start.
				log.Debug("tunnel session handed over; dialing again", "addr", ep.addr, "reason", err, "delay", delay.Round(time.Millisecond))
			case err == nil:
				// serve ended the session (the coordinator went away).
				log.Info("tunnel session ended; redialing", "addr", ep.addr, "attempt", attempt+1, "delay", delay.Round(time.Millisecond))
			case refused && refusedN&(refusedN-1) != 0:
				// A streak of refused dials (no coordinator listening)
				// warns at its 1st, 2nd, 4th, 8th... dial, not at each
				// (several a second while RefusedMax caps the backoff).
				log.Debug("tunnel dial refused; redialing", "addr", ep.addr, "err", err, "refused_in_a_row", refusedN, "delay", delay.Round(time.Millisecond))
			case refused:
				log.Warn("tunnel disconnected; redialing", "addr", ep.addr, "err", err, "refused_in_a_row", refusedN,
					"refused_for", time.Since(refusedSince).Round(time.Second), "delay", delay.Round(time.Millisecond))
			default:
				log.Warn("tunnel disconnected; redialing", "addr", ep.addr, "err", err, "attempt", attempt+1, "delay", delay.Round(time.Millisecond))
			}
			if grow {
				attempt++
			}
		}
		if r.OnRetry != nil {
			r.OnRetry(attempt, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
