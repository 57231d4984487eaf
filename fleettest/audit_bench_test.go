package fleettest_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/audit"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkExecAudit: the exec round trip of BenchmarkExecRoundTrip with
// the audit log off and on (one event per job: a JSON log line, a queued
// asynchronous JetStream publish), in the same run.
//
// Run: go test -run '^$' -bench ExecAudit -benchtime 2000x ./fleettest
func BenchmarkExecAudit(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "audit=off"
		if on {
			name = "audit=on"
		}
		b.Run(name, func(b *testing.B) {
			var rec *audit.Recorder
			f := fleettest.Start(b, fleettest.Options{Coordinator: func(c *coordinator.Config) {
				if !on {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var err error
				rec, err = audit.New(ctx, audit.Config{NATS: c.NATS, Coordinator: c.ID, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { rec.Close(context.Background()) })
				c.Audit = rec
			}})
			ctx := context.Background()
			req := protocol.ExecRequest{Target: protocol.Target{Node: "node-0"}, Argv: []string{"/bin/true"}}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := req
				t0 := time.Now()
				res, err := f.Client.Exec(ctx, &r, nil)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
				if len(res.Results) != 1 || !res.Results[0].OK() {
					b.Fatalf("result %+v", res.Results)
				}
			}
			b.StopTimer()
			reportPercentiles(b, lat)
		})
	}
}
