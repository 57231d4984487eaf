package protocol

import "slices"

// Optional protocol features, listed in Hello.Features.
const (
	// FeatureCancelStream: the agent reads the control stream after
	// Welcome and takes FrameCancelStream, the out-of-band cancel of one
	// of its streams.
	FeatureCancelStream = "cancel_stream"
)

// HasFeature reports whether h lists feature f.
func (h *Hello) HasFeature(f string) bool { return slices.Contains(h.Features, f) }

// HasFeature reports whether w lists feature f.
func (w *Welcome) HasFeature(f string) bool { return slices.Contains(w.Features, f) }

// MaxControlFrameSize bounds a frame the coordinator sends on the control
// stream after Welcome (FrameCancelStream), in bytes; the agent's reader
// refuses larger ones.
const MaxControlFrameSize = 4 << 10

// CancelStream is the payload of FrameCancelStream, which the coordinator
// sends on the control stream (see the package doc) to stop the operation
// of one of the session's streams at once: the same as a FrameCancel on
// that stream, but not queued behind the bytes the stream already carries
// (stdin the command does not read, say), which can keep an in-band cancel
// from ever reaching the agent. A stream that ended, or that the agent
// does not cancel (dial, job, inventory), makes it a no-op.
type CancelStream struct {
	// StreamID is the yamux stream id, the same on both ends of the
	// session.
	StreamID uint32 `json:"stream_id"`
}
