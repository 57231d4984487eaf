package policy

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// benchPolicy is a policy of n identities with two roles, shaped like a
// real fleet's: the caller's grant is in a role, after a rule that does not
// match.
func benchPolicy(b testing.TB, n int) *Policy {
	var s strings.Builder
	s.WriteString(`version: 1
roles:
  deployer:
    - nodes: "env in (staging,prod),!spot"
      operations: [exec, shell, job.status, job.logs, job.cancel]
      run_as: deploy
    - nodes: "env in (staging,prod)"
      operations: [cp.read, cp.write]
      paths: [/srv/app, /var/log/app, /data]
      run_as: deploy
  observer:
    - nodes: "*"
      operations: [nodes.list, job.status]
      scope: any
identities:
`)
	for i := range n {
		fmt.Fprintf(&s, "  nats:user%d:\n    roles: [observer, deployer]\n    rules:\n      - nodes: \"gpu\"\n        operations: [forward, exec]\n        targets: [openshell]\n        run_as: gpu\n", i)
	}
	s.WriteString("  nats-account:CLIENTS:\n    roles: [observer]\n")
	p, err := Parse("bench.yaml", []byte(s.String()))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkDecide measures one decision, as on every request: wall time,
// and the thread's CPU time (cpu-ns/op), which a busy machine does not
// inflate. An allowed decision does not allocate.
func BenchmarkDecide(b *testing.B) {
	p := benchPolicy(b, 1000)
	id := Identity{Kind: KindNATS, Name: "user500", Key: "UNOTINPOLICY", Account: "CLIENTS"}
	node := Node{ID: "node-a", Labels: map[string]string{"env": "prod", "zone": "eu-1", "arch": "amd64", "kernel": "6.8"}}
	cases := []struct {
		name string
		op   Operation
		obj  Object
		ok   bool
	}{
		{"exec", OpExec, Object{}, true},
		{"cp.write", OpCopyWrite, Object{Path: "/data/run-42/checkpoints/step-1000.pt"}, true},
		{"job.status-own", OpJobStatus, Object{Owner: "nats:user500"}, true},
		{"job.cancel-other", OpJobCancel, Object{Owner: "nats:user7"}, false},
		{"shell", OpShell, Object{}, true},
		{"admin-refused", OpAdmin, Object{}, false},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			if _, err := p.Decide(id, c.op, node, c.obj); (err == nil) != c.ok {
				b.Fatalf("decision: %v, want allowed %v", err, c.ok)
			}
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				p.Decide(id, c.op, node, c.obj)
			}
			cpu.report(b)
		})
	}
}

// BenchmarkStoreDecideParallel is Store.Decide from many goroutines: the
// atomic load and the policy are shared, read-only.
func BenchmarkStoreDecideParallel(b *testing.B) {
	s := &Store{limiter: NewLimiter(nil)}
	s.cur.Store(benchPolicy(b, 1000))
	id := Identity{Kind: KindNATS, Name: "user500", Account: "CLIENTS"}
	node := Node{ID: "node-a", Labels: map[string]string{"env": "prod"}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.Decide(id, OpExec, node, Object{})
		}
	})
}

// BenchmarkLimiterAllow is one rate-limit check, as on every request.
func BenchmarkLimiterAllow(b *testing.B) {
	l := NewLimiter(nil)
	id := Identity{Kind: KindNATS, Name: "alice"}
	lim := Limits{MaxConcurrentJobs: 1, RequestsPerSecond: 1e6, Burst: 1 << 20}
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		l.Allow(id, OpExec, lim)
	}
	cpu.report(b)
}

func BenchmarkParse(b *testing.B) {
	var s strings.Builder
	p := benchPolicy(b, 1000)
	s.Write(p.Marshal())
	data := []byte(s.String())
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("bench.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBaselineSelector is one match of the deployer role's selector
// alone: the floor under a Decide of exec, to report Decide as a ratio to
// in the same run on a busy machine.
func BenchmarkBaselineSelector(b *testing.B) {
	sel, err := protocol.ParseSelector("env in (staging,prod),!spot")
	if err != nil {
		b.Fatal(err)
	}
	labels := map[string]string{"env": "prod", "zone": "eu-1", "arch": "amd64", "kernel": "6.8"}
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		if !sel.Matches(labels) {
			b.Fatal("no match")
		}
	}
	cpu.report(b)
}

// cpuClock measures a benchmark loop's thread CPU time (threadCPU); the
// benchmark goroutine is locked to its thread until report.
type cpuClock struct {
	start int64
	ok    bool
}

func startCPU() cpuClock {
	runtime.LockOSThread()
	t, ok := threadCPU()
	return cpuClock{t, ok}
}

// report adds cpu-ns/op to the benchmark's results.
func (c cpuClock) report(b *testing.B) {
	t, ok := threadCPU()
	runtime.UnlockOSThread()
	if c.ok && ok && b.N > 0 {
		b.ReportMetric(float64(t-c.start)/float64(b.N), "cpu-ns/op")
	}
}
