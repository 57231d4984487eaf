package coordinator_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
)

// durableBenchRound is how many exec pairs (one direct, one durable) make
// one round of BenchmarkDurableSubmission: one round's ratio is the median
// of its durable round trips over the median of its direct ones, so that a
// scheduling hiccup on a busy machine (milliseconds, against round trips
// of a fraction of one) moves neither a round nor the median of rounds.
const durableBenchRound = 10

// BenchmarkDurableSubmission measures an exec round trip (request to final
// result, one node, a fake agent answering at once) through a coordinator
// recording jobs in a job store against one recording nothing (today's
// direct path), interleaved in one run: each iteration runs one of each,
// in alternating order (A,B then B,A), and every durableBenchRound
// iterations make a round. It reports the median of the per-round ratios
// (durable/direct, the figure issue 11 bounds by 1.2), their spread (the
// first and last quartile), and the median round trip of each path. Each
// coordinator has its own embedded server, with sync_interval: always
// (what tether coordinator's embedded server sets by default) or the
// server's default (fsync every 2 minutes). Run with -benchtime=Nx, N a
// multiple of durableBenchRound (at least 5 rounds).
//
// The floor of what durability can cost is one acknowledged write to a
// file-stored stream on the same server (the record must be stored
// before the job runs: issue 11), measured in the same rounds: it reports
// its median (store-write-ns) and the durable path's extra time over it
// (extra/store-write, 1.0 when the durable path costs exactly one store
// write more than the direct one).
func BenchmarkDurableSubmission(b *testing.B) {
	for _, tc := range []struct {
		name               string
		detach, syncAlways bool
	}{{"attached/sync=always", false, true}, {"detached/sync=always", true, true}, {"attached/sync=default", false, false}, {"detached/sync=default", true, false}} {
		detach := tc.detach
		b.Run(tc.name, func(b *testing.B) {
			sync := func(o *server.Options) { o.SyncAlways = tc.syncAlways }
			quiet := func(c *coordinator.Config) { c.Logger = nil }
			direct := newHarnessNATS(b, sync, quiet)
			durable := newHarnessNATS(b, sync, withStore(b, nil, quiet))
			opts := agentOpts{id: "n1"}
			if detach {
				opts = detachedAgent(nil)
				opts.id = "n1"
			}
			direct.dialAgent(b, opts)
			durable.dialAgent(b, opts)
			req := mustJSON(b, protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"ok"}, Detach: detach})
			run := func(h *harness) time.Duration {
				start := time.Now()
				r, err := execRaw(h.client, req)
				if err != nil || r.err != nil || r.result == nil {
					b.Fatalf("exec: %v %+v", err, r.err)
				}
				return time.Since(start)
			}
			js, err := jetstream.New(durable.coordNC)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "BENCH_FLOOR", Subjects: []string{"bench.floor"}, Storage: jetstream.FileStorage, MaxMsgs: 1000}); err != nil {
				b.Fatalf("floor stream: %v", err)
			}
			record := mustJSON(b, map[string]string{"id": "j-0123456789", "owner": "user:client", "state": "running", "node": "n1"})
			write := func() time.Duration {
				start := time.Now()
				if _, err := js.Publish(context.Background(), "bench.floor", record); err != nil {
					b.Fatalf("floor write: %v", err)
				}
				return time.Since(start)
			}
			for range 20 { // warm up connections and the store
				run(direct)
				run(durable)
				write()
			}
			var dDirect, dDurable, dWrite []time.Duration
			n := 0
			for b.Loop() {
				if n%2 == 0 {
					dDirect = append(dDirect, run(direct))
					dDurable = append(dDurable, run(durable))
				} else {
					dDurable = append(dDurable, run(durable))
					dDirect = append(dDirect, run(direct))
				}
				dWrite = append(dWrite, write())
				n++
			}
			var ratios, extra []float64
			for i := 0; i+durableBenchRound <= n; i += durableBenchRound {
				dur, dir, w := median(dDurable[i:i+durableBenchRound]), median(dDirect[i:i+durableBenchRound]), median(dWrite[i:i+durableBenchRound])
				ratios = append(ratios, float64(dur)/float64(dir))
				extra = append(extra, float64(dur-dir)/float64(w))
			}
			if len(ratios) == 0 {
				return // b.Loop's first calibration pass: too few for a round
			}
			slices.Sort(ratios)
			slices.Sort(extra)
			b.ReportMetric(float64(median(dDirect).Nanoseconds()), "direct-ns/exec")
			b.ReportMetric(float64(median(dDurable).Nanoseconds()), "durable-ns/exec")
			b.ReportMetric(ratios[len(ratios)/2], "durable/direct")
			b.ReportMetric(ratios[len(ratios)/4], "ratio-q1")
			b.ReportMetric(ratios[len(ratios)*3/4], "ratio-q3")
			b.ReportMetric(float64(median(dWrite).Nanoseconds()), "store-write-ns")
			b.ReportMetric(extra[len(extra)/2], "extra/store-write")
			b.ReportMetric(float64(len(ratios)), "rounds")
		})
	}
}

// median is the median of d (the upper one of an even count), leaving d
// as it was.
func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
