package tunnel

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// ErrPeerSilent is wrapped by Session.Err when the session was closed
// because nothing arrived from the peer for Config.IdleTimeout.
var ErrPeerSilent = errors.New("tunnel: nothing received from the peer")

// noteRead records, for the idle watch, that a Read returned data. yamux
// reads through a buffered reader, so this costs one clock reading per
// buffer fill, not per frame.
func (c *watchConn) noteRead() { c.lastRead.Store(int64(time.Since(c.flow.epoch))) }

// silentFor reports how long ago a Read last returned data (or the
// connection was wrapped, if none did).
func (c *watchConn) silentFor() time.Duration {
	return time.Since(c.flow.epoch) - time.Duration(c.lastRead.Load())
}

// idleWatch closes a session whose peer stayed silent for timeout. It runs
// no goroutine: a timer re-arms itself for the time left until the silence
// would reach timeout, and closes the session when it has.
type idleWatch struct {
	y       *yamux.Session
	conn    *watchConn
	timeout time.Duration

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	cause   error // set when the watch closed the session
}

func watchIdle(y *yamux.Session, c *watchConn, timeout time.Duration) *idleWatch {
	w := &idleWatch{y: y, conn: c, timeout: timeout}
	w.mu.Lock()
	w.timer = time.AfterFunc(timeout, w.check)
	w.mu.Unlock()
	return w
}

// check runs when the timer fires.
func (w *idleWatch) check() {
	w.mu.Lock()
	if w.stopped || w.y.IsClosed() {
		w.stopped = true
		w.mu.Unlock()
		return
	}
	silent := w.conn.silentFor()
	if silent < w.timeout {
		w.timer.Reset(w.timeout - silent)
		w.mu.Unlock()
		return
	}
	w.stopped = true
	w.cause = fmt.Errorf("%w for %v", ErrPeerSilent, w.timeout)
	w.mu.Unlock()
	w.y.Close()
}

// stop stops the timer; the session is being closed by its owner.
func (w *idleWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.timer.Stop()
}

// err is the cause recorded when the watch closed the session, or nil.
func (w *idleWatch) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cause
}
