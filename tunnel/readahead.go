package tunnel

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// Read-ahead beneath TLS: crypto/tls reads the connection into its record
// buffer, about one 16 KiB record per read system call, so a bulk stream
// costs a read per record. Once a read filled what TLS asked for (more is
// likely waiting), the next one takes everything the socket holds, up to
// readAheadMax, into a borrowed buffer with a read that does not wait, and
// serves TLS's reads from it. A read-ahead that finds nothing gives the
// buffer back and waits in a plain read into TLS's own buffer, so a session
// waiting for its peer holds no read-ahead buffer.

// readAheadMax is the size of a read-ahead buffer.
const readAheadMax = 256 << 10

var readAheadPool = sync.Pool{New: func() any { b := make([]byte, readAheadMax); return &b }}

// readAheadOff turns read-ahead off, for benchmarks that measure it.
var readAheadOff atomic.Bool

// aheadReader is corkConn's read side. TLS reads from one goroutine at a
// time (its input lock), so it needs no lock of its own.
type aheadReader struct {
	rc       syscall.RawConn // nil: the transport has no fd; no read-ahead
	buf      *[]byte         // borrowed while it holds unread bytes
	pos, end int
	bulk     bool // the last read filled what was asked
}

// rawConnOf returns the syscall.RawConn of c when c is a TCP or Unix
// socket, possibly inside DialTLS's recorder.
func rawConnOf(c net.Conn) syscall.RawConn {
	if f, ok := c.(*firstBytes); ok {
		c = f.Conn
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

func (r *aheadReader) read(c net.Conn, p []byte) (int, error) {
	if r.buf != nil {
		n := copy(p, (*r.buf)[r.pos:r.end])
		r.pos += n
		if r.pos == r.end {
			readAheadPool.Put(r.buf)
			r.buf = nil
		}
		return n, nil
	}
	if r.bulk && r.rc != nil && len(p) < readAheadMax && !readAheadOff.Load() {
		bp := readAheadPool.Get().(*[]byte)
		var n int
		var rerr error
		err := r.rc.Read(func(fd uintptr) bool {
			n, rerr = syscall.Read(int(fd), *bp)
			return true // never wait: a plain Read below does
		})
		switch {
		case err == nil && rerr == nil && n > 0:
			r.buf, r.pos, r.end = bp, 0, n
			return r.read(c, p)
		case err == nil && (rerr == nil || errors.Is(rerr, syscall.EAGAIN)):
			// Nothing there yet (n == 0 with no error is EOF: the
			// plain read below reports it).
		}
		readAheadPool.Put(bp)
	}
	n, err := c.Read(p)
	r.bulk = n == len(p)
	return n, err
}
