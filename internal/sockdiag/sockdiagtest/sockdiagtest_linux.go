// Package sockdiagtest makes TCP sockets that belong to another local
// user, for tests of code that asks sock_diag who owns a socket.
package sockdiagtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// Nobody is the uid of the other user the tests make sockets as.
const Nobody = 65534

// asUID runs make on a locked thread whose file system uid is uid: the
// kernel records the fsuid of the thread that creates a socket as its
// owner, so the socket belongs to uid as if that user's process had made
// it. It skips t unless the test runs as root (setfsuid needs
// CAP_SETUID).
func asUID[T any](t testing.TB, uid uint32, make func() (T, error)) func() (T, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a socket of another uid is made with setfsuid")
	}
	return func() (T, error) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		prev, _ := unix.SetfsuidRetUid(int(uid))
		defer unix.SetfsuidRetUid(prev)
		if now, _ := unix.SetfsuidRetUid(-1); now != int(uid) {
			var zero T
			return zero, fmt.Errorf("sockdiagtest: setfsuid(%d) left fsuid %d", uid, now)
		}
		return make()
	}
}

// Dialer returns a dial function whose sockets are owned by uid (see
// asUID); it skips t unless the test runs as root.
func Dialer(t testing.TB, uid uint32) func(ctx context.Context, addr string) (net.Conn, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a socket of another uid is made with setfsuid")
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return asUID(t, uid, func() (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		})()
	}
}

// Do runs f on a thread whose file system uid is uid, so that the
// sockets f makes (net.Listen, Accept, Dial) belong to uid; it skips t
// unless the test runs as root.
func Do(t testing.TB, uid uint32, f func() error) error {
	t.Helper()
	_, err := asUID(t, uid, func() (struct{}, error) { return struct{}{}, f() })()
	return err
}

// Listen listens on addr (host:port) with a socket owned by uid, closed
// when t ends; it skips t unless the test runs as root. Connections it
// accepts belong to uid too.
func Listen(t testing.TB, uid uint32, addr string) net.Listener {
	t.Helper()
	ln, err := asUID(t, uid, func() (net.Listener, error) { return net.Listen("tcp", addr) })()
	if err != nil {
		t.Fatalf("sockdiagtest: listen on %s as uid %d: %v", addr, uid, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
