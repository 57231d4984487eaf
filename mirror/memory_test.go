package mirror

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// peakHeap samples the process's in-use heap until stop is called and
// returns the peak.
func peakHeap() (stop func() uint64) {
	runtime.GC()
	var peak uint64
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak
	}
}

// testBoundedMemory copies a sparse file of size bytes and checks that the
// heap of the whole process (sender and receiver) stays under 32 MiB.
func testBoundedMemory(t *testing.T, size int64) {
	src := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(src)
	fatalIf(t, err)
	fatalIf(t, f.Truncate(size))
	f.Close()
	dst := filepath.Join(t.TempDir(), "big")
	stop := peakHeap()
	start := time.Now()
	res, _ := mustCopy(t, src, dst, Options{})
	peak := stop()
	el := time.Since(start)
	if res.BytesWritten != size {
		t.Fatalf("wrote %d bytes, want %d", res.BytesWritten, size)
	}
	fi, err := os.Stat(dst)
	fatalIf(t, err)
	if fi.Size() != size {
		t.Fatalf("destination has %d bytes, want %d", fi.Size(), size)
	}
	t.Logf("%d MiB in %v (%.0f MB/s), peak heap in use %.1f MiB", size>>20, el, float64(size)/el.Seconds()/1e6, float64(peak)/(1<<20))
	if peak > 32<<20 {
		t.Errorf("peak heap in use %.1f MiB, want under 32 MiB", float64(peak)/(1<<20))
	}
}

func TestBoundedMemory64MiB(t *testing.T) { testBoundedMemory(t, 64<<20) }

// TestBoundedMemory1GiB is the figure; it writes 1 GiB, so it runs
// only with TETHER_TEST_1GIB=1 (the benchmarks cover it too).
func TestBoundedMemory1GiB(t *testing.T) {
	if os.Getenv("TETHER_TEST_1GIB") == "" {
		t.Skip("set TETHER_TEST_1GIB=1 to copy 1 GiB")
	}
	testBoundedMemory(t, 1<<30)
}
