package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// panicsCount reads tether_panics_total{component} from reg.
func panicsCount(t *testing.T, reg *prometheus.Registry, component string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != panics.MetricName {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "component" && l.GetValue() == component {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A panic in one NATS handler (the nodes endpoint), in one node's run of a
// fan-out job, and in an endpoint Config.Endpoints added, each fail that
// request (or that node's result) with an internal error, while another
// exec job keeps streaming and completes with all of its output; the
// coordinator keeps serving and counts each panic once.
func TestPanicInNATSHandlerLeavesOtherJobs(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := fleettest.Start(t, fleettest.Options{
		Agents: 2,
		Coordinator: func(c *coordinator.Config) {
			c.Registerer = reg
			c.Endpoints = func(svc micro.Service) error {
				return svc.AddEndpoint("boom", micro.HandlerFunc(func(micro.Request) { panic("injected panic in an added endpoint") }),
					// A subject clients can reach (an exported one that
					// this fleet, without sandbox services, leaves free).
					micro.WithEndpointSubject(protocol.SubjectLeaseOpen))
			}
		},
	})
	coordinator.SetTestHook(f.Coordinator, func(point string) {
		if point == "nats nodes" || point == "exec node node-1" {
			panic("injected panic at " + point)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The bystander job streams, waits for the test, then streams more.
	release := filepath.Join(t.TempDir(), "release")
	var (
		mu      sync.Mutex
		out     strings.Builder
		started = make(chan struct{})
		once    sync.Once
	)
	type result struct {
		res *protocol.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := f.Client.ExecWith(ctx, &protocol.ExecRequest{
			Target: protocol.Target{Node: "node-0"},
			Script: "seq 1 5000\nwhile [ ! -e " + release + " ]; do sleep 0.02; done\nseq 5001 10000",
		}, client.ExecOptions{Output: func(_, stream string, data []byte) {
			mu.Lock()
			out.Write(data)
			mu.Unlock()
			once.Do(func() { close(started) })
		}})
		done <- result{res, err}
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the bystander job produced no output")
	}

	// A handler panics: its caller gets a 500 internal error.
	_, err := f.Client.Nodes(ctx, "")
	var ae *protocol.APIError
	if !errors.As(err, &ae) || ae.Status != 500 || ae.Code != protocol.ErrCodeInternal || !strings.Contains(ae.Message, "injected panic at nats nodes") {
		t.Fatalf("nodes with a panicking handler: %v, want a 500 internal error naming the panic", err)
	}
	if n := panicsCount(t, reg, "coordinator"); n != 1 {
		t.Errorf("tether_panics_total{component=coordinator} = %v after one panic, want 1", n)
	}

	// One node's run panics: that node's result is an internal error, the
	// other node's is its exit.
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"true"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Nodes != 2 || res.Succeeded != 1 || res.Results[1].Node != "node-1" || res.Results[1].ErrorCode != protocol.CodeInternal ||
		!strings.Contains(res.Results[1].Error, "injected panic at exec node node-1") {
		t.Fatalf("fan-out with a panicking node run: %+v", res)
	}

	// An endpoint added through Config.Endpoints is guarded too.
	msg, err := f.NC.RequestWithContext(ctx, protocol.SubjectLeaseOpen, nil)
	if err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "500" {
		t.Fatalf("added endpoint: %v, %+v; want a 500 micro error", err, msg)
	}
	if n := panicsCount(t, reg, "coordinator"); n != 3 {
		t.Errorf("tether_panics_total{component=coordinator} = %v after three panics, want 3", n)
	}

	// The bystander completes with every line.
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	var want strings.Builder
	for i := 1; i <= 10000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	mu.Lock()
	got := out.String()
	mu.Unlock()
	if !r.res.Results[0].OK() || got != want.String() {
		t.Fatalf("bystander: %+v, %d of %d output bytes", r.res.Results[0], len(got), want.Len())
	}

	// The coordinator still serves.
	coordinator.SetTestHook(f.Coordinator, nil)
	nodes, err := f.Client.Nodes(ctx, "")
	if err != nil || len(nodes) != 2 {
		t.Fatalf("nodes after the panics: %v, %v", nodes, err)
	}
}
