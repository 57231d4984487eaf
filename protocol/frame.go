package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Version is the tunnel protocol version carried in every stream header and in
// Hello. Peers with different versions refuse each other with a clear error.
const Version = 1

// Size limits of the tunnel protocol. Decoders reject anything larger before
// allocating for it.
const (
	// MaxHeaderSize bounds a stream header's JSON params, in bytes.
	MaxHeaderSize = 64 << 10
	// MaxFrameSize bounds one frame's payload, in bytes.
	MaxFrameSize = 1 << 20
	// ChunkSize is the payload size senders use for data frames: large
	// enough to amortise framing, small enough to interleave streams.
	ChunkSize = 32 << 10
)

// Sentinel errors; callers branch on them with errors.Is.
var (
	ErrVersion       = errors.New("protocol: unsupported protocol version")
	ErrTooLarge      = errors.New("protocol: message exceeds size limit")
	ErrUnknownKind   = errors.New("protocol: unknown stream kind")
	ErrUnknownFrame  = errors.New("protocol: unknown frame type")
	ErrUnexpected    = errors.New("protocol: unexpected frame")
	ErrMalformedJSON = errors.New("protocol: malformed JSON payload")
)

// FrameType says what a frame's payload is.
type FrameType uint8

// Frame types. Values are part of the wire format: never renumber.
const (
	FrameStdin      FrameType = 1  // raw bytes for the process's stdin
	FrameStdinClose FrameType = 2  // no payload: stdin is at EOF
	FrameStdout     FrameType = 3  // raw bytes the process wrote to stdout
	FrameStderr     FrameType = 4  // raw bytes the process wrote to stderr
	FrameExit       FrameType = 5  // JSON ExitStatus; the last frame of an exec
	FrameError      FrameType = 6  // JSON ErrorInfo; the operation failed
	FrameCancel     FrameType = 7  // no payload: stop the operation now
	FrameHello      FrameType = 16 // JSON Hello (agent → coordinator)
	FrameWelcome    FrameType = 17 // JSON Welcome (coordinator → agent)
	FrameReject     FrameType = 18 // JSON ErrorInfo (coordinator → agent)
	FrameHeartbeat  FrameType = 19 // JSON Heartbeat (agent → coordinator)
	// FrameCancelStream (coordinator → agent, control stream): JSON
	// CancelStream. Sent only to an agent whose Hello listed
	// FeatureCancelStream.
	FrameCancelStream FrameType = 20
	// Enrollment and renewal (enroll.go).
	FrameEnroll   FrameType = 21 // JSON Enroll (agent → coordinator): the first frame instead of a Hello
	FrameEnrolled FrameType = 22 // JSON Enrolled (coordinator → agent): the agent's certificate
	FrameRenew    FrameType = 23 // JSON Renew (agent → coordinator, control stream after Welcome)
	FrameRenewed  FrameType = 24 // JSON Enrolled (coordinator → agent, control stream): the renewed certificate
	// FrameSSHChannel (agent → coordinator, control stream after Welcome):
	// JSON SSHChannelEvent, one SSH channel that ended (ssh.go). Sent only
	// by an agent whose Hello listed FeatureSSH.
	FrameSSHChannel FrameType = 25
	// FrameDrain (coordinator → agent, control stream after Welcome):
	// JSON Drain, the coordinator is going away (drain.go). Sent only to
	// an agent whose Hello listed FeatureDrain.
	FrameDrain FrameType = 26
	// FrameJobExit (agent → coordinator, control stream after Welcome):
	// JSON JobStatus, a detached job of the agent's node that exited or
	// was found lost (jobexit.go), so that the job's durable record is
	// settled at once rather than when someone next asks. Sent only by
	// an agent whose Hello listed FeatureJobExit, to a coordinator whose
	// Welcome listed it.
	FrameJobExit FrameType = 27

	// Copy frames (copy.go).
	FrameManifest    FrameType = 32 // JSON []ManifestEntry: part of what the receiver has
	FrameManifestEnd FrameType = 33 // JSON ManifestEnd: the receiver's manifest is complete
	FrameEntry       FrameType = 34 // JSON CopyEntry: the next entry of the source tree
	FrameFileData    FrameType = 35 // raw bytes of the current file entry
	FrameEntryEnd    FrameType = 36 // JSON EntryEnd: the current file is complete
	FrameCopyEnd     FrameType = 37 // JSON CopyEnd: the sender sent every entry
	FrameCopyDone    FrameType = 38 // JSON CopyResult: the receiver committed the copy
	FrameCopySkip    FrameType = 39 // JSON CopySkip: the sender skipped an entry it cannot carry

	// Terminal frames (pty.go).
	FrameResize FrameType = 40 // JSON WindowSize: the terminal changed size
	FrameSignal FrameType = 41 // JSON Signal: deliver a signal to the process group

	// Job frames (job.go).
	FrameJob FrameType = 48 // JSON JobStatus or JobOutputEnd: a job stream's answer

	// Dial and inventory streams (inventory.go).
	FrameDialOK       FrameType = 64 // no payload: the target is connected; raw bytes follow
	FrameInventory    FrameType = 65 // JSON InventoryPage
	FrameInventoryEnd FrameType = 66 // JSON InventoryEnd: the last frame of an inventory stream
	FrameSandboxOp    FrameType = 67 // JSON SandboxOpResult: a sandbox stream's answer

	// The direct data path's frames (direct.go): on a client's yamux
	// session with the coordinator, never on an agent's tunnel.
	FrameDirectControl FrameType = 80 // no payload: the first frame of the client session's control stream
	FrameDirectOpen    FrameType = 81 // JSON DirectOpen (client → coordinator): the first frame of a data stream
	FrameDirectAnswer  FrameType = 82 // JSON DirectAnswer (coordinator → client): the data stream's open outcome
	FrameDirectCancel  FrameType = 83 // JSON DirectRef (client → coordinator, control stream): Stream.Cancel
	FrameDirectClose   FrameType = 84 // JSON DirectRef (client → coordinator, control stream): Stream.Close
	FrameDirectEnd     FrameType = 85 // JSON DirectEnd (coordinator → client, control stream): how a data stream's coordinator side ended
)

var frameNames = map[FrameType]string{
	FrameStdin: "stdin", FrameStdinClose: "stdin-close", FrameStdout: "stdout",
	FrameStderr: "stderr", FrameExit: "exit", FrameError: "error",
	FrameCancel: "cancel", FrameHello: "hello", FrameWelcome: "welcome",
	FrameReject: "reject", FrameHeartbeat: "heartbeat", FrameCancelStream: "cancel-stream",
	FrameEnroll: "enroll", FrameEnrolled: "enrolled", FrameRenew: "renew", FrameRenewed: "renewed",
	FrameSSHChannel: "ssh-channel",
	FrameDrain:      "drain",
	FrameJobExit:    "job-exit",
	FrameManifest:   "manifest", FrameManifestEnd: "manifest-end", FrameEntry: "entry",
	FrameFileData: "file-data", FrameEntryEnd: "entry-end", FrameCopyEnd: "copy-end",
	FrameCopyDone: "copy-done", FrameCopySkip: "copy-skip", FrameResize: "resize", FrameSignal: "signal",
	FrameJob: "job", FrameDialOK: "dial-ok", FrameInventory: "inventory",
	FrameInventoryEnd: "inventory-end", FrameSandboxOp: "sandbox-op",
	FrameDirectControl: "direct-control", FrameDirectOpen: "direct-open", FrameDirectAnswer: "direct-answer",
	FrameDirectCancel: "direct-cancel", FrameDirectClose: "direct-close", FrameDirectEnd: "direct-end",
}

// String returns the frame type's name, or "frame(N)" for unknown types.
func (t FrameType) String() string {
	if n, ok := frameNames[t]; ok {
		return n
	}
	return fmt.Sprintf("frame(%d)", uint8(t))
}

// Valid reports whether t is a known frame type.
func (t FrameType) Valid() bool { _, ok := frameNames[t]; return ok }

// Frame is one decoded frame. Payload aliases the buffer it was read into
// unless documented otherwise.
type Frame struct {
	Type    FrameType
	Payload []byte
}

// frameHeaderSize is the fixed prefix of a frame: type and length.
const frameHeaderSize = 5

// WriteFrame writes one frame as a single Write call, so that a frame is never
// split across transport records by the writer. It fails with ErrTooLarge if
// payload exceeds MaxFrameSize.
func WriteFrame(w io.Writer, t FrameType, payload []byte) error {
	if len(payload) > MaxFrameSize {
		return fmt.Errorf("write %s frame of %d bytes: %w (max %d)", t, len(payload), ErrTooLarge, MaxFrameSize)
	}
	buf := make([]byte, frameHeaderSize+len(payload))
	buf[0] = byte(t)
	binary.BigEndian.PutUint32(buf[1:5], uint32(len(payload)))
	copy(buf[frameHeaderSize:], payload)
	_, err := w.Write(buf)
	return err
}

// WriteJSONFrame encodes v as JSON (without HTML escaping, see MarshalJSON)
// and writes it as one frame of type t, in one Write call.
func WriteJSONFrame(w io.Writer, t FrameType, v any) error {
	buf, err := encodeJSON(frameHeaderSize, v)
	if err != nil {
		return fmt.Errorf("encode %s frame: %w", t, err)
	}
	n := len(buf) - frameHeaderSize
	if n > MaxFrameSize {
		return fmt.Errorf("write %s frame of %d bytes: %w (max %d)", t, n, ErrTooLarge, MaxFrameSize)
	}
	buf[0] = byte(t)
	binary.BigEndian.PutUint32(buf[1:5], uint32(n))
	_, err = w.Write(buf)
	return err
}

// MarshalJSON encodes v as the protocol writes JSON in headers and frames:
// like json.Marshal, but without escaping '<', '>' and '&' (which would
// inflate a script made of them sixfold). Use it to measure what a header
// or frame will weigh.
func MarshalJSON(v any) ([]byte, error) { return encodeJSON(0, v) }

// encodeJSON returns prefix zero bytes followed by v's JSON encoding (no
// HTML escaping, no trailing newline), so that callers can fill in a frame
// or header prefix and write everything at once.
func encodeJSON(prefix int, v any) ([]byte, error) {
	var b bytes.Buffer
	b.Write(make([]byte, prefix))
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	out := b.Bytes()
	return out[:len(out)-1], nil // Encode ends with a newline
}

// FrameReader decodes frames from a stream, reusing one buffer. It is not safe
// for concurrent use.
type FrameReader struct {
	r   io.Reader
	hdr [frameHeaderSize]byte
	buf []byte
	// Max bounds the payload size accepted; zero means MaxFrameSize.
	Max int
}

// NewFrameReader returns a FrameReader reading from r.
func NewFrameReader(r io.Reader) *FrameReader { return &FrameReader{r: r} }

// Next reads the next frame. The returned payload is valid until the next call
// to Next. It returns io.EOF at a clean end of stream (between frames),
// io.ErrUnexpectedEOF for a truncated frame, ErrUnknownFrame for an unknown
// type and ErrTooLarge for an oversized payload; in the last two cases
// nothing is allocated for the payload.
func (fr *FrameReader) Next() (Frame, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return Frame{}, err
	}
	t := FrameType(fr.hdr[0])
	n := binary.BigEndian.Uint32(fr.hdr[1:5])
	if !t.Valid() {
		return Frame{}, fmt.Errorf("read frame: %w: %d", ErrUnknownFrame, fr.hdr[0])
	}
	max := fr.Max
	if max <= 0 {
		max = MaxFrameSize
	}
	if uint64(n) > uint64(max) {
		return Frame{}, fmt.Errorf("read %s frame of %d bytes: %w (max %d)", t, n, ErrTooLarge, max)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	p := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, fmt.Errorf("read %s frame payload: %w", t, err)
	}
	return Frame{Type: t, Payload: p}, nil
}

// DecodeJSON decodes a frame's JSON payload into v, wrapping failures in
// ErrMalformedJSON. Unknown fields are skipped: reports and statuses may
// grow new optional fields within a protocol version. But nothing is read
// two ways: a key that matches a field only when case is ignored, a key
// given twice in one object, bytes that are not UTF-8 and unpaired
// surrogate escapes are errors (a *JSONError; see strictjson.go).
// (Requests, which must be understood whole, are decoded strictly; see
// Header.DecodeParams.)
func DecodeJSON(payload []byte, v any) error {
	if err := decodeTolerant(payload, v); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformedJSON, err)
	}
	return nil
}

// ParseFrame decodes the frame at the start of b, for readers that gather
// bytes as they come rather than block on a stream (FrameReader's
// counterpart). It returns the frame and its encoded length, or n == 0 and
// no error when b holds only part of a frame; ErrUnknownFrame for an
// unknown type and ErrTooLarge for a payload above max (zero means
// MaxFrameSize), both as soon as the 5-byte prefix is there. The payload
// aliases b.
func ParseFrame(b []byte, max int) (f Frame, n int, err error) {
	if len(b) < frameHeaderSize {
		return Frame{}, 0, nil
	}
	t := FrameType(b[0])
	size := binary.BigEndian.Uint32(b[1:5])
	if !t.Valid() {
		return Frame{}, 0, fmt.Errorf("read frame: %w: %d", ErrUnknownFrame, b[0])
	}
	if max <= 0 {
		max = MaxFrameSize
	}
	if uint64(size) > uint64(max) {
		return Frame{}, 0, fmt.Errorf("read %s frame of %d bytes: %w (max %d)", t, size, ErrTooLarge, max)
	}
	end := frameHeaderSize + int(size)
	if len(b) < end {
		return Frame{}, 0, nil
	}
	return Frame{Type: t, Payload: b[frameHeaderSize:end]}, end, nil
}
