package protocol_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	frames := []protocol.Frame{
		{Type: protocol.FrameStdout, Payload: []byte("hello\n")},
		{Type: protocol.FrameStdinClose, Payload: []byte{}},
		{Type: protocol.FrameStderr, Payload: bytes.Repeat([]byte{0xff, 0}, protocol.ChunkSize/2)},
	}
	for _, f := range frames {
		if err := protocol.WriteFrame(&buf, f.Type, f.Payload); err != nil {
			t.Fatal(err)
		}
	}
	fr := protocol.NewFrameReader(&buf)
	for i, want := range frames {
		got, err := fr.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if got.Type != want.Type || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("frame %d: got %v/%d bytes, want %v/%d bytes", i, got.Type, len(got.Payload), want.Type, len(want.Payload))
		}
	}
	if _, err := fr.Next(); err != io.EOF {
		t.Fatalf("after last frame: got %v, want io.EOF", err)
	}
}

func TestFrameErrors(t *testing.T) {
	big := make([]byte, 5)
	big[0] = byte(protocol.FrameStdout)
	binary.BigEndian.PutUint32(big[1:], protocol.MaxFrameSize+1)
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"unknown type", []byte{99, 0, 0, 0, 0}, protocol.ErrUnknownFrame},
		{"zero type", []byte{0, 0, 0, 0, 0}, protocol.ErrUnknownFrame},
		{"oversized", big, protocol.ErrTooLarge},
		{"truncated header", []byte{3, 0}, io.ErrUnexpectedEOF},
		{"truncated payload", []byte{3, 0, 0, 0, 9, 'a'}, io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := protocol.NewFrameReader(bytes.NewReader(tt.in)).Next()
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
	if err := protocol.WriteFrame(io.Discard, protocol.FrameStdout, make([]byte, protocol.MaxFrameSize+1)); !errors.Is(err, protocol.ErrTooLarge) {
		t.Fatalf("WriteFrame oversized: got %v", err)
	}
}

func TestFrameReaderCustomMax(t *testing.T) {
	var buf bytes.Buffer
	protocol.WriteFrame(&buf, protocol.FrameStdout, make([]byte, 100))
	fr := protocol.NewFrameReader(&buf)
	fr.Max = 99
	if _, err := fr.Next(); !errors.Is(err, protocol.ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	want := protocol.ExecParams{Argv: []string{"echo", "hi"}, Env: map[string]string{"A": "b"}, TimeoutMS: 1500}
	if err := protocol.WriteHeader(&buf, protocol.KindExec, &want); err != nil {
		t.Fatal(err)
	}
	h, err := protocol.ReadHeader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if h.Kind != protocol.KindExec || h.Version != protocol.Version {
		t.Fatalf("header = %+v", h)
	}
	var got protocol.ExecParams
	if err := h.DecodeParams(&got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("params mismatch (-want +got):\n%s", diff)
	}
}

func TestHeaderErrors(t *testing.T) {
	hdr := func(ver, kind byte, n uint32, params string) []byte {
		b := []byte{ver, kind, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[2:], n)
		return append(b, params...)
	}
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"old version", hdr(0, 2, 2, "{}"), protocol.ErrVersion},
		{"future version", hdr(2, 2, 2, "{}"), protocol.ErrVersion},
		{"unknown kind", hdr(1, 42, 2, "{}"), protocol.ErrUnknownKind},
		{"oversized", hdr(1, 2, protocol.MaxHeaderSize+1, ""), protocol.ErrTooLarge},
		{"truncated params", hdr(1, 2, 10, "{}"), io.ErrUnexpectedEOF},
		{"empty", nil, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := protocol.ReadHeader(bytes.NewReader(tt.in))
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDecodeParamsStrict(t *testing.T) {
	for _, params := range []string{`{"argv":["x"],"bogus":true}`, `{"argv":["x"]} {}`, `{"argv":`, `[]`} {
		h := protocol.Header{Version: protocol.Version, Kind: protocol.KindExec, Params: []byte(params)}
		var p protocol.ExecParams
		if err := h.DecodeParams(&p); !errors.Is(err, protocol.ErrMalformedJSON) {
			t.Errorf("DecodeParams(%s) = %v, want ErrMalformedJSON", params, err)
		}
	}
}

func TestExecParamsValidate(t *testing.T) {
	tests := []struct {
		name string
		p    protocol.ExecParams
		ok   bool
	}{
		{"script", protocol.ExecParams{Script: "echo hi"}, true},
		{"argv", protocol.ExecParams{Argv: []string{"true"}, Stdin: true}, true},
		{"neither", protocol.ExecParams{}, false},
		{"both", protocol.ExecParams{Script: "x", Argv: []string{"y"}}, false},
		{"empty argv0", protocol.ExecParams{Argv: []string{""}}, false},
		{"script with stdin", protocol.ExecParams{Script: "cat", Stdin: true}, false},
		{"bad env key", protocol.ExecParams{Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}, false},
		{"negative timeout", protocol.ExecParams{Argv: []string{"true"}, TimeoutMS: -1}, false},
		{"huge script", protocol.ExecParams{Script: string(make([]byte, protocol.MaxScriptSize+1))}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

// ParseFrame decodes what FrameReader decodes, from any prefix of the
// encoded bytes: nothing until a frame is whole, then the frame and its
// length; and refuses unknown types and oversized payloads from the
// prefix alone.
func TestParseFrameMatchesFrameReader(t *testing.T) {
	var enc bytes.Buffer
	protocol.WriteFrame(&enc, protocol.FrameHeartbeat, []byte(`{"rtt_us":5}`))
	protocol.WriteFrame(&enc, protocol.FrameStdout, nil)
	protocol.WriteFrame(&enc, protocol.FrameJobExit, bytes.Repeat([]byte("x"), 300))
	all := enc.Bytes()
	fr := protocol.NewFrameReader(bytes.NewReader(all))
	off := 0
	for {
		want, err := fr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		rest := all[off:]
		whole := 0
		for cut := 0; cut <= len(rest); cut++ {
			f, n, err := protocol.ParseFrame(rest[:cut], 0)
			if err != nil {
				t.Fatalf("prefix of %d bytes: %v", cut, err)
			}
			if n == 0 {
				continue
			}
			if whole == 0 {
				whole = cut
			}
			if f.Type != want.Type || !bytes.Equal(f.Payload, want.Payload) {
				t.Fatalf("prefix of %d bytes: got %s %q, want %s %q", cut, f.Type, f.Payload, want.Type, want.Payload)
			}
		}
		if whole != 5+len(want.Payload) {
			t.Fatalf("%s frame whole after %d bytes, want %d", want.Type, whole, 5+len(want.Payload))
		}
		off += whole
	}
	if _, _, err := protocol.ParseFrame([]byte{200, 0, 0, 0, 1}, 0); !errors.Is(err, protocol.ErrUnknownFrame) {
		t.Errorf("unknown type: %v, want ErrUnknownFrame", err)
	}
	if _, _, err := protocol.ParseFrame([]byte{byte(protocol.FrameHeartbeat), 0, 0, 0x10, 1}, 4096); !errors.Is(err, protocol.ErrTooLarge) {
		t.Errorf("payload over max: %v, want ErrTooLarge", err)
	}
}
