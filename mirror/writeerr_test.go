package mirror

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWriteErrorNamesDestination fails the write of a file's copy with
// ENOSPC (a full disk, injected), streamed and small: the error names the
// path the file was being copied to, not its temporary name in the stage
// (fresh17 item 8: `entry "big": write: write 1: no space left on
// device`), says that the destination is unchanged, and is what the sender
// is told.
func TestWriteErrorNamesDestination(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		size       int
	}{
		{"streamed", "big", smallFile + 1},
		{"small", "small", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "src")
			build(t, src, spec{tc.file: strings.Repeat("x", tc.size)})
			dst := filepath.Join(t.TempDir(), "dst")
			build(t, dst, spec{"keep": "k"})
			before := digest(t, dst)
			full := func(rel string) error {
				if rel == tc.file {
					return unix.ENOSPC
				}
				return nil
			}
			dataWriteHook = full
			smallIOHook = func(op, rel string) error {
				if op == "write" {
					return full(rel)
				}
				return nil
			}
			t.Cleanup(func() { dataWriteHook, smallIOHook = nil, nil })
			s, r, _ := runCopy(t, src, dst, Options{})
			want := dst + "/" + tc.file + ": no space left on device (the destination is unchanged)"
			var we *WriteError
			if !errors.As(r.err, &we) || we.Path != dst+"/"+tc.file || !errors.Is(r.err, unix.ENOSPC) || !strings.HasSuffix(r.err.Error(), ": "+want) {
				t.Errorf("receive: %v; want a *WriteError for %s/%s ending %q", r.err, dst, tc.file, want)
			}
			var pe *PeerError
			if !errors.As(s.err, &pe) || pe.Info.Message != want {
				t.Errorf("send: %v; want the peer's message %q", s.err, want)
			}
			if got := digest(t, dst); len(got) != len(before) {
				t.Errorf("the failed copy changed the destination: %v", got)
			}
			noStage(t, filepath.Dir(dst))
		})
	}
}
