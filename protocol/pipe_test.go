package protocol_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

func TestParsePipeHeader(t *testing.T) {
	h := func(kv ...string) map[string][]string {
		m := map[string][]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = []string{kv[i+1]}
		}
		return m
	}
	const (
		op     = protocol.HeaderPipeOp
		seq    = protocol.HeaderPipeSeq
		credit = protocol.HeaderPipeCredit
	)
	tests := []struct {
		name    string
		h       map[string][]string
		body    int
		want    protocol.PipeMsg
		wantErr string
	}{
		{"data", h(op, "data", seq, "7"), 10, protocol.PipeMsg{Op: protocol.PipeData, Seq: 7}, ""},
		{"data max seq", h(op, "data", seq, "18446744073709551615"), 1, protocol.PipeMsg{Op: protocol.PipeData, Seq: 1<<64 - 1}, ""},
		{"ack", h(op, "ack", credit, "8388608"), 0, protocol.PipeMsg{Op: protocol.PipeAck, Credit: 8 << 20}, ""},
		{"eof", h(op, "eof", seq, "0"), 0, protocol.PipeMsg{Op: protocol.PipeEOF}, ""},
		{"close", h(op, "close", protocol.HeaderPipeError, "boom"), 0, protocol.PipeMsg{Op: protocol.PipeClose, Error: "boom"}, ""},
		{"close quiet", h(op, "close"), 0, protocol.PipeMsg{Op: protocol.PipeClose}, ""},
		{"ping", h(op, "ping"), 0, protocol.PipeMsg{Op: protocol.PipePing}, ""},
		{"reset", h(op, "reset", protocol.HeaderPipeError, "cancelled"), 0, protocol.PipeMsg{Op: protocol.PipeReset, Error: "cancelled"}, ""},
		{"reset quiet", h(op, "reset"), 0, protocol.PipeMsg{Op: protocol.PipeReset}, ""},
		{"reset with body", h(op, "reset"), 1, protocol.PipeMsg{Op: protocol.PipeReset}, "reset message has a 1 byte body"},
		{"open", h(op, "open", protocol.HeaderPipeInbox, "_INBOX.abc.1"), 0, protocol.PipeMsg{Op: protocol.PipeOpen, Inbox: "_INBOX.abc.1"}, ""},
		{"no op", h(seq, "1"), 0, protocol.PipeMsg{}, "no Tether-Pipe-Op"},
		{"unknown op", h(op, "rst"), 0, protocol.PipeMsg{}, `unknown Tether-Pipe-Op "rst"`},
		{"data no seq", h(op, "data"), 1, protocol.PipeMsg{Op: protocol.PipeData}, "no Tether-Pipe-Seq"},
		{"data empty", h(op, "data", seq, "1"), 0, protocol.PipeMsg{Op: protocol.PipeData}, "data body of 0 bytes"},
		{"data huge", h(op, "data", seq, "1"), protocol.MaxPipeMessage + 1, protocol.PipeMsg{Op: protocol.PipeData}, "data body of"},
		{"ack with body", h(op, "ack", credit, "1"), 3, protocol.PipeMsg{Op: protocol.PipeAck}, "ack message has a 3 byte body"},
		{"seq sign", h(op, "eof", seq, "+1"), 0, protocol.PipeMsg{Op: protocol.PipeEOF}, "not a plain decimal"},
		{"seq leading zero", h(op, "eof", seq, "01"), 0, protocol.PipeMsg{Op: protocol.PipeEOF}, "not a plain decimal"},
		{"seq overflow", h(op, "eof", seq, "18446744073709551616"), 0, protocol.PipeMsg{Op: protocol.PipeEOF}, "not a decimal uint64"},
		{"credit hex", h(op, "ack", credit, "0x10"), 0, protocol.PipeMsg{Op: protocol.PipeAck}, "not a plain decimal"},
		{"open no inbox", h(op, "open"), 0, protocol.PipeMsg{Op: protocol.PipeOpen}, "no Tether-Pipe-Inbox"},
		{"open wildcard", h(op, "open", protocol.HeaderPipeInbox, "a.*"), 0, protocol.PipeMsg{Op: protocol.PipeOpen, Inbox: "a.*"}, "not a literal subject"},
		{"open space", h(op, "open", protocol.HeaderPipeInbox, "a b"), 0, protocol.PipeMsg{Op: protocol.PipeOpen, Inbox: "a b"}, "space or control"},
		{"close long error", h(op, "close", protocol.HeaderPipeError, strings.Repeat("x", protocol.MaxPipeErrorLen+1)), 0,
			protocol.PipeMsg{Op: protocol.PipeClose, Error: strings.Repeat("x", protocol.MaxPipeErrorLen+1)}, "over 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.ParsePipeHeader(tt.h, tt.body)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, protocol.ErrPipeHeader) {
					t.Fatalf("err = %v, want ErrPipeHeader containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("mismatch (-want +got):\n%s", diff)
			}
			// The reference encoding round-trips.
			again, err := protocol.ParsePipeHeader(got.Header(), tt.body)
			if err != nil {
				t.Fatalf("re-parse: %v", err)
			}
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("round trip mismatch (-first +second):\n%s", diff)
			}
		})
	}
}

func TestPipeOpString(t *testing.T) {
	for o := protocol.PipeData; o <= protocol.PipeReset; o++ {
		back, err := protocol.ParsePipeOp(o.String())
		if err != nil || back != o {
			t.Errorf("ParsePipeOp(%q) = %v, %v", o.String(), back, err)
		}
	}
	if s := protocol.PipeOp(0).String(); s != "op(0)" {
		t.Errorf("PipeOp(0) = %q", s)
	}
}

func TestTruncatePipeError(t *testing.T) {
	long := strings.Repeat("é", protocol.MaxPipeErrorLen) // 2 bytes each
	got := protocol.TruncatePipeError("line1\nline2\r" + long)
	if len(got) > protocol.MaxPipeErrorLen || !utf8.ValidString(got) || strings.ContainsAny(got, "\r\n") {
		t.Errorf("TruncatePipeError: %d bytes, valid UTF-8 %v, %q...", len(got), utf8.ValidString(got), got[:20])
	}
	if got := protocol.TruncatePipeError("short"); got != "short" {
		t.Errorf("short text changed: %q", got)
	}
}

func FuzzParsePipeHeader(f *testing.F) {
	f.Add("data", "0", "", "", "", 1)
	f.Add("ack", "", "8388608", "", "", 0)
	f.Add("eof", "12", "", "", "", 0)
	f.Add("close", "", "", "tunnel to node a lost", "", 0)
	f.Add("open", "", "", "", "_INBOX.x.y", 0)
	f.Add("ping", "-1", "x", "\n", "a..b", 5)
	f.Fuzz(func(t *testing.T, op, seq, credit, errText, inbox string, body int) {
		h := map[string][]string{}
		for k, v := range map[string]string{
			protocol.HeaderPipeOp: op, protocol.HeaderPipeSeq: seq, protocol.HeaderPipeCredit: credit,
			protocol.HeaderPipeError: errText, protocol.HeaderPipeInbox: inbox,
		} {
			if v != "" {
				h[k] = []string{v}
			}
		}
		m, err := protocol.ParsePipeHeader(h, body)
		if err != nil {
			if !errors.Is(err, protocol.ErrPipeHeader) {
				t.Fatalf("error does not wrap ErrPipeHeader: %v", err)
			}
			return
		}
		if !m.Op.Valid() {
			t.Fatalf("accepted invalid op %v", m.Op)
		}
		again, err := protocol.ParsePipeHeader(m.Header(), body)
		if err != nil {
			t.Fatalf("re-parse of accepted %+v: %v", m, err)
		}
		m.Error = protocol.TruncatePipeError(m.Error) // the encoder normalises it
		if diff := cmp.Diff(m, again); diff != "" {
			t.Fatalf("round trip mismatch (-first +second):\n%s", diff)
		}
	})
}
