package panics_test

import (
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/internal/panics"
)

func TestRecoverContainsAndCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := panics.New(reg, nil, "agent")
	other := panics.New(reg, nil, "coordinator") // same registry: reused, not refused

	var got *panics.Error
	func() {
		defer g.Recover("exec stream", func(e *panics.Error) { got = e })
		var s []string
		_ = s[1] // index out of range
	}()
	if got == nil {
		t.Fatal("report was not called")
	}
	if got.Where != "exec stream" || !strings.Contains(string(got.Stack), "panics_test") {
		t.Errorf("Error = %q, stack %d bytes; want where and the test's frame", got.Error(), len(got.Stack))
	}
	var re runtime.Error
	if !errors.As(got, &re) {
		t.Errorf("errors.As(runtime.Error) failed for %v", got)
	}
	func() {
		defer other.Recover("request", nil)
		panic("boom")
	}()
	const want = `
# HELP tether_panics_total Panics contained in a per-connection, per-stream or per-request goroutine, by component. Each one failed one caller with an internal error; the daemon kept serving.
# TYPE tether_panics_total counter
tether_panics_total{component="agent"} 1
tether_panics_total{component="coordinator"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), panics.MetricName); err != nil {
		t.Error(err)
	}
}

func TestRecoverWithoutPanicDoesNothing(t *testing.T) {
	g := panics.New(nil, nil, "agent")
	called := false
	func() {
		defer g.Recover("x", func(*panics.Error) { called = true })
	}()
	if called {
		t.Error("report called without a panic")
	}
}

func TestGo(t *testing.T) {
	g := panics.New(nil, nil, "agent")
	done := make(chan *panics.Error, 1)
	g.Go("job", func(e *panics.Error) { done <- e }, func() { panic(errors.New("bad")) })
	if e := <-done; e.Unwrap() == nil || e.Unwrap().Error() != "bad" {
		t.Errorf("Unwrap = %v, want bad", e.Unwrap())
	}
}

func TestRecoverPassesErrAbortHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := panics.New(reg, nil, "facade_opensandbox")
	var got any
	func() {
		defer func() { got = recover() }()
		defer g.Recover("request", func(*panics.Error) { t.Error("report called for http.ErrAbortHandler") })
		panic(http.ErrAbortHandler)
	}()
	if got != http.ErrAbortHandler {
		t.Fatalf("recovered %v, want http.ErrAbortHandler re-raised", got)
	}
	const want = `
# HELP tether_panics_total Panics contained in a per-connection, per-stream or per-request goroutine, by component. Each one failed one caller with an internal error; the daemon kept serving.
# TYPE tether_panics_total counter
tether_panics_total{component="facade_opensandbox"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), panics.MetricName); err != nil {
		t.Error(err)
	}
}
