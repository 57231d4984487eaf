package admission

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math"
	"math/big"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Pacer admits handshakes at a bounded rate, a token bucket of Rate
// tokens a second holding at most Burst, and tells each one it refuses
// when to come back: the refused are given the bucket's next free slots in
// turn, 1/Rate apart, so that a storm of agents that all dialed at once
// (a coordinator restart) comes back spread over the time the coordinator
// needs to handshake them, instead of retrying on their own backoff.
//
// A slot is a promise, not a reservation: whoever asks first when a token
// is there gets it. A refused agent that comes back late, or finds its
// token taken by a newcomer, is given a new slot at the end of the queue.
//
// Sources (SourceOf) are served fairly: a heavy source, one that was
// admitted more than about twice in the last second or two (a decaying
// count), may take a token only while the bucket is at least half full.
// Heavy sources' slots are promised from a queue of their own, behind the
// light sources' slots promised so far. So a flood
// of connections from a few sources, however fast, cannot keep the agents
// of other sources out (they find the lower half of the bucket, and are
// not queued behind the flood), while a restart storm from many sources, each light, is paced
// at Rate. Many agents behind one address (a NAT) are one heavy source:
// they get the rate the light ones leave.
//
// Many agents coming back at once (a storm: announced by Expect after a
// restart, or more newcomers in a second than the burst) are not admitted
// as fast as the rate allows but spread over StormWindow, each given a
// point of the window of its own (storm.go); the rate stays the upper
// bound.
//
// It is safe for concurrent use; its mutex is a leaf lock.
type Pacer struct {
	maxWait time.Duration // longest retry-after given
	now     func() time.Time

	mu     sync.Mutex
	rate   float64 // tokens per second (SetRate)
	burst  float64 // bucket size
	tokens float64
	last   time.Time // when tokens was computed
	// next is the next slot to promise to a light source, nextHeavy to a
	// heavy one (a queue of their own, so that a flood's promises do not
	// push the light sources' slots back); in the past when none is
	// promised.
	next, nextHeavy time.Time
	// recent are the sources' decaying admission counts (halved every
	// heavyHalfLife), at most maxSources of them.
	recent map[netip.Prefix]*sourceCount

	// The storm (storm.go): the one in progress (nil: none); the size
	// Expect announced for the next one, and when; the newcomers counted
	// since arrFrom.
	storm    *storm
	expect   int
	expectAt time.Time
	arrFrom  time.Time
	arrN     int
}

// sourceCount is a source's admissions, decayed to at; when it last
// asked; the point of the storm it was given (zero: none).
type sourceCount struct {
	n    float64
	at   time.Time
	seen time.Time
	slot time.Time
}

const (
	// heavyCount is the decayed admission count past which a source is
	// heavy.
	heavyCount = 2
	// heavyHalfLife halves a source's count.
	heavyHalfLife = time.Second
	// maxSources bounds the sources a Pacer remembers; past it, a source
	// it does not know is taken for heavy.
	maxSources = 1 << 14
)

// NewPacer returns a Pacer admitting rate handshakes a second (positive),
// burst at once (at least 1), telling the refused to come back within at
// most maxWait. The bucket starts full. now is the clock; nil is
// time.Now.
func NewPacer(rate float64, burst int, maxWait time.Duration, now func() time.Time) *Pacer {
	if now == nil {
		now = time.Now
	}
	b := float64(max(burst, 1))
	return &Pacer{rate: rate, burst: b, maxWait: maxWait, now: now, tokens: b, last: now(), recent: map[netip.Prefix]*sourceCount{}}
}

// heavy reports whether src is a heavy source, and returns its count
// (decayed to now; nil when it is not remembered and there is no room).
// p.mu must be held.
func (p *Pacer) heavy(src netip.Prefix, now time.Time) (bool, *sourceCount) {
	c := p.recent[src]
	if c == nil {
		if len(p.recent) >= maxSources {
			for k, v := range p.recent {
				if decay(v, now) < 0.1 && v.slot.IsZero() {
					delete(p.recent, k)
				}
			}
		}
		if len(p.recent) >= maxSources {
			return true, nil
		}
		c = &sourceCount{at: now}
		p.recent[src] = c
	}
	decay(c, now)
	return c.n >= heavyCount, c
}

// decay brings c's count to now and returns it.
func decay(c *sourceCount, now time.Time) float64 {
	if el := now.Sub(c.at); el > 0 {
		c.n *= math.Exp2(-el.Seconds() / heavyHalfLife.Seconds())
		c.at = now
	}
	return c.n
}

// Admit takes a token for a connection from src and returns true, or
// returns false and how long the caller should be told to wait (at most
// maxWait). The wait is the slot promised to the caller: the time until a
// token is free for it, behind every slot promised before; during a storm,
// its point of the storm's window (storm.go).
func (p *Pacer) Admit(src netip.Prefix) (ok bool, retryAfter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if el := now.Sub(p.last).Seconds(); el > 0 {
		p.tokens = min(p.burst, p.tokens+el*p.rate)
	}
	p.last = now
	heavy, c := p.heavy(src, now)
	// A newcomer: a source that has not asked for a while and holds no
	// point of a storm (an agent back for its point after a long wait is
	// no newcomer).
	newcomer := c == nil || (c.slot.IsZero() && (c.seen.IsZero() || now.Sub(c.seen) > newcomerAfter))
	if c != nil {
		c.seen = now
	}
	if ok, wait, handled := p.admitStorm(c, newcomer, now); handled {
		return ok, wait
	}
	floor := 1.0
	if heavy {
		floor = max(1, p.burst/2)
	}
	if p.tokens >= floor {
		p.tokens--
		if c != nil {
			c.n++
		}
		return true, 0
	}
	gap := time.Duration(float64(time.Second) / p.rate)
	slot := now.Add(time.Duration((floor - p.tokens) / p.rate * float64(time.Second)))
	if heavy {
		// Behind every light source's slot promised so far, in a queue
		// of their own that light sources do not wait behind.
		if p.nextHeavy.After(slot) {
			slot = p.nextHeavy
		}
		if p.next.After(slot) {
			slot = p.next
		}
		p.nextHeavy = slot.Add(gap)
	} else {
		if p.next.After(slot) {
			slot = p.next
		}
		p.next = slot.Add(gap)
	}
	return false, min(slot.Sub(now), p.maxWait)
}

// Rate returns the admission rate, in handshakes a second.
func (p *Pacer) Rate() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate
}

// Burst returns the bucket size.
func (p *Pacer) Burst() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int(p.burst)
}

// SetRate changes the admission rate (positive, handshakes a second) from
// now on. The bucket keeps its tokens; slots already promised stand.
func (p *Pacer) SetRate(rate float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if el := now.Sub(p.last).Seconds(); el > 0 {
		p.tokens = min(p.burst, p.tokens+el*p.rate) // earned at the old rate
	}
	p.last = now
	p.rate = rate
}

var (
	costOnce sync.Once
	cost     time.Duration
)

// HandshakeCost returns the CPU time this machine spends on the server's
// side of one agent handshake, as measured once per process (the first
// call takes about a dozen handshakes' time, some 20 ms): the fastest of
// rounds of a mutual-TLS 1.3 handshake with P-256 certificates over an
// in-memory pipe, halved. The two sides of a pipe take turns, so a round's
// wall time is both sides' CPU time; the server's share of it is about
// half (key exchange, signature, verifying the client's chain). The
// fastest round, not a middle one: wall time only grows with what else
// the host runs meanwhile (on a shared host at load 20 the median read
// 2 ms, four times the idle cost, and the rate a quarter of what the CPUs
// sustain). It leaves out what follows the handshake (the Hello,
// registration), which costs far less.
func HandshakeCost() time.Duration {
	costOnce.Do(func() { cost = measureHandshake(9) })
	return cost
}

// RateFor returns the handshakes a second that share of this machine's
// CPUs (GOMAXPROCS) sustains at the measured HandshakeCost, at least 1.
func RateFor(share float64) float64 {
	c := HandshakeCost().Seconds()
	if c <= 0 {
		c = 1e-3
	}
	return max(1, share*float64(runtime.GOMAXPROCS(0))/c)
}

func measureHandshake(rounds int) time.Duration {
	srv, cli, err := calibrationConfigs()
	if err != nil {
		return time.Millisecond // cannot measure: a typical server's cost
	}
	var ds []time.Duration
	for range rounds {
		a, b := net.Pipe()
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- tls.Server(a, srv).Handshake() }()
		cerr := tls.Client(b, cli).Handshake()
		serr := <-done
		d := time.Since(start)
		a.Close()
		b.Close()
		if cerr == nil && serr == nil {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return time.Millisecond
	}
	return slices.Min(ds) / 2
}

// calibrationConfigs returns throwaway mutual-TLS configurations shaped
// like the tunnel's (TLS 1.3, P-256 certificates).
func calibrationConfigs() (srv, cli *tls.Config, err error) {
	mk := func() (tls.Certificate, *x509.Certificate, error) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, nil, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "calibration"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"calibration"},
			KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			return tls.Certificate{}, nil, err
		}
		x, err := x509.ParseCertificate(der)
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}, x, err
	}
	sc, sx, err := mk()
	if err != nil {
		return nil, nil, err
	}
	cc, cx, err := mk()
	if err != nil {
		return nil, nil, err
	}
	sp, cp := x509.NewCertPool(), x509.NewCertPool()
	sp.AddCert(sx)
	cp.AddCert(cx)
	srv = &tls.Config{Certificates: []tls.Certificate{sc}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: cp, MinVersion: tls.VersionTLS13}
	cli = &tls.Config{Certificates: []tls.Certificate{cc}, RootCAs: sp, ServerName: "calibration", MinVersion: tls.VersionTLS13}
	return srv, cli, nil
}
