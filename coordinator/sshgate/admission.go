package sshgate

import (
	"net"
	"net/netip"
	"sync"
)

// admission bounds the connections in their SSH handshake (accepted, not
// yet authenticated): at most max in all and perSource from one source
// (sourceOf). It is the tunnel's pre-auth admission
// (coordinator/admission.go) for SSH clients: when all max places are
// taken, a newcomer whose source holds at least two fewer handshakes than
// the busiest source takes the place of that source's oldest handshake,
// which is cut; otherwise it is refused. So a burst from one source cannot
// keep another source's client out, and the only handshake of a source is
// never cut. Every handshake is also cut at Config.HandshakeTimeout.
//
// It is safe for concurrent use; mu is a leaf lock.
type admission struct {
	max, perSource int

	mu       sync.Mutex
	total    int
	bySource map[netip.Prefix][]*pending // oldest first
}

// pending is one connection in its handshake.
type pending struct {
	conn     net.Conn
	source   netip.Prefix
	admitted bool // holds a place; guarded by admission.mu
}

func newAdmission(max, perSource int) *admission {
	return &admission{max: max, perSource: perSource, bySource: map[netip.Prefix][]*pending{}}
}

// Refusals of admission.enter, also labels of
// tether_ssh_connections_total.
const (
	connSourceLimit = "source_limit" // perSource handshakes of its source in progress
	connOverload    = "overload"     // max handshakes in progress, none to cut
)

// enter admits p, or returns why it is refused. When admitting p cut
// another handshake, that one is returned as victim; the caller closes its
// conn. An admitted p must leave when its handshake ends.
func (a *admission) enter(p *pending) (victim *pending, refused string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mine := len(a.bySource[p.source])
	if mine >= a.perSource {
		return nil, connSourceLimit
	}
	if a.total >= a.max {
		var busiest netip.Prefix
		most := 0
		for src, l := range a.bySource {
			if len(l) > most {
				busiest, most = src, len(l)
			}
		}
		// The busiest source must keep at least as many handshakes as the
		// newcomer's will have, or newcomers would cut each other forever.
		if most-1 < mine+1 {
			return nil, connOverload
		}
		victim = a.bySource[busiest][0]
		a.remove(busiest, 0)
		victim.admitted = false
	}
	a.bySource[p.source] = append(a.bySource[p.source], p)
	a.total++
	p.admitted = true
	return victim, ""
}

// leave releases p's place, if it still holds one.
func (a *admission) leave(p *pending) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !p.admitted {
		return
	}
	p.admitted = false
	for i, x := range a.bySource[p.source] {
		if x == p {
			a.remove(p.source, i)
			return
		}
	}
}

// remove deletes the i-th handshake of src. a.mu must be held.
func (a *admission) remove(src netip.Prefix, i int) {
	l := a.bySource[src]
	l = append(l[:i:i], l[i+1:]...)
	if len(l) == 0 {
		delete(a.bySource, src)
	} else {
		a.bySource[src] = l
	}
	a.total--
}

// sourceOf is the source a connection's handshakes are counted against:
// its IPv4 address (also written as an IPv4-mapped IPv6 address), or the
// /64 of its IPv6 address (one IPv6 host is routinely given a whole /64).
// Addresses that are not IP (pipes in tests) share the zero source.
func sourceOf(addr net.Addr) netip.Prefix {
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
