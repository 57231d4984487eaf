package opensandboxtest_test

import (
	"bytes"
	"encoding/binary"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// The PTY tests replay wire-facts §5.3 (PTY-n) against the fake execd.

func TestPTYCreateAttachEcho(t *testing.T) {
	_, base := newExecd(t, opensandboxtest.ExecdConfig{})
	// PTY-1.
	id := createPTY(t, base, opensandbox.CreatePTYRequest{})
	if _, err := uuid.Parse(id); err != nil {
		t.Fatalf("session id %q: %v", id, err)
	}
	if st := ptyStatus(t, base, id); st != (opensandbox.PTYStatus{SessionID: id}) {
		t.Fatalf("before attach: %+v", st)
	}
	// PTY-2: no replay, connected first; the process now runs.
	c := dialPTY(t, base, id, "", nil)
	c.connected(id, opensandbox.ModePTY)
	if st := ptyStatus(t, base, id); !st.Running {
		t.Fatalf("after attach: %+v", st)
	}
	// PTY-3.
	c.send([]byte("echo h''i\n"))
	c.until(opensandbox.ChannelStdout, "hi\r\n")
	// PTY-10.
	c.sendControl(opensandbox.ControlFrame{Type: opensandbox.TypePing})
	if f := c.nextControl(); f.Type != opensandbox.TypePong {
		t.Fatalf("want pong, got %+v", f)
	}
	// PTY-11: error frame, connection stays open.
	c.conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"bogus"}`))
	c.conn.WriteMessage(websocket.TextMessage, []byte(`not json at all`)) // ignored
	if got, want := c.nextControl(), opensandbox.UnknownFrameError("bogus"); got != want {
		t.Fatalf("bogus frame answer %+v, want %+v", got, want)
	}
	c.sendControl(opensandbox.ControlFrame{Type: opensandbox.TypePing})
	if f := c.nextControl(); f.Type != opensandbox.TypePong {
		t.Fatalf("after an error frame: want pong, got %+v", f)
	}
	// PTY-13: a resize with a zero side is ignored; 120x40 applies.
	c.sendControl(opensandbox.ControlFrame{Type: opensandbox.TypeResize, Cols: 0, Rows: 40})
	c.send([]byte("stty size | sed 's/^/SIZE=/'\n"))
	c.until(opensandbox.ChannelStdout, "SIZE=24 80")
	c.sendControl(opensandbox.ControlFrame{Type: opensandbox.TypeResize, Cols: 120, Rows: 40})
	c.send([]byte("stty size | sed 's/^/SIZE=/'\n"))
	c.until(opensandbox.ChannelStdout, "SIZE=40 120")
	// PTY-14.
	c.send([]byte("exit 7\n"))
	if code := c.exit(); code != 7 {
		t.Fatalf("exit code %d, want 7", code)
	}
	if st := ptyStatus(t, base, id); st.Running || st.OutputOffset == 0 {
		t.Fatalf("after exit: %+v", st)
	}
}

func TestPTYReplay(t *testing.T) {
	_, base := newExecd(t, opensandboxtest.ExecdConfig{})
	// PTY-4: the first client sees "ab", lets the process go on and drops.
	id := createPTY(t, base, opensandbox.CreatePTYRequest{Command: "printf ab; read x; printf cd; read y"})
	c := dialPTY(t, base, id, "pty=0", nil)
	c.connected(id, opensandbox.ModePipe)
	c.until(opensandbox.ChannelStdout, "ab")
	c.send([]byte("go\n"))
	c.conn.Close()
	waitFor(t, "output offset 4", func() bool { return ptyStatus(t, base, id).OutputOffset == 4 })

	c = dialPTY(t, base, id, "takeover=1&since=2", nil)
	m := c.read()
	if want := []byte{3, 0, 0, 0, 0, 0, 0, 0, 2, 'c', 'd'}; m.typ != websocket.BinaryMessage || !bytes.Equal(m.data, want) {
		t.Fatalf("replay frame % x (type %d), want % x", m.data, m.typ, want)
	}
	c.connected(id, opensandbox.ModePipe) // replay BEFORE connected
	c.conn.Close()

	// PTY-5: since at or past the end: no replay.
	for _, since := range []string{"4", "1000"} {
		c = dialPTY(t, base, id, "takeover=1&since="+since, nil)
		c.connected(id, opensandbox.ModePipe)
		c.conn.Close()
	}
	// PTY-7: since=abc or absent → everything retained.
	for _, q := range []string{"takeover=1&since=abc", "takeover=1"} {
		c = dialPTY(t, base, id, q, nil)
		m := c.read()
		f, err := opensandbox.DecodeBinaryFrame(m.data)
		if err != nil || f.Channel != opensandbox.ChannelReplay || f.Offset != 0 || string(f.Data) != "abcd" {
			t.Fatalf("%s: replay %+v %v", q, f, err)
		}
		c.connected(id, opensandbox.ModePipe)
		c.conn.Close()
	}
}

func TestPTYReplayRing(t *testing.T) {
	// PTY-6: 3 MiB of output; only the last 1 MiB is retained.
	_, base := newExecd(t, opensandboxtest.ExecdConfig{})
	const total = 3 << 20
	id := createPTY(t, base, opensandbox.CreatePTYRequest{Command: "head -c 3145728 /dev/zero | tr '\\0' x; printf END; read y"})
	c := dialPTY(t, base, id, "pty=0", nil)
	c.connected(id, opensandbox.ModePipe)
	c.conn.Close()
	waitFor(t, "3 MiB of output", func() bool { return ptyStatus(t, base, id).OutputOffset == total+3 })

	c = dialPTY(t, base, id, "since=0", nil)
	m := c.read()
	f, err := opensandbox.DecodeBinaryFrame(m.data)
	if err != nil || f.Channel != opensandbox.ChannelReplay {
		t.Fatalf("replay: %v, channel %d", err, f.Channel)
	}
	if want := uint64(total + 3 - opensandbox.ReplayBufferSize); f.Offset != want || len(f.Data) != opensandbox.ReplayBufferSize {
		t.Fatalf("replay offset %d len %d, want %d and %d", f.Offset, len(f.Data), want, opensandbox.ReplayBufferSize)
	}
	if binary.BigEndian.Uint64(m.data[1:9]) != f.Offset || !strings.HasSuffix(string(f.Data), "xxxEND") {
		t.Fatalf("replay tail %q", f.Data[len(f.Data)-8:])
	}
	c.connected(id, opensandbox.ModePipe)
}

func TestPTYExclusiveAndTakeover(t *testing.T) {
	_, base := newExecd(t, opensandboxtest.ExecdConfig{})
	id := createPTY(t, base, opensandbox.CreatePTYRequest{})
	first := dialPTY(t, base, id, "", nil)
	first.connected(id, opensandbox.ModePTY)
	first.send([]byte("X=4''2\n"))
	first.until(opensandbox.ChannelStdout, "X=4''2")

	// PTY-8: refused before the upgrade.
	_, resp, err := websocket.DefaultDialer.Dial(wsURL(base, id, ""), nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("second attach: %v %v", err, resp)
	}
	var body opensandbox.ErrorBody
	status, b, _ := call(t, http.MethodGet, base+"/pty/"+id+"/ws", nil, map[string]string{
		"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
	})
	mustJSON(t, b, &body)
	if status != http.StatusConflict || body.Code != opensandbox.CodeAlreadyConnected || !strings.Contains(body.Message, id) {
		t.Fatalf("409 body: %d %+v", status, body)
	}

	// PTY-9: takeover evicts with 4001; the same shell keeps running.
	second := dialPTY(t, base, id, "takeover=1&since=1000000", nil)
	second.connected(id, opensandbox.ModePTY)
	if ce := first.closeCode(); ce.Code != opensandbox.CloseTakenOver || ce.Text != opensandbox.ReasonTakenOver {
		t.Fatalf("evicted socket closed with %v", ce)
	}
	second.send([]byte("echo v$X\n"))
	second.until(opensandbox.ChannelStdout, "v42")
}

func TestPTYSignals(t *testing.T) {
	// PTY-12, in pipe mode (PTY-15's mode) so that the shell and its child
	// share the process group.
	_, base := newExecd(t, opensandboxtest.ExecdConfig{})
	id := createPTY(t, base, opensandbox.CreatePTYRequest{Command: "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.05; done"})
	c := dialPTY(t, base, id, "pty=0", nil)
	c.connected(id, opensandbox.ModePipe)
	c.until(opensandbox.ChannelStdout, "ready\n")
	c.sendControl(opensandbox.ControlFrame{Type: opensandbox.TypeSignal, Signal: "SIGUSR1"}) // ignored: USR1 would kill bash
	c.sendControl(opensandbox.ControlFrame{Type: opensandbox.TypePing})
	if f := c.control(); f.Type != opensandbox.TypePong {
		t.Fatalf("want pong, got %+v", f)
	}
	if !ptyStatus(t, base, id).Running {
		t.Fatal("SIGUSR1 was delivered")
	}
	c.sendControl(opensandbox.ControlFrame{Type: opensandbox.TypeSignal, Signal: "SIGINT"})
	if code := c.exit(); code != 5 || !strings.Contains(c.out[opensandbox.ChannelStdout].String(), "got-int") {
		t.Fatalf("exit %d, stdout %q", code, c.out[opensandbox.ChannelStdout])
	}
}

func TestPTYPipeMode(t *testing.T) {
	// PTY-15.
	_, base := newExecd(t, opensandboxtest.ExecdConfig{})
	id := createPTY(t, base, opensandbox.CreatePTYRequest{Command: "echo out; echo err >&2"})
	c := dialPTY(t, base, id, "pty=0", nil)
	c.connected(id, opensandbox.ModePipe)
	if code := c.exit(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if got := c.out[opensandbox.ChannelStdout].String(); got != "out\n" {
		t.Errorf("stdout %q", got)
	}
	if got := c.out[opensandbox.ChannelStderr].String(); got != "err\n" {
		t.Errorf("stderr %q", got)
	}
	// A later replay merges both; the attach re-runs the exited command
	// (wire-facts §6.6), whose new output follows the replay.
	c = dialPTY(t, base, id, "pty=0&since=0", nil)
	f, err := opensandbox.DecodeBinaryFrame(c.read().data)
	if err != nil || f.Channel != opensandbox.ChannelReplay || f.Offset != 0 || len(f.Data) != 8 ||
		!strings.Contains(string(f.Data), "out\n") || !strings.Contains(string(f.Data), "err\n") {
		t.Fatalf("replay %+v %v", f, err)
	}
	c.connected(id, opensandbox.ModePipe)
	if code := c.exit(); code != 0 {
		t.Fatalf("re-run exit %d", code)
	}
}

func TestPTYUnknownSession(t *testing.T) {
	// PTY-16.
	_, base := newExecd(t, opensandboxtest.ExecdConfig{})
	for _, method := range []string{http.MethodDelete, http.MethodGet} {
		path := "/pty/unknown"
		if method == http.MethodGet {
			path += "/ws"
		}
		status, b, _ := call(t, method, base+path, nil, nil)
		var body opensandbox.ErrorBody
		mustJSON(t, b, &body)
		if status != http.StatusNotFound || body.Code != opensandbox.CodeContextNotFound {
			t.Errorf("%s %s = %d %+v", method, path, status, body)
		}
	}
	if status, _, _ := call(t, http.MethodPost, base+"/pty", "{bad", nil); status != http.StatusBadRequest {
		t.Errorf("bad create body: %d", status)
	}
}

func TestPTYDelete(t *testing.T) {
	// PTY-18.
	_, base := newExecd(t, opensandboxtest.ExecdConfig{})
	id := createPTY(t, base, opensandbox.CreatePTYRequest{})
	c := dialPTY(t, base, id, "", nil)
	c.connected(id, opensandbox.ModePTY)
	if status, _, _ := call(t, http.MethodDelete, base+"/pty/"+id, nil, nil); status != http.StatusOK {
		t.Fatalf("DELETE = %d", status)
	}
	if code := c.exit(); code != -1 {
		t.Fatalf("exit %d, want -1", code)
	}
	if status, _, _ := call(t, http.MethodGet, base+"/pty/"+id, nil, nil); status != http.StatusNotFound {
		t.Fatalf("GET after delete = %d", status)
	}
}

func TestPTYKeepalive(t *testing.T) {
	// The server pings; a client that answers stays; PTY-17: a silent one
	// that does not answer is dropped and the shell continues.
	_, base := newExecd(t, opensandboxtest.ExecdConfig{PingInterval: 20 * time.Millisecond, ReadTimeout: 300 * time.Millisecond})
	id := createPTY(t, base, opensandbox.CreatePTYRequest{})
	c := dialPTY(t, base, id, "", nil)
	pinged := make(chan struct{}, 1)
	c.conn.SetPingHandler(func(data string) error {
		select {
		case pinged <- struct{}{}:
		default:
		}
		return c.conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	})
	c.connected(id, opensandbox.ModePTY)
	done := make(chan msg, 1)
	go func() {
		c.conn.SetReadDeadline(time.Now().Add(timeout))
		for {
			typ, data, err := c.conn.ReadMessage()
			if err != nil {
				done <- msg{typ, data, err}
				return
			}
		}
	}()
	select {
	case <-pinged:
	case <-time.After(timeout):
		t.Fatal("no ping from the server")
	}
	c.conn.Close()
	<-done

	// The server may not have seen that close yet: until it has, the
	// session is still attached and an attach without takeover is a 409.
	var silent *websocket.Conn
	waitFor(t, "the closed client to be detached", func() bool {
		conn, resp, err := websocket.DefaultDialer.Dial(wsURL(base, id, ""), nil)
		if err != nil {
			if resp == nil || resp.StatusCode != http.StatusConflict {
				t.Fatalf("attach: %v", err)
			}
			return false
		}
		silent = conn
		return true
	})
	defer silent.Close()
	// Not reading means not answering pings: the server must drop it,
	// which frees the session for an attach without takeover.
	waitFor(t, "the silent client to be dropped", func() bool {
		conn, resp, err := websocket.DefaultDialer.Dial(wsURL(base, id, ""), nil)
		if err != nil {
			if resp == nil || resp.StatusCode != http.StatusConflict {
				t.Fatalf("attach: %v", err)
			}
			return false
		}
		conn.Close()
		return true
	})
	if !ptyStatus(t, base, id).Running {
		t.Fatal("shell stopped with its client")
	}
}
