package protocol_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

func TestDecodeExecRequest(t *testing.T) {
	tests := []struct {
		name string
		body string
		code string // "" = valid
	}{
		{"node argv", `{"target":{"node":"gpu-1"},"argv":["true"]}`, ""},
		{"selector script", `{"target":{"selector":"gpu=a100,zone!=b"},"script":"echo hi","timeout":"30s"}`, ""},
		{"all numeric timeout", `{"target":{"all":true},"argv":["true"],"timeout":1.5}`, ""},
		{"stdin base64", `{"target":{"node":"a"},"argv":["cat"],"stdin":"aGVsbG8="}`, ""},
		{"malformed", `{"target":`, protocol.ErrCodeMalformed},
		{"not object", `[1,2]`, protocol.ErrCodeMalformed},
		{"trailing", `{"target":{"node":"a"},"argv":["x"]} {}`, protocol.ErrCodeMalformed},
		{"unknown field", `{"target":{"node":"a"},"argv":["x"],"shell":"zsh"}`, protocol.ErrCodeUnknownField},
		{"unknown target field", `{"target":{"host":"a"},"argv":["x"]}`, protocol.ErrCodeUnknownField},
		{"no target", `{"argv":["x"]}`, protocol.ErrCodeNoTarget},
		{"empty body", ``, protocol.ErrCodeNoTarget},
		{"two targets", `{"target":{"node":"a","all":true},"argv":["x"]}`, protocol.ErrCodeInvalid},
		{"bad node id", `{"target":{"node":"a b"},"argv":["x"]}`, protocol.ErrCodeInvalid},
		{"bad selector", `{"target":{"selector":"a in (b"},"argv":["x"]}`, protocol.ErrCodeInvalid},
		{"no command", `{"target":{"node":"a"}}`, protocol.ErrCodeInvalid},
		{"script and stdin", `{"target":{"node":"a"},"script":"cat","stdin":"eA=="}`, protocol.ErrCodeInvalid},
		{"bad timeout", `{"target":{"node":"a"},"argv":["x"],"timeout":"soon"}`, protocol.ErrCodeMalformed},
		{"negative timeout", `{"target":{"node":"a"},"argv":["x"],"timeout":-1}`, protocol.ErrCodeMalformed},
		{"bad id", `{"id":"a/b","target":{"node":"a"},"argv":["x"]}`, protocol.ErrCodeInvalid},
		{"oversized script", `{"target":{"node":"a"},"script":"` + strings.Repeat("x", protocol.MaxScriptSize+1) + `"}`, protocol.ErrCodeTooLarge},
		{"oversized body", `{"target":{"node":"a"},"script":"` + strings.Repeat("x", protocol.MaxRequestSize) + `"}`, protocol.ErrCodeTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, e := protocol.DecodeExecRequest([]byte(tt.body))
			got := ""
			if e != nil {
				got = e.Code
				if e.Message == "" || e.Status == 0 {
					t.Errorf("error without status or message: %+v", e)
				}
			}
			if got != tt.code {
				t.Fatalf("code = %q (%v), want %q", got, e, tt.code)
			}
		})
	}
}

func TestExecRequestParams(t *testing.T) {
	r := protocol.ExecRequest{Argv: []string{"x"}, Timeout: protocol.Duration(1500 * time.Microsecond)}
	if got := r.Params(0).TimeoutMS; got != 2 {
		t.Fatalf("1.5ms timeout -> %d ms, want 2 (rounded up, never 0)", got)
	}
	r.Timeout = 0
	if got := r.Params(time.Minute).TimeoutMS; got != 60000 {
		t.Fatalf("default timeout -> %d ms, want 60000", got)
	}
}

func TestDurationJSON(t *testing.T) {
	var d protocol.Duration
	for in, want := range map[string]time.Duration{`"90s"`: 90 * time.Second, `2`: 2 * time.Second, `0.25`: 250 * time.Millisecond} {
		if err := json.Unmarshal([]byte(in), &d); err != nil || time.Duration(d) != want {
			t.Errorf("Unmarshal(%s) = %v, %v; want %v", in, time.Duration(d), err, want)
		}
	}
	b, _ := json.Marshal(protocol.Duration(90 * time.Second))
	if string(b) != `"1m30s"` {
		t.Errorf("Marshal = %s", b)
	}
}
