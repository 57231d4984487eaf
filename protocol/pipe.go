package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A pipe is a reliable, ordered, flow-controlled, bidirectional byte stream
// carried by NATS core messages (package natspipe implements it). The
// coordinator relays a tunnel stream over one (SubjectStream), so a client
// that speaks only NATS can drive copy, pty and interactive exec streams.
//
// # Messages
//
// Each end of a pipe has an inbox subject it subscribes to; the other end
// publishes to it. A pipe message's meaning is in its NATS headers; only
// data messages have a body.
//
//	Tether-Pipe-Op      data | ack | eof | close | ping | open | reset   (always)
//	Tether-Pipe-Seq     decimal uint64                                  (data, eof)
//	Tether-Pipe-Credit  decimal uint64                                  (ack)
//	Tether-Pipe-Error   text, at most MaxPipeErrorLen bytes             (close, reset; optional)
//	Tether-Pipe-Inbox   a NATS subject without wildcards                (open)
//
//   - data: the body is the next 1..MaxPipeMessage bytes of the stream.
//     Seq counts the data messages of one direction from 0; the receiver
//     expects exactly the next one, and any other value fails the pipe
//     ("message N lost (got M)"): NATS core may drop messages (slow
//     consumer, reconnect), and a pipe never loses bytes silently.
//   - ack: Credit is cumulative: the total number of stream bytes the
//     receiver allows the sender to have sent since the pipe opened. The
//     sender may publish data while bytesSent < Credit (a message may end
//     past it by at most its own length: it is sized min(MaxMessage,
//     Credit-bytesSent)), so a receiver never buffers more than the window
//     it granted. Credits only grow; a stale (smaller) ack is ignored.
//     Until its first ack arrives a sender has PipeInitialCredit, so every
//     receiver's window is at least that. A receiver grants more as its
//     reader consumes bytes (natspipe acks once half its window was
//     consumed), and after a handshake each end also sends one ack with its
//     whole window at once. Data past the granted credit fails the pipe.
//   - eof: half-close. Seq is the number of data messages sent in this
//     direction (the seq the next data message would have had), so the
//     receiver can verify that nothing was lost before reporting EOF. The
//     other direction stays open.
//   - close: abort both directions; Tether-Pipe-Error says why, if anything
//     went wrong. A close that arrives after the peer's eof does not cut
//     the bytes already received: they are still read, then EOF. A close
//     before eof discards unread bytes and fails the pipe.
//   - ping: keepalive. An end publishes one when it has published nothing for
//     a keepalive interval (DefaultPipeKeepAlive). An end that receives
//     nothing at all — no message of any op — for PipeSilenceFactor
//     keepalive intervals declares its peer gone and fails the pipe ("peer
//     silent for 15s"). Both ends must use the same interval.
//   - open: the first message of the answering end of a handshake (below);
//     Tether-Pipe-Inbox is that end's inbox.
//   - reset: abort the sender's direction only (QUIC's RESET_STREAM): the
//     receiver drops every byte of that direction it has not read yet,
//     ignores data and eof of that direction that arrive later (they may
//     have been on their way), and its reads fail with the reason in
//     Tether-Pipe-Error, if any. The other direction goes on: the peer
//     that reset still reads, until eof or close. It says "stop now, and
//     forget what I sent", out of band: a client cancelling an exec whose
//     command leaves its stdin unread resets its direction, so that the
//     coordinator learns of the cancel at once while the command's output
//     and exit status still reach the client. A close after a reset cuts
//     only what the receiver still had to send, as after an eof.
//
// Unknown ops are an error: a peer speaking a newer pipe version must not be
// half understood. So is a pipe header given twice (two values) or spelled
// in another case ("tether-pipe-op"): NATS header names are
// case-sensitive, and a relay or inspector that reads them otherwise would
// see another message. Headers other than these are ignored. (reset is the
// newest op: a peer that predates it fails the pipe on receiving one, which
// is the outcome of a close.)
//
// # Handshake on SubjectStream
//
// The opener (the client) creates its inbox and subscribes to it before it
// publishes its StreamRequest with that inbox as the NATS reply subject, so
// nothing the coordinator sends can be lost. The coordinator validates the
// request, opens the tunnel stream, creates and subscribes its own inbox and
// publishes an open message (Tether-Pipe-Inbox: its inbox) to the client's
// inbox, followed by an ack granting its whole window. The client then sends
// the same to the coordinator's inbox; from there both directions are
// symmetric.
// A request the coordinator refuses gets, instead of open, an ordinary NATS
// micro error reply (Nats-Service-Error-Code: status, Nats-Service-Error:
// message, JSON APIError body), and no pipe exists.
//
// Ending a relay normally: each side sends eof when it is done writing; the
// coordinator closes once both directions ended. An abort (client close,
// peer silent, tunnel lost) is a close carrying the reason.

// Header names of pipe messages.
const (
	HeaderPipeOp     = "Tether-Pipe-Op"
	HeaderPipeSeq    = "Tether-Pipe-Seq"
	HeaderPipeCredit = "Tether-Pipe-Credit"
	HeaderPipeError  = "Tether-Pipe-Error"
	HeaderPipeInbox  = "Tether-Pipe-Inbox"
)

// Pipe limits and defaults.
const (
	// DefaultPipeWindow is the default receive window of a pipe end, in
	// bytes: how far a sender may run ahead of the reader.
	DefaultPipeWindow = 8 << 20
	// DefaultPipeMessage is the default largest data body, in bytes.
	DefaultPipeMessage = 128 << 10
	// MaxPipeMessage bounds a data body, in bytes (NATS's default
	// max_payload is 1 MiB too; headers need room, so implementations also
	// stay under the connection's own limit).
	MaxPipeMessage = MaxFrameSize
	// DefaultPipeKeepAlive is how long a direction may be idle before a
	// ping is sent.
	DefaultPipeKeepAlive = 5 * time.Second
	// PipeSilenceFactor times the keepalive interval is how long an end
	// waits without receiving anything before it declares its peer gone.
	PipeSilenceFactor = 3
	// PipeInitialCredit is the credit each sender starts with, in bytes,
	// before any ack: the smallest receive window allowed.
	PipeInitialCredit = 256 << 10
	// MaxPipeErrorLen bounds Tether-Pipe-Error, in bytes; longer texts are
	// truncated by TruncatePipeError.
	MaxPipeErrorLen = 1024
	// MaxPipeInboxLen bounds Tether-Pipe-Inbox, in bytes.
	MaxPipeInboxLen = 256
)

// PipeOp is a pipe message's operation.
type PipeOp uint8

// Pipe operations. The zero value is invalid.
const (
	PipeData PipeOp = iota + 1
	PipeAck
	PipeEOF
	PipeClose
	PipePing
	PipeOpen
	PipeReset
)

var pipeOpNames = [...]string{
	PipeData: "data", PipeAck: "ack", PipeEOF: "eof",
	PipeClose: "close", PipePing: "ping", PipeOpen: "open", PipeReset: "reset",
}

// String returns the op's wire name, or "op(N)" for invalid values.
func (o PipeOp) String() string {
	if o.Valid() {
		return pipeOpNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Valid reports whether o is a defined op.
func (o PipeOp) Valid() bool { return o >= PipeData && o <= PipeReset }

// ErrPipeHeader is wrapped by every header validation error.
var ErrPipeHeader = errors.New("protocol: invalid pipe message header")

// ParsePipeOp returns the op named s.
func ParsePipeOp(s string) (PipeOp, error) {
	// A switch, not a map: this runs for every message.
	switch s {
	case "data":
		return PipeData, nil
	case "ack":
		return PipeAck, nil
	case "eof":
		return PipeEOF, nil
	case "close":
		return PipeClose, nil
	case "ping":
		return PipePing, nil
	case "open":
		return PipeOpen, nil
	case "reset":
		return PipeReset, nil
	}
	if s == "" {
		return 0, fmt.Errorf("%w: no %s", ErrPipeHeader, HeaderPipeOp)
	}
	return 0, fmt.Errorf("%w: unknown %s %q", ErrPipeHeader, HeaderPipeOp, pipeTrunc(s, 32))
}

// PipeMsg is a decoded pipe message header.
type PipeMsg struct {
	Op     PipeOp
	Seq    uint64 // data, eof
	Credit uint64 // ack
	Error  string // close, reset; may be empty
	Inbox  string // open
}

// ParsePipeHeader decodes and validates the pipe headers of a message. h is
// the message's header map (a nats.Header converts to it). Each pipe header
// has at most one value and exactly the case of its Header* name; a second
// value, or a name that equals one only when case is ignored, is an error
// naming it. It checks that the op's required headers are present and well
// formed, and bodyLen against the op: only data has a body, of
// 1..MaxPipeMessage bytes.
func ParsePipeHeader(h map[string][]string, bodyLen int) (PipeMsg, error) {
	var m PipeMsg
	if err := pipeHeadersUnambiguous(h); err != nil {
		return m, err
	}
	op, err := ParsePipeOp(pipeFirst(h, HeaderPipeOp))
	if err != nil {
		return m, err
	}
	m.Op = op
	switch op {
	case PipeData:
		if bodyLen < 1 || bodyLen > MaxPipeMessage {
			return m, fmt.Errorf("%w: data body of %d bytes, want 1..%d", ErrPipeHeader, bodyLen, MaxPipeMessage)
		}
	default:
		if bodyLen != 0 {
			return m, fmt.Errorf("%w: %s message has a %d byte body", ErrPipeHeader, op, bodyLen)
		}
	}
	switch op {
	case PipeData, PipeEOF:
		if m.Seq, err = pipeUint(h, HeaderPipeSeq); err != nil {
			return m, err
		}
	case PipeAck:
		if m.Credit, err = pipeUint(h, HeaderPipeCredit); err != nil {
			return m, err
		}
	case PipeClose, PipeReset:
		m.Error = pipeFirst(h, HeaderPipeError)
		if len(m.Error) > MaxPipeErrorLen {
			return m, fmt.Errorf("%w: %s is %d bytes, over %d", ErrPipeHeader, HeaderPipeError, len(m.Error), MaxPipeErrorLen)
		}
	case PipeOpen:
		m.Inbox = pipeFirst(h, HeaderPipeInbox)
		if err := ValidPipeInbox(m.Inbox); err != nil {
			return m, err
		}
	}
	return m, nil
}

// Header encodes m as pipe headers (a fresh map, convertible to
// nats.Header). Hot paths may build their headers themselves; this is the
// reference encoding.
func (m PipeMsg) Header() map[string][]string {
	h := map[string][]string{HeaderPipeOp: {m.Op.String()}}
	switch m.Op {
	case PipeData, PipeEOF:
		h[HeaderPipeSeq] = []string{strconv.FormatUint(m.Seq, 10)}
	case PipeAck:
		h[HeaderPipeCredit] = []string{strconv.FormatUint(m.Credit, 10)}
	case PipeClose, PipeReset:
		if m.Error != "" {
			h[HeaderPipeError] = []string{TruncatePipeError(m.Error)}
		}
	case PipeOpen:
		h[HeaderPipeInbox] = []string{m.Inbox}
	}
	return h
}

// ValidPipeInbox checks that s can be a pipe inbox: a NATS subject of
// non-empty dot-separated tokens, without wildcards, spaces or control
// characters, at most MaxPipeInboxLen bytes.
func ValidPipeInbox(s string) error {
	if s == "" {
		return fmt.Errorf("%w: no %s", ErrPipeHeader, HeaderPipeInbox)
	}
	if len(s) > MaxPipeInboxLen {
		return fmt.Errorf("%w: %s is %d bytes, over %d", ErrPipeHeader, HeaderPipeInbox, len(s), MaxPipeInboxLen)
	}
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return fmt.Errorf("%w: %s %q is not a literal subject", ErrPipeHeader, HeaderPipeInbox, pipeTrunc(s, 64))
		}
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("%w: %s %q contains a space or control character", ErrPipeHeader, HeaderPipeInbox, pipeTrunc(s, 64))
		}
	}
	return nil
}

// TruncatePipeError shortens s to at most MaxPipeErrorLen bytes without
// splitting a UTF-8 sequence and replaces line breaks (not allowed in NATS
// header values) with spaces.
func TruncatePipeError(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
	if len(s) <= MaxPipeErrorLen {
		return s
	}
	cut := MaxPipeErrorLen - len("...")
	for cut > 0 && s[cut]&0xC0 == 0x80 { // inside a multi-byte sequence
		cut--
	}
	return s[:cut] + "..."
}

// pipeHeaderNames are the pipe's headers, in their one spelling.
var pipeHeaderNames = [...]string{HeaderPipeOp, HeaderPipeSeq, HeaderPipeCredit, HeaderPipeError, HeaderPipeInbox}

// pipeHeadersUnambiguous checks that no pipe header has two values and
// none is spelled in another case.
func pipeHeadersUnambiguous(h map[string][]string) error {
	const prefix = "Tether-Pipe-"
	for k, v := range h {
		if len(k) < len(prefix) || !strings.EqualFold(k[:len(prefix)], prefix) {
			continue
		}
		for _, name := range pipeHeaderNames {
			switch {
			case k == name:
				if len(v) > 1 {
					return fmt.Errorf("%w: %s given %d times", ErrPipeHeader, name, len(v))
				}
			case strings.EqualFold(k, name):
				return fmt.Errorf("%w: header %q: pipe header names are case-sensitive (want %s)", ErrPipeHeader, pipeTrunc(k, 32), name)
			}
		}
	}
	return nil
}

func pipeFirst(h map[string][]string, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// parseUint parses a plain decimal header value (no sign, no leading zeros
// except "0" itself, at most 20 digits).
func pipeUint(h map[string][]string, k string) (uint64, error) {
	s := pipeFirst(h, k)
	if s == "" {
		return 0, fmt.Errorf("%w: no %s", ErrPipeHeader, k)
	}
	if len(s) > 1 && s[0] == '0' || s[0] == '+' || s[0] == '-' {
		return 0, fmt.Errorf("%w: %s %q is not a plain decimal number", ErrPipeHeader, k, pipeTrunc(s, 32))
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %q is not a decimal uint64", ErrPipeHeader, k, pipeTrunc(s, 32))
	}
	return v, nil
}

func pipeTrunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
