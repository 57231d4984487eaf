package tunnel

import (
	"encoding/binary"
	"net"
)

// yamux frame header layout (hashicorp/yamux spec.md): version uint8,
// type uint8, flags uint16, stream id uint32, length uint32, all big endian.
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
	// coalesceMax bounds how much of a body is copied next to the header.
	// The rest is written straight from yamux's buffer, so a session never
	// holds more than this much extra memory, however large its window.
	coalesceMax = 64 << 10
)

// coalesceConn merges each yamux data-frame header with the first part of its
// body into one Write. It relies on one fact of yamux's send loop: a data
// header with a non-zero length is always followed, by the same goroutine,
// by a Write of exactly that body. Every other write passes through.
//
// It is used only by the yamux send loop, which is a single goroutine, so it
// needs no lock.
type coalesceConn struct {
	net.Conn
	hdr     [yamuxHeaderSize]byte
	pending bool   // hdr holds a data header awaiting its body
	buf     []byte // scratch for header+body, grown up to coalesceMax
}

func (c *coalesceConn) Write(p []byte) (int, error) {
	if c.pending {
		c.pending = false
		n := min(len(p), coalesceMax-yamuxHeaderSize)
		if cap(c.buf) < yamuxHeaderSize+n {
			c.buf = make([]byte, 0, min(coalesceMax, max(4096, 2*(yamuxHeaderSize+n))))
		}
		b := append(append(c.buf[:0], c.hdr[:]...), p[:n]...)
		if _, err := c.Conn.Write(b); err != nil {
			return 0, err
		}
		if n == len(p) {
			return len(p), nil
		}
		m, err := c.Conn.Write(p[n:])
		return n + m, err
	}
	if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:12]) > 0 {
		copy(c.hdr[:], p)
		c.pending = true
		return len(p), nil
	}
	return c.Conn.Write(p)
}
