package openshell

import (
	"sync"
	"time"
)

// logInterval is the least time between two warnings of one kind (refused
// :authority values): a client that repeats its mistake, or an attacker,
// must not flood the log.
const logInterval = 10 * time.Second

// logEvery rate-limits one kind of log line to one per logInterval and
// counts the ones it suppressed (opensandbox has the same). The zero value is ready; it is safe for
// concurrent use.
type logEvery struct {
	mu      sync.Mutex
	last    time.Time
	dropped int
}

// allow reports whether to log now, and how many lines were suppressed
// since the last one logged.
func (l *logEvery) allow(now time.Time) (ok bool, dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < logInterval {
		l.dropped++
		return false, 0
	}
	l.last, dropped, l.dropped = now, l.dropped, 0
	return true, dropped
}
