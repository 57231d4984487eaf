package coordinator

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
)

// controlWriter writes the coordinator's frames on an agent's control
// stream after Welcome (today only FrameCancelStream; see protocol/doc.go).
// Every such write goes through it, so frames never interleave. It is safe
// for concurrent use; mu is a leaf lock.
type controlWriter struct {
	st      *yamux.Stream
	timeout time.Duration // bounds one frame's write (the tunnel's write timeout)
	// cancels is set when the agent's Hello listed
	// protocol.FeatureCancelStream: an agent that did not may never read
	// its control stream, so it is sent nothing.
	cancels bool

	mu   sync.Mutex
	open bool  // Welcome was written: frames may follow (welcomed)
	err  error // the first failed write: the stream may hold part of a frame, so nothing more is sent
}

// welcome writes wel, the agent's first frame, which nothing may precede,
// and opens the stream for the frames that follow, under the writer's
// lock, waiting at most the write timeout. Until then cancelStream sends
// nothing (the node is registered, so reachable by relays, a moment
// before its Welcome). One lock for both matters: with the Welcome
// written and the stream marked open apart, a cancel that came between
// (the agent had read its Welcome, a client opened a stream and
// cancelled it) was dropped as "before Welcome", and the agent never got
// it; a cancel now waits for the Welcome instead.
func (w *controlWriter) welcome(wel *protocol.Welcome) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.st.SetWriteDeadline(time.Now().Add(w.timeout))
	err := protocol.WriteJSONFrame(w.st, protocol.FrameWelcome, wel)
	w.st.SetWriteDeadline(time.Time{})
	if err != nil {
		w.err = fmt.Errorf("write the welcome frame on the control stream: %w", err)
		return w.err
	}
	w.open = true
	return nil
}

// newControlWriter returns the writer of st, the control stream of an
// agent that said hello.
func newControlWriter(st *yamux.Stream, hello *protocol.Hello, timeout time.Duration) *controlWriter {
	return &controlWriter{st: st, timeout: timeout, cancels: hello.HasFeature(protocol.FeatureCancelStream)}
}

// cancelStream tells the agent to stop the operation of its stream id at
// once (FrameCancelStream), waiting at most the write timeout. It returns
// false, sending nothing, when the agent does not take such cancels, and
// an error when the write failed (then nothing more is written on the
// control stream; the session's liveness is the heartbeats' to judge).
func (w *controlWriter) cancelStream(id uint32) (sent bool, err error) {
	if w == nil || !w.cancels {
		return false, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return false, w.err
	}
	if !w.open {
		return false, nil
	}
	w.st.SetWriteDeadline(time.Now().Add(w.timeout))
	if err := protocol.WriteJSONFrame(w.st, protocol.FrameCancelStream, &protocol.CancelStream{StreamID: id}); err != nil {
		w.err = fmt.Errorf("write cancel-stream frame for stream %d on the control stream: %w", id, err)
		return false, w.err
	}
	return true, nil
}

// cancelStream sends the agent the out-of-band cancel of st's operation
// (controlWriter.cancelStream) of job jobID, and logs a failure. It does
// nothing once the session is gone. It blocks for at most the tunnel's
// write timeout.
func (n *node) cancelStream(st *yamux.Stream, jobID string, log *slog.Logger) {
	if n.sess.IsClosed() {
		return
	}
	if _, err := n.ctl.cancelStream(st.StreamID()); err != nil {
		log.Warn("out-of-band cancel not sent", "job_id", jobID, "node_id", n.id, "stream_id", st.StreamID(), "err", err)
	}
}
