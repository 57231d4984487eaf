package protocol_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// countWriter counts Write calls.
type countWriter struct {
	bytes.Buffer
	writes int
}

func (w *countWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

// A script of '<', '>' and '&' must not be inflated by HTML escaping: 40 KiB
// of them fits a header (escaped it would be 240 KiB), and each header or
// JSON frame is still one Write.
func TestHeaderAndFrameDoNotEscapeHTML(t *testing.T) {
	script := strings.Repeat("<>&", 40<<10/3)
	var w countWriter
	if err := protocol.WriteHeader(&w, protocol.KindExec, protocol.ExecParams{Script: script}); err != nil {
		t.Fatalf("WriteHeader: %v", err)
	}
	if w.writes != 1 {
		t.Errorf("WriteHeader made %d writes, want 1", w.writes)
	}
	if w.Len() > len(script)+64 {
		t.Errorf("header is %d bytes for a %d byte script", w.Len(), len(script))
	}
	h, err := protocol.ReadHeader(&w)
	if err != nil {
		t.Fatal(err)
	}
	var p protocol.ExecParams
	if err := h.DecodeParams(&p); err != nil || p.Script != script {
		t.Fatalf("params round trip: %v (script equal: %v)", err, p.Script == script)
	}

	w = countWriter{}
	info := protocol.ErrorInfo{Code: "x", Message: "a < b && c > d"}
	if err := protocol.WriteJSONFrame(&w, protocol.FrameError, &info); err != nil {
		t.Fatal(err)
	}
	if w.writes != 1 || !strings.Contains(w.String(), "a < b && c > d") {
		t.Errorf("frame %q in %d writes, want unescaped in 1", w.String(), w.writes)
	}
	f, err := protocol.NewFrameReader(&w).Next()
	if err != nil {
		t.Fatal(err)
	}
	var got protocol.ErrorInfo
	if err := protocol.DecodeJSON(f.Payload, &got); err != nil || got != info {
		t.Errorf("frame round trip = %+v, %v", got, err)
	}
	if b, _ := protocol.MarshalJSON(&info); bytes.HasSuffix(b, []byte("\n")) {
		t.Errorf("MarshalJSON = %q, want no trailing newline", b)
	}
}

// ExecRequest.Validate measures the encoded header, not just the script's
// length: control characters encode as \u00XX, six bytes each.
func TestExecRequestValidateEncodedHeaderSize(t *testing.T) {
	tests := []struct {
		name   string
		script string
		env    map[string]string
		code   string
	}{
		{"escaped script", strings.Repeat("\x01", protocol.MaxScriptSize), nil, protocol.ErrCodeTooLarge},
		{"html chars fit", strings.Repeat("<", protocol.MaxScriptSize), nil, ""},
		{"big env", "true", map[string]string{"BIG": strings.Repeat("x", protocol.MaxHeaderSize)}, protocol.ErrCodeTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body, _ := json.Marshal(protocol.ExecRequest{Target: protocol.Target{Node: "a"}, Script: tt.script, Env: tt.env})
			_, e := protocol.DecodeExecRequest(body)
			got := ""
			if e != nil {
				got = e.Code
			}
			if got != tt.code {
				t.Fatalf("code = %q (%v), want %q", got, e, tt.code)
			}
			if e != nil && (e.Status != 413 || !strings.Contains(e.Message, "stream header")) {
				t.Errorf("error = %+v, want 413 naming the stream header", e)
			}
		})
	}
}

func TestNodesRequestValidate(t *testing.T) {
	tests := []struct {
		r    protocol.NodesRequest
		code string
	}{
		{protocol.NodesRequest{}, ""},
		{protocol.NodesRequest{Limit: protocol.MaxNodesLimit, Offset: 5}, ""},
		{protocol.NodesRequest{Limit: protocol.MaxNodesLimit + 1}, protocol.ErrCodeInvalid},
		{protocol.NodesRequest{Limit: -1}, protocol.ErrCodeInvalid},
		{protocol.NodesRequest{Offset: -1}, protocol.ErrCodeInvalid},
		{protocol.NodesRequest{Selector: "a in (b"}, protocol.ErrCodeInvalid},
	}
	for _, tt := range tests {
		got := ""
		if e := tt.r.Validate(); e != nil {
			got = e.Code
		}
		if got != tt.code {
			t.Errorf("%+v: code %q, want %q", tt.r, got, tt.code)
		}
	}
}
