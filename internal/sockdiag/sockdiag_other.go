//go:build !linux

package sockdiag

import (
	"fmt"
	"net/netip"
)

// Owner is Linux only: elsewhere it fails with ErrUnavailable.
func Owner(local, remote netip.AddrPort) (Socket, bool, error) {
	return Socket{}, false, fmt.Errorf("owner of the socket %s→%s: %w (Linux only)", local, remote, ErrUnavailable)
}

// Listeners is Linux only: elsewhere it fails with ErrUnavailable.
func Listeners(port uint16) ([]Socket, error) {
	return nil, fmt.Errorf("listeners on port %d: %w (Linux only)", port, ErrUnavailable)
}
