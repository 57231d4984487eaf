package tunnel

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// Benchmarks for issue 2's target (b): single-stream bulk throughput through a
// tunnel stream over TLS, against the baseline of plain TLS over loopback TCP
// without yamux, measured in the same run. Compare MB/s across sub-benchmarks:
//
//	go test -run '^$' -bench 'Throughput|RoundTrip' -count 5 ./tunnel
//
// "stock" turns frame coalescing off to show what it saves, "uncorked" the
// gathering of a frame's TLS records into one write (cork.go); "256KiB" uses
// yamux's default window.

const benchChunk = 64 << 10

func BenchmarkThroughput(b *testing.B) {
	b.Run("baseline=plain-tls", func(b *testing.B) {
		c, s := tlsPair(b)
		defer c.Close()
		defer s.Close()
		benchCopy(b, c, s)
	})
	for _, v := range []struct {
		name     string
		window   uint32
		coalesce bool
		uncorked bool
	}{
		{"tunnel-tls-16MiB", 16 << 20, true, false},
		{"tunnel-tls-16MiB-uncorked", 16 << 20, true, true},
		{"tunnel-tls-16MiB-stock", 16 << 20, false, true},
		{"tunnel-tls-1MiB", 1 << 20, true, false},
		{"tunnel-tls-256KiB", 256 << 10, true, false},
	} {
		b.Run(v.name, func(b *testing.B) {
			w, r := streamPairOver(b, v.window, v.coalesce, 0, !v.uncorked)
			benchCopy(b, w, r)
		})
	}
}

// BenchmarkIdleWatch measures what Config.IdleTimeout (the coordinator's
// silence watch: a clock reading per buffered read) costs, against the same
// sessions without it, in the same run:
//
//	go test -run '^$' -bench IdleWatch -count 5 ./tunnel
func BenchmarkIdleWatch(b *testing.B) {
	for _, idle := range []time.Duration{0, 15 * time.Second} {
		name := "baseline=no-watch"
		if idle > 0 {
			name = "idle-watch"
		}
		b.Run("throughput/"+name, func(b *testing.B) {
			w, r := streamPair(b, 16<<20, true, idle)
			benchCopy(b, w, r)
		})
		b.Run("roundtrip/"+name, func(b *testing.B) {
			w, r := streamPair(b, 16<<20, true, idle)
			benchPingPong(b, w, r)
		})
	}
}

// BenchmarkRoundTrip measures a 64-byte request/response on one stream, the
// shape of control traffic, against the same over plain TLS.
func BenchmarkRoundTrip(b *testing.B) {
	b.Run("baseline=plain-tls", func(b *testing.B) {
		c, s := tlsPair(b)
		defer c.Close()
		defer s.Close()
		benchPingPong(b, c, s)
	})
	for _, coalesce := range []bool{true, false} {
		name := "tunnel-tls"
		if !coalesce {
			name += "-stock"
		}
		b.Run(name, func(b *testing.B) {
			w, r := streamPair(b, 16<<20, coalesce, 0)
			benchPingPong(b, w, r)
		})
	}
}

// streamPair returns both ends of one tunnel stream over TLS; idle is both
// sessions' IdleTimeout.
func streamPair(b *testing.B, window uint32, coalesce bool, idle time.Duration) (io.ReadWriteCloser, io.ReadWriteCloser) {
	b.Helper()
	return streamPairOver(b, window, coalesce, idle, true)
}

// streamPairOver is streamPair with the TLS over Cork (as DialTLS and
// NewListener make it) or not.
func streamPairOver(b *testing.B, window uint32, coalesce bool, idle time.Duration, corked bool) (io.ReadWriteCloser, io.ReadWriteCloser) {
	b.Helper()
	c, s := tlsPair(b)
	if corked {
		c, s = corkedTLSPair(b)
	}
	cfg := DefaultConfig()
	cfg.MaxStreamWindow = window
	cfg.KeepAliveInterval = 0
	cfg.IdleTimeout = idle
	// Flow telemetry on, as the agents' tunnels run (both ends).
	cfg.Flow = new(FlowCounters)
	cs, err := newSession(c, cfg, true, coalesce)
	if err != nil {
		b.Fatal(err)
	}
	ss, err := newSession(s, cfg, false, coalesce)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.Close(); ss.Close() })
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

func benchCopy(b *testing.B, w io.Writer, r io.Reader) {
	buf := make([]byte, benchChunk)
	done := make(chan error, 1)
	total := int64(b.N) * benchChunk
	go func() {
		_, err := io.CopyN(io.Discard, r, total)
		done <- err
	}()
	b.SetBytes(benchChunk)
	b.ResetTimer()
	cpu0 := processCPU()
	for i := 0; i < b.N; i++ {
		if _, err := w.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	// Both ends run in this process, so its CPU time is the path's. On a
	// loaded machine it is steadier than MB/s, which also measures the wait
	// for a core.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(total), "cpu-ns/B")
}

// processCPU is this process's user plus system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchPingPong(b *testing.B, a, z io.ReadWriter) {
	msg := make([]byte, 64)
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(z, buf); err != nil {
				return
			}
			if _, err := z.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := a.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(a, buf); err != nil {
			b.Fatal(err)
		}
	}
}

var _ net.Conn = (*coalesceConn)(nil)

// zeroConn is a net.Conn whose Read returns at once, to measure what a
// wrapper adds per Read.
type zeroConn struct{ net.Conn }

func (zeroConn) Read(p []byte) (int, error) { return len(p), nil }

// BenchmarkIdleConnRead measures the clock reading the idle watch adds to
// each Read of the connection beneath yamux (yamux reads through a 4 KiB
// buffer, so at most once per 4 KiB), against the same connection without
// it, in the same run.
func BenchmarkIdleConnRead(b *testing.B) {
	buf := make([]byte, 4<<10)
	for _, v := range []struct {
		name string
		c    net.Conn
	}{{"baseline=no-idle-watch", &watchConn{Conn: zeroConn{}}}, {"idle-watch", &watchConn{Conn: zeroConn{}, idle: true, flow: flowState{epoch: time.Now()}}}} {
		b.Run(v.name, func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				v.c.Read(buf)
			}
		})
	}
}
