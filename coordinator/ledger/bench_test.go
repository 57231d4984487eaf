package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkReconcile10k reconciles an inventory of 10,000 new sandboxes
// (each a CAS create of its record, with its created event) and, in the
// same iteration, writes the same 10,000 records as raw KV puts with the
// same concurrency: the baseline. It reports both in seconds and their
// ratio (x-rawput). The target is under 5 s per reconcile. A second
// reconcile of the same, unchanged inventory (no writes) is reported as
// unchanged-s.
func BenchmarkReconcile10k(b *testing.B) {
	const n = 10_000
	e := newEnv(b)
	l := e.open(func(c *ledger.Config) { c.Logger = nil })
	ctx := context.Background()
	js, err := jetstream.New(e.conn())
	if err != nil {
		b.Fatal(err)
	}
	raw, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_raw", History: 1})
	if err != nil {
		b.Fatal(err)
	}
	var recon, base, unchanged time.Duration
	for i := 0; b.Loop(); i++ {
		node := fmt.Sprintf("node-%d", i) // fresh records every iteration
		inv := sandboxes(n, fmt.Sprintf("run%d", i))

		start := time.Now()
		rawPut(b, raw, node, inv, ledger.DefaultWriteConcurrency, e.clock.Now())
		base += time.Since(start)

		start = time.Now()
		if err := l.ReconcileAt(ctx, node, e.clock.Now(), inv, complete()); err != nil {
			b.Fatal(err)
		}
		recon += time.Since(start)
		if got := l.LiveOn(node); got != n {
			b.Fatalf("%d live records, want %d", got, n)
		}

		start = time.Now()
		if err := l.ReconcileAt(ctx, node, e.clock.Now(), inv, complete()); err != nil {
			b.Fatal(err)
		}
		unchanged += time.Since(start)
	}
	iters := float64(b.N)
	b.ReportMetric(recon.Seconds()/iters, "reconcile-s")
	b.ReportMetric(base.Seconds()/iters, "rawput-s")
	b.ReportMetric(recon.Seconds()/base.Seconds(), "x-rawput")
	b.ReportMetric(unchanged.Seconds()/iters, "unchanged-s")
}

// rawPut writes each sandbox's record JSON with kv.Put, conc at a time.
func rawPut(b *testing.B, kv jetstream.KeyValue, node string, inv []protocol.Sandbox, conc int, now time.Time) {
	work := make(chan *protocol.Sandbox)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				data, _ := json.Marshal(protocol.SandboxInfo{Provider: s.Provider, Node: node, ID: s.ID, Name: s.Name, Workspace: s.Workspace,
					Run: s.Labels["run"], Labels: s.Labels, Managed: true, CreatedAt: now, FirstSeen: now, LastSeen: now,
					State: protocol.SandboxLive, StateSince: now, Source: protocol.SourceInventory})
				if _, err := kv.Put(context.Background(), s.Provider+"."+node+"."+s.ID, data); err != nil {
					b.Error(err)
				}
			}
		}()
	}
	for i := range inv {
		work <- &inv[i]
	}
	close(work)
	wg.Wait()
}
