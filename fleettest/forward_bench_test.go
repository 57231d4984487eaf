package fleettest_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/fleettest"
)

// BenchmarkForward measures a forwarded TCP stream (a dial stream, as
// `tether forward` opens) on the direct path and relayed over NATS, each
// against a plain userspace relay of two io.Copy hops on loopback (client
// → hop → hop → target, the shape of client → coordinator → agent →
// target) measured in the same rounds, interleaved: bulk throughput (one
// stream, TETHER_BENCH_BULK_MIB MiB, default 64) and the p50 round trip of
// 64-byte echoes (TETHER_BENCH_ECHOES, default 2000). It reports the
// median over TETHER_BENCH_ROUNDS rounds (default 5) of each round's
// ratios:
//
//	direct-bulk/relay, nats-bulk/relay, direct-bulk/nats (throughput: higher is better)
//	direct-rtt/relay, nats-rtt/relay (p50 round trip: lower is better)
//
// and the medians of the absolute values (MB/s, µs) for orientation. Run:
//
//	go test -run '^$' -bench BenchmarkForward -benchtime 1x ./fleettest/
func BenchmarkForward(b *testing.B) {
	rounds := benchEnv(b, "TETHER_BENCH_ROUNDS", 5)
	bulk := int64(benchEnv(b, "TETHER_BENCH_BULK_MIB", 64)) << 20
	echoes := benchEnv(b, "TETHER_BENCH_ECHOES", 2000)

	target := startBenchTarget(b)
	relay := startTwoHopRelay(b, target)
	f := fleettest.Start(b, fleettest.Options{Direct: true, Agent: func(_ int, c *agent.Config) {
		c.Targets = map[string]string{"bench": target}
	}})
	direct := &client.Client{NC: f.NC, Direct: client.DirectOnly}
	defer direct.Close()
	relayed := &client.Client{NC: f.NC, Direct: client.DirectOff}
	ctx := context.Background()
	dialers := []struct {
		name string
		dial func() (io.ReadWriteCloser, error)
	}{
		{"relay", func() (io.ReadWriteCloser, error) { return net.Dial("tcp", relay) }},
		{"direct", func() (io.ReadWriteCloser, error) {
			s, err := direct.Dial(ctx, "node-0", "bench")
			if err == nil && !s.Direct() {
				err = fmt.Errorf("not on the direct path")
			}
			return s, err
		}},
		{"nats", func() (io.ReadWriteCloser, error) { return relayed.Dial(ctx, "node-0", "bench") }},
	}
	bulkOf := map[string][]float64{}
	rttOf := map[string][]float64{}
	var ratios = map[string][]float64{}
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			bw := map[string]float64{}
			rtt := map[string]float64{}
			// Interleaved, and the order turned each round.
			order := slices.Clone(dialers)
			for i := 0; i < r%len(order); i++ {
				order = append(order[1:], order[0])
			}
			for _, d := range order {
				mbps, err := measureBulk(d.dial, bulk)
				if err != nil {
					b.Fatalf("%s bulk: %v", d.name, err)
				}
				p50, err := measureEcho(d.dial, echoes)
				if err != nil {
					b.Fatalf("%s echo: %v", d.name, err)
				}
				bw[d.name], rtt[d.name] = mbps, p50
				bulkOf[d.name] = append(bulkOf[d.name], mbps)
				rttOf[d.name] = append(rttOf[d.name], p50)
			}
			ratios["direct-bulk/relay"] = append(ratios["direct-bulk/relay"], bw["direct"]/bw["relay"])
			ratios["nats-bulk/relay"] = append(ratios["nats-bulk/relay"], bw["nats"]/bw["relay"])
			ratios["direct-bulk/nats"] = append(ratios["direct-bulk/nats"], bw["direct"]/bw["nats"])
			ratios["direct-rtt/relay"] = append(ratios["direct-rtt/relay"], rtt["direct"]/rtt["relay"])
			ratios["nats-rtt/relay"] = append(ratios["nats-rtt/relay"], rtt["nats"]/rtt["relay"])
		}
	}
	b.StopTimer()
	for name, v := range ratios {
		b.ReportMetric(benchMedian(v), name)
		b.Logf("%s per round: %v", name, roundTo(v))
	}
	for _, d := range dialers {
		b.ReportMetric(benchMedian(bulkOf[d.name]), d.name+"-MB/s")
		b.ReportMetric(benchMedian(rttOf[d.name]), d.name+"-rtt-µs")
	}
}

func benchEnv(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func benchMedian(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func roundTo(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = strconv.FormatFloat(x, 'f', 3, 64)
	}
	return out
}

// startBenchTarget serves the benchmark's two modes on loopback: a
// connection's first byte picks it. 'B' then an 8-byte length: the bytes
// are read and discarded, then one byte answers; 'E': every byte is echoed.
func startBenchTarget(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				var mode [1]byte
				if _, err := io.ReadFull(c, mode[:]); err != nil {
					return
				}
				switch mode[0] {
				case 'B':
					var n [8]byte
					if _, err := io.ReadFull(c, n[:]); err != nil {
						return
					}
					// Big reads: the sink should cost little next to the paths.
					buf := make([]byte, 1<<20)
					for left := int64(binary.BigEndian.Uint64(n[:])); left > 0; {
						k, err := c.Read(buf[:min(left, int64(len(buf)))])
						left -= int64(k)
						if err != nil {
							return
						}
					}
					c.Write([]byte{1})
				case 'E':
					io.Copy(c, c)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// startTwoHopRelay chains two userspace relays (io.Copy each way) in front
// of target and returns the first one's address.
func startTwoHopRelay(b *testing.B, target string) string {
	return startRelay(b, startRelay(b, target))
}

func startRelay(b *testing.B, to string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				u, err := net.Dial("tcp", to)
				if err != nil {
					return
				}
				defer u.Close()
				done := make(chan struct{})
				go func() {
					io.Copy(u, c)
					u.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				io.Copy(c, u)
				c.(*net.TCPConn).CloseWrite()
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

// measureBulk sends n bytes through a new connection and returns the rate
// in MB/s, from the first byte to the target's acknowledgement.
func measureBulk(dial func() (io.ReadWriteCloser, error), n int64) (float64, error) {
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var hdr [9]byte
	hdr[0] = 'B'
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	buf := make([]byte, 256<<10)
	start := time.Now()
	if _, err := c.Write(hdr[:]); err != nil {
		return 0, err
	}
	for left := n; left > 0; {
		k := min(left, int64(len(buf)))
		if _, err := c.Write(buf[:k]); err != nil {
			return 0, err
		}
		left -= k
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return 0, fmt.Errorf("ack: %w", err)
	}
	return float64(n) / time.Since(start).Seconds() / 1e6, nil
}

// measureEcho sends k 64-byte messages one at a time through a new
// connection, each after the previous one's echo, and returns the median
// round trip in µs.
func measureEcho(dial func() (io.ReadWriteCloser, error), k int) (float64, error) {
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'E'}); err != nil {
		return 0, err
	}
	msg := make([]byte, 64)
	back := make([]byte, 64)
	rtts := make([]float64, 0, k)
	for i := range k + 50 {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, back); err != nil {
			return 0, err
		}
		if i >= 50 { // warm-up
			rtts = append(rtts, float64(time.Since(start).Nanoseconds())/1e3)
		}
	}
	return benchMedian(rtts), nil
}
