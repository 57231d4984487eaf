//go:build linux

// Package peeruidtest makes connections that belong to another local
// user, for tests of callers identified by peeruid.
package peeruidtest

import (
	"context"
	"net"
	"testing"

	"github.com/tetherfleet/tether/internal/sockdiag/sockdiagtest"
)

// Nobody is the uid of the other user the tests dial as.
const Nobody = sockdiagtest.Nobody

// Dialer returns a dial function whose sockets are owned by uid, as if a
// process of that user had made them (sockdiagtest.Dialer: the dial runs
// on a locked thread whose fsuid is uid). It skips t unless the test runs
// as root (setfsuid needs CAP_SETUID).
func Dialer(t testing.TB, uid uint32) func(ctx context.Context, addr string) (net.Conn, error) {
	t.Helper()
	return sockdiagtest.Dialer(t, uid)
}
