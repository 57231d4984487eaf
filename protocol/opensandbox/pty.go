package opensandbox

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// execd PTY sessions (wire-facts §3): REST under /pty, one WebSocket per
// session at /pty/<id>/ws.

// PTY paths relative to an execd base URL.
const (
	PTYPath = "/pty"
	// PTYWebSocketSuffix ends a session's WebSocket path: /pty/<id>/ws.
	PTYWebSocketSuffix = "/ws"
)

// Binary frame channels: the first byte of every binary WebSocket frame.
const (
	ChannelStdin  byte = 0x00 // client → server: raw stdin bytes
	ChannelStdout byte = 0x01 // server → client: stdout (all terminal output in PTY mode)
	ChannelStderr byte = 0x02 // server → client: stderr (pipe mode only)
	ChannelReplay byte = 0x03 // server → client: Offset header then retained output, stdout and stderr merged
)

// Sizes of the PTY stream.
const (
	// ReplayHeaderSize is the replay frame's header: channel byte and an
	// unsigned 64-bit big-endian absolute offset.
	ReplayHeaderSize = 9
	// ReplayBufferSize is the ring of retained output per session: with
	// total bytes produced, [max(0,total−ReplayBufferSize), total) is kept.
	ReplayBufferSize = 1 << 20
	// MaxLiveChunk bounds the payload of a live 0x01/0x02 frame.
	MaxLiveChunk = 32 << 10
	// InitialCols and InitialRows are a PTY-mode session's window size at
	// start.
	InitialCols = 80
	InitialRows = 24
)

// WebSocket close codes and reasons a PTY client sees (wire-facts §3.6).
const (
	// CloseNormal with ReasonProcessExited follows the exit frame.
	CloseNormal = 1000
	// ClosePolicyViolation: the server proxy could not complete the backend
	// handshake (usually execd's 409, possibly a 404); empty reason.
	ClosePolicyViolation = 1008
	// CloseInternalError: the server proxy found the backend unreachable.
	CloseInternalError = 1011
	// CloseTakenOver with ReasonTakenOver: evicted by a takeover=1 attach.
	// Clients must not reconnect after it.
	CloseTakenOver = 4001

	ReasonProcessExited = "process exited"
	ReasonTakenOver     = "TAKEN_OVER"
)

// Errors of DecodeBinaryFrame.
var (
	ErrEmptyFrame     = errors.New("opensandbox: empty binary frame")
	ErrShortReplay    = errors.New("opensandbox: replay frame shorter than its 9-byte header")
	ErrUnknownChannel = errors.New("opensandbox: unknown binary frame channel")
)

// BinaryFrame is one binary WebSocket frame of a PTY session.
type BinaryFrame struct {
	// Channel is one of the Channel* constants.
	Channel byte
	// Offset is the absolute byte offset of Data's first byte; only
	// ChannelReplay frames carry it.
	Offset uint64
	// Data is the payload. DecodeBinaryFrame aliases its input.
	Data []byte
}

// AppendBinaryFrame appends f's wire form to dst: the channel byte, for
// ChannelReplay the 8-byte big-endian Offset, then Data.
func AppendBinaryFrame(dst []byte, f BinaryFrame) []byte {
	dst = append(dst, f.Channel)
	if f.Channel == ChannelReplay {
		dst = binary.BigEndian.AppendUint64(dst, f.Offset)
	}
	return append(dst, f.Data...)
}

// EncodeBinaryFrame returns f's wire form in a new slice.
func EncodeBinaryFrame(f BinaryFrame) []byte {
	n := 1 + len(f.Data)
	if f.Channel == ChannelReplay {
		n += 8
	}
	return AppendBinaryFrame(make([]byte, 0, n), f)
}

// DecodeBinaryFrame parses a binary frame. Errors: ErrEmptyFrame (execd
// ignores empty frames), ErrShortReplay, and ErrUnknownChannel for a first
// byte above 0x03 (the frame is still returned, so a relay can pass it on;
// execd ignores client frames on any channel but ChannelStdin). Data
// aliases b; no size limit is applied (the WebSocket reader's limit is the
// bound).
func DecodeBinaryFrame(b []byte) (BinaryFrame, error) {
	if len(b) == 0 {
		return BinaryFrame{}, ErrEmptyFrame
	}
	f := BinaryFrame{Channel: b[0]}
	switch f.Channel {
	case ChannelStdin, ChannelStdout, ChannelStderr:
		f.Data = b[1:]
	case ChannelReplay:
		if len(b) < ReplayHeaderSize {
			return BinaryFrame{}, fmt.Errorf("%w: %d bytes", ErrShortReplay, len(b))
		}
		f.Offset = binary.BigEndian.Uint64(b[1:ReplayHeaderSize])
		f.Data = b[ReplayHeaderSize:]
	default:
		f.Data = b[1:]
		return f, fmt.Errorf("%w 0x%02x", ErrUnknownChannel, f.Channel)
	}
	return f, nil
}

// Control frame types (ControlFrame.Type).
const (
	// Server → client.
	TypeConnected = "connected" // SessionID, Mode
	TypePong      = "pong"
	TypeExit      = "exit"  // ExitCode
	TypeError     = "error" // Code, Error
	// Client → server.
	TypeResize = "resize" // Cols, Rows
	TypeSignal = "signal" // Signal
	TypePing   = "ping"
	TypeStdin  = "stdin" // Data (plain UTF-8 text)
)

// Session modes (ControlFrame.Mode of the connected frame).
const (
	ModePTY  = "pty"
	ModePipe = "pipe"
)

// Error frame codes (ControlFrame.Code) and execd's REST error codes for
// PTY calls.
const (
	CodeSessionGone      = "SESSION_GONE"
	CodeStartFailed      = "START_FAILED"
	CodeStdinWriteFailed = "STDIN_WRITE_FAILED"
	CodeInvalidFrame     = "INVALID_FRAME"
	CodeAlreadyConnected = "ALREADY_CONNECTED" // also the 409 body of a refused attach
	CodeTakenOver        = "TAKEN_OVER"
	CodeRuntimeError     = "RUNTIME_ERROR"
	CodeContextNotFound  = "CONTEXT_NOT_FOUND" // 404 body for an unknown session
	CodeInvalidRequest   = "INVALID_REQUEST_BODY"
	CodeNotSupported     = "NOT_SUPPORTED"
	CodeMissingQuery     = "MISSING_QUERY"
	CodeUnknown          = "UNKNOWN"
)

// Signals lists the signal names a signal frame may carry; execd silently
// ignores any other name.
var Signals = []string{"SIGINT", "SIGTERM", "SIGKILL", "SIGQUIT", "SIGHUP"}

// ValidSignal reports whether name is one of Signals.
func ValidSignal(name string) bool {
	for _, s := range Signals {
		if s == name {
			return true
		}
	}
	return false
}

// ControlFrame is one JSON text frame of a PTY session, in either
// direction. Which fields are set depends on Type (see the Type*
// constants); the others are omitted on the wire.
type ControlFrame struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
	Mode      string `json:"mode,omitempty"`
	// ExitCode is the exit frame's status: the process's exit code, -1 when
	// a signal killed it. A pointer so that 0 is sent.
	ExitCode *int   `json:"exit_code,omitempty"`
	Code     string `json:"code,omitempty"`
	Error    string `json:"error,omitempty"`
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Data     string `json:"data,omitempty"`
}

// ConnectedFrame is {"type":"connected","session_id":id,"mode":mode}.
func ConnectedFrame(id, mode string) ControlFrame {
	return ControlFrame{Type: TypeConnected, SessionID: id, Mode: mode}
}

// ExitFrame is {"type":"exit","exit_code":code}.
func ExitFrame(code int) ControlFrame { return ControlFrame{Type: TypeExit, ExitCode: &code} }

// ErrorFrame is {"type":"error","code":code,"error":text}.
func ErrorFrame(code, text string) ControlFrame {
	return ControlFrame{Type: TypeError, Code: code, Error: text}
}

// UnknownFrameError is the error frame execd sends for an unknown type:
// {"type":"error","code":"INVALID_FRAME","error":"unknown frame type \"x\""}.
func UnknownFrameError(typ string) ControlFrame {
	return ErrorFrame(CodeInvalidFrame, "unknown frame type "+strconv.Quote(typ))
}

// EncodeControlFrame returns f as JSON.
func EncodeControlFrame(f ControlFrame) []byte {
	b, err := json.Marshal(f)
	if err != nil { // cannot happen: strings and ints only
		panic(err)
	}
	return b
}

// DecodeControlFrame parses a text frame. Invalid JSON (which execd
// ignores) or a missing type is an error.
func DecodeControlFrame(b []byte) (ControlFrame, error) {
	var f ControlFrame
	if err := json.Unmarshal(b, &f); err != nil {
		return ControlFrame{}, fmt.Errorf("opensandbox: control frame: %w", err)
	}
	if f.Type == "" {
		return ControlFrame{}, errors.New("opensandbox: control frame without a type")
	}
	return f, nil
}

// CreatePTYRequest is the optional JSON body of POST /pty. Cwd is
// ~-expanded and created; Command runs as `bash --norc --noprofile -c
// <command>` (empty: an interactive `bash --norc --noprofile`).
type CreatePTYRequest struct {
	Cwd     string `json:"cwd,omitempty"`
	Command string `json:"command,omitempty"`
}

// CreatePTYResponse is the 201 body of POST /pty.
type CreatePTYResponse struct {
	SessionID string `json:"session_id"`
}

// PTYStatus is the body of GET /pty/<id>. OutputOffset is the count of
// output bytes ever produced (the next replay offset); Running is false
// before the first attach and after exit.
type PTYStatus struct {
	SessionID    string `json:"session_id"`
	Running      bool   `json:"running"`
	OutputOffset int64  `json:"output_offset"`
}

// ParsePTYPath parses an execd path under /pty: "/pty" (create), "/pty/<id>"
// (status, delete) or "/pty/<id>/ws" (attach). id is "" for "/pty"; ok is
// false for any other path.
func ParsePTYPath(path string) (id string, ws, ok bool) {
	rest, found := strings.CutPrefix(path, PTYPath)
	if !found {
		return "", false, false
	}
	if rest == "" {
		return "", false, true
	}
	if rest[0] != '/' {
		return "", false, false
	}
	id, tail, hasTail := strings.Cut(rest[1:], "/")
	if !validIDSegment(id) {
		return "", false, false
	}
	if !hasTail {
		return id, false, true
	}
	if tail == "ws" {
		return id, true, true
	}
	return "", false, false
}

// AttachOptions are the query parameters of a WebSocket attach
// (wire-facts §3.2).
type AttachOptions struct {
	// Pipe asks for pipe mode (pty=0) if this attach starts the process.
	Pipe bool
	// Since is the absolute offset to replay from; 0 replays everything
	// retained, a value at or past the end replays nothing, a negative one
	// is clamped to the oldest retained byte.
	Since int64
	// Takeover evicts the current holder instead of being refused.
	Takeover bool
}

// ParseAttachQuery reads AttachOptions from a parsed query (a url.Values
// converts): pty is "0" exactly for Pipe; takeover is "1" exactly; since is
// read as its leading integer, so "12abc" is 12 and "abc", "" or an
// overflowing value are 0. Only the first value of each key counts.
func ParseAttachQuery(q map[string][]string) AttachOptions {
	first := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	return AttachOptions{
		Pipe:     first("pty") == "0",
		Takeover: first("takeover") == "1",
		Since:    leadingInt(first("since")),
	}
}

// Encode renders o as a query string without '?' ("" when all defaults):
// pty=0, since=<n>, takeover=1 in that order. Since is sent when non-zero.
func (o AttachOptions) Encode() string {
	var parts []string
	if o.Pipe {
		parts = append(parts, "pty=0")
	}
	if o.Since != 0 {
		parts = append(parts, "since="+strconv.FormatInt(o.Since, 10))
	}
	if o.Takeover {
		parts = append(parts, "takeover=1")
	}
	return strings.Join(parts, "&")
}

// leadingInt parses an optional sign and the digits that follow at the
// start of s; anything unparsable is 0.
func leadingInt(s string) int64 {
	end := 0
	if end < len(s) && (s[end] == '-' || s[end] == '+') {
		end++
	}
	start := end
	for end < len(s) && s[end] >= '0' && s[end] <= '9' {
		end++
	}
	if end == start {
		return 0
	}
	n, err := strconv.ParseInt(s[:end], 10, 64)
	if err != nil {
		return 0
	}
	return n
}
