package policy

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits are one caller's limits.
type Limits struct {
	// MaxConcurrentJobs bounds the caller's jobs running at once
	// (Limiter.Acquire), at least 1.
	MaxConcurrentJobs int
	// RequestsPerSecond is the rate at which the caller's request budget
	// refills (Limiter.Allow), above 0.
	RequestsPerSecond float64
	// Burst is the budget's size: how many requests may come at once after
	// a quiet period, at least 1.
	Burst int

	// Where each limit was set, for messages: a field path and position,
	// or "the built-in default".
	jobsFrom, rateFrom string
}

const builtIn = "the built-in default"

// DefaultLimits returns the limits of a caller for which neither its
// entries nor the policy's defaults set any: 64 concurrent jobs, 50
// requests per second, burst 100.
func DefaultLimits() Limits {
	return Limits{MaxConcurrentJobs: 64, RequestsPerSecond: 50, Burst: 100, jobsFrom: builtIn, rateFrom: builtIn}
}

// over returns base with the limits l sets replaced.
func (l *fileLimits) over(base Limits) Limits {
	from := l.from // built once by the parser: Limits runs on every request
	if l.MaxConcurrentJobs != nil {
		base.MaxConcurrentJobs, base.jobsFrom = *l.MaxConcurrentJobs, from
	}
	if l.RequestsPerSecond != nil {
		base.RequestsPerSecond, base.rateFrom = *l.RequestsPerSecond, from
	}
	if l.Burst != nil {
		base.Burst, base.rateFrom = *l.Burst, from
	}
	return base
}

// Limits returns id's limits: each taken from the first of its entries
// (key, name, account) that sets it, else the policy's defaults, else
// DefaultLimits.
func (p *Policy) Limits(id Identity) Limits {
	var buf [3]*entry
	ents := p.lookup(id, &buf)
	l := p.defaults
	// Apply in reverse so that the first entry's settings win.
	for i := len(ents) - 1; i >= 0; i-- {
		if fl := ents[i].limits; fl != nil {
			l = fl.over(l)
		}
	}
	return l
}

// Limiter enforces Limits per caller: a token bucket of requests and a
// count of running jobs for each Identity.String. The limits are passed on
// each call, so a reloaded policy applies from a caller's next request on
// (the time before it refilled the caller's budget at the old rate; a
// larger burst fills up at the new rate, not at once). State for a
// caller with no running job and a full bucket is dropped from time to
// time, so the Limiter holds state only for recent callers. Safe for
// concurrent use.
type Limiter struct {
	// Now is the clock; nil means time.Now. Set it before first use.
	Now func() time.Time

	metrics *Metrics

	mu      sync.Mutex
	callers map[callerKey]*callerState
	sweepAt int
}

// callerKey is Identity.String's parts, so a lookup builds no string.
type callerKey struct {
	kind Kind
	v    string
}

type callerState struct {
	bucket *rate.Limiter
	rps    float64
	burst  int
	jobs   int
}

// minSweep is the number of callers below which the Limiter never sweeps.
const minSweep = 1024

// NewLimiter returns a Limiter that counts its refusals in m (nil: not
// counted).
func NewLimiter(m *Metrics) *Limiter {
	return &Limiter{metrics: m, callers: map[callerKey]*callerState{}, sweepAt: minSweep}
}

func (l *Limiter) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

func keyOf(id Identity) callerKey {
	v := id.Name
	if v == "" {
		v = id.Key
	}
	return callerKey{id.Kind, v}
}

// state returns id's state, created or updated to lim. l.mu is held.
func (l *Limiter) state(id Identity, lim Limits, now time.Time) *callerState {
	k := keyOf(id)
	s := l.callers[k]
	if s == nil {
		if len(l.callers) >= l.sweepAt {
			l.sweep(now)
		}
		s = &callerState{bucket: rate.NewLimiter(rate.Limit(lim.RequestsPerSecond), lim.Burst), rps: lim.RequestsPerSecond, burst: lim.Burst}
		l.callers[k] = s
		return s
	}
	if s.rps != lim.RequestsPerSecond {
		s.bucket.SetLimitAt(now, rate.Limit(lim.RequestsPerSecond))
		s.rps = lim.RequestsPerSecond
	}
	if s.burst != lim.Burst {
		s.bucket.SetBurstAt(now, lim.Burst)
		s.burst = lim.Burst
	}
	return s
}

// sweep drops idle callers: no running job and a full bucket (forgetting
// them changes nothing). The next sweep waits until the map has doubled,
// so sweeping costs O(1) per new caller. l.mu is held.
func (l *Limiter) sweep(now time.Time) {
	for k, s := range l.callers {
		if s.jobs == 0 && s.bucket.TokensAt(now) >= float64(s.burst) {
			delete(l.callers, k)
		}
	}
	l.sweepAt = max(2*len(l.callers), minSweep)
}

// Allow takes one request from id's budget, or refuses with a *Refusal
// (ReasonRateLimit) naming the limit and where the policy set it. op is
// the request's operation, for the refusal and the metric.
func (l *Limiter) Allow(id Identity, op Operation, lim Limits) error {
	now := l.now()
	l.mu.Lock()
	ok := l.state(id, lim, now).bucket.AllowN(now, 1)
	l.mu.Unlock()
	if ok {
		return nil
	}
	l.metrics.refused(op, ReasonRateLimit)
	return &Refusal{Identity: id, Op: op, Reason: ReasonRateLimit,
		msg: fmt.Sprintf("%s may not %s now: over its limit of %s requests per second (burst %d), set by %s",
			id, op, strconv.FormatFloat(lim.RequestsPerSecond, 'g', -1, 64), lim.Burst, lim.rateFrom)}
}

// Acquire counts one running job of id, or refuses with a *Refusal
// (ReasonJobLimit) when id already runs lim.MaxConcurrentJobs. The caller
// must call release once the job ends; calls after the first do nothing.
func (l *Limiter) Acquire(id Identity, op Operation, lim Limits) (release func(), err error) {
	now := l.now()
	l.mu.Lock()
	s := l.state(id, lim, now)
	if s.jobs >= lim.MaxConcurrentJobs {
		running := s.jobs
		l.mu.Unlock()
		l.metrics.refused(op, ReasonJobLimit)
		return nil, &Refusal{Identity: id, Op: op, Reason: ReasonJobLimit,
			msg: fmt.Sprintf("%s may not %s now: it runs %d %s, its limit max_concurrent_jobs is %d, set by %s",
				id, op, running, plural(running, "job", "jobs"), lim.MaxConcurrentJobs, lim.jobsFrom)}
	}
	s.jobs++
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			s.jobs--
			l.mu.Unlock()
		})
	}, nil
}

// Running returns how many jobs of id are counted as running.
func (l *Limiter) Running(id Identity) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.callers[keyOf(id)]; s != nil {
		return s.jobs
	}
	return 0
}
