package mirror

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

// manySmall builds a tree of many small files (and a few at and past the
// small-file limit) with varied modes, in several directories.
func manySmall(t *testing.T, root string, n int) spec {
	t.Helper()
	sp := spec{"sub/empty-dir/": ""}
	for i := range n {
		p := fmt.Sprintf("d%02d/f%04d", i%7, i)
		sp[p] = strings.Repeat(string(rune('a'+i%26)), i%300)
	}
	sp["d00/at-limit"] = strings.Repeat("L", smallFile)
	sp["d00/past-limit"] = strings.Repeat("P", smallFile+1)
	sp["sub/link"] = "-> ../d00/f0000"
	build(t, root, sp)
	fatalIf(t, os.Chmod(filepath.Join(root, "d01/f0001"), 0o444))
	fatalIf(t, os.Chmod(filepath.Join(root, "d02/f0002"), 0o4755))
	fatalIf(t, os.Chmod(filepath.Join(root, "d03"), 0o555))
	for _, p := range []string{"d01/f0001", "d02/f0002", "d03", "."} {
		fatalIf(t, os.Chtimes(filepath.Join(root, p), testTime, testTime))
	}
	return sp
}

func TestManySmallFiles(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	manySmall(t, src, 3000)
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"d00/f0000": "old", "gone": "x"})
	res, _ := mustCopy(t, src, dst, Options{Delete: true})
	copyEqual(t, src, dst)
	noStage(t, filepath.Dir(dst))
	if res.FilesWritten != 3002 || res.Deleted != 1 {
		t.Errorf("result %+v: want 3002 files written, 1 deleted", res)
	}
	// Again, unchanged: nothing travels.
	res, _ = mustCopy(t, src, dst, Options{Delete: true})
	copyEqual(t, src, dst)
	if res.FilesWritten != 0 || res.FilesKept != 3002 {
		t.Errorf("second copy %+v: want everything kept", res)
	}
}

// TestSmallFileFailureMidway fails one small file, on either end, after
// many were handed to the workers: the copy fails on both ends, the
// destination is unchanged and no stage remains.
func TestSmallFileFailureMidway(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	manySmall(t, src, 2000)
	for _, op := range []string{"write", "read"} {
		t.Run(op, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			build(t, dst, spec{"d00/f0000": "old", "keep": "k", "link": "-> keep"})
			before := digest(t, dst)
			var seen atomic.Int32
			injected := errors.New("injected failure")
			smallIOHook = func(o, rel string) error {
				if o == op && seen.Add(1) == 1000 {
					return injected
				}
				return nil
			}
			t.Cleanup(func() { smallIOHook = nil })
			s, r, _ := runCopy(t, src, dst, Options{Delete: true})
			smallIOHook = nil
			if s.err == nil || r.err == nil {
				t.Fatalf("send err %v, receive err %v; want both to fail", s.err, r.err)
			}
			if !strings.Contains(s.err.Error(), injected.Error()) || !strings.Contains(r.err.Error(), injected.Error()) {
				t.Errorf("send err %v, receive err %v; want the injected failure in both", s.err, r.err)
			}
			if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
				t.Errorf("failed copy changed the destination:\n%s", diff)
			}
			noStage(t, filepath.Dir(dst))
		})
	}
}

// TestSmallFileBadChecksumAfterMany sends many small files and then one
// with a wrong checksum: the files already queued to the writers must not
// reach the destination.
func TestSmallFileBadChecksumAfterMany(t *testing.T) {
	l := newEvilLayout(t)
	beforeTop, beforeDst := digest(t, l.top), digest(t, l.dst)
	frames := []frame{rootDirF(), entryF(protocol.CopyEntry{Path: "d", Type: "dir", Mode: 0o755})}
	for i := range 500 {
		frames = append(frames, fileFrames(fmt.Sprintf("d/f%03d", i), strings.Repeat("x", i))...)
	}
	frames = append(frames,
		entryF(protocol.CopyEntry{Path: "d/bad", Type: "file", Mode: 0o644, Size: 3}), dataF("abc"), endF("abd"),
		copyEndF(503, 0))
	r := evilSend(t, l.dst, frames)
	var ve *violation
	if !errors.As(r.err, &ve) {
		t.Errorf("receive: %v, want a protocol violation", r.err)
	}
	l.check(t, beforeTop, beforeDst)
}
