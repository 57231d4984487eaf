package coordinator

import (
	"testing"
	"time"
)

// TestEndBatchLinger: end records wait endLinger for company while the
// accept writes are quick, and go at once while they are slow (a store
// syncing each write to disk), the average following the writes.
func TestEndBatchLinger(t *testing.T) {
	var b endBatch
	if got := b.linger(); got != endLinger {
		t.Errorf("no write seen: linger %v, want %v", got, endLinger)
	}
	for range 4 {
		b.observeWrite(150 * time.Microsecond)
	}
	if got := b.linger(); got != endLinger {
		t.Errorf("writes of 150µs: linger %v, want %v", got, endLinger)
	}
	for range 32 {
		b.observeWrite(3 * time.Millisecond)
	}
	if got := b.linger(); got != 0 {
		t.Errorf("writes of 3ms: linger %v, want none", got)
	}
	for range 32 {
		b.observeWrite(100 * time.Microsecond)
	}
	if got := b.linger(); got != endLinger {
		t.Errorf("quick writes again: linger %v, want %v", got, endLinger)
	}
}
