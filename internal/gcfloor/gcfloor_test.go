package gcfloor

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live  uint64
		floor int64
		want  int
	}{
		{0, 64 * mib, 100},         // no reading yet
		{8 * mib, 0, 100},          // floor off
		{64 * mib, 64 * mib, 100},  // GOGC=100 already spaces cycles a floor apart
		{512 * mib, 64 * mib, 100}, // large heap: untouched
		{8 * mib, 64 * mib, 800},   // the bench's agent
		{7 * mib, 64 * mib, 920},   // 914.3 → next 10
		{1, 64 * mib, maxPercent},  // capped
		{40 * mib, 64 * mib, 160},  // just above 100
		{63 * mib, 64 * mib, 110},  // rounds up, never below the floor
	} {
		got := Percent(c.live, c.floor)
		if got != c.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", c.live, c.floor, got, c.want)
		}
		if got < maxPercent && c.live > 0 && c.floor > 0 && c.live*uint64(got)/100 < uint64(c.floor) && uint64(c.floor) > c.live {
			t.Errorf("Percent(%d, %d) = %d leaves the goal below the floor", c.live, c.floor, got)
		}
	}
}

// currentPercent reads the GC percent without changing it for long.
func currentPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestStartRaisesAndRestores(t *testing.T) {
	t.Setenv("GOGC", "") // registers the restore; then unset for Start
	unsetGOGC(t)
	defer debug.SetGCPercent(100)
	ctx, cancel := context.WithCancel(context.Background())
	Start(ctx, 1<<40) // a floor far above this test binary's live heap
	deadline := time.Now().Add(10 * time.Second)
	for currentPercent() == 100 {
		if time.Now().After(deadline) {
			t.Fatal("Start did not raise GOGC for a live heap far below the floor")
		}
		runtime.GC() // the live heap is known once a cycle ran
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	for currentPercent() != 100 {
		if time.Now().After(deadline) {
			t.Fatal("GOGC not restored to 100 after ctx ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStartLeavesAnOperatorsGOGC(t *testing.T) {
	t.Setenv("GOGC", "150")
	defer debug.SetGCPercent(100)
	debug.SetGCPercent(150)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	Start(ctx, 1<<40)
	time.Sleep(2 * Interval)
	if p := currentPercent(); p != 150 {
		t.Fatalf("GOGC set by the operator was changed to %d", p)
	}
}

func unsetGOGC(t *testing.T) {
	t.Helper()
	if err := os.Unsetenv("GOGC"); err != nil {
		t.Fatal(err)
	}
}
