package fleettest_test

import (
	"context"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkExecRemoteCoordinator measures a job's round trip (exec of
// `true` on one node, request to final result) when the request lands on
// the coordinator holding the node and when it lands on the other one,
// which forwards it (coordinator/fleet.go), in the same run: two
// coordinators, one agent held by coordinator 0. The queue group picks
// the coordinator; each request is classified by whether the forwarded
// counter moved. Reported: ns/owner, ns/remote and their ratio
// remote/owner.
func BenchmarkExecRemoteCoordinator(b *testing.B) {
	f := fleettest.Start(b, fleettest.Options{Coordinators: 2, Agents: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	req := &protocol.ExecRequest{Target: protocol.Target{Node: "node-0"}, Argv: []string{"true"}}
	var owner, remote time.Duration
	var nOwner, nRemote int
	b.ResetTimer()
	for b.Loop() {
		before := f.Forwarded(b)
		start := time.Now()
		res, err := f.Client.Exec(ctx, req, nil)
		d := time.Since(start)
		if err != nil || res.Succeeded != 1 {
			b.Fatalf("exec: %+v, %v", res, err)
		}
		if f.Forwarded(b) > before {
			remote += d
			nRemote++
		} else {
			owner += d
			nOwner++
		}
	}
	if nOwner == 0 || nRemote == 0 {
		b.Logf("only one path taken (%d owner, %d remote); run with a higher -benchtime", nOwner, nRemote)
		return
	}
	o, r := float64(owner)/float64(nOwner), float64(remote)/float64(nRemote)
	b.ReportMetric(o, "ns/owner")
	b.ReportMetric(r, "ns/remote")
	b.ReportMetric(r/o, "remote/owner")
}
