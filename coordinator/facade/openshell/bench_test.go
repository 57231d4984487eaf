package openshell_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	osh "github.com/tetherfleet/tether/protocol/openshell"
)

// benchEnv is a facade with one fake gateway holding one sandbox, a client
// of the facade and a client of the gateway itself.
func benchEnv(b *testing.B) (facadeCC, directCC *grpc.ClientConn, req *osh.GetSandboxRequest) {
	e := newEnv(b, envConfig{})
	if _, err := e.create(testCtx(b), &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-bench"}); err != nil {
		b.Fatal(err)
	}
	e.fleet.mu.Lock()
	addr := e.fleet.addrs["node-a"]
	e.fleet.mu.Unlock()
	return e.cc, dialFacade(b, addr), &osh.GetSandboxRequest{Name: "ng-bench"}
}

// getOnce times one GetSandbox.
func getOnce(b *testing.B, ctx context.Context, cc *grpc.ClientConn, req *osh.GetSandboxRequest) time.Duration {
	start := time.Now()
	if _, err := unary[osh.SandboxResponse](ctx, cc, osh.MethodGetSandbox, req); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// percentile returns the p-th percentile (0..1) of ds (sorted in place).
func percentile(ds []time.Duration, p float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

func benchUnary(b *testing.B, facade bool) {
	fcc, dcc, req := benchEnv(b)
	cc := dcc
	if facade {
		cc = fcc
	}
	ctx := testCtx(b)
	getOnce(b, ctx, cc, req) // warm the connections
	ds := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		ds = append(ds, getOnce(b, ctx, cc, req))
	}
	b.ReportMetric(float64(percentile(ds, .5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(ds, .99).Microseconds()), "p99-µs")
}

// BenchmarkUnaryFacade: GetSandbox through the facade (client → facade →
// gateway over loopback TCP, the dial standing in for the tunnel).
func BenchmarkUnaryFacade(b *testing.B) { benchUnary(b, true) }

// BenchmarkUnaryDirect: GetSandbox straight to the same fake gateway.
func BenchmarkUnaryDirect(b *testing.B) { benchUnary(b, false) }

// BenchmarkUnaryOverhead alternates the two paths call by call, so both see
// the same machine load, and reports the difference of their medians
// (target: under 500 µs).
func BenchmarkUnaryOverhead(b *testing.B) {
	fcc, dcc, req := benchEnv(b)
	ctx := testCtx(b)
	getOnce(b, ctx, fcc, req)
	getOnce(b, ctx, dcc, req)
	var fs, ds []time.Duration
	b.ResetTimer()
	for b.Loop() {
		fs = append(fs, getOnce(b, ctx, fcc, req))
		ds = append(ds, getOnce(b, ctx, dcc, req))
	}
	pf, pd := percentile(fs, .5), percentile(ds, .5)
	b.ReportMetric(float64(pf.Microseconds()), "facade-p50-µs")
	b.ReportMetric(float64(pd.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64((pf - pd).Microseconds()), "overhead-p50-µs")
	b.ReportMetric(float64(pf)/float64(pd), "ratio-p50")
}
