package opensandbox_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol/opensandbox"
)

func TestParsePath(t *testing.T) {
	type R = opensandbox.Route
	tests := []struct {
		path string
		want R
		ok   bool
	}{
		{"/sandboxes", R{Kind: opensandbox.RouteSandboxes}, true},
		{"/v1/sandboxes", R{Kind: opensandbox.RouteSandboxes, V1: true}, true},
		{"/v1/sandboxes/sb-1", R{Kind: opensandbox.RouteSandbox, V1: true, ID: "sb-1"}, true},
		{"/sandboxes/sb-1/endpoints/44772", R{Kind: opensandbox.RouteEndpoint, ID: "sb-1", Port: 44772}, true},
		{"/v1/sandboxes/sb-1/renew-expiration", R{Kind: opensandbox.RouteRenewExpiration, V1: true, ID: "sb-1"}, true},
		{"/v1/sandboxes/sb-1/metadata", R{Kind: opensandbox.RouteMetadata, V1: true, ID: "sb-1"}, true},
		{"/v1/sandboxes/sb-1/pause", R{Kind: opensandbox.RoutePause, V1: true, ID: "sb-1"}, true},
		{"/sandboxes/sb-1/resume", R{Kind: opensandbox.RouteResume, ID: "sb-1"}, true},
		{"/sandboxes/sb-1/proxy/44772", R{Kind: opensandbox.RouteProxy, ID: "sb-1", Port: 44772}, true},
		{"/sandboxes/sb-1/proxy/44772/", R{Kind: opensandbox.RouteProxy, ID: "sb-1", Port: 44772, Rest: "/"}, true},
		{"/v1/sandboxes/sb-1/proxy/44772/pty/x/ws", R{Kind: opensandbox.RouteProxy, V1: true, ID: "sb-1", Port: 44772, Rest: "/pty/x/ws"}, true},
		{"/sandboxes/", R{}, false},
		{"/sandboxes/sb-1/", R{}, false},
		{"/v1", R{}, false},
		{"/v1sandboxes", R{}, false},
		{"/sandboxesx", R{}, false},
		{"/v2/sandboxes", R{}, false},
		{"/sandboxes/../x", R{}, false},
		{"/sandboxes/sb-1/endpoints/0", R{}, false},
		{"/sandboxes/sb-1/endpoints/65536", R{}, false},
		{"/sandboxes/sb-1/endpoints/44x", R{}, false},
		{"/sandboxes/sb-1/endpoints/1/", R{}, false},
		{"/sandboxes/sb-1/proxy/abc", R{}, false},
		{"/sandboxes/sb-1/proxy/", R{}, false},
		{"/sandboxes/sb-1/proxy/1/../../x", R{}, false},
		{"/sandboxes/sb-1/pause/x", R{}, false},
		{"/sandboxes/sb-1/other", R{}, false},
		{"/health", R{}, false},
	}
	for _, tt := range tests {
		got, ok := opensandbox.ParsePath(tt.path)
		if ok != tt.ok || got != tt.want {
			t.Errorf("ParsePath(%q) = %+v, %v; want %+v, %v", tt.path, got, ok, tt.want, tt.ok)
		}
		if ok && got.Path() != tt.path {
			t.Errorf("ParsePath(%q).Path() = %q", tt.path, got.Path())
		}
	}
}

func TestProxyEndpoint(t *testing.T) {
	// OSB-6: the endpoint names the host that answered, without /v1.
	if got, want := opensandbox.ProxyEndpoint("osb:8080", "sb-1", 44772), "osb:8080/sandboxes/sb-1/proxy/44772"; got != want {
		t.Errorf("ProxyEndpoint = %q, want %q", got, want)
	}
}

func TestMetadataFilter(t *testing.T) {
	got, err := opensandbox.ParseMetadataFilter("nemo-gym.nvidia.com/run=run-123&team=")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"nemo-gym.nvidia.com/run": "run-123", "team": ""}, got); diff != "" {
		t.Errorf("parse (-want +got):\n%s", diff)
	}
	// OSB-3 and other strict-parsing failures.
	for _, bad := range []string{"a=1&broken", "a=1&", "&a=1", "broken", "a=1&&b=2"} {
		if _, err := opensandbox.ParseMetadataFilter(bad); !errors.Is(err, opensandbox.ErrInvalidMetadataFilter) {
			t.Errorf("ParseMetadataFilter(%q) err = %v, want ErrInvalidMetadataFilter", bad, err)
		}
	}
	if m, err := opensandbox.ParseMetadataFilter(""); err != nil || len(m) != 0 {
		t.Errorf("empty filter = %v, %v", m, err)
	}
	if m, _ := opensandbox.ParseMetadataFilter("a=x+y%26z%zz&a=last"); m["a"] != "last" {
		t.Errorf("repeated key: %v", m)
	}
	if m, _ := opensandbox.ParseMetadataFilter("a=x+y%26z%zz"); m["a"] != "x y&z%zz" {
		t.Errorf("decode: %q", m["a"])
	}
	enc := opensandbox.EncodeMetadataFilter(map[string]string{"nemo-gym.nvidia.com/run": "run-123", "a": "x&y=z%"})
	if want := "a=x%26y%3Dz%25&nemo-gym.nvidia.com/run=run-123"; enc != want {
		t.Errorf("encode = %q, want %q", enc, want)
	}
	if opensandbox.EncodeMetadataFilter(nil) != "" {
		t.Error("nil filter should encode empty")
	}
	if !opensandbox.MatchMetadata(map[string]string{"a": "1", "b": "2"}, map[string]string{"a": "1"}) ||
		opensandbox.MatchMetadata(map[string]string{"a": "1"}, map[string]string{"a": "1", "b": ""}) {
		t.Error("MatchMetadata")
	}
}

func TestValidateMetadata(t *testing.T) {
	if err := opensandbox.ValidateMetadata(map[string]string{"nemo-gym.nvidia.com/team": "gym_team", "purpose": "test", "empty": ""}); err != nil {
		t.Errorf("valid metadata refused: %v", err)
	}
	for _, m := range []map[string]string{
		{"opensandbox.io/x": "1"}, // OSB-8
		{"workload": "configs/x.yaml"},
		{"Team/x": "a"},
		{"": "a"},
	} {
		if err := opensandbox.ValidateMetadata(m); err == nil {
			t.Errorf("ValidateMetadata(%v) accepted", m)
		}
	}
}

func TestSanitizeMetadataValue(t *testing.T) {
	// NG-5.
	tests := map[string]string{
		"gym team":                     "gym_team",
		"nemo_gym/configs/foo.yaml":    "nemo_gym_configs_foo.yaml",
		"  x  ":                        "x",
		"":                             "metadata",
		"-.-":                          "metadata",
		"héllo wörld":                  "h_llo_w_rld",
		"alice@corp.com":               "alice_corp.com",
		"__init__":                     "init",
		strings.Repeat("a", 70):        strings.Repeat("a", 63),
		strings.Repeat("a", 62) + "-b": strings.Repeat("a", 62),
	}
	for in, want := range tests {
		if got := opensandbox.SanitizeMetadataValue(in); got != want {
			t.Errorf("SanitizeMetadataValue(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBinaryFrames(t *testing.T) {
	// PTY-4: replay of "cd" from offset 2.
	replay := opensandbox.EncodeBinaryFrame(opensandbox.BinaryFrame{Channel: opensandbox.ChannelReplay, Offset: 2, Data: []byte("cd")})
	if want := []byte{3, 0, 0, 0, 0, 0, 0, 0, 2, 'c', 'd'}; !bytes.Equal(replay, want) {
		t.Errorf("replay frame = % x, want % x", replay, want)
	}
	f, err := opensandbox.DecodeBinaryFrame(replay)
	if err != nil || f.Offset != 2 || string(f.Data) != "cd" {
		t.Errorf("decode replay = %+v, %v", f, err)
	}
	if b := opensandbox.EncodeBinaryFrame(opensandbox.BinaryFrame{Channel: opensandbox.ChannelStdin, Data: []byte("echo hi\n")}); string(b) != "\x00echo hi\n" {
		t.Errorf("stdin frame = %q", b)
	}
	if _, err := opensandbox.DecodeBinaryFrame(nil); !errors.Is(err, opensandbox.ErrEmptyFrame) {
		t.Errorf("empty: %v", err)
	}
	if _, err := opensandbox.DecodeBinaryFrame([]byte{3, 0, 0}); !errors.Is(err, opensandbox.ErrShortReplay) {
		t.Errorf("short replay: %v", err)
	}
	if f, err := opensandbox.DecodeBinaryFrame([]byte{9, 'x'}); !errors.Is(err, opensandbox.ErrUnknownChannel) || f.Channel != 9 {
		t.Errorf("unknown channel: %+v %v", f, err)
	}
}

func TestControlFrames(t *testing.T) {
	tests := []struct {
		f    opensandbox.ControlFrame
		want string
	}{
		{opensandbox.ConnectedFrame("id1", opensandbox.ModePTY), `{"type":"connected","session_id":"id1","mode":"pty"}`},
		{opensandbox.ExitFrame(0), `{"type":"exit","exit_code":0}`},
		{opensandbox.ExitFrame(-1), `{"type":"exit","exit_code":-1}`},
		{opensandbox.UnknownFrameError("bogus"), `{"type":"error","code":"INVALID_FRAME","error":"unknown frame type \"bogus\""}`},
		{opensandbox.ControlFrame{Type: opensandbox.TypePong}, `{"type":"pong"}`},
		{opensandbox.ControlFrame{Type: opensandbox.TypeResize, Cols: 120, Rows: 40}, `{"type":"resize","cols":120,"rows":40}`},
		{opensandbox.ControlFrame{Type: opensandbox.TypeSignal, Signal: "SIGINT"}, `{"type":"signal","signal":"SIGINT"}`},
	}
	for _, tt := range tests {
		got := opensandbox.EncodeControlFrame(tt.f)
		if string(got) != tt.want {
			t.Errorf("encode %+v = %s, want %s", tt.f, got, tt.want)
		}
		back, err := opensandbox.DecodeControlFrame(got)
		if err != nil || !cmp.Equal(back, tt.f) {
			t.Errorf("decode %s = %+v, %v", got, back, err)
		}
	}
	for _, bad := range []string{`not json`, `{}`, `{"type":""}`, `[1]`} {
		if _, err := opensandbox.DecodeControlFrame([]byte(bad)); err == nil {
			t.Errorf("DecodeControlFrame(%s) accepted", bad)
		}
	}
	if !opensandbox.ValidSignal("SIGHUP") || opensandbox.ValidSignal("SIGUSR1") {
		t.Error("ValidSignal")
	}
}

func TestAttachQuery(t *testing.T) {
	tests := []struct {
		q    map[string][]string
		want opensandbox.AttachOptions
	}{
		{nil, opensandbox.AttachOptions{}},
		{map[string][]string{"takeover": {"1"}, "since": {"2"}}, opensandbox.AttachOptions{Takeover: true, Since: 2}},
		{map[string][]string{"takeover": {"true"}, "since": {"abc"}, "pty": {"1"}}, opensandbox.AttachOptions{}}, // PTY-7
		{map[string][]string{"since": {"12abc"}, "pty": {"0"}}, opensandbox.AttachOptions{Since: 12, Pipe: true}},
		{map[string][]string{"since": {"-5"}}, opensandbox.AttachOptions{Since: -5}},
		{map[string][]string{"since": {"99999999999999999999"}}, opensandbox.AttachOptions{}},
	}
	for _, tt := range tests {
		if got := opensandbox.ParseAttachQuery(tt.q); got != tt.want {
			t.Errorf("ParseAttachQuery(%v) = %+v, want %+v", tt.q, got, tt.want)
		}
	}
	if got := (opensandbox.AttachOptions{Pipe: true, Since: 10, Takeover: true}).Encode(); got != "pty=0&since=10&takeover=1" {
		t.Errorf("Encode = %q", got)
	}
}

func TestParsePTYPath(t *testing.T) {
	tests := []struct {
		path   string
		id     string
		ws, ok bool
	}{
		{"/pty", "", false, true},
		{"/pty/abc", "abc", false, true},
		{"/pty/abc/ws", "abc", true, true},
		{"/pty/", "", false, false},
		{"/pty/abc/x", "", false, false},
		{"/ptyx", "", false, false},
		{"/pty/../ws", "", false, false},
	}
	for _, tt := range tests {
		id, ws, ok := opensandbox.ParsePTYPath(tt.path)
		if id != tt.id || ws != tt.ws || ok != tt.ok {
			t.Errorf("ParsePTYPath(%q) = %q %v %v", tt.path, id, ws, ok)
		}
	}
}

func TestCommandEvents(t *testing.T) {
	// OSB-11's stream as execd writes it, then read back the way the SDK does.
	var buf bytes.Buffer
	events := []opensandbox.CommandEvent{
		{Type: opensandbox.EventInit, Text: "cmd-1", Timestamp: 1},
		{Type: opensandbox.EventStdout, Text: "hi", Timestamp: 2},
		{Type: opensandbox.EventError, Timestamp: 3, Error: &opensandbox.CommandError{EName: opensandbox.CommandExecErrorName, EValue: "3", Traceback: []string{"exit status 3"}}},
	}
	for _, ev := range events {
		if err := opensandbox.WriteCommandEvent(&buf, ev); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.HasPrefix(buf.String(), `{"type":"init","text":"cmd-1","timestamp":1}`+"\n\n") {
		t.Errorf("wire form: %q", buf.String())
	}
	// The SDK also accepts data: lines and skips SSE fields.
	buf.WriteString(": comment\nevent: x\nid: 1\nretry: 5\ndata: {\"type\":\"execution_complete\",\"execution_time\":7}\r\n\r\n")
	events = append(events, opensandbox.CommandEvent{Type: opensandbox.EventExecutionComplete, ExecutionTime: 7})
	r := opensandbox.NewCommandEventReader(&buf)
	for i, want := range events {
		got, err := r.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if !cmp.Equal(got, want) {
			t.Errorf("event %d = %+v, want %+v", i, got, want)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Errorf("end: %v", err)
	}
	if _, err := opensandbox.NewCommandEventReader(strings.NewReader("garbage\n")).Next(); err == nil {
		t.Error("garbage accepted")
	}
}

func TestLifecycleJSON(t *testing.T) {
	// OSB-1's body decodes; unknown fields are tolerated.
	body := `{"image":{"uri":"python:3.12"},"entrypoint":["tail","-f","/dev/null"],"timeout":600,"env":{"A":"1"},
	"metadata":{"nemo-gym.nvidia.com/run":"run-123","purpose":"test"},"resourceLimits":{"cpu":"2","memory":"4096Mi"},
	"extensions":{"imagePullPolicy":"IfNotPresent"},"secureAccess":false,"somethingNew":1}`
	var req opensandbox.CreateSandboxRequest
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	if req.Image.URI != "python:3.12" || *req.Timeout != 600 || req.Metadata["purpose"] != "test" || req.SecureAccess == nil {
		t.Errorf("decoded %+v", req)
	}
	// A sandbox without expiry omits expiresAt; createdAt is RFC 3339.
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b, _ := json.Marshal(opensandbox.Sandbox{ID: "sb-1", Status: opensandbox.SandboxStatus{State: opensandbox.StateRunning}, Entrypoint: []string{"x"}, CreatedAt: created})
	if want := `{"id":"sb-1","status":{"state":"Running"},"entrypoint":["x"],"createdAt":"2026-01-02T03:04:05Z"}`; string(b) != want {
		t.Errorf("sandbox JSON = %s, want %s", b, want)
	}
	b, _ = json.Marshal(opensandbox.Endpoint{Endpoint: "osb:8080/sandboxes/sb-1/proxy/44772"})
	if want := `{"endpoint":"osb:8080/sandboxes/sb-1/proxy/44772"}`; string(b) != want {
		t.Errorf("endpoint JSON = %s", b)
	}
}
