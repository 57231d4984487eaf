package protocol_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

// The fuzzers check that decoders never panic, never allocate past their
// limits, and that whatever they accept re-encodes to an equivalent value.
// Their seed corpora run as ordinary tests.

func FuzzFrameReader(f *testing.F) {
	var seed bytes.Buffer
	protocol.WriteFrame(&seed, protocol.FrameStdout, []byte("out"))
	protocol.WriteJSONFrame(&seed, protocol.FrameExit, &protocol.ExitStatus{ExitCode: 3})
	f.Add(seed.Bytes())
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{99, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := protocol.NewFrameReader(bytes.NewReader(data))
		for {
			fm, err := fr.Next()
			if err != nil {
				if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, protocol.ErrTooLarge) && !errors.Is(err, protocol.ErrUnknownFrame) {
					t.Fatalf("unexpected error class: %v", err)
				}
				return
			}
			if len(fm.Payload) > protocol.MaxFrameSize {
				t.Fatalf("payload of %d bytes accepted", len(fm.Payload))
			}
			var buf bytes.Buffer
			if err := protocol.WriteFrame(&buf, fm.Type, fm.Payload); err != nil {
				t.Fatal(err)
			}
			again, err := protocol.NewFrameReader(&buf).Next()
			if err != nil || again.Type != fm.Type || !bytes.Equal(again.Payload, fm.Payload) {
				t.Fatalf("re-encode mismatch: %v", err)
			}
			// JSON frames decode leniently but must not panic.
			var st protocol.ExitStatus
			_ = protocol.DecodeJSON(fm.Payload, &st)
		}
	})
}

func FuzzStreamHeader(f *testing.F) {
	var seed bytes.Buffer
	protocol.WriteHeader(&seed, protocol.KindExec, &protocol.ExecParams{Script: "echo hi", TimeoutMS: 10})
	f.Add(seed.Bytes())
	f.Add([]byte{1, 1, 0, 0, 0, 2, '{', '}'})
	f.Add([]byte{2, 1, 0, 0, 0, 0})
	f.Add([]byte{1, 2, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := protocol.ReadHeader(bytes.NewReader(data))
		if err != nil {
			return
		}
		if len(h.Params) > protocol.MaxHeaderSize || !h.Kind.Valid() || h.Version != protocol.Version {
			t.Fatalf("accepted invalid header %+v", h)
		}
		var p protocol.ExecParams
		if err := h.DecodeParams(&p); err != nil {
			return
		}
		_ = p.Validate()
	})
}

func FuzzExecRequest(f *testing.F) {
	f.Add([]byte(`{"target":{"node":"a"},"argv":["true"]}`))
	f.Add([]byte(`{"target":{"selector":"gpu in (a,b),!spot"},"script":"echo hi","timeout":"1s","stdin":"eA=="}`))
	f.Add([]byte(`{"target":{"all":true},"argv":["x"],"timeout":1e300}`))
	f.Add([]byte(`{"id":"job-1","target":{"node":"a"},"argv":["x"],"env":{"A":"B"},"max_parallel":3}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, e := protocol.DecodeExecRequest(data)
		if e != nil {
			if e.Code == "" || e.Message == "" || e.Status < 400 {
				t.Fatalf("error without code/message/status: %+v", e)
			}
			return
		}
		p := req.Params(0)
		if err := p.Validate(); err != nil {
			t.Fatalf("accepted request has invalid params: %v", err)
		}
		var buf bytes.Buffer
		if err := protocol.WriteHeader(&buf, protocol.KindExec, &p); err != nil && !errors.Is(err, protocol.ErrTooLarge) {
			t.Fatal(err)
		}
	})
}

// FuzzSelector parses selectors as the API and the CLI do: what is
// accepted has valid keys and values and no empty term, prints
// (formatSelector) to a selector that parses to the same requirements, and
// matches as its requirements say; what is refused is refused with a
// short message that names the selector, however long it is.
func FuzzSelector(f *testing.F) {
	for _, s := range []string{"gpu=a100", "a in (b,c),!d", "x!=y, z", "a notin ()", "((", "a=b,,c", " ", ",", "a in (b,)",
		strings.Repeat("k", 4000) + " x", "a=" + strings.Repeat("v", 4000), "a in (" + strings.Repeat("(", 100), "!" + strings.Repeat("-", 4000)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		sel, err := protocol.ParseSelector(text)
		if err != nil {
			if len(err.Error()) > maxProblemLen {
				t.Fatalf("selector %.100q: a message of %d bytes (is a value not clipped?): %.300q…", text, len(err.Error()), err.Error())
			}
			if !strings.HasPrefix(err.Error(), "selector ") {
				t.Fatalf("selector %.100q: error does not name the selector: %v", text, err)
			}
			return
		}
		if text != "" && sel.Empty() {
			t.Fatalf("non-empty selector %q accepted with no requirement", text)
		}
		labels := map[string]string{}
		for _, r := range sel.Reqs {
			if err := protocol.ValidLabelKey(r.Key); err != nil {
				t.Fatalf("accepted invalid key: %v", err)
			}
			if (r.Op == protocol.OpExists || r.Op == protocol.OpNotExists) != (len(r.Values) == 0) {
				t.Fatalf("selector %q: requirement %+v has the wrong number of values", text, r)
			}
			for _, v := range r.Values {
				if err := protocol.ValidLabelValue(v); err != nil {
					t.Fatalf("accepted invalid value: %v", err)
				}
			}
			if len(r.Values) > 0 {
				labels[r.Key] = r.Values[0]
			}
		}
		again, err := protocol.ParseSelector(formatSelector(sel))
		if err != nil || !cmp.Equal(sel.Reqs, again.Reqs) {
			t.Fatalf("selector %q → %q → %+v, %v; want %+v", text, formatSelector(sel), again.Reqs, err, sel.Reqs)
		}
		for _, r := range sel.Reqs {
			if want := r.Matches(labels); sel.Matches(labels) && !want {
				t.Fatalf("selector %q matches %v but its requirement %+v does not", text, labels, r)
			}
		}
	})
}
