package fleettest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkFanOut runs `true` (argv, no shell) on 1,000 simulated agents
// (real agents with real tunnels, in 4 child processes, each agent forking a
// real process) through NATS and the coordinator, and reports the wall time
// of one whole fan-out. The baseline, measured in the same run, forks the
// same 1,000 processes from 4 processes with the same total parallelism:
// the floor that fork/exec alone sets on this machine (a Go process forks
// one child at a time, so one process could not reach it). x-floor is
// tether's wall time over the baseline's.
func BenchmarkFanOut(b *testing.B) {
	if testing.Short() {
		b.Skip("starts 1000 agents")
	}
	const agents, procs = 1000, 4
	for _, parallel := range []int{64, 256} {
		b.Run(fmt.Sprintf("agents=%d/max-parallel=%d", agents, parallel), func(b *testing.B) {
			floor := forkFloor(b, agents, parallel, procs)
			f := fleettest.Start(b, fleettest.Options{Agents: agents, Processes: procs})
			ctx := context.Background()
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				res, err := f.Client.Exec(ctx, &protocol.ExecRequest{
					Target: protocol.Target{All: true}, Argv: []string{"true"}, MaxParallel: parallel,
				}, nil)
				total += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if res.Nodes != agents || res.Failed != 0 {
					b.Fatalf("result: %d nodes, %d failed", res.Nodes, res.Failed)
				}
			}
			b.StopTimer()
			wall := total / time.Duration(b.N)
			b.ReportMetric(wall.Seconds(), "wall-s")
			b.ReportMetric(floor.Seconds(), "floor-s")
			b.ReportMetric(wall.Seconds()/floor.Seconds(), "x-floor")
		})
	}
}

// forkFloor forks n `true` processes from procs child processes, at most
// parallel at once in all, and returns the wall time.
func forkFloor(b *testing.B, n, parallel, procs int) time.Duration {
	cmds := make([]*exec.Cmd, procs)
	for k := range cmds {
		cmds[k] = exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
		cmds[k].Env = append(os.Environ(), "TETHER_FLEETTEST_CHILD=forks",
			fmt.Sprintf("TETHER_FLEETTEST_FORKS=%d|%d", (k+1)*n/procs-k*n/procs, max(1, parallel/procs)))
		cmds[k].Stderr = os.Stderr
	}
	start := time.Now()
	for _, c := range cmds {
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// childForks forks TETHER_FLEETTEST_FORKS="count|parallel" `true`
// processes and exits.
func childForks() {
	var n, parallel int
	fmt.Sscanf(os.Getenv("TETHER_FLEETTEST_FORKS"), "%d|%d", &n, &parallel)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := exec.Command("true").Run(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}()
	}
	wg.Wait()
}
