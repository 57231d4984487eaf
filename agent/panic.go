package agent

import (
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// Panics. Every goroutine the agent starts for one stream (its handler and
// the handler's helpers: waiters, copiers, frame readers, listers) defers
// a.guard.Recover, so that a bug one stream's input reaches costs that
// stream an internal error frame and nothing else: the session, the other
// streams and the detached jobs go on, and tether_panics_total{component=
// "agent"} counts it. See the package doc for the goroutines left
// unguarded.
//
// A handler defers its guard right after its deferred st.Close, so that the
// error frame is written before the stream is closed. Deferred calls of
// the handler's own frames run before the guard recovers (they are inner
// frames of the unwinding): those that wait for helpers must first end
// the process group, or the unwinding would wait for a process that keeps
// running (runProcess and ptySession.run do; a detached job's supervisor is its
// shim, a process of its own: jobshim.go).

// answerPanic returns the report of a panic in st's handler: st is answered
// with a CodeInternal error frame, through w when the handler writes its
// frames through one (so that it never interleaves with output nor follows
// the final frame), else directly.
func (a *Agent) answerPanic(st *yamux.Stream, w *frameWriter) func(*panics.Error) {
	return func(e *panics.Error) {
		info := &protocol.ErrorInfo{Code: protocol.CodeInternal, Message: fmt.Sprintf("node %s: %v", a.cfg.NodeID, e)}
		if w != nil {
			w.final(protocol.FrameError, info)
			return
		}
		st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
		protocol.WriteJSONFrame(st, protocol.FrameError, info)
	}
}

// crash records the first panic contained in one of an operation's helper
// goroutines and tells the operation's handler, which then ends the
// operation and answers with an internal error. Its zero value is not
// usable; use newCrash.
type crash struct {
	once sync.Once
	c    chan struct{}
	err  *panics.Error // set before c is closed
}

func newCrash() *crash { return &crash{c: make(chan struct{})} }

// report is the panics report callback of the helpers.
func (c *crash) report(e *panics.Error) {
	c.once.Do(func() {
		c.err = e
		close(c.c)
	})
}

// done is closed once a helper panicked.
func (c *crash) done() <-chan struct{} { return c.c }

// error returns the first contained panic, or nil if none happened.
func (c *crash) error() *panics.Error {
	select {
	case <-c.c:
		return c.err
	default:
		return nil
	}
}

// hook calls the test hook (Agent.testHook) at point, if one is set.
func (a *Agent) hook(point string, v any) {
	if a.testHook != nil {
		a.testHook(point, v)
	}
}
