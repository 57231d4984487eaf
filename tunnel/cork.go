package tunnel

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"syscall"
)

// Corking: crypto/tls hands each record (at most 16 KiB of plaintext) to the
// connection beneath it as a write of its own, so a 64 KiB yamux frame costs
// four or five write system calls, each of which wakes the peer's reader.
// The session's send loop corks the transport connection around each data
// frame instead: the frame's records gather in a borrowed buffer and leave in
// one write when the frame is done (TCP_CORK's idea, without its 200 ms
// timer: the uncork is explicit). Every other write (handshake, alerts, key
// updates, window updates and pings) passes straight through.

// corkMax is the largest burst gathered before it is written out: the body of
// a 256 KiB frame plus its records' overhead fits. A larger frame goes out in
// several writes of about this size.
const corkMax = 256<<10 + 8<<10

// corkPool holds the gathering buffers. They are borrowed while corked and
// returned at the uncork, so an idle session holds none.
var corkPool = sync.Pool{New: func() any { b := make([]byte, 0, corkMax); return &b }}

// Cork wraps raw, the transport connection a tunnel's TLS will run over (for
// tls.Client or tls.Server), so that a Session over that TLS connection can
// write each frame's records in one system call. Without it a Session works
// the same, one write per record.
func Cork(raw net.Conn) net.Conn {
	return &corkConn{Conn: raw, ahead: aheadReader{rc: rawConnOf(raw)}}
}

// NewListener is tls.NewListener over ln for tunnels: each accepted
// connection is wrapped by Cork beneath its TLS.
func NewListener(ln net.Listener, cfg *tls.Config) net.Listener {
	return tls.NewListener(corkListener{ln}, cfg)
}

type corkListener struct{ net.Listener }

func (l corkListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Cork(c), nil
}

// corkConn gathers writes between cork and uncork. The mutex orders them
// with writes from other goroutines (crypto/tls answers a key update from
// its reader), which join the gathered burst in order.
type corkConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    *[]byte // borrowed while corked and holding bytes

	ahead aheadReader // the read side (readahead.go)
}

// SyscallConn is the transport's, so that what inspects the socket beneath
// the TLS (the coordinator's wait for a first byte before its handshake)
// sees it through the cork. It fails for a transport without one.
func (c *corkConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, fmt.Errorf("tunnel: %T beneath the cork has no file descriptor", c.Conn)
}

// CloseWrite half-closes the transport, when it can (TCP, Unix sockets).
func (c *corkConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("tunnel: %T beneath the cork cannot half-close", c.Conn)
}

// Read reads with read-ahead (readahead.go).
func (c *corkConn) Read(p []byte) (int, error) { return c.ahead.read(c.Conn, p) }

// corkOf returns the corkConn beneath c, a TLS connection made over Cork, or
// nil.
func corkOf(c net.Conn) *corkConn {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil
	}
	k, _ := tc.NetConn().(*corkConn)
	return k
}

func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// uncork writes what was gathered and ends the burst. Its error is the
// first failed write of the burst: crypto/tls saw success for the records it
// gathered, so this is where a broken connection shows.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.flushLocked()
}

func (c *corkConn) flushLocked() error {
	if c.buf == nil {
		return nil
	}
	b := c.buf
	c.buf = nil
	_, err := c.Conn.Write(*b)
	*b = (*b)[:0]
	corkPool.Put(b)
	return err
}

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return c.Conn.Write(p)
	}
	if c.buf != nil && len(*c.buf)+len(p) > corkMax {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) >= corkMax {
		return c.Conn.Write(p)
	}
	if c.buf == nil {
		c.buf = corkPool.Get().(*[]byte)
	}
	*c.buf = append(*c.buf, p...)
	return len(p), nil
}
