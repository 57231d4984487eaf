//go:build linux

// Package peeruidtest makes connections that belong to another local
// user, for tests of callers identified by peeruid.
package peeruidtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// Nobody is the uid of the other user the tests dial as.
const Nobody = 65534

// Dialer returns a dial function whose sockets are owned by uid, as if a
// process of that user had made them: the kernel records the file system
// uid of the thread that creates a socket, so the dial runs on a locked
// thread whose fsuid is uid until the socket exists. It skips t unless
// the test runs as root (setfsuid needs CAP_SETUID).
func Dialer(t testing.TB, uid uint32) func(ctx context.Context, addr string) (net.Conn, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a socket of another uid is made with setfsuid")
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		prev, _ := unix.SetfsuidRetUid(int(uid))
		defer unix.SetfsuidRetUid(prev)
		if now, _ := unix.SetfsuidRetUid(-1); now != int(uid) {
			return nil, fmt.Errorf("peeruidtest: setfsuid(%d) left fsuid %d", uid, now)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}
