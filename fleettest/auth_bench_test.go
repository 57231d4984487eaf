package fleettest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// benchPolicy is a policy of the size a team would write: a few roles and
// identities, the fleettest client user granted exec through a role, so
// Decide walks entries and rules as it would in production. run_as is the
// agent's own account (root in these tests), as every exec ran before
// policy named a user.
const benchPolicy = `version: 1
roles:
  operator:
    - nodes: "env=prod"
      operations: [exec, shell]
      run_as: deploy
    - nodes: "*"
      operations: [job.status, job.logs, job.cancel, nodes.list]
  submitter:
    - nodes: "index"
      operations: [exec]
      run_as: root
    - nodes: "*"
      operations: [job.status, job.logs, nodes.list]
identities:
  nats:alice:
    roles: [operator]
  nats:bob:
    roles: [submitter]
    limits:
      max_concurrent_jobs: 8
  nats:fleettest:             # a CI system: limits raised, still counted
    roles: [submitter]
    limits:
      requests_per_second: 100000
      burst: 100000
  nats-account:CLIENTS:
    rules:
      - nodes: "*"
        operations: [nodes.list]
`

// BenchmarkExecAuth is issue 9's authorization target: the exec round trip
// of BenchmarkExecRoundTrip (/bin/true as argv on one node, in-process
// client) with authorization on (operator-mode NATS: the request crosses
// the CLIENTS→TETHER service import and is stamped, the coordinator
// verifies the caller's JWT, asks the policy, counts the request against
// the caller's limits) against the same fleet with none (an open NATS
// server, callers unidentified, no policy: how every coordinator ran
// before issue 9). The fleets run side by side and the requests
// alternate, one on each per iteration, so load on a shared machine falls
// on all alike. It reports each side's p50 and p99, the ratio of the p50s
// over the whole run, and the median over 10 blocks of the per-block p50
// ratio (target: at most 1.05); authn/off-p50 is a third fleet that
// identifies callers but has no policy, splitting the cost between NATS
// (the service import and its stamped header) and policy.
//
// Run: go test -run '^$' -bench ExecAuth -benchtime 2000x ./fleettest
func BenchmarkExecAuth(b *testing.B) {
	path := filepath.Join(b.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(benchPolicy), 0o600); err != nil {
		b.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	off := fleettest.Start(b, fleettest.Options{Anonymous: true})
	on := fleettest.Start(b, fleettest.Options{Coordinator: func(c *coordinator.Config) { c.Policy = store }})
	// Identification without a policy: what the NATS side (the import,
	// the stamped header, Identify) costs on its own.
	authn := fleettest.Start(b, fleettest.Options{})
	latAuthn := make([]time.Duration, 0, b.N)
	ctx := context.Background()
	exec := func(f *fleettest.Fleet) time.Duration {
		r := protocol.ExecRequest{Target: protocol.Target{Node: "node-0"}, Argv: []string{"/bin/true"}}
		t0 := time.Now()
		res, err := f.Client.Exec(ctx, &r, nil)
		d := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Results) != 1 || !res.Results[0].OK() {
			b.Fatalf("result %+v", res.Results)
		}
		return d
	}
	exec(off) // warm all: connections, first-use caches
	exec(on)
	exec(authn)
	latOff := make([]time.Duration, 0, b.N)
	latOn := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		latAuthn = append(latAuthn, exec(authn))
		if i%2 == 0 { // alternate which goes first
			latOff = append(latOff, exec(off))
			latOn = append(latOn, exec(on))
		} else {
			latOn = append(latOn, exec(on))
			latOff = append(latOff, exec(off))
		}
	}
	b.StopTimer()
	p50 := func(l []time.Duration) time.Duration {
		s := slices.Clone(l)
		slices.Sort(s)
		return s[(len(s)-1)/2]
	}
	p99 := func(l []time.Duration) time.Duration {
		s := slices.Clone(l)
		slices.Sort(s)
		return s[int(0.99*float64(len(s)-1))]
	}
	b.ReportMetric(float64(p50(latOff).Microseconds()), "off-p50-µs")
	b.ReportMetric(float64(p50(latOn).Microseconds()), "on-p50-µs")
	b.ReportMetric(float64(p99(latOff).Microseconds()), "off-p99-µs")
	b.ReportMetric(float64(p99(latOn).Microseconds()), "on-p99-µs")
	b.ReportMetric(float64(p50(latOn))/float64(p50(latOff)), "on/off-p50")
	b.ReportMetric(float64(p50(latAuthn))/float64(p50(latOff)), "authn/off-p50")
	const blocks = 10
	if b.N >= 10*blocks {
		var ratios []float64
		n := b.N / blocks
		for k := 0; k < blocks; k++ {
			ratios = append(ratios, float64(p50(latOn[k*n:(k+1)*n]))/float64(p50(latOff[k*n:(k+1)*n])))
		}
		slices.Sort(ratios)
		b.ReportMetric((ratios[blocks/2-1]+ratios[blocks/2])/2, "on/off-p50-block-median")
		b.Logf("per-block p50 ratios (sorted): %v", fmt.Sprint(ratios))
	}
}
