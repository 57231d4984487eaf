package tunnel

import (
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/countcopy"
)

// A/B benchmarks of the tunnel core: two configurations side by side in
// one process, rounds interleaved (A, B, A, B…), each round moving the same
// bytes through each; reported as the median of the per-round ratios B/A
// of throughput and of CPU per byte, and for round trips the ratio of the
// p50s.
//
//	go test -run '^$' -bench 'AB' -benchtime 10x ./tunnel
//
// (-benchtime Nx sets the rounds.)

// abRoundBytes is what each configuration moves per round.
const abRoundBytes = 128 << 20

// copyLoop copies src to dst through buf, as the splices do (countcopy.Copy).
func copyLoop(dst io.Writer, src io.Reader, buf []byte) (int64, error) {
	var total int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			total += int64(w)
			if werr != nil {
				return total, werr
			}
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// bulkSource reads as a socket with plenty buffered does: every Read fills
// p, until n bytes were given.
type bulkSource struct{ n int64 }

func (s *bulkSource) Read(p []byte) (int, error) {
	if s.n <= 0 {
		return 0, io.EOF
	}
	k := int(min(int64(len(p)), s.n))
	s.n -= int64(k)
	return k, nil
}

type sink struct{}

func (sink) Write(p []byte) (int, error) { return len(p), nil }

// abSide is one configuration under test: a stream pair and the copy
// buffer sizes of its writer and reader.
type abSide struct {
	name   string
	w, r   io.ReadWriteCloser
	wbuf   []byte
	rbuf   []byte
	pooled bool // copy with countcopy.CopyPooled instead of wbuf/rbuf
	result struct{ mbps, cpu []float64 }
}

// copyIn and copyOut are the side's writer's and reader's copies.
func (s *abSide) copyIn(src io.Reader) error {
	if s.pooled {
		_, err := countcopy.CopyPooled(s.w, src, nil)
		return err
	}
	_, err := copyLoop(s.w, src, s.wbuf)
	return err
}

func (s *abSide) copyOut(dst io.Writer, n int64) error {
	if s.pooled {
		_, err := countcopy.CopyPooled(dst, io.LimitReader(s.r, n), nil)
		return err
	}
	_, err := copyLoop(dst, io.LimitReader(s.r, n), s.rbuf)
	return err
}

// round moves abRoundBytes through the side and records MB/s and CPU ns/B.
func (s *abSide) round(b *testing.B) (mbps, cpuPerB float64) {
	done := make(chan error, 1)
	go func() { done <- s.copyOut(sink{}, abRoundBytes) }()
	cpu0, t0 := processCPU(), time.Now()
	if err := s.copyIn(&bulkSource{abRoundBytes}); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	el, cpu := time.Since(t0), processCPU()-cpu0
	return float64(abRoundBytes) / el.Seconds() / 1e6, float64(cpu) / abRoundBytes
}

// runAB runs b.N rounds of a and z interleaved (the order alternating) and
// reports the medians of z/a.
func runAB(b *testing.B, a, z *abSide) {
	var tput, cpu []float64
	for i := 0; i < b.N; i++ {
		var ma, ca, mz, cz float64
		if i%2 == 0 {
			ma, ca = a.round(b)
			mz, cz = z.round(b)
		} else {
			mz, cz = z.round(b)
			ma, ca = a.round(b)
		}
		a.result.mbps = append(a.result.mbps, ma)
		z.result.mbps = append(z.result.mbps, mz)
		tput = append(tput, mz/ma)
		cpu = append(cpu, cz/ca)
	}
	b.ReportMetric(median(a.result.mbps), "MB/s-"+a.name)
	b.ReportMetric(median(z.result.mbps), "MB/s-"+z.name)
	b.ReportMetric(median(tput), "throughput-ratio")
	b.ReportMetric(median(cpu), "cpu/B-ratio")
}

// median is ws_test.go's.
// BenchmarkABCopyChunk: the splices' copy, 32 KiB buffers (io.Copy's and
// the agent's dial copies' before) against countcopy.CopyPooled (32 KiB
// growing to 256 KiB), both ends, over one corked TLS tunnel stream each;
// and the tunnel with CopyPooled against plain TLS (no yamux) with the
// same copies.
func BenchmarkABCopyChunk(b *testing.B) {
	mk := func(name string, pooled bool) *abSide {
		w, r := streamPair(b, 16<<20, true, 0)
		return &abSide{name: name, w: w, r: r, wbuf: make([]byte, 32<<10), rbuf: make([]byte, 32<<10), pooled: pooled}
	}
	b.Run("32KiB-vs-pooled", func(b *testing.B) { runAB(b, mk("32KiB", false), mk("pooled", true)) })
	b.Run("32KiB-vs-256KiB", func(b *testing.B) {
		big := mk("256KiB", false)
		big.wbuf, big.rbuf = make([]byte, 256<<10), make([]byte, 256<<10)
		runAB(b, mk("32KiB", false), big)
	})
	b.Run("64KiB-writes-vs-256KiB-writes", func(b *testing.B) {
		mid := mk("64KiB-w", false)
		mid.wbuf, mid.rbuf = make([]byte, 64<<10), make([]byte, 256<<10)
		big := mk("256KiB-w", false)
		big.wbuf, big.rbuf = make([]byte, 256<<10), make([]byte, 256<<10)
		runAB(b, mid, big)
	})
	b.Run("plain-tls-vs-tunnel", func(b *testing.B) {
		c, s := tlsPair(b)
		b.Cleanup(func() { c.Close(); s.Close() })
		runAB(b, &abSide{name: "tls", w: c, r: s, pooled: true}, mk("tunnel", true))
	})
}

// BenchmarkABRoundTrip: a 64-byte echo whose far end copies the stream
// back to itself with 32 KiB buffers against countcopy.CopyPooled (a small
// message must not get slower); reports both p50s and their ratio, rounds
// of 2,000 echoes interleaved.
func BenchmarkABRoundTrip(b *testing.B) {
	type side struct {
		st  io.ReadWriteCloser
		lat []time.Duration
	}
	mk := func(pooled bool) *side {
		w, r := streamPair(b, 16<<20, true, 0)
		go func() {
			if pooled {
				countcopy.CopyPooled(r, r, nil)
			} else {
				copyLoop(r, r, make([]byte, 32<<10))
			}
		}()
		return &side{st: w}
	}
	a, z := mk(false), mk(true)
	msg, buf := make([]byte, 64), make([]byte, 64)
	round := func(s *side) {
		for range 2000 {
			t0 := time.Now()
			if _, err := s.st.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(s.st, buf); err != nil {
				b.Fatal(err)
			}
			s.lat = append(s.lat, time.Since(t0))
		}
	}
	var ratios []float64
	p50 := func(l []time.Duration) float64 {
		s := slices.Clone(l)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds())
	}
	for i := 0; i < b.N; i++ {
		a.lat, z.lat = a.lat[:0], z.lat[:0]
		if i%2 == 0 {
			round(a)
			round(z)
		} else {
			round(z)
			round(a)
		}
		ratios = append(ratios, p50(z.lat)/p50(a.lat))
	}
	b.ReportMetric(p50(a.lat), "p50-µs-32KiB")
	b.ReportMetric(p50(z.lat), "p50-µs-pooled")
	b.ReportMetric(median(ratios), "p50-ratio")
}

// BenchmarkABWindow: yamux's stream window, 16 MiB (DefaultConfig) against
// smaller ones, with 256 KiB copies.
func BenchmarkABWindow(b *testing.B) {
	for _, win := range []uint32{1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("16MiB-vs-%dMiB", win>>20), func(b *testing.B) {
			mk := func(name string, win uint32) *abSide {
				w, r := streamPair(b, win, true, 0)
				return &abSide{name: name, w: w, r: r, wbuf: make([]byte, 256<<10), rbuf: make([]byte, 256<<10)}
			}
			runAB(b, mk("16MiB", 16<<20), mk(fmt.Sprintf("%dMiB", win>>20), win))
		})
	}
}

// BenchmarkCopy256KiB is the B side of BenchmarkABCopyChunk alone, for
// profiles: go test -run '^$' -bench Copy256KiB -benchtime 20x -cpuprofile cpu.out ./tunnel
func BenchmarkCopy256KiB(b *testing.B) {
	w, r := streamPair(b, 16<<20, true, 0)
	s := &abSide{name: "256KiB", w: w, r: r, wbuf: make([]byte, 256<<10), rbuf: make([]byte, 256<<10)}
	var mbps, cpu []float64
	for i := 0; i < b.N; i++ {
		m, c := s.round(b)
		mbps, cpu = append(mbps, m), append(cpu, c)
	}
	b.ReportMetric(median(mbps), "MB/s")
	b.ReportMetric(median(cpu), "cpu-ns/B")
}

// BenchmarkABReadAhead: the tunnel with read-ahead beneath TLS
// (readahead.go) off and on, CopyPooled at both ends. The knob is read at
// each Read, so both sides run the same sessions; rounds interleave.
func BenchmarkABReadAhead(b *testing.B) {
	w, r := streamPair(b, 16<<20, true, 0)
	s := &abSide{name: "x", w: w, r: r, pooled: true}
	var tput, cpu, off, on []float64
	round := func(disable bool) (float64, float64) {
		readAheadOff.Store(disable)
		defer readAheadOff.Store(false)
		return s.round(b)
	}
	for i := 0; i < b.N; i++ {
		var ma, ca, mz, cz float64
		if i%2 == 0 {
			ma, ca = round(true)
			mz, cz = round(false)
		} else {
			mz, cz = round(false)
			ma, ca = round(true)
		}
		off, on = append(off, ma), append(on, mz)
		tput, cpu = append(tput, mz/ma), append(cpu, cz/ca)
	}
	b.ReportMetric(median(off), "MB/s-off")
	b.ReportMetric(median(on), "MB/s-on")
	b.ReportMetric(median(tput), "throughput-ratio")
	b.ReportMetric(median(cpu), "cpu/B-ratio")
}
