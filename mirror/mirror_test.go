package mirror

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

// richTree has every kind of entry a copy keeps.
func richTree(t *testing.T, root string) {
	t.Helper()
	outside := t.TempDir()
	build(t, root, spec{
		"a.txt":           "alpha",
		"empty":           "",
		"bin/run.sh":      "#!/bin/sh\necho hi\n",
		"deep/x/y/z.txt":  "zzz",
		"emptydir/":       "",
		"ro/":             "",
		"ro/file":         "read only",
		"link-rel":        "-> a.txt",
		"link-dir":        "-> deep/x",
		"link-dangling":   "-> does/not/exist",
		"link-outside":    "-> " + outside,
		"deep/x/up":       "-> ../../a.txt",
		"name with space": "s",
	})
	fatalIf(t, os.Chmod(filepath.Join(root, "bin/run.sh"), 0o755|os.ModeSetuid))
	fatalIf(t, os.Chmod(filepath.Join(root, "empty"), 0o600))
	fatalIf(t, os.Chmod(filepath.Join(root, "ro/file"), 0o444))
	fatalIf(t, os.Chmod(filepath.Join(root, "ro"), 0o555))
	fatalIf(t, os.Chmod(filepath.Join(root, "emptydir"), 0o1777))
	for _, p := range []string{"bin/run.sh", "empty", "ro/file", "ro", "emptydir", "."} {
		fatalIf(t, os.Chtimes(filepath.Join(root, p), testTime, testTime))
	}
}

func TestCopyTreeKeepsModesTimesSymlinks(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	richTree(t, src)
	parent := filepath.Join(t.TempDir(), "missing", "parent")
	dst := filepath.Join(parent, "dst")
	res, _ := mustCopy(t, src, dst, Options{Logger: testLogger(t)})
	copyEqual(t, src, dst)
	noStage(t, parent)
	want := &protocol.CopyResult{Entries: 18, FilesWritten: 6, BytesWritten: int64(len("alpha#!/bin/sh\necho hi\nzzzread onlys"))}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	// Symlinks were created verbatim and never followed.
	if got, _ := os.Readlink(filepath.Join(dst, "link-dangling")); got != "does/not/exist" {
		t.Errorf("dangling link = %q", got)
	}
}

func TestDeleteRemovesExtras(t *testing.T) {
	// NeMo Gym NG-3: copy(local, remote) where remote has an extra file:
	// the extra file is deleted; remote mirrors local.
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"keep.txt": "k", "sub/new.txt": "n"})
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"keep.txt": "old", "extra.txt": "x", "extradir/f": "f", "sub/old.txt": "o", "sub/link": "-> x"})
	res, _ := mustCopy(t, src, dst, Options{Delete: true})
	copyEqual(t, src, dst)
	if res.Deleted != 5 {
		t.Errorf("Deleted = %d, want 5 (extra.txt, extradir, extradir/f, sub/old.txt, sub/link)", res.Deleted)
	}
}

func TestWithoutDeleteKeepsExtras(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"keep.txt": "k", "sub/new.txt": "n", "typechange": "now a file"})
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"keep.txt": "old", "extra.txt": "x", "extradir/f": "f", "sub/old.txt": "o", "sub/link": "-> x", "typechange/inner": "i"})
	before := digest(t, dst)
	res, _ := mustCopy(t, src, dst, Options{})
	got := digest(t, dst)
	want := digest(t, src)
	// A file does not replace the non-empty directory typechange without
	// Delete (its entries would go): it is skipped, as rsync -a does.
	if res.Skipped != 1 || len(res.SkippedEntries) != 1 || res.SkippedEntries[0].Path != "typechange" {
		t.Errorf("skipped %+v, want typechange", res.SkippedEntries)
	}
	for _, p := range []string{"extra.txt", "extradir", "extradir/f", "sub/old.txt", "sub/link", "typechange", "typechange/inner"} {
		want[p] = before[p]
	}
	// The source's directory mtimes win, as rsync's do.
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dst is not old ∪ new (-want +got):\n%s", diff)
	}
}

func TestIncrementalSendsOnlyChanged(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	big := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB
	build(t, src, spec{"big1": big, "big2": big, "small": "s", "d/big3": big})
	dst := filepath.Join(t.TempDir(), "dst")
	_, first := mustCopy(t, src, dst, Options{})
	if first < 3<<20 {
		t.Fatalf("first copy sent %d bytes, want at least 3 MiB", first)
	}
	var before syscall.Stat_t
	fatalIf(t, syscall.Stat(filepath.Join(dst, "big1"), &before))

	// Change one file's content (and so its mtime).
	fatalIf(t, os.WriteFile(filepath.Join(src, "small"), []byte("changed"), 0o644))
	res, second := mustCopy(t, src, dst, Options{})
	copyEqual(t, src, dst)
	if res.FilesWritten != 1 || res.FilesKept != 3 || res.BytesWritten != int64(len("changed")) {
		t.Errorf("result = %+v, want 1 written (7 bytes), 3 kept", res)
	}
	if second > 64<<10 {
		t.Errorf("re-copy sent %d bytes on the wire, want only metadata and the changed file", second)
	}
	// Unchanged files were hard-linked, not rewritten.
	var after syscall.Stat_t
	fatalIf(t, syscall.Stat(filepath.Join(dst, "big1"), &after))
	if before.Ino != after.Ino {
		t.Errorf("unchanged file got a new inode")
	}

	// A mode change alone: no data travels, but the file gets a new inode
	// with the new mode, so the old tree was never modified.
	fatalIf(t, os.Chmod(filepath.Join(src, "big2"), 0o600))
	res, _ = mustCopy(t, src, dst, Options{})
	copyEqual(t, src, dst)
	if res.FilesWritten != 0 || res.FilesKept != 4 {
		t.Errorf("result = %+v, want 0 written, 4 kept", res)
	}
}

func TestChecksumCatchesSameSizeSameMtime(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"f": "AAAA", "g": "same"})
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"f": "BBBB", "g": "same"})

	// By size and mtime the files look equal: nothing travels.
	res, _ := mustCopy(t, src, dst, Options{})
	if res.FilesWritten != 0 {
		t.Fatalf("without checksum: %d files written, want 0", res.FilesWritten)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "f")); string(b) != "BBBB" {
		t.Fatalf("without checksum f = %q", b)
	}
	res, _ = mustCopy(t, src, dst, Options{Checksum: true})
	if res.FilesWritten != 1 || res.FilesKept != 1 {
		t.Errorf("with checksum: result %+v, want 1 written, 1 kept", res)
	}
	copyEqual(t, src, dst)
}

func TestSingleFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.bin")
	fatalIf(t, os.WriteFile(src, []byte("payload"), 0o640))
	fatalIf(t, os.Chtimes(src, testTime, testTime))
	dst := filepath.Join(dir, "out", "dst.bin")

	res, _ := mustCopy(t, src, dst, Options{})
	copyEqual(t, src, dst)
	if res.FilesWritten != 1 || res.Entries != 1 {
		t.Errorf("first copy: %+v", res)
	}
	res, _ = mustCopy(t, src, dst, Options{})
	if res.FilesKept != 1 || res.FilesWritten != 0 {
		t.Errorf("second copy: %+v, want kept", res)
	}
	fatalIf(t, os.WriteFile(src, []byte("payload 2"), 0o600))
	mustCopy(t, src, dst, Options{})
	copyEqual(t, src, dst)
	noStage(t, filepath.Dir(dst))

	// A symlink named as the source is followed (the user named it).
	link := filepath.Join(dir, "link")
	fatalIf(t, os.Symlink(src, link))
	mustCopy(t, link, filepath.Join(dir, "viaLink"), Options{})
	copyEqual(t, src, filepath.Join(dir, "viaLink"))
}

func TestReplaceTypes(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	fatalIf(t, os.WriteFile(file, []byte("f"), 0o644))
	tree := filepath.Join(dir, "tree")
	build(t, tree, spec{"a": "a", "b/c": "c"})

	t.Run("dir over file needs delete", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "dst")
		mustCopy(t, file, dst, Options{})
		if _, r, _ := runCopy(t, tree, dst, Options{}); r.err == nil || !strings.Contains(r.err.Error(), "--delete") {
			t.Fatalf("directory over a file without delete: %v, want a refusal naming --delete", r.err)
		}
		copyEqual(t, file, dst)
		mustCopy(t, tree, dst, Options{Delete: true})
		copyEqual(t, tree, dst)
		noStage(t, filepath.Dir(dst))
	})
	t.Run("file onto dir lands inside", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "dst")
		mustCopy(t, tree, dst, Options{})
		mustCopy(t, file, dst, Options{Delete: true})
		copyEqual(t, file, filepath.Join(dst, "file"))
		if got, _ := os.ReadFile(filepath.Join(dst, "a")); string(got) != "a" {
			t.Fatalf("the directory's own files were touched: a = %q", got)
		}
		noStage(t, filepath.Dir(dst))
		noStage(t, dst)
		// Copying it again sends nothing: it is compared with DST/NAME.
		res, _ := mustCopy(t, file, dst, Options{})
		if res.FilesWritten != 0 || res.FilesKept != 1 {
			t.Fatalf("re-copy of a file into a directory: %+v, want it kept", res)
		}
		copyEqual(t, file, filepath.Join(dst, "file"))
	})
	t.Run("file into a new dir", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "new")
		mustCopy(t, file, dst, Options{Into: true})
		copyEqual(t, file, filepath.Join(dst, "file"))
	})
	t.Run("file into a file", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "dst")
		fatalIf(t, os.WriteFile(dst, []byte("x"), 0o644))
		if _, r, _ := runCopy(t, file, dst, Options{Into: true}); r.err == nil {
			t.Fatal("copy into a file named as a directory succeeded")
		}
	})
	// A symlink at the destination is followed, as cp follows it
	// (TestReceiveFollowsDestinationSymlink has every form).
	dst := filepath.Join(t.TempDir(), "dst")
	target := t.TempDir()
	fatalIf(t, os.Symlink(target, dst))
	mustCopy(t, tree, dst, Options{Delete: true})
	copyEqual(t, tree, target)
	if fi, err := os.Lstat(dst); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the destination symlink was replaced")
	}
}

// cutConn closes itself once n bytes were read through it.
type cutConn struct {
	net.Conn
	left int
}

func (c *cutConn) Read(p []byte) (int, error) {
	if c.left <= 0 {
		c.Conn.Close()
		return 0, errors.New("cut")
	}
	if len(p) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	c.left -= n
	return n, err
}

func TestInterruptedLeavesOldTreeIntact(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	sp := spec{}
	for i := range 16 {
		sp[filepath.Join("d", string(rune('a'+i)))] = strings.Repeat(string(rune('a'+i)), 256<<10)
	}
	build(t, src, sp)
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"d/a": "old a", "d/old": "old", "keep": "k", "link": "-> d/a"})
	before := digest(t, dst)

	for _, cut := range []int{0, 100, 2 << 20, 3 << 20} {
		a, b := net.Pipe()
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		rc := make(chan error, 1)
		go func() {
			_, err := Receive(ctx, dst, &cutConn{Conn: b, left: cut}, Options{Delete: true})
			b.Close()
			rc <- err
		}()
		_, serr := Send(ctx, src, a, Options{})
		a.Close()
		rerr := <-rc
		cancel()
		if serr == nil || rerr == nil {
			t.Fatalf("cut at %d: send err %v, receive err %v; want both to fail", cut, serr, rerr)
		}
		t.Logf("cut at %d: receive: %v", cut, rerr)
		if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
			t.Fatalf("cut at %d changed the destination:\n%s", cut, diff)
		}
		noStage(t, filepath.Dir(dst))
	}
}

func TestCancel(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"big": ""})
	// Sparse and large enough that the cancel lands long before the end.
	fatalIf(t, os.Truncate(filepath.Join(src, "big"), 1<<30))
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"old": "o"})
	before := digest(t, dst)

	// The sender's context ends mid-copy: the receiver sees FrameCancel
	// (or the cut) and keeps the old tree.
	a, b := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	rc := make(chan error, 1)
	go func() {
		_, err := Receive(context.Background(), dst, b, Options{})
		b.Close()
		rc <- err
	}()
	_, serr := Send(ctx, src, a, Options{Progress: func(p Progress) {
		if p.Bytes > 0 {
			cancel()
		}
	}})
	a.Close()
	rerr := <-rc
	if !errors.Is(serr, context.Canceled) {
		t.Errorf("send: %v, want context.Canceled", serr)
	}
	if rerr == nil {
		t.Errorf("receive succeeded after cancel")
	}
	if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
		t.Errorf("cancel changed the destination:\n%s", diff)
	}
	noStage(t, filepath.Dir(dst))

	// FrameCancel from the peer.
	r := evilSend(t, dst, append([]frame{rootDirF()}, frame{t: protocol.FrameCancel}))
	if !errors.Is(r.err, ErrCanceled) {
		t.Errorf("receive after FrameCancel: %v, want ErrCanceled", r.err)
	}
	if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
		t.Errorf("cancel changed the destination:\n%s", diff)
	}
}

func TestSourceChangesWhileRead(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"f": strings.Repeat("x", 4<<20)})
	dst := filepath.Join(t.TempDir(), "dst")
	a, b := net.Pipe()
	rc := make(chan error, 1)
	go func() {
		_, err := Receive(context.Background(), dst, b, Options{})
		b.Close()
		rc <- err
	}()
	once := false
	_, serr := Send(context.Background(), src, a, Options{Progress: func(p Progress) {
		if p.Bytes > 0 && !once {
			once = true
			os.Truncate(filepath.Join(src, "f"), 1<<20)
		}
	}})
	a.Close()
	rerr := <-rc
	if serr == nil || !strings.Contains(serr.Error(), "shrank") {
		t.Errorf("send: %v, want a shrank error", serr)
	}
	var pe *PeerError
	if !errors.As(rerr, &pe) || !strings.Contains(pe.Info.Message, "shrank") {
		t.Errorf("receive: %v, want the sender's error", rerr)
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Errorf("destination created by a failed copy: %v", err)
	}
	noStage(t, filepath.Dir(dst))
}

func TestStaleStagesRemoved(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": "a"})
	parent := t.TempDir()
	stale := filepath.Join(parent, stagePrefix+"dst-0123456789abcdef")
	build(t, stale, spec{"junk": "j"})
	fatalIf(t, os.Chmod(stale, 0o555))
	unrelated := filepath.Join(parent, ".tether-stage-notours")
	fatalIf(t, os.WriteFile(unrelated, nil, 0o644))
	mustCopy(t, src, filepath.Join(parent, "dst"), Options{})
	if diff := cmp.Diff([]string{unrelated[len(parent)+1:], "dst"}, listDir(t, parent)); diff != "" {
		t.Errorf("parent after copy (-want +got):\n%s", diff)
	}
}

func TestConcurrentCopiesSerialize(t *testing.T) {
	srcA := filepath.Join(t.TempDir(), "a")
	build(t, srcA, spec{"f": strings.Repeat("a", 1<<20), "only-a": "a"})
	srcB := filepath.Join(t.TempDir(), "b")
	// Sizes differ: with equal sizes and mtimes the second copy would
	// rightly keep the first one's file.
	build(t, srcB, spec{"f": strings.Repeat("b", 1<<20+1), "only-b": "b"})
	dst := filepath.Join(t.TempDir(), "dst")
	errs := make(chan error, 2)
	for _, src := range []string{srcA, srcB} {
		go func() {
			s, r, _ := runCopy(t, src, dst, Options{Delete: true})
			errs <- errors.Join(s.err, r.err)
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// One of the two won, whole.
	got := digest(t, dst)
	if diff := cmp.Diff(digest(t, srcA), got); diff != "" {
		if diff2 := cmp.Diff(digest(t, srcB), got); diff2 != "" {
			t.Errorf("destination is a mix of both copies:\n%s", diff)
		}
	}
	noStage(t, filepath.Dir(dst))
}

func TestProgress(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": strings.Repeat("a", 300<<10), "b": "b"})
	var last Progress
	calls := 0
	_, _ = mustCopy(t, src, filepath.Join(t.TempDir(), "dst"), Options{Progress: func(p Progress) { last = p; calls++ }})
	want := Progress{Files: 2, TotalFiles: 2, Bytes: 300<<10 + 1, TotalBytes: 300<<10 + 1}
	if last != want || calls == 0 {
		t.Errorf("last progress %+v after %d calls, want %+v", last, calls, want)
	}
}

func TestReceiverProgressFromRootTotals(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": "aaa", "b": "bb"})
	a, b := net.Pipe()
	var last Progress
	rc := make(chan error, 1)
	go func() {
		_, err := Receive(context.Background(), filepath.Join(t.TempDir(), "dst"), b, Options{Progress: func(p Progress) { last = p }})
		b.Close()
		rc <- err
	}()
	_, err := Send(context.Background(), src, a, Options{})
	a.Close()
	fatalIf(t, errors.Join(err, <-rc))
	if want := (Progress{Files: 2, TotalFiles: 2, Bytes: 5, TotalBytes: 5}); last != want {
		t.Errorf("receiver progress %+v, want %+v", last, want)
	}
}

func TestMain(m *testing.M) {
	// Tests compare modes exactly: no umask surprises.
	syscall.Umask(0o022)
	os.Exit(m.Run())
}
