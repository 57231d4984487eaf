package coordinator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Rate of the log lines unauthenticated peers can cause, per message: a
// burst, then one per interval. What is dropped is counted in the next line
// of the same message (attribute "suppressed"), and every refusal is also
// counted in tether_coordinator_auth_failures_total.
const (
	preauthLogBurst    = 3
	preauthLogInterval = 10 * time.Second
	// preauthLogKeys bounds the distinct messages tracked (yamux's messages
	// embed addresses); further messages share one limiter.
	preauthLogKeys = 64
)

// rateLimitedHandler passes at most burst records per message and then one
// per interval, whatever their level, and adds the number dropped since the
// last one passed to the next that does. Handlers derived by WithAttrs and
// WithGroup share its limiters, so per-connection loggers
// (log.With("remote_addr", ...)) are limited together.
type rateLimitedHandler struct {
	h slog.Handler
	s *rateState
}

type rateState struct {
	every time.Duration
	burst int

	mu   sync.Mutex
	keys map[string]*rateKey
	rest rateKey // messages past preauthLogKeys
}

type rateKey struct {
	lim        *rate.Limiter
	suppressed int
}

func newRateLimitedHandler(h slog.Handler, every time.Duration, burst int) *rateLimitedHandler {
	s := &rateState{every: every, burst: burst, keys: map[string]*rateKey{}}
	s.rest.lim = rate.NewLimiter(rate.Every(every), burst)
	return &rateLimitedHandler{h: h, s: s}
}

func (r *rateLimitedHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return r.h.Enabled(ctx, l)
}

func (r *rateLimitedHandler) Handle(ctx context.Context, rec slog.Record) error {
	s := r.s
	s.mu.Lock()
	k := s.keys[rec.Message]
	if k == nil {
		if len(s.keys) < preauthLogKeys {
			k = &rateKey{lim: rate.NewLimiter(rate.Every(s.every), s.burst)}
			s.keys[rec.Message] = k
		} else {
			k = &s.rest
		}
	}
	if !k.lim.Allow() {
		k.suppressed++
		s.mu.Unlock()
		return nil
	}
	n := k.suppressed
	k.suppressed = 0
	s.mu.Unlock()
	if n > 0 {
		rec = rec.Clone()
		rec.AddAttrs(slog.Int("suppressed", n))
	}
	return r.h.Handle(ctx, rec)
}

func (r *rateLimitedHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &rateLimitedHandler{h: r.h.WithAttrs(attrs), s: r.s}
}

func (r *rateLimitedHandler) WithGroup(name string) slog.Handler {
	return &rateLimitedHandler{h: r.h.WithGroup(name), s: r.s}
}
