package protocol_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// Selector errors point at the bad character (its byte offset in the whole
// selector, not the offset of its term) and quote the selector; counts are
// in the right number.
func TestSelectorErrorMessages(t *testing.T) {
	tests := []struct {
		sel  string
		want []string // substrings of the error
		not  []string // must not appear
	}{
		{"a=b\x00c", []string{`selector "a=b\x00c"`, "at offset 3", `'\x00'`}, []string{"at offset 0"}},
		{"x=y, a=b\x00c", []string{"at offset 8"}, nil},
		{"zone in (a,b\x01)", []string{"at offset 12"}, nil},
		{"k\x00=v", []string{"at offset 1"}, nil},
		{"a in (b", []string{`selector "a in (b"`, "unclosed '(' at offset 5"}, nil},
		{"a in b)", []string{`selector "a in b)"`, "unbalanced ')' at offset 6"}, nil},
		{"a in ((b))", []string{`selector "a in ((b))"`, "nested '(' at offset 6"}, nil},
		{" ", []string{"1 byte of white space"}, []string{"1 bytes"}},
		{"  ", []string{"2 bytes of white space"}, nil},
	}
	for _, tt := range tests {
		_, err := protocol.ParseSelector(tt.sel)
		if err == nil {
			t.Errorf("ParseSelector(%q) succeeded, want an error", tt.sel)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ParseSelector(%q) = %q, want it to contain %q", tt.sel, err, w)
			}
		}
		for _, n := range tt.not {
			if strings.Contains(err.Error(), n) {
				t.Errorf("ParseSelector(%q) = %q, must not contain %q", tt.sel, err, n)
			}
		}
	}
}

// An empty value in a set is an error, like an empty set and an empty term:
// "k in (,)" must not quietly match nothing (or, with notin, everything).
// An empty label value is still matched with "k=".
func TestSelectorEmptySetValue(t *testing.T) {
	for _, tt := range []struct{ sel, want string }{
		{"dev in (,)", "empty value in the set at offset 8"},
		{"dev in (a,)", "empty value in the set at offset 10"},
		{"dev notin (,a)", "empty value in the set at offset 11"},
		{"dev in (a, ,b)", "empty value in the set at offset 10"},
	} {
		_, err := protocol.ParseSelector(tt.sel)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseSelector(%q) = %v, want an error containing %q", tt.sel, err, tt.want)
		}
	}
	s, err := protocol.ParseSelector("empty=")
	if err != nil || !s.Matches(map[string]string{"empty": ""}) {
		t.Errorf(`"empty=" = %v, %v; want it to match an empty value`, s, err)
	}
}

// Bad base64 in an exec request's stdin names the field.
func TestDecodeExecRequestBadBase64(t *testing.T) {
	_, e := protocol.DecodeExecRequest([]byte(`{"target":{"node":"a"},"argv":["cat"],"stdin":"abc!"}`))
	if e == nil || e.Code != protocol.ErrCodeMalformed || !strings.Contains(e.Message, "stdin") || !strings.Contains(e.Message, "base64") {
		t.Fatalf("error = %v, want malformed_request naming stdin and base64", e)
	}
	if strings.Contains(e.Message, "not valid JSON") {
		t.Errorf("message %q says the body is not JSON; it is, its stdin is not base64", e.Message)
	}
}

// A script containing NUL is refused (bash would drop the byte and run
// something else), as argv and commands with NUL are: by ExecParams.Validate,
// and so by the API.
func TestScriptWithNULRefused(t *testing.T) {
	p := protocol.ExecParams{Script: "echo a\x00b"}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "script contains NUL") {
		t.Errorf("Validate() = %v, want script contains NUL", err)
	}
	body, _ := json.Marshal(protocol.ExecRequest{Target: protocol.Target{Node: "a"}, Script: "echo a\x00b"})
	if _, e := protocol.DecodeExecRequest(body); e == nil || e.Code != protocol.ErrCodeInvalid || !strings.Contains(e.Message, "script contains NUL") {
		t.Errorf("DecodeExecRequest = %v, want invalid_request naming the NUL", e)
	}
}

// The stream header limit is reported as one number with its meaning,
// wherever params are measured against it.
func TestHeaderLimitMessage(t *testing.T) {
	want := fmt.Sprintf("over the stream header limit of %d bytes (64 KiB)", protocol.MaxHeaderSize)
	body, _ := json.Marshal(protocol.ExecRequest{Target: protocol.Target{Node: "a"}, Script: "true",
		Env: map[string]string{"BIG": strings.Repeat("x", protocol.MaxHeaderSize)}})
	_, e := protocol.DecodeExecRequest(body)
	if e == nil || !strings.Contains(e.Message, want) {
		t.Errorf("exec request: %v, want a message containing %q", e, want)
	}
}

// CheckHeaderSize is what the CLI measures stream params with before it
// sends them (shell, exec): the same limit and message as the API's.
func TestCheckHeaderSize(t *testing.T) {
	want := fmt.Sprintf("over the stream header limit of %d bytes (64 KiB)", protocol.MaxHeaderSize)
	err := protocol.CheckHeaderSize("pty params", &protocol.PTYParams{Argv: []string{"echo", strings.Repeat("y", protocol.MaxHeaderSize)}})
	if err == nil || !errors.Is(err, protocol.ErrTooLarge) || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "pty params are ") {
		t.Errorf("CheckHeaderSize = %v, want ErrTooLarge containing %q", err, want)
	}
	if err := protocol.CheckHeaderSize("pty params", &protocol.PTYParams{Argv: []string{"true"}}); err != nil {
		t.Errorf("CheckHeaderSize of small params = %v", err)
	}
	// Exec params without a timeout keep room for the coordinator's.
	p := &protocol.ExecParams{Argv: []string{"echo", strings.Repeat("y", protocol.MaxHeaderSize-40)}}
	if err := protocol.CheckHeaderSize("exec params", p); err == nil || !strings.Contains(err.Error(), "default timeout") {
		t.Errorf("CheckHeaderSize near the limit = %v, want an error counting the default timeout", err)
	}
	p.TimeoutMS = 1000
	if err := protocol.CheckHeaderSize("exec params", p); err != nil {
		t.Errorf("CheckHeaderSize with a timeout = %v", err)
	}
}
