package sshgate

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// clientReadBuf is the read buffer, in bytes, under an authenticated
// client connection's SSH transport when the connection has no file
// descriptor to read ahead on (readBuffered).
const clientReadBuf = 64 << 10

// clientReadAhead is the size, in bytes, of a read-ahead under an
// authenticated client connection in bulk (readBuffered): eight of
// OpenSSH's 32 KiB bulk packets.
const clientReadAhead = 256 << 10

var readAheadPool = sync.Pool{New: func() any { b := make([]byte, clientReadAhead); return &b }}

// readBuffered is a client connection whose reads go straight to the
// socket until buffer is called, and read ahead after. x/crypto/ssh reads
// its transport through a 4 KiB bufio.Reader, so a 32 KiB packet (OpenSSH's
// bulk packets) took at least two read system calls, the fill and the rest.
// Once buffered, a read that filled what was asked (bulk: more is likely
// waiting) makes the next one take everything the socket holds, up to
// clientReadAhead, into a pooled buffer with a read that does not wait,
// and the packets are served from memory; a read-ahead that finds nothing
// gives the buffer back and waits in a plain read, so a connection waiting
// for its client holds no buffer (a ControlMaster's idle connection costs
// no read memory). Only authenticated connections read ahead, and only
// on a plain TCP or Unix socket: any other connection (a listener's
// wrapper, which may hold bytes of its own) gets a clientReadBuf
// bufio.Reader instead, which it holds until it ends (at most
// Config.MaxConnections of them).
type readBuffered struct {
	net.Conn
	on atomic.Bool
	r  atomic.Pointer[bufio.Reader] // the fallback for any other connection
	// The read-ahead: touched only by the transport's reading goroutine
	// (x/crypto/ssh reads a connection from one goroutine).
	rc       syscall.RawConn
	buf      *[]byte // borrowed while it holds unread bytes
	pos, end int
	bulk     bool // the last plain read filled what was asked
}

// Read reads ahead once buffer was called, from the socket before.
func (c *readBuffered) Read(p []byte) (int, error) {
	if r := c.r.Load(); r != nil {
		return r.Read(p)
	}
	if !c.on.Load() {
		return c.Conn.Read(p)
	}
	if c.buf != nil {
		n := copy(p, (*c.buf)[c.pos:c.end])
		c.pos += n
		if c.pos == c.end {
			readAheadPool.Put(c.buf)
			c.buf = nil
		}
		return n, nil
	}
	if c.bulk && len(p) < clientReadAhead {
		bp := readAheadPool.Get().(*[]byte)
		var n int
		var rerr error
		err := c.rc.Read(func(fd uintptr) bool {
			n, rerr = syscall.Read(int(fd), *bp)
			return true // never wait: the plain Read below does
		})
		if err == nil && rerr == nil && n > 0 {
			c.buf, c.pos, c.end = bp, 0, n
			return c.Read(p)
		}
		// Nothing there yet (EAGAIN), or an end or error that the plain
		// read below reports.
		readAheadPool.Put(bp)
		if rerr != nil && !errors.Is(rerr, syscall.EAGAIN) {
			c.bulk = false
		}
	}
	n, err := c.Conn.Read(p)
	c.bulk = n == len(p)
	return n, err
}

// buffer turns the read-ahead on for the connection's later reads. It is
// called once, by the connection's goroutine, while the transport's own
// goroutine may be reading: a read in progress ends on the socket, and the
// next one reads ahead (or takes the fallback buffer, which starts empty),
// so no byte is lost or read twice.
func (c *readBuffered) buffer() {
	// Only a plain socket: a wrapper that offers its descriptor may hold
	// bytes of its own (a peeked header) that a read of the descriptor
	// would skip.
	var sc syscall.Conn
	switch conn := c.Conn.(type) {
	case *net.TCPConn:
		sc = conn
	case *net.UnixConn:
		sc = conn
	}
	if sc != nil {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc = rc
			c.on.Store(true)
			return
		}
	}
	c.r.Store(bufio.NewReaderSize(c.Conn, clientReadBuf))
}
