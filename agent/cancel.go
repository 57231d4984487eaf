package agent

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"sync"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// Out-of-band cancels (protocol.FrameCancelStream). An exec, pty or copy
// stream takes a FrameCancel in band, but that frame waits behind every
// byte the stream already carries: stdin that a command leaves unread fills
// its pipe, the exec's stdin queue and the stream's window, and a cancel
// behind it is never read. So the coordinator also names the stream on the
// control stream, which the agent reads for the whole session
// (readControl), and the operation registered under that stream id is
// stopped as by its own FrameCancel.
//
// yamux stream ids are per session, so each session has its own table
// (streamCancels), found from any of its streams through
// yamux.Stream.Session; the registry (cancelRegistry) holds the tables of
// the sessions whose control stream is being read.

// maxEarlyCancels bounds the cancels a session's table remembers for
// streams not registered (yet): the control frame may overtake the
// stream's header, which is read on the stream's own goroutine, or name a
// stream that already ended. Streams are registered within moments of
// their opening, so a handful is enough; the oldest is forgotten first.
const maxEarlyCancels = 64

// streamCancels is one session's table of cancellable operations by stream
// id. Its zero value is not ready; use newStreamCancels. mu is a leaf lock.
type streamCancels struct {
	mu    sync.Mutex
	m     map[uint32]func()
	early map[uint32]bool // cancelled before registration
	order []uint32        // early's ids, oldest first
}

func newStreamCancels() *streamCancels {
	return &streamCancels{m: map[uint32]func(){}, early: map[uint32]bool{}}
}

// add registers cancel for stream id and returns the function that removes
// it. When a cancel for id came first, cancel is called at once (after add
// returned the lock). cancel must not block, and may be called after the
// removal (a cancel in flight).
func (t *streamCancels) add(id uint32, cancel func()) (remove func()) {
	t.mu.Lock()
	early := t.early[id]
	if early {
		delete(t.early, id)
	} else {
		t.m[id] = cancel
	}
	t.mu.Unlock()
	if early {
		cancel()
		return func() {}
	}
	return func() {
		t.mu.Lock()
		delete(t.m, id)
		t.mu.Unlock()
	}
}

// cancel stops the operation of stream id, or remembers the cancel for a
// registration to come (bounded by maxEarlyCancels). It reports whether an
// operation was registered.
func (t *streamCancels) cancel(id uint32) bool {
	t.mu.Lock()
	f, ok := t.m[id]
	if ok {
		delete(t.m, id)
	} else if !t.early[id] {
		if len(t.order) >= maxEarlyCancels {
			delete(t.early, t.order[0])
			t.order = t.order[1:]
		}
		t.early[id] = true
		t.order = append(t.order, id)
	}
	t.mu.Unlock()
	if ok {
		f()
	}
	return ok
}

// cancelRegistry maps each served session to its table. Its zero value is
// ready. mu is a leaf lock, never held while a table's is.
type cancelRegistry struct {
	mu sync.Mutex
	m  map[*yamux.Session]*streamCancels
}

// open creates the table of session s.
func (r *cancelRegistry) open(s *yamux.Session) *streamCancels {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[*yamux.Session]*streamCancels{}
	}
	t := newStreamCancels()
	r.m[s] = t
	return t
}

// close forgets the table of session s.
func (r *cancelRegistry) close(s *yamux.Session) {
	r.mu.Lock()
	delete(r.m, s)
	r.mu.Unlock()
}

// add registers cancel, which must not block and is called at most once
// (even if the coordinator names the stream again), as the out-of-band
// cancel of st's operation, and returns the function that removes it. On
// a session whose control stream is not read (tests that serve streams
// alone) it registers nothing.
func (r *cancelRegistry) add(st *yamux.Stream, cancel func()) (remove func()) {
	r.mu.Lock()
	t := r.m[st.Session()]
	r.mu.Unlock()
	if t == nil {
		return func() {}
	}
	var once sync.Once
	return t.add(st.StreamID(), func() { once.Do(cancel) })
}

// startControl opens the cancel table of ctl's session and starts, on wg,
// the reader of the coordinator's frames on ctl (readControl). The table
// lives until the reader returns, at the session's end; a panic of the
// reader closes the session (sess), as a heartbeat's does.
func (a *Agent) startControl(ctl *yamux.Stream, sess interface{ Close() error }, wg *sync.WaitGroup, replies chan<- protocol.Frame, drains chan<- protocol.Drain, log *slog.Logger) {
	ys := ctl.Session()
	t := a.cancels.open(ys)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer a.cancels.close(ys)
		defer a.guard.Recover("control reader", func(*panics.Error) { sess.Close() })
		a.readControl(ctl, t, replies, drains, log)
	}()
}

// readControl reads the coordinator's frames on the control stream until
// it ends (with the session): FrameCancelStream cancels the named stream's
// operation through t; FrameDrain goes to drains (without waiting: the
// first one counts); other known frames are ignored. A frame it cannot
// read (an unknown type, too large: a coordinator that sent what this
// agent's Hello did not ask for) ends the interpretation, not the reading:
// the rest of the stream is read and dropped, so the coordinator's writes
// never block on it.
func (a *Agent) readControl(ctl io.Reader, t *streamCancels, replies chan<- protocol.Frame, drains chan<- protocol.Drain, log *slog.Logger) {
	fr := protocol.NewFrameReader(ctl)
	fr.Max = protocol.MaxControlFrameSize
	for {
		f, err := fr.Next()
		if err != nil {
			if errors.Is(err, protocol.ErrUnknownFrame) || errors.Is(err, protocol.ErrTooLarge) {
				log.Warn("control stream: the coordinator sent a frame this agent cannot read; ignoring the rest of the control stream", "err", err)
				io.Copy(io.Discard, ctl)
			}
			return
		}
		switch f.Type {
		case protocol.FrameCancelStream:
			var c protocol.CancelStream
			if err := protocol.DecodeJSON(f.Payload, &c); err != nil {
				log.Warn("control stream: ignoring a bad cancel-stream frame", "err", err)
				continue
			}
			found := t.cancel(c.StreamID)
			log.Debug("cancel from the control stream", "stream", c.StreamID, "running", found)
		case protocol.FrameDrain:
			var d protocol.Drain
			if err := protocol.DecodeJSON(f.Payload, &d); err != nil {
				log.Warn("control stream: ignoring a bad drain frame", "err", err)
				continue
			}
			select {
			case drains <- d:
			default:
			}
		case protocol.FrameRenewed, protocol.FrameReject:
			// The answer to a renewal (identity.go), which waits for it;
			// one unasked for is dropped.
			select {
			case replies <- protocol.Frame{Type: f.Type, Payload: bytes.Clone(f.Payload)}:
			default:
				log.Debug("control stream: dropping an unexpected renewal answer", "frame", f.Type.String())
			}
		default:
			log.Debug("control stream: ignoring frame", "frame", f.Type.String())
		}
	}
}
