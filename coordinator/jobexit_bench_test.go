package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkJobExitSettle measures how long a detached job's record takes
// to be settled after its end: (A) by the agent's exit report, from the
// frame's write until the record read from the store is terminal, against
// (B) the lazy path reports replace, a job.get round trip (the
// coordinator asks the node, then writes the record). Each round runs one
// of each, in alternating order, on one coordinator and one fake agent;
// it reports both means and the median of the per-round ratios A/B.
func BenchmarkJobExitSettle(b *testing.B) {
	var st *jobstore.Store
	h := newHarnessNATS(b, nil, withStore(b, &st, func(c *coordinator.Config) { c.Logger = nil }))
	var exited atomic.Bool
	exited.Store(true) // the node answers status with exited 5
	o := detachedAgent(&exited)
	o.id, o.features = "n1", []string{protocol.FeatureJobExit}
	a := h.dialAgent(b, o)
	ctx := context.Background()
	seq := 0
	submit := func() string {
		seq++
		id := fmt.Sprintf("bench-%d", seq)
		req := mustJSON(b, protocol.ExecRequest{ID: id, Target: protocol.Target{Node: "n1"}, Script: "x", Detach: true})
		if r, err := execRaw(h.client, req); err != nil || r.err != nil {
			b.Fatalf("exec: %v %+v", err, r.err)
		}
		// The record is running once recordEnd wrote it.
		for {
			j, err := st.Get(ctx, id)
			if err == nil && j.State == protocol.JobStateRunning {
				return id
			}
		}
	}
	byReport := func() time.Duration {
		id := submit()
		start := time.Now()
		if err := protocol.WriteJSONFrame(a.ctrl, protocol.FrameJobExit, exitReport(id, 5)); err != nil {
			b.Fatal(err)
		}
		for {
			j, err := st.Get(ctx, id)
			if err == nil && j.State.Terminal() {
				return time.Since(start)
			}
		}
	}
	byGet := func() time.Duration {
		id := submit()
		start := time.Now()
		m, err := h.client.Request(protocol.SubjectJobGet, mustJSON(b, protocol.JobGetRequest{ID: id}), defaultTestTimeout)
		d := time.Since(start)
		if err != nil || len(m.Data) == 0 {
			b.Fatalf("job.get: %v", err)
		}
		if j, err := st.Get(ctx, id); err != nil || !j.State.Terminal() {
			b.Fatalf("job.get left the record %+v, %v", j, err)
		}
		return d
	}
	for range 10 { // warm up
		byReport()
		byGet()
	}
	var dA, dB time.Duration
	var ratios []float64
	n := 0
	for b.Loop() {
		var ra, rb time.Duration
		if n%2 == 0 {
			ra, rb = byReport(), byGet()
		} else {
			rb, ra = byGet(), byReport()
		}
		dA, dB = dA+ra, dB+rb
		ratios = append(ratios, float64(ra)/float64(rb))
		n++
	}
	slices.Sort(ratios)
	b.ReportMetric(float64(dA.Nanoseconds())/float64(n), "report-ns/settle")
	b.ReportMetric(float64(dB.Nanoseconds())/float64(n), "jobget-ns/settle")
	b.ReportMetric(ratios[len(ratios)/2], "report/jobget-median")
}
