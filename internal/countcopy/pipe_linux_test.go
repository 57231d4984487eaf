package countcopy

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func pipeSize(t *testing.T, f *os.File) int {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := -1
	rc.Control(func(fd uintptr) { n, _ = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) })
	return n
}

// GrowPipe grows a pipe (either end) to the size asked, never shrinks one,
// and leaves other files alone.
func TestGrowPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if n := pipeSize(t, r); n >= BulkPipe {
		t.Skipf("pipes start at %d bytes here", n)
	}
	GrowPipe(w, BulkPipe)
	if n := pipeSize(t, r); n < BulkPipe {
		t.Fatalf("after GrowPipe the pipe holds %d bytes, want %d", n, BulkPipe)
	}
	GrowPipe(r, 64<<10)
	if n := pipeSize(t, r); n < BulkPipe {
		t.Fatalf("GrowPipe to 64 KiB shrank the pipe to %d bytes", n)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "plain"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	GrowPipe(f, BulkPipe) // no panic, no effect
	GrowPipe(nil, BulkPipe)
}
