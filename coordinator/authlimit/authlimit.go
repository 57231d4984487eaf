// Package authlimit throttles failed authentication per source IP: the
// console's login form and bearer tokens, and the sandbox facades'
// tether-token (review F15: 600 wrong guesses went through in 0.35 s).
//
// Each source IP (the connection's remote address, an IPv6 one taken as
// its /64: see Key; X-Forwarded-For and other proxy headers are never
// read) has a token bucket of Burst
// failures, refilled at one failure per Every. A failed credential check
// takes one; while the bucket holds less than one, every request of that
// IP carrying a credential is refused (HTTP 429 with Retry-After, gRPC
// ResourceExhausted) before its credential is checked: also a correct
// one, or the refusal would tell a guess that hit from one that missed.
// A success never takes from the bucket. Requests without credentials
// (the loopback identity) are not the limiter's business.
//
// Memory is bounded: at most MaxTracked IPs are tracked; beyond that the
// least recently failing one is forgotten (an IP whose bucket refilled is
// dropped first, as it is equivalent to an untracked one).
package authlimit

import (
	"container/list"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/tetherfleet/tether/internal/admission"
)

// The defaults (Config's zero values): 10 failures at once, then one a
// second, per source IP; 4096 IPs tracked.
const (
	DefaultBurst      = 10
	DefaultEvery      = time.Second
	DefaultMaxTracked = 4096
)

// Config configures a Limiter; zero fields take the defaults above.
type Config struct {
	// Listener names what the limiter guards ("console", "opensandbox",
	// "openshell"): the listener label of tether_auth_throttled_total and
	// the log's.
	Listener string
	// Burst is how many failures an IP may have at once (>= 1).
	Burst int
	// Every is how often an IP gains back one failure (> 0).
	Every time.Duration
	// MaxTracked bounds the IPs tracked (>= 1).
	MaxTracked int
	// Logger receives one warning per IP each time it becomes throttled;
	// nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Limiter counts failures per source IP (package doc). Safe for
// concurrent use. Its zero value is not usable: use New.
type Limiter struct {
	cfg       Config
	log       *slog.Logger
	throttled prometheus.Counter

	mu    sync.Mutex
	byIP  map[string]*list.Element // of *entry
	order *list.List               // front: most recently failed
}

// entry is one tracked IP.
type entry struct {
	ip     string
	bucket *rate.Limiter
	// logged: this throttled spell was logged already (reset when the
	// IP may fail again).
	logged bool
}

// New returns a Limiter of cfg (zero fields: the defaults).
func New(cfg Config) *Limiter {
	if cfg.Burst < 1 {
		cfg.Burst = DefaultBurst
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.MaxTracked < 1 {
		cfg.MaxTracked = DefaultMaxTracked
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &Limiter{cfg: cfg, log: cfg.Logger, byIP: make(map[string]*list.Element), order: list.New()}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.throttled = prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "tether_auth_throttled_total",
		Help:        "Requests carrying credentials refused unchecked because their source IP failed authentication too often (10 failures at once, then one a second, per IP), by listener.",
		ConstLabels: prometheus.Labels{"listener": cfg.Listener},
	})
	return l
}

// Register registers the limiter's counter, tether_auth_throttled_total
// with its listener label, with reg (limiters of different listeners may
// share one registry).
func (l *Limiter) Register(reg prometheus.Registerer) error {
	return reg.Register(l.throttled)
}

// Key returns the source a connection's remote address ("host:port", as
// http.Request.RemoteAddr or a gRPC peer's Addr) is throttled as: its
// IPv4 address ("192.0.2.1", also for an IPv4-mapped IPv6 address), or
// the /64 of its IPv6 address ("2001:db8::/64"), as the tunnel's
// handshake limit counts sources (admission.SourcePrefix): one IPv6 host
// is routinely given a whole /64, and keyed per address a guesser would
// have 2^64 buckets. A remote that is no IP address (a Unix socket's "@"
// or "") is returned as it is, its host part if it has a port.
func Key(remote string) string {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	p := admission.SourcePrefix(ip)
	if p.Addr().Is4() {
		return p.Addr().String()
	}
	return p.String()
}

// Check reports whether ip may have its credential checked now. When it
// may not, it returns the wait until it may (rounded up to whole seconds,
// at least one: the Retry-After), counts the refusal and logs the first
// refusal of each throttled spell with the source.
func (l *Limiter) Check(ip string) (retryAfter time.Duration, ok bool) {
	now := l.cfg.Now()
	l.mu.Lock()
	el := l.byIP[ip]
	if el == nil {
		l.mu.Unlock()
		return 0, true
	}
	e := el.Value.(*entry)
	tokens := e.bucket.TokensAt(now)
	if tokens >= 1 {
		e.logged = false
		l.mu.Unlock()
		return 0, true
	}
	first := !e.logged
	e.logged = true
	l.mu.Unlock()
	wait := time.Duration(math.Ceil((1-tokens)*float64(l.cfg.Every)/float64(time.Second))) * time.Second
	wait = max(wait, time.Second)
	l.throttled.Inc()
	if first {
		l.log.Warn(l.cfg.Listener+": authentication throttled: too many failed credentials from one source IP; its requests with credentials are refused unchecked (429/ResourceExhausted) until it waits",
			"listener", l.cfg.Listener, "remote", ip, "retry_after_seconds", strconv.FormatInt(int64(wait/time.Second), 10),
			"burst", l.cfg.Burst, "every", l.cfg.Every.String())
	}
	return wait, false
}

// Fail records a failed credential check of ip: it takes one from ip's
// bucket (tracking ip, and forgetting another if MaxTracked are tracked).
func (l *Limiter) Fail(ip string) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expireLocked(now)
	if el := l.byIP[ip]; el != nil {
		l.order.MoveToFront(el)
		el.Value.(*entry).bucket.AllowN(now, 1)
		return
	}
	for len(l.byIP) >= l.cfg.MaxTracked {
		l.evictLocked(now)
	}
	b := rate.NewLimiter(rate.Every(l.cfg.Every), l.cfg.Burst)
	b.AllowN(now, 1)
	l.byIP[ip] = l.order.PushFront(&entry{ip: ip, bucket: b})
}

// evictLocked forgets one tracked IP: the least recently failing one
// whose bucket refilled, else the least recently failing one. l.mu held.
func (l *Limiter) evictLocked(now time.Time) {
	// Refilled entries are looked for among the oldest few only, so that
	// a Fail stays O(1).
	const scan = 8
	el := l.order.Back()
	for i := 0; i < scan && el != nil; i, el = i+1, el.Prev() {
		if e := el.Value.(*entry); e.bucket.TokensAt(now) >= float64(l.cfg.Burst) {
			l.removeLocked(el)
			return
		}
	}
	l.removeLocked(l.order.Back())
}

// expireLocked forgets the least recently failing IPs whose buckets
// refilled (a few per call: entries expire as new IPs fail). l.mu held.
func (l *Limiter) expireLocked(now time.Time) {
	for range 4 {
		el := l.order.Back()
		if el == nil || el.Value.(*entry).bucket.TokensAt(now) < float64(l.cfg.Burst) {
			return
		}
		l.removeLocked(el)
	}
}

// removeLocked forgets el's IP. l.mu held.
func (l *Limiter) removeLocked(el *list.Element) {
	delete(l.byIP, el.Value.(*entry).ip)
	l.order.Remove(el)
}

// Tracked returns how many IPs the limiter tracks now (tests, metrics).
func (l *Limiter) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byIP)
}

// Throttled returns the limiter's tether_auth_throttled_total counter.
func (l *Limiter) Throttled() prometheus.Counter { return l.throttled }
