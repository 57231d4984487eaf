package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// FeatureDrain: the agent takes FrameDrain on the control stream: it
// connects to another coordinator after Drain.RetryAfterMS while the
// drained session's streams in flight finish.
const FeatureDrain = "drain"

// Drain is the payload of FrameDrain, which a coordinator sends on the
// control stream of each agent session when it begins to drain (SIGTERM),
// followed by a yamux GoAway: the coordinator opens no new streams on the
// session, the ones in flight go on until they end or the coordinator's
// drain deadline passes, and the agent should connect elsewhere.
type Drain struct {
	// RetryAfterMS is how long the agent waits before it dials its next
	// coordinator, in milliseconds: the coordinator staggers its agents
	// so that they do not all land on a peer at once. Agents bound it
	// (MaxDrainRetryAfter).
	RetryAfterMS int64 `json:"retry_after_ms"`
	// Coordinator, if set, is the tunnel address (host:port) the agent
	// should try first, when it is one of the agent's own coordinator
	// addresses; otherwise the agent takes its next one.
	Coordinator string `json:"coordinator,omitempty"`
	// Message says why, for the agent's log.
	Message string `json:"message,omitempty"`
}

// MaxDrainRetryAfter bounds the wait a Drain may ask for; a larger
// RetryAfterMS is taken as this.
const MaxDrainRetryAfter = 2 * time.Minute

// RetryAfter returns RetryAfterMS as a duration in [0, MaxDrainRetryAfter].
func (d *Drain) RetryAfter() time.Duration {
	return min(max(time.Duration(d.RetryAfterMS)*time.Millisecond, 0), MaxDrainRetryAfter)
}

// Busy refusal: the coordinator's answer, before TLS, to a connection it
// will not handshake now because it admits agents at a bounded rate
// (coordinator Config.AdmitRate). It is written on the raw TCP connection
// in place of the TLS ServerHello, then the connection is closed:
//
//	offset  size  field
//	0       6     magic "TETHER" (0x54 is no TLS record type, so a TLS
//	              client stops at the first 5 bytes)
//	6       1     version, 1
//	7       1     code: 1 = busy
//	8       4     retry after, milliseconds, big-endian uint32
//
// It is not authenticated (it precedes TLS): an agent bounds the wait it
// asks for by its own backoff cap, so that whoever can write to its TCP
// connection cannot park it for longer than dropping the connection would.
const (
	busyMagic   = "TETHER"
	busyVersion = 1
	busyCode    = 1
	// BusyRefusalSize is the length of an encoded busy refusal, in bytes.
	BusyRefusalSize = 12
)

// ErrNotRefusal is returned by ParseBusyRefusal for bytes that are not a
// busy refusal.
var ErrNotRefusal = errors.New("protocol: not a busy refusal")

// AppendBusyRefusal appends the busy refusal asking the agent to come back
// after d (clamped to [0, 2³²-1] ms) to b.
func AppendBusyRefusal(b []byte, d time.Duration) []byte {
	ms := min(max(d.Milliseconds(), 0), 1<<32-1)
	b = append(b, busyMagic...)
	b = append(b, busyVersion, busyCode)
	return binary.BigEndian.AppendUint32(b, uint32(ms))
}

// IsBusyRefusalPrefix reports whether b, the first bytes a server sent
// (at least 5 of them), begins like a busy refusal.
func IsBusyRefusalPrefix(b []byte) bool {
	n := min(len(b), len(busyMagic))
	return n >= 5 && string(b[:n]) == busyMagic[:n]
}

// ParseBusyRefusal decodes a busy refusal from the first BusyRefusalSize
// bytes of b and returns the wait it asks for. It fails with
// ErrNotRefusal, wrapped, for anything else (short, another magic, an
// unknown version or code).
func ParseBusyRefusal(b []byte) (time.Duration, error) {
	if len(b) < BusyRefusalSize {
		return 0, fmt.Errorf("busy refusal of %d bytes, want %d: %w", len(b), BusyRefusalSize, ErrNotRefusal)
	}
	if string(b[:6]) != busyMagic {
		return 0, fmt.Errorf("busy refusal magic %q: %w", b[:6], ErrNotRefusal)
	}
	if b[6] != busyVersion || b[7] != busyCode {
		return 0, fmt.Errorf("busy refusal version %d code %d, want %d and %d: %w", b[6], b[7], busyVersion, busyCode, ErrNotRefusal)
	}
	return time.Duration(binary.BigEndian.Uint32(b[8:12])) * time.Millisecond, nil
}
