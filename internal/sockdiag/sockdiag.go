package sockdiag

import (
	"errors"
	"net/netip"
)

// ErrUnavailable matches (errors.Is) the errors of a query that the
// kernel could not answer: no sock_diag here, or a broken answer.
var ErrUnavailable = errors.New("sock_diag unavailable")

// TCP states of a socket (include/net/tcp_states.h), as Socket.State
// reports them.
const (
	StateEstablished = 1
	StateSynRecv     = 3
	StateTimeWait    = 6
	StateCloseWait   = 8
	StateListen      = 10
	StateNewSynRecv  = 12
)

// Socket is one TCP socket as sock_diag reports it.
type Socket struct {
	// Local and Remote are its ends (Remote is the zero port and an
	// unspecified address for a listener); IPv4-mapped IPv6 addresses
	// are reported as IPv4, wildcards as 0.0.0.0 or ::.
	Local, Remote netip.AddrPort
	// IPv6 is true for an AF_INET6 socket (also when its addresses are
	// IPv4-mapped).
	IPv6 bool
	// State is the TCP state (StateEstablished, StateListen, ...).
	State uint8
	// UID is the owner. The kernel reports 0 for sockets that have no
	// owner of their own yet or any more (StateNewSynRecv, StateTimeWait):
	// callers must check State before trusting UID.
	UID uint32
}

// Serves reports whether the listener l accepts connections to dst: its
// port is dst's and its address is dst's or a wildcard of a family that
// reaches dst (0.0.0.0 for an IPv4 dst; :: for an IPv6 dst and, unless the
// socket is IPv6-only, which sock_diag does not say, an IPv4 one).
func (l Socket) Serves(dst netip.AddrPort) bool {
	if l.State != StateListen || l.Local.Port() != dst.Port() {
		return false
	}
	a, d := l.Local.Addr(), dst.Addr().Unmap()
	switch {
	case a == d:
		return true
	case a.IsUnspecified() && a.Is4():
		return d.Is4()
	case a.IsUnspecified():
		return true // ::, dual-stack unless IPV6_V6ONLY: assumed to serve both
	}
	return false
}
