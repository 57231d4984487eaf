package mirror

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/protocol"
)

// skipTree builds a source with entries a copy cannot carry next to
// ordinary ones: a named pipe, a socket, and two files whose opening fails
// with EACCES (injected: the tests may run as root), one small and one
// streamed.
func skipTree(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"ok": "ok", "sub/b": "b", "sub/denied": "small", "big-denied": strings.Repeat("x", smallFile+1)})
	fatalIf(t, syscall.Mkfifo(filepath.Join(src, "sub", "fifo"), 0o644))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(src, "sock"), Net: "unix"})
	fatalIf(t, err)
	ln.SetUnlinkOnClose(false)
	ln.Close()
	smallIOHook = func(op, rel string) error {
		if op == "open" && strings.HasSuffix(rel, "denied") {
			return unix.EACCES
		}
		return nil
	}
	t.Cleanup(func() { smallIOHook = nil })
	return src
}

// TestSkippedEntriesArePartial copies a source holding entries a copy
// cannot carry: each is named in the result, everything else is copied,
// and the destination keeps what it had at those paths, even with Delete.
func TestSkippedEntriesArePartial(t *testing.T) {
	src := skipTree(t)
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"sub/denied": "old version", "sub/fifo": "was a file", "gone": "g"})
	res, _ := mustCopy(t, src, dst, Options{Delete: true})
	var got []string
	for _, sk := range res.SkippedEntries {
		got = append(got, sk.Path+": "+sk.Reason)
	}
	want := []string{
		"big-denied: open: permission denied",
		"sub/denied: open: permission denied",
		"sock: socket: only files, directories and symlinks are copied",
		"sub/fifo: named pipe: only files, directories and symlinks are copied",
	}
	if diff := cmp.Diff(want, got, cmpSorted()); diff != "" || res.Skipped != 4 {
		t.Errorf("skipped %d (-want +got):\n%s", res.Skipped, diff)
	}
	d := digest(t, dst)
	for p, data := range map[string]string{"ok": "ok", "sub/b": "b", "sub/denied": "old version", "sub/fifo": "was a file"} {
		if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(b) != data {
			t.Errorf("%s = %q, %v; want %q", p, b, err, data)
		}
	}
	if _, ok := d["gone"]; ok {
		t.Errorf("Delete kept an entry the source lacks")
	}
	if _, ok := d["big-denied"]; ok {
		t.Errorf("a skipped file was created")
	}
	noStage(t, dst)
}

// cmpSorted compares string slices ignoring order.
func cmpSorted() cmp.Option {
	return cmp.Transformer("sort", func(in []string) []string {
		out := append([]string(nil), in...)
		for i := range out {
			for j := i + 1; j < len(out); j++ {
				if out[j] < out[i] {
					out[i], out[j] = out[j], out[i]
				}
			}
		}
		return out
	})
}

// TestStrictIsAllOrNothing: with Strict, an entry that cannot be carried
// fails the copy, names every such entry found by the walk, and changes
// nothing; one that fails only when opened fails it too.
func TestStrictIsAllOrNothing(t *testing.T) {
	src := skipTree(t)
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"ok": "old", "extra": "e"})
	before := digest(t, dst)
	s, r, _ := runCopy(t, src, dst, Options{Strict: true, Delete: true})
	if s.err == nil || r.err == nil {
		t.Fatalf("strict copy succeeded: send %v, receive %v", s.err, r.err)
	}
	for _, name := range []string{"sock", "sub/fifo"} {
		if !strings.Contains(r.err.Error(), name) {
			t.Errorf("receive error %q does not name %s", r.err, name)
		}
	}
	if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
		t.Errorf("a failed strict copy changed the destination:\n%s", diff)
	}
	noStage(t, dst)

	// Only the open fails: the failure comes mid-copy.
	os.Remove(filepath.Join(src, "sock"))
	os.Remove(filepath.Join(src, "sub", "fifo"))
	s, r, _ = runCopy(t, src, dst, Options{Strict: true, Delete: true})
	if s.err == nil || r.err == nil || !strings.Contains(r.err.Error(), "permission denied") {
		t.Fatalf("strict copy with an unreadable file: send %v, receive %v", s.err, r.err)
	}
	if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
		t.Errorf("a failed strict copy changed the destination:\n%s", diff)
	}
	noStage(t, dst)
}

// TestUnreadableForReal checks real permissions (not an injected error):
// only meaningful when not root, who reads everything.
func TestUnreadableForReal(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads every file: TestSkippedEntriesArePartial injects EACCES instead")
	}
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"ok": "ok", "secret": "s", "closed/x": "x"})
	fatalIf(t, os.Chmod(filepath.Join(src, "secret"), 0))
	fatalIf(t, os.Chmod(filepath.Join(src, "closed"), 0))
	t.Cleanup(func() { os.Chmod(filepath.Join(src, "closed"), 0o755) })
	dst := filepath.Join(t.TempDir(), "dst")
	res, _ := mustCopy(t, src, dst, Options{})
	if res.Skipped != 2 {
		t.Errorf("skipped %+v, want secret and closed", res.SkippedEntries)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "ok")); string(b) != "ok" {
		t.Errorf("ok = %q", b)
	}
}

// TestTypeChangesInPlace replaces entries of every type by every other
// type inside a directory updated in place (with Delete: without it a
// non-empty directory is not replaced, TestTypeChangeInsideTree).
func TestTypeChangesInPlace(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"was-dir": "file now", "was-file/x": "dir now", "was-link/y": "dir now", "was-dir2": "-> elsewhere", "was-fifo": "file now"})
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"was-dir/a": "a", "was-dir/deep/b": "b", "was-file": "f", "was-link": "-> somewhere", "was-dir2/c": "c", "keep": "k"})
	fatalIf(t, syscall.Mkfifo(filepath.Join(dst, "was-fifo"), 0o644))
	ino := inode(t, dst)
	res, _ := mustCopy(t, src, dst, Options{Delete: true})
	want := digest(t, src)
	if diff := cmp.Diff(want, digest(t, dst)); diff != "" {
		t.Errorf("destination (-want +got):\n%s", diff)
	}
	if inode(t, dst) != ino {
		t.Errorf("the destination was replaced")
	}
	if res.Deleted != 5 || res.Replaced != 5 { // was-dir/a, was-dir/deep, was-dir/deep/b, was-dir2/c, keep; every was-*
		t.Errorf("deleted %d, replaced %d, want 5 and 5", res.Deleted, res.Replaced)
	}
	noStage(t, dst)
}

// TestKeptFileWithOtherLinks changes only the mode of a file whose inode
// has another name outside the destination: that other name keeps its
// mode (the destination gets a fresh copy), while a file with one link is
// updated in place.
func TestKeptFileWithOtherLinks(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"shared": "same", "single": "same"})
	dst := filepath.Join(t.TempDir(), "dst")
	mustCopy(t, src, dst, Options{})
	other := filepath.Join(t.TempDir(), "other")
	fatalIf(t, os.Link(filepath.Join(dst, "shared"), other))
	singleIno := inode(t, filepath.Join(dst, "single"))
	fatalIf(t, os.Chmod(filepath.Join(src, "shared"), 0o600))
	fatalIf(t, os.Chmod(filepath.Join(src, "single"), 0o600))
	res, _ := mustCopy(t, src, dst, Options{})
	if res.FilesWritten != 0 || res.FilesKept != 2 {
		t.Errorf("result %+v, want both kept", res)
	}
	copyEqual(t, src, dst)
	if fi, _ := os.Stat(other); fi.Mode().Perm() != 0o644 {
		t.Errorf("the other link's mode changed to %v", fi.Mode())
	}
	if inode(t, filepath.Join(dst, "single")) != singleIno {
		t.Errorf("a file with one link was rewritten for a mode change")
	}
}

// TestStaleTemporariesRemoved: entries staged by a killed copy inside a
// destination are removed by the next copy, except in a directory another
// live copy holds locked.
func TestStaleTemporariesRemoved(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": "a", "sub/b": "b", "busy/c": "c"})
	dst := filepath.Join(t.TempDir(), "dst")
	stale := tmpPrefix + "0123456789abcdef-7"
	build(t, dst, spec{stale: "junk", "sub/" + stale + "/x": "junk", "busy/" + stale: "live"})
	busy, err := os.Open(filepath.Join(dst, "busy"))
	fatalIf(t, err)
	defer busy.Close()
	fatalIf(t, unix.Flock(int(busy.Fd()), unix.LOCK_EX))
	res, _ := mustCopy(t, src, dst, Options{Delete: true})
	if res.Deleted != 0 {
		t.Errorf("deleted %d: staged entries are not the destination's", res.Deleted)
	}
	for _, p := range []string{stale, "sub/" + stale} {
		if _, err := os.Lstat(filepath.Join(dst, p)); !os.IsNotExist(err) {
			t.Errorf("stale %s kept (%v)", p, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dst, "busy", stale)); err != nil {
		t.Errorf("the staged entry of a live copy was removed: %v", err)
	}
}

// TestNoDeleteThroughMountPoint refuses, before changing anything, a copy
// whose Delete would remove a mount point or replace it.
func TestNoDeleteThroughMountPoint(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": "new a!", "file-now": "f"})
	for _, name := range []string{"mnt", "file-now"} {
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			build(t, dst, spec{"a": "a"})
			mountTmpfs(t, filepath.Join(dst, name))
			build(t, filepath.Join(dst, name), spec{"data": "precious"})
			before := digest(t, dst)
			_, r, _ := runCopy(t, src, dst, Options{Delete: true})
			if r.err == nil || !strings.Contains(r.err.Error(), "mount point") {
				t.Fatalf("receive: %v, want a refusal naming the mount point", r.err)
			}
			if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
				t.Errorf("the refused copy changed the destination:\n%s", diff)
			}
		})
	}
}

// TestResolveConfined drives the resolver with copy roots: symlinks that
// stay inside a root are followed (absolute ones too), those that leave
// every root are refused, and so is climbing above a root.
func TestResolveConfined(t *testing.T) {
	top := t.TempDir()
	root, other, outside := filepath.Join(top, "root"), filepath.Join(top, "other"), filepath.Join(top, "outside")
	build(t, root, spec{"d/f": "f", "d/x/g": "g", "updown": "-> d/x/..", "abs": "-> " + filepath.Join(root, "d"), "rel": "-> d", "up": "-> ../outside",
		"up2": "-> d/../../outside", "toother": "-> " + other, "loop": "-> loop", "dot": "-> .", "dotdot": "-> d/.."})
	build(t, other, spec{"g": "g"})
	build(t, outside, spec{"secret": "s"})
	rs := newResolver([]string{root, other}, nil)
	for _, tc := range []struct {
		path, dir, name string // dir relative to top
		err             string
	}{
		{path: root + "/d/f", dir: "root/d", name: "f"},
		{path: root + "/abs/f", dir: "root/d", name: "f"},
		{path: root + "/abs", dir: "root", name: "d"},
		{path: root + "/rel/new", dir: "root/d", name: "new"},
		{path: root + "/toother/g", dir: "other", name: "g"},
		{path: root, dir: "root"},
		{path: root + "/dot", dir: "root"},
		{path: root + "/dotdot", dir: "root"},
		{path: root + "/updown", dir: "root", name: "d"},
		{path: root + "/updown/x/..", dir: "root", name: "d"},
		{path: root + "/up", err: "leads outside the copy root"},
		{path: root + "/up2/secret", err: "leads outside the copy root"},
		{path: root + "/../outside/secret", err: "is not under a copy root"},
		{path: outside, err: "is not under a copy root"},
		{path: root + "/loop", err: "too many levels of symbolic links"},
		{path: root + "/d/f/x", err: "not a directory"},
		{path: root + "/missing/x", err: "no such file or directory"},
	} {
		got, err := rs.resolve(tc.path, false)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("resolve(%s) = %v, want an error containing %q", tc.path, err, tc.err)
			}
			if err == nil {
				got.dir.Close()
			}
			continue
		}
		if err != nil {
			t.Errorf("resolve(%s): %v", tc.path, err)
			continue
		}
		want, _ := os.Stat(filepath.Join(top, tc.dir))
		fi, _ := got.dir.Stat()
		if !os.SameFile(want, fi) || got.name != tc.name {
			t.Errorf("resolve(%s) = (%s, %q), want (%s, %q)", tc.path, got.dir.Name(), got.name, tc.dir, tc.name)
		}
		got.dir.Close()
	}
	// With create, missing directories on the way are made.
	got, err := rs.resolve(root+"/new/deeper/leaf", true)
	fatalIf(t, err)
	got.dir.Close()
	if fi, err := os.Stat(filepath.Join(root, "new", "deeper")); err != nil || !fi.IsDir() || got.name != "leaf" {
		t.Errorf("create: %v, %v, name %q", fi, err, got.name)
	}
	var rf *refusal
	if _, err := rs.resolve(outside, false); !errors.As(err, &rf) {
		t.Errorf("a path outside the roots is not a refusal: %v", err)
	}
	_ = protocol.CodeBadRequest
}

// TestStageInsideWhenParentNotWritable copies onto a directory whose
// parent this user cannot write (a home directory in /home): the stage
// goes inside the destination instead. Only meaningful when not root.
func TestStageInsideWhenParentNotWritable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes every directory")
	}
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": "new a!", "sub/b": "b"})
	parent := filepath.Join(t.TempDir(), "parent")
	dst := filepath.Join(parent, "home")
	build(t, dst, spec{"a": "old"})
	fatalIf(t, os.Chmod(parent, 0o555))
	t.Cleanup(func() { os.Chmod(parent, 0o755) })
	mustCopy(t, src, dst, Options{Delete: true})
	copyEqual(t, src, dst)
	noStage(t, parent)
}

// TestWithoutOpenat2 runs lookups and a copy the way kernels without
// openat2 do (one openat(O_NOFOLLOW) per component): a symlink on the way
// is refused there too.
func TestWithoutOpenat2(t *testing.T) {
	noOpenat2 = true
	t.Cleanup(func() { noOpenat2 = false })
	dir := t.TempDir()
	build(t, dir, spec{"d/e/f": "f", "l": "-> d", "d/le": "-> e"})
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	fatalIf(t, err)
	defer unix.Close(dfd)
	if fd, err := openBeneath(dfd, "d/e/f", unix.O_RDONLY, 0); err != nil {
		t.Errorf("open d/e/f: %v", err)
	} else {
		unix.Close(fd)
	}
	for _, p := range []string{"l/e/f", "d/le/f", "d/le", "l", "d/../d/e/f"} {
		if fd, err := openBeneath(dfd, p, unix.O_RDONLY, 0); err == nil {
			unix.Close(fd)
			t.Errorf("open %s followed a symlink or climbed", p)
		}
	}
	src := filepath.Join(t.TempDir(), "src")
	richTree(t, src)
	dst := filepath.Join(t.TempDir(), "dst")
	build(t, dst, spec{"a.txt": "old", "deep/x/old": "o"})
	mustCopy(t, src, dst, Options{Delete: true})
	copyEqual(t, src, dst)
}

// TestEffectiveRoots: the intersection of copy roots and granted paths, on
// component boundaries.
func TestEffectiveRoots(t *testing.T) {
	for _, tt := range []struct {
		roots, within []string
		want          string
	}{
		{[]string{"/tmp"}, []string{"/tmp/f10/pub"}, "/tmp/f10/pub"},
		{[]string{"/srv/a", "/srv/b"}, []string{"/srv"}, "/srv/a,/srv/b"},
		{[]string{"/"}, []string{"/home/u", "/opt/x/"}, "/home/u,/opt/x"},
		{[]string{"/tmp"}, []string{"/tmpfoo", "/etc"}, ""},
		{[]string{"/data"}, []string{"/data"}, "/data"},
	} {
		if got := strings.Join(EffectiveRoots(tt.roots, tt.within), ","); got != tt.want {
			t.Errorf("EffectiveRoots(%q, %q) = %q, want %q", tt.roots, tt.within, got, tt.want)
		}
	}
}

// BenchmarkResolveWithin: resolving a path three levels below a granted
// path, with the copy roots alone (roots) and narrowed to the grant
// (within), which opens the granted path beneath the root first.
func BenchmarkResolveWithin(b *testing.B) {
	root := b.TempDir()
	pub := filepath.Join(root, "a", "pub")
	if err := os.MkdirAll(filepath.Join(pub, "x", "y"), 0o755); err != nil {
		b.Fatal(err)
	}
	p := filepath.Join(pub, "x", "y", "f")
	for _, bc := range []struct {
		name   string
		within []string
	}{{"roots", nil}, {"within", []string{pub}}} {
		b.Run(bc.name, func(b *testing.B) {
			rs := newResolver([]string{root}, bc.within)
			for b.Loop() {
				t, err := rs.resolve(p, false)
				if err != nil {
					b.Fatal(err)
				}
				t.dir.Close()
			}
		})
	}
}
