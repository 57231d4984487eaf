package opensandboxtest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"

	"github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// timeout bounds every wait of these tests.
const timeout = 10 * time.Second

// call sends one request and returns status, body and headers. body is
// JSON-encoded unless it is a string or nil.
func call(t *testing.T, method, url string, body any, hdr map[string]string) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, b, resp.Header
}

// mustJSON decodes b into v.
func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

// newExecd serves a fresh execd on loopback and returns its base URL.
func newExecd(t *testing.T, cfg opensandboxtest.ExecdConfig) (*opensandboxtest.Execd, string) {
	t.Helper()
	e, err := opensandboxtest.NewExecd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(e)
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
		ts.Close()
	})
	return e, ts.URL
}

// createPTY creates a session and returns its id.
func createPTY(t *testing.T, base string, req opensandbox.CreatePTYRequest) string {
	t.Helper()
	status, body, _ := call(t, http.MethodPost, base+"/pty", req, nil)
	if status != http.StatusCreated {
		t.Fatalf("POST /pty = %d %s", status, body)
	}
	var resp opensandbox.CreatePTYResponse
	mustJSON(t, body, &resp)
	return resp.SessionID
}

func ptyStatus(t *testing.T, base, id string) opensandbox.PTYStatus {
	t.Helper()
	status, body, _ := call(t, http.MethodGet, base+"/pty/"+id, nil, nil)
	if status != http.StatusOK {
		t.Fatalf("GET /pty/%s = %d %s", id, status, body)
	}
	var st opensandbox.PTYStatus
	mustJSON(t, body, &st)
	return st
}

// waitFor polls cond (a state the fake reaches on its own, e.g. output
// produced by a process) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ptyClient is one attached socket.
type ptyClient struct {
	t    *testing.T
	conn *websocket.Conn
	out  map[byte]*bytes.Buffer // payload received per channel
}

// wsURL turns an http base URL into the session's WebSocket URL.
func wsURL(base, id, query string) string {
	u := "ws" + strings.TrimPrefix(base, "http") + "/pty/" + id + "/ws"
	if query != "" {
		u += "?" + query
	}
	return u
}

// dialPTY attaches and fails the test unless the handshake succeeds.
func dialPTY(t *testing.T, base, id, query string, hdr http.Header) *ptyClient {
	t.Helper()
	conn, resp, err := websocket.DefaultDialer.Dial(wsURL(base, id, query), hdr)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("attach %s?%s: %v (HTTP %d)", id, query, err, status)
	}
	t.Cleanup(func() { conn.Close() })
	return &ptyClient{t: t, conn: conn, out: map[byte]*bytes.Buffer{}}
}

// msg is one message read from a socket.
type msg struct {
	typ  int
	data []byte
	err  error
}

func (c *ptyClient) read() msg {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	typ, data, err := c.conn.ReadMessage()
	if err == nil && typ == websocket.BinaryMessage {
		if f, ferr := opensandbox.DecodeBinaryFrame(data); ferr == nil {
			if c.out[f.Channel] == nil {
				c.out[f.Channel] = &bytes.Buffer{}
			}
			c.out[f.Channel].Write(f.Data)
		}
	}
	return msg{typ, data, err}
}

// control reads the next message and requires a control frame.
func (c *ptyClient) control() opensandbox.ControlFrame {
	c.t.Helper()
	m := c.read()
	if m.err != nil || m.typ != websocket.TextMessage {
		c.t.Fatalf("want a control frame, got type %d %q err %v", m.typ, m.data, m.err)
	}
	f, err := opensandbox.DecodeControlFrame(m.data)
	if err != nil {
		c.t.Fatal(err)
	}
	return f
}

// nextControl reads the next control frame, collecting output frames on
// the way.
func (c *ptyClient) nextControl() opensandbox.ControlFrame {
	c.t.Helper()
	for {
		m := c.read()
		if m.err != nil {
			c.t.Fatalf("want a control frame: %v", m.err)
		}
		if m.typ == websocket.TextMessage {
			f, err := opensandbox.DecodeControlFrame(m.data)
			if err != nil {
				c.t.Fatal(err)
			}
			return f
		}
	}
}

// connected reads the connected frame and checks it.
func (c *ptyClient) connected(id, mode string) {
	c.t.Helper()
	if f := c.control(); f != opensandbox.ConnectedFrame(id, mode) {
		c.t.Fatalf("want connected frame, got %+v", f)
	}
}

// until reads until the output of channel ch contains want, and returns
// any control frames seen meanwhile.
func (c *ptyClient) until(ch byte, want string) []opensandbox.ControlFrame {
	c.t.Helper()
	var ctl []opensandbox.ControlFrame
	for c.out[ch] == nil || !strings.Contains(c.out[ch].String(), want) {
		m := c.read()
		if m.err != nil {
			c.t.Fatalf("waiting for %q on channel %d (have %q): %v", want, ch, c.out[ch], m.err)
		}
		if m.typ == websocket.TextMessage {
			f, _ := opensandbox.DecodeControlFrame(m.data)
			ctl = append(ctl, f)
		}
	}
	return ctl
}

// exit reads until the exit frame and the close that follows it; it
// returns the exit code.
func (c *ptyClient) exit() int {
	c.t.Helper()
	code := -2
	for {
		m := c.read()
		if m.err != nil {
			var ce *websocket.CloseError
			if !errors.As(m.err, &ce) || ce.Code != opensandbox.CloseNormal || ce.Text != opensandbox.ReasonProcessExited {
				c.t.Fatalf("want close 1000 %q, got %v", opensandbox.ReasonProcessExited, m.err)
			}
			if code == -2 {
				c.t.Fatal("closed without an exit frame")
			}
			return code
		}
		if m.typ == websocket.TextMessage {
			f, err := opensandbox.DecodeControlFrame(m.data)
			if err == nil && f.Type == opensandbox.TypeExit && f.ExitCode != nil {
				code = *f.ExitCode
			}
		}
	}
}

func (c *ptyClient) send(b []byte) {
	c.t.Helper()
	if err := c.conn.WriteMessage(websocket.BinaryMessage, opensandbox.EncodeBinaryFrame(opensandbox.BinaryFrame{Channel: opensandbox.ChannelStdin, Data: b})); err != nil {
		c.t.Fatal(err)
	}
}

func (c *ptyClient) sendControl(f opensandbox.ControlFrame) {
	c.t.Helper()
	if err := c.conn.WriteMessage(websocket.TextMessage, opensandbox.EncodeControlFrame(f)); err != nil {
		c.t.Fatal(err)
	}
}

// closeCode reads until the socket ends and returns its close error.
func (c *ptyClient) closeCode() *websocket.CloseError {
	c.t.Helper()
	for {
		m := c.read()
		if m.err != nil {
			var ce *websocket.CloseError
			if !errors.As(m.err, &ce) {
				c.t.Fatalf("socket ended without a close frame: %v", m.err)
			}
			return ce
		}
	}
}
