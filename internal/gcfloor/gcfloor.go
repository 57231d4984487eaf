// Package gcfloor gives a long-running Tether process a heap floor: the Go
// collector's next cycle starts no sooner than Floor bytes of new allocation
// after the last one, however small the live heap is.
//
// Why: Go starts a cycle once the heap grows by GOGC% of the live heap, with
// a floor of 4 MiB. The coordinator and the agent move bulk data through
// golang.org/x/crypto/ssh, which allocates a fresh copy of every packet it
// reads (32 KiB for OpenSSH's bulk packets), so with a live heap of about
// 8 MiB the collector ran a cycle every 8 MiB moved: about 130 cycles per GiB,
// 10 to 15% of the process's CPU in `make bench-ssh` (and much of the rest of
// the allocation is garbage within one packet's time). Raising the floor cuts
// the cycles in proportion; it costs at most Floor bytes of heap that a
// smaller floor would have reclaimed sooner, and nothing for a process that
// allocates little.
//
// The floor only ever raises the collector's goal: a live heap large enough
// that GOGC already spaces cycles Floor apart is left alone, and a memory
// limit (GOMEMLIMIT) still caps the heap. An operator who sets GOGC has
// chosen: Start then does nothing.
package gcfloor

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Default is the floor the coordinator and the agent run with: 64 MiB, so
// that a bulk SSH transfer with an 8 MiB live heap runs one cycle per 72 MiB
// moved instead of per 16 MiB.
const Default = 64 << 20

// Interval is how often Start re-reads the live heap. The live heap of a
// coordinator or an agent changes over seconds, not within one.
const Interval = time.Second

// maxPercent bounds the GOGC Start sets: a tiny live heap early in a
// process's life must not make one cycle's goal unbounded (the floor is still
// met: Floor is far below maxPercent% of any live heap the runtime reports).
const maxPercent = 100_000

const liveMetric = "/gc/heap/live:bytes"

// Start keeps the collector's goal at least floor bytes above the live heap
// until ctx ends, re-reading the live heap every Interval. It returns at once;
// the work runs in one goroutine. The live heap is known once the first cycle
// ran; until then Go's own 4 MiB floor applies. If the GOGC environment variable is set (to
// a number or "off"), or floor is not positive, it does nothing.
func Start(ctx context.Context, floor int64) {
	if _, set := os.LookupEnv("GOGC"); set || floor <= 0 {
		return
	}
	go func() {
		t := time.NewTicker(Interval)
		defer t.Stop()
		sample := []metrics.Sample{{Name: liveMetric}}
		applied := 100
		for {
			metrics.Read(sample)
			if sample[0].Value.Kind() == metrics.KindUint64 {
				if p := Percent(sample[0].Value.Uint64(), floor); p != applied {
					debug.SetGCPercent(p)
					applied = p
				}
			}
			select {
			case <-ctx.Done():
				debug.SetGCPercent(100)
				return
			case <-t.C:
			}
		}
	}()
}

// Percent is the GOGC that puts the collector's goal at least floor bytes
// above a live heap of live bytes: Go's default, 100, when that already
// holds, else floor as a percentage of live, rounded up to the next 10% so
// that a drifting live heap does not change it every second.
func Percent(live uint64, floor int64) int {
	if live == 0 || floor <= 0 || live >= uint64(floor) {
		return 100
	}
	p := (uint64(floor)*100 + live - 1) / live
	p = (p + 9) / 10 * 10
	if p > maxPercent {
		return maxPercent
	}
	return int(p)
}
