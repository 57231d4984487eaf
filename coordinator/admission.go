package coordinator

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

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
