package tunnel

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// waitFor polls cond until it holds or defaultTestTimeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(defaultTestTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// flowPair is a session pair over conns with flow telemetry on both ends,
// each with counters of its own, and the smallest stream window so that a
// writer runs out of it after 256 KiB.
func flowPair(t *testing.T, c, s net.Conn) (client, server *Session, cf, sf *FlowCounters) {
	t.Helper()
	cf, sf = new(FlowCounters), new(FlowCounters)
	ccfg, scfg := testConfig(), testConfig()
	ccfg.MaxStreamWindow, scfg.MaxStreamWindow = 256<<10, 256<<10
	ccfg.Flow, scfg.Flow = cf, sf
	cs, err := Client(c, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := Server(s, scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Close() })
	return cs, ss, cf, sf
}

// A reader that holds off makes the writer run out of window: the writer's
// session counts a stall lasting at least as long as the reader held off,
// adds it to its counters, and ends it once the reader caught up; the
// reader's session, which sent nothing but window updates, counts none.
func TestFlowStallOnSlowReader(t *testing.T) {
	const holdOff = 30 * time.Millisecond
	for name, mk := range transports(t) {
		t.Run(name, func(t *testing.T) {
			c, s := mk()
			client, server, cf, sf := flowPair(t, c, s)
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()

			payload := make([]byte, 1<<20) // four windows
			var wg sync.WaitGroup
			wg.Add(1)
			var writeErr error
			go func() {
				defer wg.Done()
				st, err := client.Open(ctx, protocol.KindExec, struct{}{})
				if err != nil {
					writeErr = err
					return
				}
				defer st.Close()
				_, writeErr = st.Write(payload)
			}()
			st, _, err := server.Accept(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			waitFor(t, "the writer's first stall", func() bool { return client.FlowStats().Stalls >= 1 })
			time.Sleep(holdOff) // the reader holds off: the stall goes on
			if got := client.FlowStats().StallTime; got < holdOff {
				t.Errorf("stall in progress: StallTime %v, want at least %v", got, holdOff)
			}
			if n, err := io.ReadFull(st, make([]byte, len(payload))); err != nil {
				t.Fatalf("read %d bytes: %v", n, err)
			}
			wg.Wait()
			if writeErr != nil {
				t.Fatal(writeErr)
			}
			fs := client.FlowStats()
			if fs.Stalls < 1 || fs.StallTime < holdOff {
				t.Errorf("writer's session: %d stalls for %v, want at least 1 for %v", fs.Stalls, fs.StallTime, holdOff)
			}
			// The writer's last stall ends with the window update for
			// the reader's last read; the counters hold every ended one.
			waitFor(t, "the last stall to end", func() bool { return cf.StallTime() == client.FlowStats().StallTime })
			if cf.Stalls() != fs.Stalls || cf.StallTime() < holdOff {
				t.Errorf("writer's counters: %d stalls for %v, want %d for at least %v", cf.Stalls(), cf.StallTime(), fs.Stalls, holdOff)
			}
			if got := server.FlowStats(); got.Stalls != 0 || got.StallTime != 0 || sf.Stalls() != 0 {
				t.Errorf("reader's session counted stalls: %+v, counters %d", got, sf.Stalls())
			}
		})
	}
}

// A reader that keeps up with a window larger than the payload never lets
// the writer run out of it: no stall is counted. (A new stream's window is
// 256 KiB until the peer's acknowledgement grants the rest, so a writer
// that writes more before it arrives does stall: the writer here waits for
// the reader's first byte, which comes after it.)
func TestFlowNoStallWithinWindow(t *testing.T) {
	c, s := corkedTLSPair(t)
	cf := new(FlowCounters)
	cfg := testConfig() // 16 MiB window
	cfg.Flow = cf
	client, server := sessionPair(t, c, s, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		st, _, err := server.Accept(ctx)
		if err != nil {
			done <- err
			return
		}
		if _, err := st.Write([]byte{1}); err != nil {
			done <- err
			return
		}
		_, err = io.Copy(io.Discard, st)
		st.Close()
		done <- err
	}()
	st, err := client.Open(ctx, protocol.KindExec, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(st, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if fs := client.FlowStats(); fs.Stalls != 0 || cf.Stalls() != 0 {
		t.Errorf("a writer within its window counted stalls: %+v", fs)
	}
}

// gateConn blocks its Writes while closed is set, until Close or open.
type gateConn struct {
	net.Conn
	mu      sync.Mutex
	blocked bool
	cond    *sync.Cond
	closed  bool
}

func newGateConn(c net.Conn) *gateConn {
	g := &gateConn{Conn: c}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *gateConn) set(blocked bool) {
	g.mu.Lock()
	g.blocked = blocked
	g.mu.Unlock()
	g.cond.Broadcast()
}

func (g *gateConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	for g.blocked && !g.closed {
		g.cond.Wait()
	}
	closed := g.closed
	g.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return g.Conn.Write(p)
}

func (g *gateConn) Close() error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.cond.Broadcast()
	return g.Conn.Close()
}

// While the connection takes nothing, the frame the send loop is writing
// shows as queued, in the session and in its counters; once the connection
// takes it again, and when a session closes with a frame in the
// connection's hands, it is back to zero.
func TestFlowQueuedBytes(t *testing.T) {
	const size = 64 << 10
	for _, end := range []string{"drained", "closed"} {
		t.Run(end, func(t *testing.T) {
			c, s := tcpPair(t)
			gc := newGateConn(c)
			client, server, cf, _ := flowPair(t, gc, s)
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			accepted := make(chan error, 1)
			go func() {
				st, _, err := server.Accept(ctx)
				if err == nil {
					go io.Copy(io.Discard, st)
				}
				accepted <- err
			}()
			st, err := client.Open(ctx, protocol.KindExec, struct{}{})
			if err != nil {
				t.Fatal(err)
			}
			if err := <-accepted; err != nil {
				t.Fatal(err)
			}
			if q := client.FlowStats().QueuedBytes; q != 0 {
				t.Fatalf("idle session: %d bytes queued", q)
			}
			gc.set(true)
			written := make(chan error, 1)
			go func() {
				_, err := st.Write(make([]byte, size))
				written <- err
			}()
			waitFor(t, "the frame to be queued", func() bool { return client.FlowStats().QueuedBytes == size && cf.QueuedBytes() == size })
			switch end {
			case "drained":
				gc.set(false)
				if err := <-written; err != nil {
					t.Fatal(err)
				}
			case "closed":
				client.Close()
				<-written
			}
			if q, a := client.FlowStats().QueuedBytes, cf.QueuedBytes(); q != 0 || a != 0 {
				t.Errorf("%s: %d bytes queued in the session, %d in its counters, want 0", end, q, a)
			}
		})
	}
}

// Each answered Ping's round trip is kept, and counted.
func TestFlowPingRTT(t *testing.T) {
	c, s := net.Pipe()
	client, _ := sessionPair(t, c, s, testConfig())
	for i := 0; i < 3; i++ {
		d, err := client.Ping()
		if err != nil {
			t.Fatal(err)
		}
		if got := client.FlowStats(); got.RTT != d || got.Pings != uint64(i+1) {
			t.Errorf("after ping %d of %v: FlowStats %+v", i+1, d, got)
		}
	}
}

// Streams are forgotten once closed both ways or reset, so a long session
// keeps no state for its past streams.
func TestFlowForgetsClosedStreams(t *testing.T) {
	c, s := tcpPair(t)
	client, server, _, _ := flowPair(t, c, s)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	go func() {
		for {
			st, err := server.AcceptRaw(ctx)
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, st)
				st.Close()
			}()
		}
	}()
	for i := 0; i < 20; i++ {
		st, err := client.OpenRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Write([]byte("x"))
		if i%2 == 0 {
			st.Close() // FIN both ways
			io.Copy(io.Discard, st)
		} else {
			st.Close()
		}
	}
	tracked := func(s *Session) int {
		if tab := s.wc.flow.tab.Load(); tab != nil {
			return len(tab.ids)
		}
		return 0
	}
	waitFor(t, "every closed stream to be forgotten", func() bool { return tracked(client) == 0 && tracked(server) == 0 })
}

// sinkConn takes every Write and reads the bytes it was given, looping.
type sinkConn struct {
	net.Conn
	rd []byte
}

func (*sinkConn) Write(p []byte) (int, error) { return len(p), nil }

func (s *sinkConn) Read(p []byte) (int, error) { return copy(p, s.rd), nil }

// flowConns is a tracked session's send and receive wrappers over sinks,
// with stream 1 open: the receive side reads window updates for it.
func flowConns(tb testing.TB, tracked bool) (*coalesceConn, *watchConn) {
	wc := &watchConn{Conn: &sinkConn{rd: yamuxHeader(yamuxTypeWindowUpdate, 0, 1, 64)}}
	cc := &coalesceConn{Conn: &sinkConn{}}
	if tracked {
		wc.flow.agg, wc.flow.epoch = new(FlowCounters), time.Now()
		cc.flow = &wc.flow
		cc.Write(yamuxHeader(yamuxTypeWindowUpdate, yamuxFlagSYN, 1, 0))
	}
	return cc, wc
}

// The telemetry takes no allocation per frame, written or read.
func TestFlowNoAllocsPerFrame(t *testing.T) {
	cc, wc := flowConns(t, true)
	hdr, body := yamuxHeader(yamuxTypeData, 0, 1, 64), make([]byte, 64)
	buf := make([]byte, yamuxHeaderSize)
	if a := testing.AllocsPerRun(1000, func() {
		cc.Write(hdr)
		cc.Write(body)
		wc.Read(buf)
	}); a != 0 {
		t.Errorf("%v allocations per frame", a)
	}
	if got := wc.flow.lookup(1); got == nil || got.sent.Load() == 0 || got.granted.Load() == 0 {
		t.Fatalf("stream 1 not tracked: %+v", got)
	}
}

// BenchmarkFlowFrame measures what the telemetry adds to each frame: a
// 64-byte data frame written (header and body through the coalescing
// writer) and a window update read, tracked against untracked, in the same
// run:
//
//	go test -run '^$' -bench FlowFrame -count 5 ./tunnel
func BenchmarkFlowFrame(b *testing.B) {
	for _, tracked := range []bool{false, true} {
		name := "baseline=untracked"
		if tracked {
			name = "tracked"
		}
		b.Run(name, func(b *testing.B) {
			cc, wc := flowConns(b, tracked)
			hdr, body := yamuxHeader(yamuxTypeData, 0, 1, 64), make([]byte, 64)
			buf := make([]byte, yamuxHeaderSize)
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				cc.Write(hdr)
				cc.Write(body)
				wc.Read(buf)
			}
			// CPU time, steadier than ns/op on a loaded machine.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// A hostile peer's frames (window updates for streams never opened, huge
// deltas, a SYN flood past maxFlowStreams, FIN and RST of unknown ids,
// repeated SYNs, stream id 0, unknown types) neither panic the receive
// loop's bookkeeping nor grow its table past maxFlowStreams, nor drive a
// counter or gauge negative; a stream of ours still stalls and unstalls.
func TestFlowHostilePeerFrames(t *testing.T) {
	var agg FlowCounters
	f := &flowState{agg: &agg, epoch: time.Now()}
	const ours = 1 // a stream this side opened
	hdr := func(typ byte, flags uint16, id, length uint32) []byte {
		return []byte{0, typ, byte(flags >> 8), byte(flags), byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id),
			byte(length >> 24), byte(length >> 16), byte(length >> 8), byte(length)}
	}
	f.send(hdr(yamuxTypeWindowUpdate, yamuxFlagSYN, ours, 0))
	for id := uint32(2); id < 2*maxFlowStreams+10; id += 2 {
		f.recv(yamuxTypeData, yamuxFlagSYN, id, 0)
		f.recv(yamuxTypeWindowUpdate, yamuxFlagSYN, id, 1<<32-1)
	}
	for _, fr := range []struct {
		typ    byte
		flags  uint16
		id, ln uint32
	}{
		{yamuxTypeWindowUpdate, 0, 1<<32 - 1, 1<<32 - 1},
		{yamuxTypeWindowUpdate, 0, 0, 1<<32 - 1},
		{yamuxTypeData, yamuxFlagFIN | yamuxFlagRST, 12345677, 1 << 31},
		{yamuxTypeData, yamuxFlagFIN, 12345679, 0},
		{0xff, 0xffff, ours, 1<<32 - 1},
		{yamuxTypeData, yamuxFlagSYN | yamuxFlagFIN, ours, 1<<32 - 1}, // a repeated SYN and a FIN of ours
	} {
		f.recv(fr.typ, fr.flags, fr.id, fr.ln)
	}
	if tab := f.tab.Load(); tab == nil || len(tab.ids) > maxFlowStreams {
		t.Fatalf("table after the flood: %v streams, want at most %d and ours", tab, maxFlowStreams)
	}
	if f.lookup(ours) == nil {
		t.Fatal("our stream was dropped by the peer's frames")
	}
	// Our stream runs out of its window, then the peer's update ends it.
	f.send(hdr(yamuxTypeData, 0, ours, initialStreamWindow))
	if got := f.snapshot().Stalls; got != 1 {
		t.Errorf("stalls after our window ran out: %d, want 1", got)
	}
	f.recv(yamuxTypeWindowUpdate, 0, ours, 1<<32-1)
	f.recv(yamuxTypeWindowUpdate, yamuxFlagRST, ours, 1<<32-1)
	f.closeAll()
	s := f.snapshot()
	if s.Stalls != 1 || s.StallTime < 0 || s.QueuedBytes != 0 || agg.QueuedBytes() != 0 || agg.StallTime() < 0 || agg.Stalls() != 1 {
		t.Errorf("after the hostile frames: session %+v, shared stalls %d, stall time %v, queued %d", s, agg.Stalls(), agg.StallTime(), agg.QueuedBytes())
	}
}
