package coordinator

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// admission bounds the agent connections in their handshake (accepted, not
// yet registered or refused): at most max in all and perSource from one
// source (sourceOf). When all max are taken, a newcomer whose source holds
// at least two fewer handshakes than the busiest source takes the place of
// that source's oldest handshake, which is cut; otherwise it is refused. So
// the handshake of an agent from a source with none in progress is admitted
// at once unless every handshake in progress is the only one of its source,
// and the only handshake of a source is never cut. A flood from a few
// sources, or from many sources with several connections each, cannot keep
// an agent out; only one from more distinct sources than max, each holding
// a handshake open, refuses newcomers, and each of its connections is cut
// after FirstByteTimeout when silent, HandshakeTimeout at the latest.
//
// It is safe for concurrent use; mu is a leaf lock.
type admission struct {
	max, perSource int

	mu       sync.Mutex
	total    int
	bySource map[netip.Prefix][]*agentConn // oldest first
}

func newAdmission(max, perSource int) *admission {
	return &admission{max: max, perSource: perSource, bySource: map[netip.Prefix][]*agentConn{}}
}

// enter admits ac, or returns the reason of its refusal (reasonSourceLimit,
// reasonOverload). When admitting ac cut another handshake, that one is
// returned as victim, marked evicted; the caller closes it. An admitted ac
// must leave once its handshake ended.
func (a *admission) enter(ac *agentConn) (victim *agentConn, refused string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mine := len(a.bySource[ac.source])
	if mine >= a.perSource {
		return nil, reasonSourceLimit
	}
	if a.total >= a.max {
		var busiest netip.Prefix
		most := 0
		for src, l := range a.bySource {
			if len(l) > most {
				busiest, most = src, len(l)
			}
		}
		// Cutting one of the busiest source's handshakes must leave that
		// source with at least as many as the newcomer's will have, or
		// newcomers would take each other's places forever.
		if most-1 < mine+1 {
			return nil, reasonOverload
		}
		l := a.bySource[busiest]
		victim = l[0]
		a.remove(busiest, 0)
		victim.admitted = false
		victim.evicted.Store(true)
	}
	a.bySource[ac.source] = append(a.bySource[ac.source], ac)
	a.total++
	ac.admitted = true
	return victim, ""
}

// leave releases ac's place, if it still holds one.
func (a *admission) leave(ac *agentConn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !ac.admitted {
		return
	}
	ac.admitted = false
	for i, x := range a.bySource[ac.source] {
		if x == ac {
			a.remove(ac.source, i)
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

// sourceOf is the source a connection's handshakes are counted against: its
// IPv4 address (also when written as an IPv4-mapped IPv6 address), or the
// /64 of its IPv6 address, since one IPv6 host is routinely given a whole
// /64. Addresses that are not IP (in-memory pipes) share the zero source.
func sourceOf(addr net.Addr) netip.Prefix {
	var ip netip.Addr
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		if addr == nil {
			return netip.Prefix{}
		}
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

// errNoFirstByte is returned by waitFirstByte when the peer closed the
// connection without sending anything.
var errNoFirstByte = errors.New("closed before sending a byte")

// waitFirstByte waits until conn has a byte to read, without consuming it,
// or until deadline (a timeout error). A connection closed or reset before
// its first byte yields errNoFirstByte. Connections it cannot peek at (not
// a socket: in-memory pipes in tests) return nil at once and are bounded by
// the handshake's own deadline only.
func waitFirstByte(conn net.Conn, deadline time.Time) error {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	conn.SetReadDeadline(deadline)
	defer conn.SetReadDeadline(time.Time{})
	var b [1]byte
	var peekErr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN || err == unix.EWOULDBLOCK || err == unix.EINTR:
			return false // not readable yet: wait (until the deadline)
		case err != nil:
			peekErr = errNoFirstByte // reset, or the like
		case n == 0:
			peekErr = errNoFirstByte // orderly close
		}
		return true
	})
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			return errNoFirstByte
		}
		return err
	}
	return peekErr
}
