package client_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkExecReplies compares, in one run, an exec request answered at
// once by a stand-in coordinator through the shared reply subscription
// ("shared") and through a subscription per request (as before it,
// "per-request"), and a bare NATS request/reply ("floor", the least any
// request can take). Rounds of 100 requests alternate between the three
// (the order reversed every other round); it reports the median per-round
// ratios shared/per-request and shared/floor, and each one's median µs per
// request.
func BenchmarkExecReplies(b *testing.B) {
	s := runServer(b)
	newFake(b, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		f.result(m, req.ID, 0, protocol.ExecResult{Results: []protocol.NodeResult{{Node: "a"}}})
	}, nil)
	echo := serve(b, s)
	if _, err := echo.Subscribe(protocol.SubjectNodes, func(m *nats.Msg) { m.Respond(nil) }); err != nil {
		b.Fatal(err)
	}
	echo.Flush()
	shared := client.New(connect(b, s))
	perReq := client.New(connect(b, s))
	client.SetPerRequestReplies(perReq, true)
	floorNC := connect(b, s)
	ctx := context.Background()
	execOnce := func(c *client.Client) func() {
		return func() {
			req := &protocol.ExecRequest{Target: protocol.Target{Node: "a"}, Argv: []string{"true"}}
			if _, err := c.Exec(ctx, req, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	sides := []func(){execOnce(shared), execOnce(perReq), func() {
		if _, err := floorNC.Request(protocol.SubjectNodes, nil, 10*time.Second); err != nil {
			b.Fatal(err)
		}
	}}
	const perRound = 100
	rounds := max(b.N/perRound, 3)
	per := make([][]float64, len(sides))
	b.ResetTimer()
	for r := range rounds {
		for k := range sides {
			i := k
			if r%2 == 1 {
				i = len(sides) - 1 - k
			}
			start := time.Now()
			for range perRound {
				sides[i]()
			}
			per[i] = append(per[i], float64(time.Since(start).Microseconds())/perRound)
		}
	}
	b.StopTimer()
	ratio := func(a, c int) float64 {
		var v []float64
		for r := range rounds {
			v = append(v, per[a][r]/per[c][r])
		}
		return medianOf(v)
	}
	b.ReportMetric(ratio(0, 1), "shared/per-request")
	b.ReportMetric(ratio(0, 2), "shared/floor")
	b.ReportMetric(ratio(1, 2), "per-request/floor")
	b.ReportMetric(medianOf(per[0]), "shared-µs")
	b.ReportMetric(medianOf(per[1]), "per-request-µs")
	b.ReportMetric(medianOf(per[2]), "floor-µs")
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
