package admission

import (
	"math"
	"time"
)

// A storm is many agents coming back at once: after a coordinator restart
// (announced with Expect, from the number it held before) or seen as more
// newcomers in a second than the bucket holds. The Pacer spreads a storm's
// admissions evenly over StormWindow from its first arrival, instead of
// admitting it as fast as the rate allows: at the measured rate a fleet of
// a thousand is back in well under a second, all of it within one second,
// which is the herd the pacing exists to break up.
//
// Each agent of a storm is given a point of the storm's schedule when it
// first asks: points are spaced so that the agents expected and not yet
// seen fit in what is left of the window, never closer than 1/Rate (the
// handshake rate stays the upper bound). An agent whose point is now is
// admitted at once; the others are told to come back at their point, and
// the point is kept for their source (a reservation, unlike the bucket's
// slots): coming back at it, or late, they are admitted. A source holds
// one point at a time: its other connections meanwhile (agents behind one
// NAT address, a flood) are paced by the bucket, whose tokens the storm's
// admissions take too, so that Rate bounds both together; so are sources
// past the maxSources the Pacer remembers. So with n agents expected, the
// k-th is admitted about k·StormWindow/n after the first, every agent is
// in within StormWindow (or n/Rate, if longer), and no one-second window
// holds more than 1/StormWindow (about 36%) of them. A storm of no more
// agents than the burst is no storm: the bucket admits them at once.
//
// Without an announcement the storm's size is extrapolated from its
// arrivals: agents find a restarted coordinator within their refused-dial
// window (tunnel.Redialer.RefusedMax, 1 s by default), so the m newcomers
// of the first e of a storm stand for m·demandWindow/e, less the burst
// the bucket admitted before the storm was recognised. That is a guess:
// the share of the busiest second comes nearer 1/StormWindow the larger
// the storm.

// StormWindow is the window a storm's admissions are spread over. A
// one-second window holds at most 1/StormWindow of them (36%); the rest
// of the 40% the fleet target allows is for what happens after admission:
// the agents come back up to 1% late, and handshakes and registrations
// started evenly finish in bunches, most after the coordinator's start
// (make bench-reconnect saw registrations 4 to 6 points above the
// admissions' share). All back within 3 s leaves it no longer.
const StormWindow = 2800 * time.Millisecond

const (
	// demandWindow is the refused-dial window agents redial within
	// (tunnel.Redialer.RefusedMax by default): the span over which a
	// storm that was not announced is taken to arrive, and the window
	// newcomers are counted over to recognise one.
	demandWindow = time.Second
	// minElapsed floors the time a storm's size is extrapolated over, so
	// that its first few arrivals do not stand for an unbounded fleet.
	minElapsed = 50 * time.Millisecond
	// lateGrace is how long a storm's points are kept past the last:
	// agents come back up to 1% (at most 50 ms) after their wait, and on
	// a loaded host their timers fire late.
	lateGrace = time.Second
	// newcomerAfter is how long a source must not have asked to count as
	// a newcomer.
	newcomerAfter = 2 * time.Second
	// slotTolerance is how early an agent may come back for its point and
	// still be admitted: busy refusals carry whole milliseconds, cut down.
	slotTolerance = 5 * time.Millisecond
)

// storm is the schedule of a storm in progress.
type storm struct {
	from, end time.Time // the first arrival; from + StormWindow
	// announced is the number Expect gave (0: none, the size is
	// extrapolated); n is the size the schedule is planned for.
	announced, n int
	k            int       // points given
	pre          int       // the newcomers admitted before it was recognised
	next         time.Time // the next free point
}

// Expect announces that about n agents are coming back now (a restart of
// the coordinator that held them). When n is more than the burst, the
// agents asking from now on are a storm, spread over StormWindow from the
// first of them (see storm.go); an announcement nobody follows within
// StormWindow lapses. A storm in progress takes the larger of the two
// sizes. n of at most the burst announces nothing.
func (p *Pacer) Expect(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if float64(n) <= p.burst {
		return
	}
	if s := p.storm; s != nil {
		s.announced = max(s.announced, n)
		s.n = max(s.n, n)
		return
	}
	p.expect, p.expectAt = n, p.now()
}

// StormSpread returns the window a storm of n agents is spread over:
// StormWindow, or the time Rate takes to admit them when longer; zero for
// n of at most the burst, which are admitted at once.
func (p *Pacer) StormSpread(n int) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if float64(n) <= p.burst {
		return 0
	}
	return max(StormWindow, time.Duration(float64(n)/p.rate*float64(time.Second)))
}

// InStorm reports whether a storm's schedule is in progress.
func (p *Pacer) InStorm() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.storm != nil
}

// admitStorm decides a connection from a source with count c (nil: not
// remembered) during a storm, starting one when an announcement is
// pending or newcomers outnumber the burst; handled is false when the
// bucket decides. p.mu must be held.
func (p *Pacer) admitStorm(c *sourceCount, newcomer bool, now time.Time) (ok bool, wait time.Duration, handled bool) {
	p.endStorm(now)
	if newcomer {
		if now.Sub(p.arrFrom) >= demandWindow {
			p.arrFrom, p.arrN = now, 0
		}
		p.arrN++
	}
	if p.storm == nil && p.expect > 0 && now.Sub(p.expectAt) > StormWindow {
		p.expect = 0 // nobody came
	}
	if p.storm == nil && (p.expect > 0 || float64(p.arrN) > p.burst) {
		// The first point is when the bucket has a token: a storm
		// recognised from its newcomers comes after the burst the bucket
		// admitted.
		first := now
		if p.tokens < 1 {
			first = now.Add(time.Duration((1 - p.tokens) / p.rate * float64(time.Second)))
		}
		p.storm = &storm{from: now, end: now.Add(StormWindow), announced: p.expect, n: p.expect, next: first, pre: p.arrN - 1}
		p.expect = 0
	}
	s := p.storm
	if s == nil || c == nil {
		return false, 0, false
	}
	if !c.slot.IsZero() {
		if c.slot.After(now.Add(slotTolerance)) {
			// Another agent behind the source's address (or one back
			// early): one point per source at a time, so that neither
			// many agents behind a NAT nor a flood from one address take
			// the storm's schedule; the bucket paces the rest.
			return false, 0, false
		}
		c.slot = time.Time{}
		p.take(c)
		return true, 0, true
	}
	point := now
	if s.next.After(point) {
		point = s.next
	}
	s.k++
	if s.announced == 0 {
		// The newcomers of the demand window so far (the burst admitted
		// before the storm was recognised among them) stand for
		// demandWindow's worth.
		if el := now.Sub(p.arrFrom); el < demandWindow {
			el = max(el, minElapsed)
			s.n = max(s.n, int(math.Ceil(float64(p.arrN)*demandWindow.Seconds()/el.Seconds()))-s.pre)
		}
	}
	s.n = max(s.n, s.k)
	// Fit the points still to give (this one's successors: n-k) evenly in
	// what is left of the window; past the window (more agents than
	// expected), at the window's average spacing.
	gap := time.Duration(float64(StormWindow) / float64(s.n))
	if left := s.end.Sub(point); left > 0 && s.announced > 0 {
		gap = left / time.Duration(s.n-s.k+1)
	}
	gap = max(gap, time.Duration(float64(time.Second)/p.rate))
	s.next = point.Add(gap)
	if !point.After(now) {
		p.take(c)
		return true, 0, true
	}
	c.slot = point
	return false, min(point.Sub(now), p.maxWait), true
}

// endStorm ends the storm in progress once its window passed (or every
// agent expected came) and every point given is past, dropping the points
// nobody came back for. p.mu must be held.
func (p *Pacer) endStorm(now time.Time) {
	s := p.storm
	if s == nil || now.Before(s.next.Add(lateGrace)) || (now.Before(s.end) && s.k < s.n) {
		return
	}
	p.storm = nil
	for _, c := range p.recent {
		c.slot = time.Time{}
	}
}

// take counts an admission of c's source during a storm, and takes its
// token from the bucket, which may go into debt: the storm's points are
// never closer than 1/Rate, and what the bucket admits besides (see
// admitStorm) waits until the debt is paid, so that Rate bounds both
// together. p.mu must be held.
func (p *Pacer) take(c *sourceCount) {
	c.n++
	p.tokens = max(p.tokens-1, -p.burst)
}
