package protocol

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// Kind is a stream's operation type, the second byte of its header.
type Kind uint8

// Stream kinds. Values are part of the wire format: never renumber.
const (
	KindControl   Kind = 1 // the session's first stream: hello, welcome, heartbeats
	KindExec      Kind = 2 // run a process; params ExecParams
	KindCopy      Kind = 3 // mirror a file or tree; params CopyParams (copy.go)
	KindPTY       Kind = 4 // interactive terminal; params PTYParams (pty.go)
	KindSSH       Kind = 5 // the agent's own SSH server; params SSHParams (ssh.go)
	KindDial      Kind = 6 // raw bytes to an allow-listed local target; params DialParams (inventory.go)
	KindJob       Kind = 7 // query or cancel a detached job; params JobParams (job.go)
	KindInventory Kind = 8 // list the sandboxes of the agent's gateways; params InventoryParams
	KindSandbox   Kind = 9 // one operation on a sandbox of the agent's gateways; params SandboxOpParams
)

var kindNames = map[Kind]string{
	KindControl: "control", KindExec: "exec", KindCopy: "copy",
	KindPTY: "pty", KindSSH: "ssh", KindDial: "dial", KindJob: "job",
	KindInventory: "inventory", KindSandbox: "sandbox",
}

// Kinds lists every defined stream kind, for pre-initialising metric labels.
func Kinds() []Kind {
	return []Kind{KindControl, KindExec, KindCopy, KindPTY, KindSSH, KindDial, KindJob, KindInventory, KindSandbox}
}

// String returns the kind's name, or "kind(N)" for unknown kinds.
func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Valid reports whether k is a defined stream kind.
func (k Kind) Valid() bool { _, ok := kindNames[k]; return ok }

// headerPrefixSize is the fixed part of a stream header: version, kind, length.
const headerPrefixSize = 6

// Header is a decoded stream header. Params holds the raw JSON parameters; use
// DecodeParams to decode them into the kind's struct.
type Header struct {
	Version uint8
	Kind    Kind
	Params  json.RawMessage
}

// WriteHeader encodes params as JSON (see MarshalJSON) and writes a stream
// header of kind k in one Write call. It fails with ErrTooLarge if the params
// exceed MaxHeaderSize.
func WriteHeader(w io.Writer, k Kind, params any) error {
	buf, err := encodeJSON(headerPrefixSize, params)
	if err != nil {
		return fmt.Errorf("encode %s stream header: %w", k, err)
	}
	n := len(buf) - headerPrefixSize
	if n > MaxHeaderSize {
		return fmt.Errorf("write %s stream header of %d bytes: %w (max %d)", k, n, ErrTooLarge, MaxHeaderSize)
	}
	buf[0] = Version
	buf[1] = byte(k)
	binary.BigEndian.PutUint32(buf[2:6], uint32(n))
	_, err = w.Write(buf)
	return err
}

// ReadHeader reads one stream header. It returns ErrVersion for a header of
// another protocol version, ErrUnknownKind for an undefined kind and
// ErrTooLarge for params over MaxHeaderSize, in each case before reading the
// params. The params are returned raw and unvalidated.
func ReadHeader(r io.Reader) (Header, error) {
	var p [headerPrefixSize]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return Header{}, fmt.Errorf("read stream header: %w", err)
	}
	h := Header{Version: p[0], Kind: Kind(p[1])}
	if h.Version != Version {
		return h, fmt.Errorf("read stream header: %w: got %d, want %d", ErrVersion, h.Version, Version)
	}
	if !h.Kind.Valid() {
		return h, fmt.Errorf("read stream header: %w: %d", ErrUnknownKind, p[1])
	}
	n := binary.BigEndian.Uint32(p[2:6])
	if n > MaxHeaderSize {
		return h, fmt.Errorf("read %s stream header of %d bytes: %w (max %d)", h.Kind, n, ErrTooLarge, MaxHeaderSize)
	}
	h.Params = make([]byte, n)
	if _, err := io.ReadFull(r, h.Params); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return h, fmt.Errorf("read %s stream header params: %w", h.Kind, err)
	}
	return h, nil
}

// DecodeParams decodes the header's params strictly into v, because a
// request that is only partly understood must not run: a key that is not
// exactly one of the struct's field names (case-sensitively), a key given
// twice in one object, bytes that are not UTF-8, an unpaired surrogate
// escape and trailing data are errors wrapping ErrMalformedJSON (with a
// *JSONError naming the path, for all but syntax errors; see
// strictjson.go).
func (h Header) DecodeParams(v any) error {
	if err := decodeStrict(h.Params, v); err != nil {
		return fmt.Errorf("%s stream params: %w: %w", h.Kind, ErrMalformedJSON, err)
	}
	return nil
}
