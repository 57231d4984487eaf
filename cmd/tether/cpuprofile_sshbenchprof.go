//go:build sshbenchprof

package main

// A profiling harness for the SSH benchmarks, compiled only with
// -tags sshbenchprof (never into a release build, and it opens no
// listener): with TETHER_CPUPROFILE_DIR set, a tether process writes a
// pprof CPU profile of TETHER_CPUPROFILE_SECONDS (default 3) seconds into
// DIR/COMMAND-PID-N.cpu (COMMAND is the first argument: coordinator, agent,
// ssh-proxy, ...). tether ssh-proxy, which lives for one connection,
// starts its profile at once; every other command starts one each time it
// receives SIGUSR1, so that a long-running coordinator or agent is profiled
// during the transfer only. A process that exits before its seconds are up
// leaves an empty file (give ssh-proxy a transfer that outlasts them):
//
//	go build -tags sshbenchprof -o /tmp/tether-prof ./cmd/tether
//	TETHER_CPUPROFILE_DIR=/tmp/prof make bench-ssh ...   # then kill -USR1 PID
//	go tool pprof -top /tmp/tether-prof /tmp/prof/agent-PID-1.cpu

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"time"
)

func init() {
	dir := os.Getenv("TETHER_CPUPROFILE_DIR")
	if dir == "" || len(os.Args) < 2 {
		return
	}
	secs, err := strconv.ParseFloat(os.Getenv("TETHER_CPUPROFILE_SECONDS"), 64)
	if err != nil || secs <= 0 {
		secs = 3
	}
	var mu sync.Mutex
	n, busy := 0, false
	start := func() {
		mu.Lock()
		defer mu.Unlock()
		if busy {
			return
		}
		n++
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d-%d.cpu", filepath.Base(os.Args[1]), os.Getpid(), n)))
		if err != nil {
			fmt.Fprintf(os.Stderr, "tether: cpu profile: %v\n", err)
			return
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "tether: cpu profile: %v\n", err)
			f.Close()
			return
		}
		busy = true
		time.AfterFunc(time.Duration(secs*float64(time.Second)), func() {
			pprof.StopCPUProfile()
			f.Close()
			mu.Lock()
			busy = false
			mu.Unlock()
		})
	}
	if os.Args[1] == "ssh-proxy" {
		start()
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		for range sig {
			start()
		}
	}()
}
