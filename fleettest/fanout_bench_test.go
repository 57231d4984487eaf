package fleettest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkFanOut runs `true` (argv, no shell) on 1,000 simulated agents
// (real agents with real tunnels, in 4 child processes, each agent forking a
// real process) through NATS and the coordinator, and reports the wall time
// of one whole fan-out. The baseline, measured in the same iterations (the
// order alternating), forks the same 1,000 processes from 4 processes with
// the same total parallelism: the floor that fork/exec alone sets on this
// machine (a Go process forks one child at a time, so one process could
// not reach it). x-floor is the median over iterations of tether's wall
// time over that iteration's floor (issue 12's target: <= 1.1); wall-s and
// floor-s are medians too.
//
// With TETHER_FANOUT_PROFILE=DIR set, DIR/coordinator.cpu profiles the test
// process (client, NATS server, coordinator) and DIR/agents-<i>.cpu each
// agent host, during the fan-outs only (not the fleet's start).
func BenchmarkFanOut(b *testing.B) {
	if testing.Short() {
		b.Skip("starts 1000 agents")
	}
	const agents, procs = 1000, 4
	profDir := os.Getenv("TETHER_FANOUT_PROFILE")
	if profDir != "" {
		os.Setenv(fleettest.AgentHostProfileEnv, filepath.Join(profDir, "agents"))
		defer os.Unsetenv(fleettest.AgentHostProfileEnv)
	}
	for _, parallel := range []int{64, 256} {
		b.Run(fmt.Sprintf("agents=%d/max-parallel=%d", agents, parallel), func(b *testing.B) {
			f := fleettest.Start(b, fleettest.Options{Agents: agents, Processes: procs})
			ctx := context.Background()
			fanOut := func() time.Duration {
				start := time.Now()
				res, err := f.Client.Exec(ctx, &protocol.ExecRequest{
					Target: protocol.Target{All: true}, Argv: []string{"true"}, MaxParallel: parallel,
				}, nil)
				d := time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if res.Nodes != agents || res.Failed != 0 {
					b.Fatalf("result: %d nodes, %d failed", res.Nodes, res.Failed)
				}
				return d
			}
			fanOut() // warm up: first streams, first replies
			if profDir != "" {
				pf, err := os.Create(filepath.Join(profDir, fmt.Sprintf("coordinator-%d.cpu", parallel)))
				if err != nil {
					b.Fatal(err)
				}
				if err := pprof.StartCPUProfile(pf); err != nil {
					b.Fatal(err)
				}
				f.ProfileAgentHosts(true)
				defer func() {
					f.ProfileAgentHosts(false)
					pprof.StopCPUProfile()
					pf.Close()
				}()
			}
			var walls, floors, ratios []float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var wall, floor time.Duration
				if i%2 == 0 {
					wall = fanOut()
					floor = forkFloor(b, agents, parallel, procs)
				} else {
					floor = forkFloor(b, agents, parallel, procs)
					wall = fanOut()
				}
				walls = append(walls, wall.Seconds())
				floors = append(floors, floor.Seconds())
				ratios = append(ratios, wall.Seconds()/floor.Seconds())
			}
			b.StopTimer()
			b.ReportMetric(median(walls), "wall-s")
			b.ReportMetric(median(floors), "floor-s")
			b.ReportMetric(median(ratios), "x-floor")
		})
	}
}

// median returns the median of xs (which it sorts), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
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
