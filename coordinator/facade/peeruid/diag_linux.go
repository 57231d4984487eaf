package peeruid

import (
	"net/netip"

	"github.com/tetherfleet/tether/internal/sockdiag"
)

// diagLookup asks sock_diag (package internal/sockdiag: one exact lookup
// in microseconds, where /proc/net/tcp walks every socket) for the owner
// of the socket whose local end is src (the caller's) and remote end dst
// (ours). found is false when no such socket exists; an error matching
// sockdiag.ErrUnavailable means sock_diag cannot answer here and Lookup
// falls back to /proc.
func diagLookup(src, dst netip.AddrPort) (uid uint32, found bool, err error) {
	s, found, err := sockdiag.Owner(src, dst)
	return s.UID, found, err
}
