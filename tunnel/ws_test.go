package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tetherfleet/tether/protocol"
)

// wsServe serves the WebSocket transport on a loopback TLS listener made
// as the coordinator's (Cork, ServeALPN) with sc; each upgraded connection
// goes to the returned channel. It returns the listener's address.
func wsServe(tb testing.TB, sc *tls.Config) (string, <-chan net.Conn) {
	return wsServeBuf(tb, sc, wsServerReadBufferSize, wsServerBufferSize)
}

// wsServeBuf is wsServe with the server's read and write buffers of
// readSize and bufSize bytes.
func wsServeBuf(tb testing.TB, sc *tls.Config, readSize, bufSize int) (string, <-chan net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	conns := make(chan net.Conn, 16)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != WebSocketPath {
			http.NotFound(w, r)
			return
		}
		c, err := upgradeWebSocket(w, r, readSize, bufSize, &sync.Pool{})
		if err != nil {
			return
		}
		conns <- c
	})}
	go srv.Serve(NewListener(ln, ServeALPN(sc)))
	tb.Cleanup(func() {
		srv.Close()
		for {
			select {
			case c := <-conns:
				c.Close()
			default:
				return
			}
		}
	})
	return ln.Addr().String(), conns
}

// wsPair returns both ends of a WebSocket transport connection over TLS,
// dialed as agents dial it.
func wsPair(tb testing.TB) (client, server net.Conn) {
	tb.Helper()
	return wsPairBuf(tb, wsServerReadBufferSize, wsServerBufferSize)
}

// wsPairBuf is wsPair with the server's read and write buffers of
// readSize and bufSize bytes.
func wsPairBuf(tb testing.TB, readSize, bufSize int) (client, server net.Conn) {
	tb.Helper()
	cc, sc := tlsConfigs(tb)
	addr, conns := wsServeBuf(tb, sc, readSize, bufSize)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	d := &WebSocketDialer{TLS: TunedTLS(cc), PingInterval: -1}
	c, err := d.Dial(ctx, addr)
	if err != nil {
		tb.Fatal(err)
	}
	select {
	case s := <-conns:
		return c, s
	case <-ctx.Done():
		tb.Fatal("no upgraded connection")
	}
	return nil, nil
}

func TestWebSocketConnCarriesBytesAcrossMessages(t *testing.T) {
	c, s := wsPair(t)
	defer c.Close()
	defer s.Close()
	if !IsWebSocket(c) || !IsWebSocket(s) {
		t.Fatal("not websocket conns")
	}
	if st := c.(*wsConn).ConnectionState(); len(st.PeerCertificates) == 0 || st.NegotiatedProtocol != ALPNHTTP {
		t.Errorf("client TLS state: %d peer certificates, ALPN %q; want the server's chain and %s", len(st.PeerCertificates), st.NegotiatedProtocol, ALPNHTTP)
	}
	// Three writes (one message each, the last larger than the write
	// buffer, so several frames), read back in small reads that straddle
	// the messages' bounds.
	want := []byte(strings.Repeat("a", 10) + strings.Repeat("b", 1) + strings.Repeat("c", 3*wsBufferSize+7))
	errc := make(chan error, 1)
	go func() {
		for _, p := range [][]byte{want[:10], want[10:11], want[11:]} {
			if _, err := c.Write(p); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	got := make([]byte, 0, len(want))
	buf := make([]byte, 7)
	for len(got) < len(want) {
		s.SetReadDeadline(time.Now().Add(defaultTestTimeout))
		n, err := s.Read(buf)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
		got = append(got, buf[:n]...)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("read %d bytes that differ from the %d written", len(got), len(want))
	}
	// A closed peer reads as EOF or an error, never hangs.
	c.Close()
	s.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	if _, err := s.Read(buf); err == nil {
		t.Fatal("read from a closed peer succeeded")
	}
}

func TestWebSocketReadDeadline(t *testing.T) {
	c, s := wsPair(t)
	defer c.Close()
	defer s.Close()
	s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := s.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
}

// TestWebSocketTextFrameRefused: a peer that sends a text message is told
// why (close 1003) and cut off; the reader gets ErrTextFrame.
func TestWebSocketTextFrameRefused(t *testing.T) {
	cc, sc := tlsConfigs(t)
	addr, conns := wsServe(t, sc)
	cfg := cc.Clone()
	cfg.NextProtos = []string{ALPNHTTP}
	d := websocket.Dialer{TLSClientConfig: cfg, HandshakeTimeout: defaultTestTimeout}
	ws, _, err := d.Dial("wss://"+addr+WebSocketPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	s := <-conns
	defer s.Close()
	if err := ws.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	if _, err := s.Read(make([]byte, 16)); !errors.Is(err, ErrTextFrame) {
		t.Fatalf("server read: %v, want ErrTextFrame", err)
	}
	ws.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	_, _, err = ws.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseUnsupportedData || !strings.Contains(ce.Text, "binary") {
		t.Fatalf("client read: %v, want close 1003 saying binary messages only", err)
	}
}

// TestWebSocketDialRefusals: a server that does not take ALPN http/1.1 (an
// older coordinator) and a path that is not upgraded are errors that say
// so.
func TestWebSocketDialRefusals(t *testing.T) {
	cc, sc := tlsConfigs(t)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	old, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	tln := NewListener(old, sc) // no NextProtos
	go func() {
		for {
			c, err := tln.Accept()
			if err != nil {
				return
			}
			go func() {
				c.(*tls.Conn).Handshake()
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	d := &WebSocketDialer{TLS: cc, PingInterval: -1}
	if _, err := d.Dial(ctx, old.Addr().String()); err == nil || !strings.Contains(err.Error(), "ALPN") {
		t.Errorf("dial of a server without ALPN: %v, want an error naming ALPN", err)
	}

	addr, _ := wsServe(t, sc)
	d.Path = "/elsewhere"
	if _, err := d.Dial(ctx, addr); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("dial of another path: %v, want 404", err)
	}
}

// wsStreamPair is streamPair over the WebSocket transport: both ends of
// one tunnel stream over wsPair.
func wsStreamPair(b *testing.B) (io.ReadWriteCloser, io.ReadWriteCloser) {
	b.Helper()
	return wsStreamPairBuf(b, wsServerReadBufferSize, wsServerBufferSize)
}

// wsStreamPairBuf is wsStreamPair with the server's read and write
// buffers of readSize and bufSize bytes.
func wsStreamPairBuf(b *testing.B, readSize, bufSize int) (io.ReadWriteCloser, io.ReadWriteCloser) {
	b.Helper()
	c, s := wsPairBuf(b, readSize, bufSize)
	cfg := DefaultConfig()
	cfg.KeepAliveInterval = 0
	cs, ss := sessionPair(b, c, s, cfg)
	ctx := context.Background()
	type acc struct {
		st  io.ReadWriteCloser
		err error
	}
	ch := make(chan acc, 1)
	go func() {
		st, _, err := ss.Accept(ctx)
		ch <- acc{st, err}
	}()
	w, err := cs.Open(ctx, protocol.KindExec, struct{}{})
	if err != nil {
		b.Fatal(err)
	}
	a := <-ch
	if a.err != nil {
		b.Fatal(a.err)
	}
	return w, a.st
}

// BenchmarkWebSocketTransport measures the WebSocket transport against the
// TLS transport (the agent's default: yamux over TLS over Cork), both with
// the session's tuning, in the same run: each iteration is one round that
// measures both, in alternating order, and the benchmark reports the
// median of the rounds' ratios (ws/tls), so a machine's passing load
// moves no round much:
//
//	go test -run '^$' -bench WebSocketTransport -benchtime 20x ./tunnel
//
// throughput: 32 MiB one way, agent to coordinator (the client masks its
// frames) and back; ratio of MB/s, target ≥ 0.9, and of the process's CPU
// time (ws/tls-cpu-ratio, steadier on a loaded machine). roundtrip: 500 64-byte
// echoes; ratio of the mean round trip, target ≤ 1.1.
func BenchmarkWebSocketTransport(b *testing.B) {
	for _, dir := range []string{"up", "down"} {
		b.Run("throughput-"+dir, func(b *testing.B) {
			tw, tr := streamPair(b, 16<<20, true, 0)
			ww, wr := wsStreamPair(b)
			if dir == "down" {
				tw, tr = tr, tw
				ww, wr = wr, ww
			}
			const total = 32 << 20
			var ratios, cpuRatios, tlsMBps, wsMBps []float64
			for i := 0; i < b.N; i++ {
				var dt, dw, ct, cw time.Duration
				if i%2 == 0 {
					dt, ct = bulkCPU(b, tw, tr, total)
					dw, cw = bulkCPU(b, ww, wr, total)
				} else {
					dw, cw = bulkCPU(b, ww, wr, total)
					dt, ct = bulkCPU(b, tw, tr, total)
				}
				ratios = append(ratios, dt.Seconds()/dw.Seconds())
				cpuRatios = append(cpuRatios, cw.Seconds()/ct.Seconds())
				tlsMBps = append(tlsMBps, total/dt.Seconds()/1e6)
				wsMBps = append(wsMBps, total/dw.Seconds()/1e6)
			}
			b.ReportMetric(median(ratios), "ws/tls-ratio")
			b.ReportMetric(median(cpuRatios), "ws/tls-cpu-ratio")
			b.ReportMetric(median(tlsMBps), "tls-MB/s")
			b.ReportMetric(median(wsMBps), "ws-MB/s")
		})
	}
	b.Run("roundtrip", func(b *testing.B) {
		tw, tr := streamPair(b, 16<<20, true, 0)
		ww, wr := wsStreamPair(b)
		go echoLoop(tr)
		go echoLoop(wr)
		const n = 500
		var ratios, tlsUS, wsUS []float64
		for i := 0; i < b.N; i++ {
			var dt, dw time.Duration
			if i%2 == 0 {
				dt, dw = rttOnce(b, tw, n), rttOnce(b, ww, n)
			} else {
				dw, dt = rttOnce(b, ww, n), rttOnce(b, tw, n)
			}
			ratios = append(ratios, dw.Seconds()/dt.Seconds())
			tlsUS = append(tlsUS, dt.Seconds()/n*1e6)
			wsUS = append(wsUS, dw.Seconds()/n*1e6)
		}
		b.ReportMetric(median(ratios), "ws/tls-ratio")
		b.ReportMetric(median(tlsUS), "tls-µs/rt")
		b.ReportMetric(median(wsUS), "ws-µs/rt")
	})
}

// bulkOnce writes total bytes to w in 64 KiB writes and returns how long
// until r read them all.
func bulkOnce(b *testing.B, w io.Writer, r io.Reader, total int64) time.Duration {
	d, _ := bulkCPU(b, w, r, total)
	return d
}

// bulkCPU is bulkOnce that also returns the process's CPU time for it
// (both ends run in this process): steadier than the wall time on a
// loaded machine, which also measures the wait for a core.
func bulkCPU(b *testing.B, w io.Writer, r io.Reader, total int64) (wall, cpu time.Duration) {
	buf := make([]byte, benchChunk)
	done := make(chan error, 1)
	cpu0 := processCPU()
	start := time.Now()
	go func() {
		_, err := io.CopyN(io.Discard, r, total)
		done <- err
	}()
	for sent := int64(0); sent < total; sent += benchChunk {
		if _, err := w.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return time.Since(start), processCPU() - cpu0
}

// echoLoop echoes 64-byte messages until the stream fails.
func echoLoop(z io.ReadWriter) {
	buf := make([]byte, 64)
	for {
		if _, err := io.ReadFull(z, buf); err != nil {
			return
		}
		if _, err := z.Write(buf); err != nil {
			return
		}
	}
}

// rttOnce runs n 64-byte round trips on a and returns how long they took.
func rttOnce(b *testing.B, a io.ReadWriter, n int) time.Duration {
	msg := make([]byte, 64)
	buf := make([]byte, 64)
	start := time.Now()
	for range n {
		if _, err := a.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(a, buf); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkWebSocketServerBuffer measures the coordinator's write buffer
// (wsServerBufferSize, 16 KiB: gorilla writes a server's body of more than
// twice that straight from yamux's buffer, with the frame header as a
// record of its own) against a buffer that holds a whole 64 KiB frame
// (every byte copied into it), coordinator to agent, in interleaved
// rounds; it reports the medians of the per-round ratios of throughput
// and of CPU time (16 KiB's over 68 KiB's: below 1 is cheaper):
//
//	go test -run '^$' -bench WebSocketServerBuffer -benchtime 40x ./tunnel
func BenchmarkWebSocketServerBuffer(b *testing.B) {
	sr, sw := wsStreamPairBuf(b, wsServerReadBufferSize, wsServerBufferSize) // agent reads, coordinator writes
	cr, cw := wsStreamPairBuf(b, wsServerReadBufferSize, wsBufferSize)
	const total = 32 << 20
	var ratios, cpuRatios []float64
	for i := 0; i < b.N; i++ {
		var ds, dc, cs, cc time.Duration
		if i%2 == 0 {
			ds, cs = bulkCPU(b, sw, sr, total)
			dc, cc = bulkCPU(b, cw, cr, total)
		} else {
			dc, cc = bulkCPU(b, cw, cr, total)
			ds, cs = bulkCPU(b, sw, sr, total)
		}
		ratios = append(ratios, dc.Seconds()/ds.Seconds())
		cpuRatios = append(cpuRatios, cs.Seconds()/cc.Seconds())
	}
	b.ReportMetric(median(ratios), "16KiB/68KiB-ratio")
	b.ReportMetric(median(cpuRatios), "16KiB/68KiB-cpu-ratio")
}

// BenchmarkWebSocketServerReadBuffer measures the coordinator's read
// buffer (wsServerReadBufferSize, 512 B, held by every idle agent) against
// 4 KiB, agent to coordinator, in interleaved rounds; it reports the
// medians of the per-round ratios of throughput and of CPU time (512 B's
// over 4 KiB's):
//
//	go test -run '^$' -bench WebSocketServerReadBuffer -benchtime 40x ./tunnel
func BenchmarkWebSocketServerReadBuffer(b *testing.B) {
	sw, sr := wsStreamPairBuf(b, wsServerReadBufferSize, wsServerBufferSize) // agent writes, coordinator reads
	bw, br := wsStreamPairBuf(b, 4<<10, wsServerBufferSize)
	const total = 32 << 20
	var ratios, cpuRatios []float64
	for i := 0; i < b.N; i++ {
		var ds, db, cs, cb time.Duration
		if i%2 == 0 {
			ds, cs = bulkCPU(b, sw, sr, total)
			db, cb = bulkCPU(b, bw, br, total)
		} else {
			db, cb = bulkCPU(b, bw, br, total)
			ds, cs = bulkCPU(b, sw, sr, total)
		}
		ratios = append(ratios, db.Seconds()/ds.Seconds())
		cpuRatios = append(cpuRatios, cs.Seconds()/cb.Seconds())
	}
	b.ReportMetric(median(ratios), "512B/4KiB-ratio")
	b.ReportMetric(median(cpuRatios), "512B/4KiB-cpu-ratio")
}
