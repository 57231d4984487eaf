package fleettest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkExecAuthorized is BenchmarkExecRoundTrip with one agent, with
// and without authorization in the same run (the target: at most
// 1.05× today's). Both identify the caller from what the NATS server
// stamped; "on" also decides exec by a policy with a role, a selector rule
// and limits. The ratio is on/off of ns/op.
//
// Run: go test -run '^$' -bench ExecAuthorized -benchtime 2000x ./fleettest
func BenchmarkExecAuthorized(b *testing.B) {
	const pol = `version: 1
roles:
  runner:
    - nodes: "index in (0,1,2)"
      operations: [exec]
      run_as: root
identities:
  nats:fleettest:
    roles: [runner]
    limits:
      requests_per_second: 1000000
      burst: 1000000
`
	path := filepath.Join(b.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(pol), 0o600); err != nil {
		b.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, on := range []bool{false, true} {
		name := "authz=off"
		if on {
			name = "authz=on"
		}
		b.Run(name, func(b *testing.B) {
			f := fleettest.Start(b, fleettest.Options{Coordinator: func(c *coordinator.Config) {
				if on {
					c.Policy = store
				}
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
			reportPercentiles(b, lat)
		})
	}
}
