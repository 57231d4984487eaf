package agent

import (
	"fmt"
	"os"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkExecAttached: one attached exec of true, start to exit frame.
func BenchmarkExecAttached(b *testing.B) {
	h := newHarness(b, nil)
	for b.Loop() {
		e := h.open(b, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}})
		e.finish(b)
		if e.exit == nil {
			b.Fatal(e.errInfo)
		}
	}
}

// BenchmarkDetachedStart: one detached job of true, start to its exit
// recorded.
func BenchmarkDetachedStart(b *testing.B) {
	h := newHarness(b, nil)
	b.Cleanup(h.a.jobs.wg.Wait)
	i := 0
	for b.Loop() {
		i++
		id := fmt.Sprintf("b%d", i)
		e := h.open(b, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}, Detach: true, JobID: id})
		e.finish(b)
		if e.exit == nil || !e.exit.Detached {
			b.Fatal(e.errInfo)
		}
	}
}

// BenchmarkRecordGroup: what recording an attached exec's process group
// (and removing the record) adds to each exec.
func BenchmarkRecordGroup(b *testing.B) {
	h := newHarness(b, nil)
	pid := os.Getpid()
	for b.Loop() {
		h.a.recordGroup(pid)()
	}
}
