package tunnel

import (
	"encoding/binary"
	"net"
	"sync"
)

// yamux frame header layout (hashicorp/yamux spec.md): version uint8,
// type uint8, flags uint16, stream id uint32, length uint32, all big endian.
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
	// coalesceMax bounds how much of a body is copied next to the header:
	// one TLS record's worth (16 KiB of plaintext), so the header rides in
	// the first record and the rest of a large body is written straight
	// from yamux's buffer. Copying more only adds memmove for bodies that
	// span several records anyway.
	coalesceMax = 16 << 10
)

// bufPool holds coalescing buffers of coalesceMax bytes. They are borrowed
// for one Write and returned, so an idle session holds none: with a thousand
// mostly idle agents per coordinator, a buffer per session would cost more
// than the rest of the session.
var bufPool = sync.Pool{New: func() any { b := make([]byte, coalesceMax); return &b }}

// coalesceConn merges each yamux data-frame header with the first part of its
// body into one Write, and shows every frame it writes to the session's flow
// telemetry (flow.go). It relies on one fact of yamux's send loop: a data
// header with a non-zero length is always followed, by the same goroutine,
// by a Write of exactly that body. Every other write passes through.
//
// It is used only by the yamux send loop, which is a single goroutine, so it
// needs no lock.
type coalesceConn struct {
	net.Conn
	cork    *corkConn   // the transport beneath the TLS, if made with Cork; else nil
	frames  frameWriter // the transport writes a frame itself (WebSocket); else nil
	hdr     [yamuxHeaderSize]byte
	pending bool // hdr holds a data header awaiting its body
	// stock writes each header and body as yamux does (benchmarks of what
	// coalescing saves), still feeding flow.
	stock bool
	// flow is the session's flow telemetry (flow.go), fed every header
	// written and the bytes of each body in the connection's hands; nil
	// when the session tracks no streams.
	flow *flowState
}

func (c *coalesceConn) Write(p []byte) (int, error) {
	if c.pending {
		c.pending = false
		n, err := c.writeBody(p)
		if c.flow != nil {
			c.flow.queueEnd()
		}
		return n, err
	}
	if len(p) != yamuxHeaderSize {
		return c.Conn.Write(p)
	}
	if c.flow != nil {
		c.flow.send(p)
	}
	if p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:12]) > 0 {
		if c.flow != nil {
			c.flow.queueStart(int64(binary.BigEndian.Uint32(p[8:12])))
		}
		c.pending = true
		if c.stock {
			n, err := c.Conn.Write(p)
			if err != nil && c.flow != nil {
				c.flow.queueEnd() // yamux writes no body after a failed header
			}
			return n, err
		}
		copy(c.hdr[:], p)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// writeBody writes a data frame's body p, with the header held in hdr
// unless stock.
func (c *coalesceConn) writeBody(p []byte) (int, error) {
	if c.stock {
		return c.Conn.Write(p)
	}
	if c.frames != nil {
		return c.frames.writeFrame(c.hdr[:], p)
	}
	if c.cork != nil {
		c.cork.cork()
		n, err := c.writeFrame(p)
		if uerr := c.cork.uncork(); err == nil && uerr != nil {
			return 0, uerr
		}
		return n, err
	}
	return c.writeFrame(p)
}

// frameWriter is a transport that sends a data frame's header and body
// together better than one Write of both: the WebSocket transport makes
// them one message, copied once into its frame buffer.
type frameWriter interface {
	// writeFrame writes hdr then body and returns the bytes of body
	// written.
	writeFrame(hdr, body []byte) (int, error)
}

// writeFrame writes the pending header and body p: the header with the
// body's first part in one Write, then the rest.
func (c *coalesceConn) writeFrame(p []byte) (int, error) {
	n := min(len(p), coalesceMax-yamuxHeaderSize)
	bp := bufPool.Get().(*[]byte)
	b := append(append((*bp)[:0], c.hdr[:]...), p[:n]...)
	_, err := c.Conn.Write(b)
	bufPool.Put(bp)
	if err != nil {
		return 0, err
	}
	if n == len(p) {
		return len(p), nil
	}
	m, err := c.Conn.Write(p[n:])
	return n + m, err
}
