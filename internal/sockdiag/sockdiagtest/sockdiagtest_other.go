//go:build !linux

package sockdiagtest

import (
	"context"
	"net"
	"testing"
)

// Nobody is the uid of the other user the tests make sockets as.
const Nobody = 65534

// Dialer skips t: a socket of another uid is made on Linux only.
func Dialer(t testing.TB, uid uint32) func(ctx context.Context, addr string) (net.Conn, error) {
	t.Skip("sockets of another uid are made on Linux only")
	return nil
}

// Listen skips t: a socket of another uid is made on Linux only.
func Listen(t testing.TB, uid uint32, addr string) net.Listener {
	t.Skip("sockets of another uid are made on Linux only")
	return nil
}

// Do skips t: a socket of another uid is made on Linux only.
func Do(t testing.TB, uid uint32, f func() error) error {
	t.Skip("sockets of another uid are made on Linux only")
	return nil
}
