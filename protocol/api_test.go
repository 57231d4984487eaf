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
		{"negative timeout", `{"target":{"node":"a"},"argv":["x"],"timeout":-1}`, protocol.ErrCodeInvalid},
		{"negative timeout string", `{"target":{"node":"a"},"argv":["x"],"timeout":"-5s"}`, protocol.ErrCodeInvalid},
		{"null timeout", `{"target":{"node":"a"},"argv":["x"],"timeout":null}`, ""},
		{"empty script", `{"target":{"node":"a"},"script":""}`, protocol.ErrCodeInvalid},
		{"env value with NUL", `{"target":{"node":"a"},"argv":["x"],"env":{"A":"b\u0000c"}}`, protocol.ErrCodeInvalid},
		{"commands", `{"target":{"node":"a"},"commands":["echo a","false"]}`, ""},
		{"commands fail fast", `{"target":{"node":"a"},"commands":["echo a","false"],"fail_fast":true}`, ""},
		{"fail fast without commands", `{"target":{"node":"a"},"script":"x","fail_fast":true}`, protocol.ErrCodeInvalid},
		{"commands and argv", `{"target":{"node":"a"},"commands":["x"],"argv":["y"]}`, protocol.ErrCodeInvalid},
		{"commands with stdin", `{"target":{"node":"a"},"commands":["cat"],"stdin":"eA=="}`, protocol.ErrCodeInvalid},
		{"detach", `{"target":{"node":"a"},"script":"sleep 1","detach":true}`, ""},
		{"detach with stdin", `{"target":{"node":"a"},"argv":["cat"],"stdin":"eA==","detach":true}`, protocol.ErrCodeInvalid},
		{"detach fail fast", `{"target":{"node":"a"},"commands":["x"],"fail_fast":true,"detach":true}`, protocol.ErrCodeInvalid},
		{"wrong type", `{"target":{"node":5},"argv":["x"]}`, protocol.ErrCodeMalformed},
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

func TestDecodeExecRequestMessages(t *testing.T) {
	long := strings.Repeat("x", 500)
	tests := []struct {
		name, body, want string
	}{
		{"negative number timeout", `{"target":{"node":"a"},"argv":["x"],"timeout":-1}`, "timeout must not be negative"},
		{"negative string timeout", `{"target":{"node":"a"},"argv":["x"],"timeout":"-5s"}`, "timeout must not be negative"},
		{"empty script", `{"target":{"node":"a"},"script":""}`, "script is empty"},
		{"node of the wrong type", `{"target":{"node":5},"argv":["x"]}`, "target.node: want a string, got number"},
		{"argv of the wrong type", `{"target":{"node":"a"},"argv":"ls"}`, "argv: want an array, got a string"},
		{"fail_fast of the wrong type", `{"target":{"node":"a"},"commands":["x"],"fail_fast":"yes"}`, "fail_fast: want true or false, got a string"},
		{"bad timeout string", `{"target":{"node":"a"},"argv":["x"],"timeout":"soon"}`, `timeout: "soon" is not a duration`},
		{"timeout of the wrong type", `{"target":{"node":"a"},"argv":["x"],"timeout":[1]}`, "timeout: want"},
		{"not an object", `[1]`, "must be a JSON object"},
		{"env value NUL", `{"target":{"node":"a"},"argv":["x"],"env":{"K":"a\u0000"}}`, `env "K": value contains NUL`},
		{"long id is clipped", `{"id":"` + long + `","target":{"node":"a"},"argv":["x"]}`, `"` + strings.Repeat("x", 64) + `"…`},
		{"long node is clipped", `{"target":{"node":"` + long + `"},"argv":["x"]}`, `"` + strings.Repeat("x", 64) + `"…`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, e := protocol.DecodeExecRequest([]byte(tt.body))
			if e == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(e.Message, tt.want) {
				t.Errorf("message %q does not contain %q", e.Message, tt.want)
			}
			if strings.Contains(e.Message, "Go struct") || strings.Contains(e.Message, "protocol.") || strings.Contains(e.Message, long) {
				t.Errorf("message %q leaks Go names or echoes a long value", e.Message)
			}
		})
	}
}

func TestShellScript(t *testing.T) {
	for _, tt := range []struct {
		p    protocol.ExecParams
		want string
	}{
		{protocol.ExecParams{Script: "a"}, "a"},
		{protocol.ExecParams{Commands: []string{"echo a", "false"}}, "echo a\nfalse"},
		{protocol.ExecParams{Commands: []string{"echo a"}, FailFast: true}, ""},
		{protocol.ExecParams{Argv: []string{"x"}}, ""},
	} {
		if got := tt.p.ShellScript(); got != tt.want {
			t.Errorf("%+v: ShellScript = %q, want %q", tt.p, got, tt.want)
		}
	}
}

func TestJobParamsValidate(t *testing.T) {
	for _, tt := range []struct {
		p  protocol.JobParams
		ok bool
	}{
		{protocol.JobParams{Op: "status", ID: "j1"}, true},
		{protocol.JobParams{Op: "output", ID: "j1", Stream: "stderr", Offset: 5, Limit: 10}, true},
		{protocol.JobParams{Op: "output", ID: "j1", Stream: "stdin"}, false},
		{protocol.JobParams{Op: "output", ID: "j1", Stream: "stdout", Limit: protocol.MaxJobOutputLimit + 1}, false},
		{protocol.JobParams{Op: "output", ID: "j1", Stream: "stdout", Offset: -1}, false},
		{protocol.JobParams{Op: "delete", ID: "j1"}, false},
		{protocol.JobParams{Op: "cancel", ID: "../x"}, false},
	} {
		if err := tt.p.Validate(); (err == nil) != tt.ok {
			t.Errorf("%+v: Validate = %v, want ok=%v", tt.p, err, tt.ok)
		}
	}
}
