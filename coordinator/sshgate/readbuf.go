package sshgate

import (
	"bufio"
	"net"
	"sync/atomic"
)

// clientReadBuf is the read buffer, in bytes, under an authenticated
// client connection's SSH transport (readBuffered).
const clientReadBuf = 64 << 10

// readBuffered is a client connection whose reads go straight to the
// socket until buffer is called, and through a clientReadBuf buffer
// after. x/crypto/ssh reads its transport through a 4 KiB bufio.Reader,
// so a 32 KiB packet (OpenSSH's bulk packets) took at least two read
// system calls, the fill and the rest; with this buffer under it one read
// takes what the socket holds, up to 64 KiB, and the packets are served
// from memory. Only authenticated connections get the buffer, so that
// connections still in their handshake (a flood's) cost no more memory
// than before; a connection holds it until it ends (at most
// Config.MaxConnections of them).
type readBuffered struct {
	net.Conn
	r atomic.Pointer[bufio.Reader]
}

// Read reads from the buffer once buffer was called, from the socket
// before.
func (c *readBuffered) Read(p []byte) (int, error) {
	if r := c.r.Load(); r != nil {
		return r.Read(p)
	}
	return c.Conn.Read(p)
}

// buffer puts the read buffer under the connection's later reads. It is
// called once, by the connection's goroutine, while the transport's own
// goroutine may be reading: a read in progress ends on the socket, and the
// next one takes the buffer, which starts empty, so no byte is lost or
// read twice.
func (c *readBuffered) buffer() {
	c.r.Store(bufio.NewReaderSize(c.Conn, clientReadBuf))
}
