package opensandbox_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// ptyEnv is one sandbox behind the facade, reached through its server
// proxy route.
type ptyEnv struct {
	*facadeEnv
	node *opensandboxtest.Server
	id   string // sandbox id
	base string // path of the execd base: /sandboxes/<id>/proxy/44772
}

func newPTYEnv(t *testing.T, mod func(*opensandbox.Config)) *ptyEnv {
	t.Helper()
	e := newFacadeEnv(t, mod)
	node := e.startNode(t, "n1", nil, opensandboxtest.Config{})
	id := e.create(t, nil, nil)
	return &ptyEnv{facadeEnv: e, node: node, id: id, base: "/sandboxes/" + id + "/proxy/44772"}
}

// createSession creates a PTY session through the facade (PTY-1).
func (p *ptyEnv) createSession(t *testing.T, body string) string {
	t.Helper()
	code, _, resp := p.do(t, "POST", p.base+"/pty", nil, body)
	if code != http.StatusCreated {
		t.Fatalf("POST /pty: %d %s", code, resp)
	}
	var cr osb.CreatePTYResponse
	mustJSON(t, resp, &cr)
	return cr.SessionID
}

func (p *ptyEnv) status(t *testing.T, sid string) osb.PTYStatus {
	t.Helper()
	code, _, body := p.do(t, "GET", "/v1"+p.base+"/pty/"+sid, nil, "")
	if code != http.StatusOK {
		t.Fatalf("GET /pty/%s: %d %s", sid, code, body)
	}
	var st osb.PTYStatus
	mustJSON(t, body, &st)
	return st
}

// waitOffset polls the session until its output offset reaches n (the
// process produces output on its own schedule).
func (p *ptyEnv) waitOffset(t *testing.T, sid string, n int64) {
	t.Helper()
	deadline := time.Now().Add(defaultTestTimeout)
	for p.status(t, sid).OutputOffset < n {
		if time.Now().After(deadline) {
			t.Fatalf("output offset of %s never reached %d", sid, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// attach opens the session's WebSocket through the facade.
func (p *ptyEnv) attach(t *testing.T, sid, query string) *wsClient {
	t.Helper()
	u := "ws://" + p.host + p.base + "/pty/" + sid + "/ws"
	if query != "" {
		u += "?" + query
	}
	conn, resp, err := websocket.DefaultDialer.Dial(u, nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("attach %s: %v (HTTP %d)", u, err, status)
	}
	t.Cleanup(func() { conn.Close() })
	return &wsClient{t: t, conn: conn, out: map[byte]*bytes.Buffer{}}
}

// wsClient is one socket with the output it received per channel.
type wsClient struct {
	t    *testing.T
	conn *websocket.Conn
	out  map[byte]*bytes.Buffer
}

// next reads one message; output frames are also collected.
func (c *wsClient) next() (typ int, data []byte, err error) {
	c.t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	typ, data, err = c.conn.ReadMessage()
	if err == nil && typ == websocket.BinaryMessage && len(data) > 0 {
		payload := data[1:]
		if data[0] == osb.ChannelReplay && len(data) >= osb.ReplayHeaderSize {
			payload = data[osb.ReplayHeaderSize:]
		}
		if c.out[data[0]] == nil {
			c.out[data[0]] = &bytes.Buffer{}
		}
		c.out[data[0]].Write(payload)
	}
	return typ, data, err
}

// text reads the next message and requires a text frame.
func (c *wsClient) text() osb.ControlFrame {
	c.t.Helper()
	typ, data, err := c.next()
	if err != nil || typ != websocket.TextMessage {
		c.t.Fatalf("want a text frame, got type %d %q, err %v", typ, data, err)
	}
	f, err := osb.DecodeControlFrame(data)
	if err != nil {
		c.t.Fatal(err)
	}
	return f
}

// until reads until channel ch's output contains want; it returns the
// text frames read meanwhile.
func (c *wsClient) until(ch byte, want string) []osb.ControlFrame {
	c.t.Helper()
	var ctl []osb.ControlFrame
	for c.out[ch] == nil || !strings.Contains(c.out[ch].String(), want) {
		typ, data, err := c.next()
		if err != nil {
			c.t.Fatalf("waiting for %q on channel %d (have %q): %v", want, ch, c.out[ch], err)
		}
		if typ == websocket.TextMessage {
			f, _ := osb.DecodeControlFrame(data)
			ctl = append(ctl, f)
		}
	}
	return ctl
}

// closeErr reads until the socket ends and returns its close frame.
func (c *wsClient) closeErr() *websocket.CloseError {
	c.t.Helper()
	for {
		if _, _, err := c.next(); err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				c.t.Fatalf("socket ended without a close frame: %v", err)
			}
			return ce
		}
	}
}

// exitCode reads until the exit frame and the close 1000 after it.
func (c *wsClient) exitCode() int {
	c.t.Helper()
	code := -2
	for {
		typ, data, err := c.next()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != osb.CloseNormal || ce.Text != osb.ReasonProcessExited {
				c.t.Fatalf("want close 1000 %q, got %v", osb.ReasonProcessExited, err)
			}
			if code == -2 {
				c.t.Fatal("closed without an exit frame")
			}
			return code
		}
		if typ == websocket.TextMessage {
			if f, err := osb.DecodeControlFrame(data); err == nil && f.Type == osb.TypeExit && f.ExitCode != nil {
				code = *f.ExitCode
			}
		}
	}
}

func (c *wsClient) stdin(s string) {
	c.t.Helper()
	if err := c.conn.WriteMessage(websocket.BinaryMessage, osb.EncodeBinaryFrame(osb.BinaryFrame{Channel: osb.ChannelStdin, Data: []byte(s)})); err != nil {
		c.t.Fatal(err)
	}
}

func (c *wsClient) control(f osb.ControlFrame) {
	c.t.Helper()
	if err := c.conn.WriteMessage(websocket.TextMessage, osb.EncodeControlFrame(f)); err != nil {
		c.t.Fatal(err)
	}
}

// PTY-1, PTY-2, PTY-3, PTY-10 and an RFC 6455 ping, through the facade.
func TestPTYAttachEchoPing(t *testing.T) {
	p := newPTYEnv(t, nil)
	sid := p.createSession(t, `{}`)
	if st := p.status(t, sid); st != (osb.PTYStatus{SessionID: sid, Running: false, OutputOffset: 0}) {
		t.Errorf("PTY-1 status %+v", st)
	}
	c := p.attach(t, sid, "")
	if f := c.text(); f != osb.ConnectedFrame(sid, osb.ModePTY) {
		t.Fatalf("PTY-2: first frame %+v, want connected", f)
	}
	if active := metricValue(t, p.facadeEnv, "tether_opensandbox_facade_websocket_sessions"); active != 1 {
		t.Errorf("active websocket sessions = %v, want 1", active)
	}
	c.stdin("echo hi\n")
	c.until(osb.ChannelStdout, "hi\r\n")

	pongs := make(chan string, 1)
	c.conn.SetPongHandler(func(data string) error { pongs <- data; return nil })
	if err := c.conn.WriteControl(websocket.PingMessage, []byte("p1"), time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	c.control(osb.ControlFrame{Type: osb.TypePing})
	for {
		typ, data, err := c.next()
		if err != nil {
			t.Fatalf("PTY-10: %v", err)
		}
		if typ != websocket.TextMessage {
			continue // the shell's prompt
		}
		if f, _ := osb.DecodeControlFrame(data); f.Type == osb.TypePong {
			break
		}
	}
	select {
	case got := <-pongs:
		if got != "p1" {
			t.Errorf("pong payload %q", got)
		}
	default:
		t.Error("no pong for the RFC 6455 ping before the JSON pong")
	}
	if !p.status(t, sid).Running {
		t.Error("process not running after attach")
	}
}

// PTY-4: drop the socket after "ab"; the process writes "cd" later; a
// reattach with takeover and since=2 gets B(0x03, offset 2, "cd") and then
// connected, byte for byte through the facade.
func TestPTYReattachReplay(t *testing.T) {
	p := newPTYEnv(t, nil)
	sid := p.createSession(t, `{"command":"printf ab; read x; printf cd; read y"}`)
	c := p.attach(t, sid, "pty=0")
	if f := c.text(); f != osb.ConnectedFrame(sid, osb.ModePipe) {
		t.Fatalf("connected %+v", f)
	}
	c.until(osb.ChannelStdout, "ab")
	c.stdin("\n")
	c.conn.Close()
	p.waitOffset(t, sid, 4)

	c2 := p.attach(t, sid, "takeover=1&since=2")
	typ, data, err := c2.next()
	want := append([]byte{osb.ChannelReplay}, binary.BigEndian.AppendUint64(nil, 2)...)
	want = append(want, "cd"...)
	if err != nil || typ != websocket.BinaryMessage || !bytes.Equal(data, want) {
		t.Fatalf("PTY-4 first frame: type %d % x err %v; want % x", typ, data, err, want)
	}
	if f := c2.text(); f != osb.ConnectedFrame(sid, osb.ModePipe) {
		t.Fatalf("PTY-4 second frame %+v, want connected", f)
	}
	// PTY-5: since at the current offset → no replay.
	c2.conn.Close()
	c3 := p.attach(t, sid, "takeover=1&since=4")
	if f := c3.text(); f != osb.ConnectedFrame(sid, osb.ModePipe) {
		t.Fatalf("PTY-5 first frame %+v, want connected", f)
	}
}

// PTY-8 and PTY-9 through the facade: a second attach without takeover is
// accepted and closed 1008 by the node's server proxy; with takeover the
// first socket gets 4001 TAKEN_OVER and the shell keeps running.
func TestPTYExclusiveAndTakeover(t *testing.T) {
	p := newPTYEnv(t, nil)
	sid := p.createSession(t, `{}`)
	first := p.attach(t, sid, "")
	first.text() // connected
	first.stdin("echo one\n")
	first.until(osb.ChannelStdout, "one\r\n")

	second := p.attach(t, sid, "")
	if ce := second.closeErr(); ce.Code != osb.ClosePolicyViolation {
		t.Errorf("PTY-8: close %d %q, want 1008", ce.Code, ce.Text)
	}

	third := p.attach(t, sid, "takeover=1")
	if ce := first.closeErr(); ce.Code != osb.CloseTakenOver || ce.Text != osb.ReasonTakenOver {
		t.Errorf("PTY-9: first socket closed %d %q, want 4001 TAKEN_OVER", ce.Code, ce.Text)
	}
	for {
		typ, data, err := third.next()
		if err != nil {
			t.Fatalf("third socket: %v", err)
		}
		if typ == websocket.TextMessage {
			if f, _ := osb.DecodeControlFrame(data); f != osb.ConnectedFrame(sid, osb.ModePTY) {
				t.Fatalf("third socket frame %+v, want connected", f)
			}
			break
		}
		if data[0] != osb.ChannelReplay {
			t.Fatalf("third socket: output before connected: % x", data)
		}
	}
	third.stdin("echo two\n")
	third.until(osb.ChannelStdout, "two\r\n")
}

// PTY-14: exit 7 → exit frame, close 1000 "process exited"; the session
// then reads not running. The WebSocket gauge goes back to zero.
func TestPTYExit(t *testing.T) {
	p := newPTYEnv(t, nil)
	sid := p.createSession(t, `{"command":"exit 7"}`)
	c := p.attach(t, sid, "")
	if f := c.text(); f.Type != osb.TypeConnected {
		t.Fatalf("first frame %+v", f)
	}
	if code := c.exitCode(); code != 7 {
		t.Errorf("exit code %d, want 7", code)
	}
	if p.status(t, sid).Running {
		t.Error("still running after exit")
	}
	c.conn.Close()
	deadline := time.Now().Add(defaultTestTimeout)
	for metricValue(t, p.facadeEnv, "tether_opensandbox_facade_websocket_sessions") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("websocket gauge never went back to 0")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := metricValue(t, p.facadeEnv, "tether_opensandbox_facade_websocket_sessions_total"); n != 1 {
		t.Errorf("websocket sessions total %v, want 1", n)
	}
}

// PTY-15: pipe mode keeps stdout and stderr apart; a later replay merges
// them in one 0x03 frame.
func TestPTYPipeMode(t *testing.T) {
	p := newPTYEnv(t, nil)
	sid := p.createSession(t, `{"command":"echo out; echo err >&2"}`)
	c := p.attach(t, sid, "pty=0")
	if f := c.text(); f != osb.ConnectedFrame(sid, osb.ModePipe) {
		t.Fatalf("connected %+v", f)
	}
	if code := c.exitCode(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if got := c.out[osb.ChannelStdout].String(); got != "out\n" {
		t.Errorf("stdout %q", got)
	}
	if got := c.out[osb.ChannelStderr].String(); got != "err\n" {
		t.Errorf("stderr %q", got)
	}
	r := p.attach(t, sid, "pty=0&since=0")
	typ, data, err := r.next()
	if err != nil || typ != websocket.BinaryMessage || data[0] != osb.ChannelReplay {
		t.Fatalf("replay: type %d % x err %v", typ, data, err)
	}
	payload := string(data[osb.ReplayHeaderSize:])
	if binary.BigEndian.Uint64(data[1:9]) != 0 || !strings.Contains(payload, "out\n") || !strings.Contains(payload, "err\n") {
		t.Errorf("replay frame % x", data)
	}
}

// Close ends spliced WebSockets.
func TestCloseEndsWebSockets(t *testing.T) {
	p := newPTYEnv(t, nil)
	sid := p.createSession(t, `{}`)
	c := p.attach(t, sid, "")
	c.text()
	p.f.Close()
	for {
		if _, _, err := c.next(); err != nil {
			break
		}
	}
}
