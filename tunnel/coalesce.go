package tunnel

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
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

	// synHolds counts the stream opens whose SYN may wait for the next
	// frame (Session.OpenGated arms one before it opens a stream whose
	// header follows at once): such a SYN is kept in syn and written
	// in front of whatever the send loop writes next, so a stream's SYN
	// and its header leave in one write and reach the peer in one read
	// (the peer's accept then finds the header already buffered). Only
	// the send loop touches syn and holding; synHolds is armed by
	// openers.
	synHolds atomic.Int32
	syn      [yamuxHeaderSize]byte
	holding  bool
}

// armSYNHold lets the next stream SYN wait for the frame after it. The
// caller must make sure a frame follows (the stream's header, or its
// close); disarmSYNHold takes an unused arming back.
func (c *coalesceConn) armSYNHold() { c.synHolds.Add(1) }

// disarmSYNHold takes back one arming that no SYN used (the open
// failed), if any is left.
func (c *coalesceConn) disarmSYNHold() {
	for {
		n := c.synHolds.Load()
		if n <= 0 || c.synHolds.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// takeSYNHold reports whether the window update p opening a stream may
// be held, using up one arming. A SYN uses up its arming even when it
// cannot be held (a SYN is held already, and leaves with it; a stock or
// framing transport), so that no arming outlives its SYN and holds a
// later one that no frame is promised to follow.
func (c *coalesceConn) takeSYNHold(p []byte) bool {
	if p[1] != yamuxTypeWindowUpdate || binary.BigEndian.Uint16(p[2:4])&yamuxFlagSYN == 0 {
		return false
	}
	for {
		n := c.synHolds.Load()
		if n <= 0 {
			return false
		}
		if c.synHolds.CompareAndSwap(n, n-1) {
			return !c.stock && c.frames == nil && !c.holding
		}
	}
}

// release writes a held SYN in front of p (one Write) and returns p's
// count; with nothing held it writes p alone.
func (c *coalesceConn) release(p []byte) (int, error) {
	if !c.holding {
		return c.Conn.Write(p)
	}
	c.holding = false
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	if len(p) > coalesceMax-yamuxHeaderSize {
		if _, err := c.Conn.Write(c.syn[:]); err != nil {
			return 0, err
		}
		return c.Conn.Write(p)
	}
	b := append(append((*bp)[:0], c.syn[:]...), p...)
	n, err := c.Conn.Write(b)
	return max(n-yamuxHeaderSize, 0), err
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
		return c.release(p)
	}
	if c.flow != nil {
		c.flow.send(p)
	}
	if c.takeSYNHold(p) {
		copy(c.syn[:], p)
		c.holding = true
		return len(p), nil
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
	return c.release(p)
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
	bp := bufPool.Get().(*[]byte)
	b := (*bp)[:0]
	if c.holding {
		c.holding = false
		b = append(b, c.syn[:]...)
	}
	b = append(b, c.hdr[:]...)
	n := min(len(p), coalesceMax-len(b))
	b = append(b, p[:n]...)
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
