package tunnel

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// Readiness without a goroutine: yamux hands a stream's data to whoever is
// blocked in the stream's Read, so a server that reads a rarely used stream
// (the coordinator reading each agent's control stream: a heartbeat every
// 5 s) needs a goroutine parked in Read for every session, a third one
// besides yamux's own receive and send loops. The session instead watches
// the plaintext frames yamux reads (watchConn, the connection beneath
// yamux) and, once yamux has taken in data or a close for a watched
// stream, runs a callback in a short-lived goroutine that reads what is
// buffered without blocking (PollRead) and returns. An idle session so
// holds yamux's two goroutines and nothing else.
//
// When is the data readable? yamux's receive loop reads the connection
// through a bufio.Reader and handles each frame before it reads the next
// one; it asks the connection for more bytes only once every byte it read
// before has been handled (its buffer is empty). So at the entry of each
// Read of watchConn, every frame whose bytes an earlier Read returned is in
// its stream's buffer, save at most the header being read. That entry is
// where the callback is started.

// watchConn parses the yamux frame headers in the bytes it reads, notes
// frames of the watched stream, and starts the watch's callback at the
// entry of the next Read. Its Close runs the close callback once. It is
// read by yamux's receive loop only (one goroutine), so the parser needs no
// lock; watched, pending and the callbacks are shared.
type watchConn struct {
	net.Conn

	// Frame parser state, owned by the reading goroutine.
	hdr  [yamuxHeaderSize]byte
	hn   int    // bytes of hdr gathered
	skip uint32 // body bytes of the current data frame still to pass
	cur  uint32 // stream id of the current data frame

	watched atomic.Uint32 // stream id of the watched stream; 0: none
	pending atomic.Bool   // a watched frame was read: run the callback at the next Read
	run     runner        // the readiness callback

	closeOnce sync.Once
	mu        sync.Mutex
	closed    bool
	onClose   []func()

	// flow is the session's flow-control telemetry (flow.go): the frames
	// read feed its window arithmetic when flow.agg is set.
	flow flowState

	// idle is set when the session has an idle watch (idle.go): each Read
	// that returns data stores its time in lastRead, in nanoseconds since
	// flow.epoch (the session's start, whether or not flow is tracked).
	idle     bool
	lastRead atomic.Int64
}

// yamuxReadBuf is the size of the bufio.Reader yamux reads its connection
// through (bufio's default). Reads of it into its own buffer ask for at
// most this many bytes; larger reads come from a LimitedReader over one
// frame's body (see Read).
const yamuxReadBuf = 4096

// Read reads from the connection beneath, following the frames.
//
// A read that asks for exactly the rest of a data frame's body, more than
// yamuxReadBuf bytes, can only be yamux copying that body into its
// stream's buffer (through bufio, which reads large requests straight into
// the caller's slice, and an io.LimitedReader of the body's length): it is
// read in full and answered with io.EOF beside the bytes. yamux copies a
// body with io.Copy into a bytes.Buffer made for exactly the body's length,
// and bytes.Buffer.ReadFrom, which stops only at an EOF, grows its buffer
// before every read: without the EOF the read that finds the body's end
// doubles the full buffer first (allocating, zeroing and copying twice the
// frame, a seventh of a bulk stream's CPU on each receiving hop). bufio
// hands the EOF on once and forgets it; the LimitedReader ends at it
// anyway. yamux would block for the rest of the body regardless, holding
// the stream's buffer, so reading it in full waits no longer.
func (c *watchConn) Read(p []byte) (int, error) {
	if c.pending.Load() && c.pending.Swap(false) {
		c.run.kick()
	}
	if len(p) > yamuxReadBuf && c.hn == 0 && c.skip == uint32(len(p)) {
		n, err := io.ReadFull(c.Conn, p)
		if n > 0 {
			c.scanAll(p[:n])
		}
		if err == nil {
			err = io.EOF // the body's end (c.skip is 0 now)
		} else if err == io.ErrUnexpectedEOF {
			err = io.EOF // the connection's own end
		}
		return n, err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.scanAll(p[:n])
	}
	return n, err
}

// scanAll is scan while a stream is watched, else scanQuiet.
func (c *watchConn) scanAll(b []byte) {
	if c.idle {
		c.noteRead()
	}
	if c.watched.Load() != 0 {
		c.scan(b)
	} else {
		c.scanQuiet(b)
	}
}

// scan follows the frame boundaries through b, marking pending when a data
// frame's body, or any frame with FIN or RST, of the watched stream passes,
// and hands every header to the flow telemetry (flow.go).
func (c *watchConn) scan(b []byte) {
	w := c.watched.Load()
	for len(b) > 0 {
		if c.skip > 0 {
			k := min(uint32(len(b)), c.skip)
			c.skip -= k
			b = b[k:]
			if c.cur == w {
				c.pending.Store(true)
			}
			continue
		}
		k := copy(c.hdr[c.hn:], b)
		c.hn += k
		b = b[k:]
		if c.hn < yamuxHeaderSize {
			return
		}
		c.hn = 0
		typ, flags, id, length := parseHeader(c.hdr[:])
		if typ == yamuxTypeData {
			c.skip, c.cur = length, id
		}
		if c.flow.agg != nil {
			c.flow.recv(typ, flags, id, length)
		}
		if id == w && (typ == yamuxTypeData || typ == yamuxTypeWindowUpdate) && flags&(yamuxFlagFIN|yamuxFlagRST) != 0 {
			c.pending.Store(true)
		}
	}
}

// scanQuiet keeps the parser in step while nothing is watched, and feeds
// the flow telemetry as scan does.
func (c *watchConn) scanQuiet(b []byte) {
	for len(b) > 0 {
		if c.skip > 0 {
			k := min(uint32(len(b)), c.skip)
			c.skip -= k
			b = b[k:]
			continue
		}
		k := copy(c.hdr[c.hn:], b)
		c.hn += k
		b = b[k:]
		if c.hn < yamuxHeaderSize {
			return
		}
		c.hn = 0
		typ, flags, id, length := parseHeader(c.hdr[:])
		if typ == yamuxTypeData {
			c.skip, c.cur = length, id
		}
		if c.flow.agg != nil {
			c.flow.recv(typ, flags, id, length)
		}
	}
}

// Close closes the connection and starts the close callbacks, once.
func (c *watchConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() {
		c.flow.closeAll()
		c.mu.Lock()
		c.closed = true
		fns := c.onClose
		c.onClose = nil
		c.mu.Unlock()
		for _, fn := range fns {
			go fn()
		}
	})
	return err
}

// addOnClose runs fn in a goroutine of its own once the connection is
// closed, at once if it already is.
func (c *watchConn) addOnClose(fn func()) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		go fn()
		return
	}
	c.onClose = append(c.onClose, fn)
	c.mu.Unlock()
}

// runner runs fn in a goroutine of its own when kicked, never two at once:
// a kick while fn runs makes it run once more after it returned, so no
// readiness is lost between fn's last read and its return.
type runner struct {
	state atomic.Int32 // 0 idle, 1 running, 2 running and kicked again
	fn    func()
}

func (r *runner) kick() {
	for {
		switch r.state.Load() {
		case 0:
			if r.state.CompareAndSwap(0, 1) {
				go r.loop()
				return
			}
		case 1:
			if r.state.CompareAndSwap(1, 2) {
				return
			}
		default:
			return
		}
	}
}

func (r *runner) loop() {
	for {
		r.fn()
		if r.state.CompareAndSwap(1, 0) {
			return
		}
		r.state.Store(1) // was 2: run again
	}
}

// yamux frame type and flags the watch needs (hashicorp/yamux spec.md).
const (
	yamuxTypeWindowUpdate = 1
	yamuxFlagFIN          = 0x4
	yamuxFlagRST          = 0x8
)

// Watch makes the session call fn, in a goroutine of its own, whenever data
// or the peer's close (FIN or RST) of st was received and is readable,
// instead of a goroutine waiting in st.Read: fn reads what is there with
// PollRead and returns. Calls never overlap; a readiness that comes while
// fn runs makes it run once more after it returned. fn also runs once at
// once, for what arrived before Watch. Watch may be called once per
// session. fn must not block on the session's other streams.
func (s *Session) Watch(st *yamux.Stream, fn func()) {
	s.wc.run.fn = fn
	s.wc.watched.Store(st.StreamID())
	// Bytes read but not yet handled when watched was set are handled
	// before the next Read: run fn there too.
	s.wc.pending.Store(true)
	s.wc.run.kick()
}

// OnClose runs fn in a goroutine of its own once the session's connection
// was closed (by either side, a failed ping, the idle watch, a connection
// error), at once if it already was. The session's Done channel is closed
// by then or shortly after.
func (s *Session) OnClose(fn func()) { s.wc.addOnClose(fn) }

// pollDeadline is a read deadline long past: a yamux Read with it returns
// what the stream holds, or ErrTimeout at once instead of waiting.
var pollDeadline = time.Unix(1, 0)

// PollRead reads into p what st holds, without waiting for more: (n, nil)
// with n > 0 when data was buffered, (0, nil) when nothing was, io.EOF
// once the peer closed st and everything was read, and yamux's error for
// a reset stream or a closed session. It leaves st's read deadline in the
// past: a stream read by PollRead is read only by it (see Watch).
func PollRead(st *yamux.Stream, p []byte) (int, error) {
	st.SetReadDeadline(pollDeadline)
	n, err := st.Read(p)
	if errors.Is(err, yamux.ErrTimeout) {
		return n, nil
	}
	return n, err
}
