// Package admission bounds connections in their pre-authentication phase
// (accepted, not yet authenticated) fairly across sources, for every
// listener that authenticates after accepting: the coordinator's tunnel
// listener and its SSH jump host.
//
// A Controller admits at most Max handshakes in all and PerSource from one
// source (SourceOf). When all Max places are taken, a newcomer whose source
// holds at least two fewer handshakes than the busiest source takes the
// place of that source's oldest handshake, which is cut (Enter returns it
// as the victim); otherwise it is refused. So the handshake of a client
// from a source with none in progress is admitted at once unless every
// handshake in progress is the only one of its source, and the only
// handshake of a source is never cut. A flood from a few sources, or from
// many sources with several connections each, cannot keep a client out;
// only one from more distinct sources than Max, each holding a handshake
// open, refuses newcomers, and the listener's handshake deadline cuts each
// of those.
//
// A Pacer (pacer.go) bounds the rate at which handshakes start, a token
// bucket sized from the measured cost of a handshake (HandshakeCost), and
// promises each connection it refuses a slot to come back at; it serves
// light sources before heavy ones, so that a flood cannot lock agents out;
// a storm of agents coming back at once (storm.go) it spreads over
// StormWindow, so that no second holds more than about 36% of it.
package admission

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Refusals of Enter; also metric labels.
const (
	// SourceLimit: PerSource handshakes of the newcomer's source are in
	// progress.
	SourceLimit = "source_limit"
	// Overload: Max handshakes are in progress and none may be cut.
	Overload = "overload"
)

// Ticket is one connection's place in a Controller. Make one per accepted
// connection with NewTicket; its owner reads Evicted to tell a cut
// handshake from a failed one.
type Ticket struct {
	// Source is what the connection counts against (SourceOf).
	Source netip.Prefix
	// Owner is the caller's state of the connection, returned with a
	// victim for the caller to close.
	Owner    any
	admitted bool // holds a place; guarded by the Controller's mu
	evicted  atomic.Bool
}

// NewTicket returns the ticket of an accepted connection, counted against
// SourceOf(remote).
func NewTicket(remote net.Addr, owner any) *Ticket {
	return &Ticket{Source: SourceOf(remote), Owner: owner}
}

// Evicted reports whether Enter cut this ticket's handshake to make room
// for another source.
func (t *Ticket) Evicted() bool { return t.evicted.Load() }

// Controller is the admission of one listener. It is safe for concurrent
// use; its mutex is a leaf lock.
type Controller struct {
	max int

	mu        sync.Mutex
	perSource int // SetPerSource changes it
	total     int
	bySource  map[netip.Prefix][]*Ticket // oldest first
}

// New returns a Controller admitting max handshakes, perSource of them
// from one source.
func New(max, perSource int) *Controller {
	return &Controller{max: max, perSource: perSource, bySource: map[netip.Prefix][]*Ticket{}}
}

// SetPerSource changes the handshakes admitted from one source (at least
// 1). Handshakes already admitted keep their places; a source over the new
// bound is refused until it is back under it.
func (c *Controller) SetPerSource(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.perSource = max(n, 1)
}

// Enter admits t, or returns the reason of its refusal (SourceLimit,
// Overload). When admitting t cut another handshake, that one is returned
// as victim, marked evicted; the caller closes its connection
// (victim.Owner). An admitted t
// must Leave once its handshake ended.
func (c *Controller) Enter(t *Ticket) (victim *Ticket, refused string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	mine := len(c.bySource[t.Source])
	if mine >= c.perSource {
		return nil, SourceLimit
	}
	if c.total >= c.max {
		var busiest netip.Prefix
		most := 0
		for src, l := range c.bySource {
			if len(l) > most {
				busiest, most = src, len(l)
			}
		}
		// Cutting one of the busiest source's handshakes must leave that
		// source with at least as many as the newcomer's will have, or
		// newcomers would take each other's places forever.
		if most-1 < mine+1 {
			return nil, Overload
		}
		victim = c.bySource[busiest][0]
		c.remove(busiest, 0)
		victim.admitted = false
		victim.evicted.Store(true)
	}
	c.bySource[t.Source] = append(c.bySource[t.Source], t)
	c.total++
	t.admitted = true
	return victim, ""
}

// Leave releases t's place, if it still holds one. It may be called more
// than once.
func (c *Controller) Leave(t *Ticket) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !t.admitted {
		return
	}
	t.admitted = false
	for i, x := range c.bySource[t.Source] {
		if x == t {
			c.remove(t.Source, i)
			return
		}
	}
}

// InProgress returns how many handshakes hold a place.
func (c *Controller) InProgress() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// remove deletes the i-th handshake of src. c.mu must be held.
func (c *Controller) remove(src netip.Prefix, i int) {
	l := c.bySource[src]
	l = append(l[:i:i], l[i+1:]...)
	if len(l) == 0 {
		delete(c.bySource, src)
	} else {
		c.bySource[src] = l
	}
	c.total--
}

// SourceOf is the source a connection's handshakes are counted against:
// its IPv4 address (also when written as an IPv4-mapped IPv6 address), or
// the /64 of its IPv6 address, since one IPv6 host is routinely given a
// whole /64. Addresses that are not IP (in-memory pipes) share the zero
// source.
func SourceOf(addr net.Addr) netip.Prefix {
	var ip netip.Addr
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case nil:
		return netip.Prefix{}
	default:
		ap, err := netip.ParseAddrPort(addr.String())
		if err != nil {
			return netip.Prefix{}
		}
		ip = ap.Addr()
	}
	return SourcePrefix(ip)
}

// SourcePrefix is SourceOf's rule for an IP: its IPv4 address as a /32
// (also when written IPv4-mapped), else the /64 of its IPv6 address,
// without zone; the zero Prefix for an invalid address. The auth
// throttle (coordinator/authlimit) keys on it too, so that a guesser with
// a /64 has one bucket, not 2^64.
func SourcePrefix(ip netip.Addr) netip.Prefix {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return netip.Prefix{}
	}
	bits := 64
	if ip.Is4() {
		bits = 32
	}
	p, _ := ip.WithZone("").Prefix(bits)
	return p
}
