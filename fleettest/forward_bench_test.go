package fleettest_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"

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
//
// TETHER_BENCH_ONLY=direct (or nats, relay) measures that path alone, for
// a CPU profile of it (-cpuprofile); the ratios are then meaningless.
func BenchmarkForward(b *testing.B) {
	rounds := benchEnv(b, "TETHER_BENCH_ROUNDS", 5)
	bulk := int64(benchEnv(b, "TETHER_BENCH_BULK_MIB", 64)) << 20
	echoes := benchEnv(b, "TETHER_BENCH_ECHOES", 2000)

	target := fleettest.BenchTarget(b)
	relay := fleettest.TwoHopRelay(b, target)
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
	if only := os.Getenv("TETHER_BENCH_ONLY"); only != "" {
		// For a profile of one path: no ratios then.
		dialers = slices.DeleteFunc(dialers, func(d struct {
			name string
			dial func() (io.ReadWriteCloser, error)
		}) bool {
			return d.name != only
		})
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
				mbps, err := fleettest.MeasureBulk(d.dial, bulk)
				if err != nil {
					b.Fatalf("%s bulk: %v", d.name, err)
				}
				p50, err := fleettest.MeasureEcho(d.dial, echoes)
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
		b.ReportMetric(fleettest.Median(v), name)
		b.Logf("%s per round: %v", name, roundTo(v))
	}
	for _, d := range dialers {
		b.ReportMetric(fleettest.Median(bulkOf[d.name]), d.name+"-MB/s")
		b.ReportMetric(fleettest.Median(rttOf[d.name]), d.name+"-rtt-µs")
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

func roundTo(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = strconv.FormatFloat(x, 'f', 3, 64)
	}
	return out
}
