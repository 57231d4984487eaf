package mirror

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// inode returns the inode of p (not following a final symlink).
func inode(t testing.TB, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	fatalIf(t, unix.Lstat(p, &st))
	return st.Ino
}

// TestReceiveKeepsDestinationIdentity copies onto an existing directory
// while a descriptor of it is held open (a shell's cwd, a service's working
// directory): the directory keeps its inode, and the descriptor sees the
// new tree. Its subdirectories keep theirs too.
func TestReceiveKeepsDestinationIdentity(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": "new aa", "sub/b": "new bb", "sub/c": "c", "n/x": "x"})
	for _, del := range []bool{false, true} {
		dst := filepath.Join(t.TempDir(), "dst")
		build(t, dst, spec{"a": "old a", "sub/b": "old b", "extra": "e"})
		ino, subIno := inode(t, dst), inode(t, filepath.Join(dst, "sub"))
		held, err := os.Open(dst)
		fatalIf(t, err)
		defer held.Close()

		mustCopy(t, src, dst, Options{Delete: del})
		want := digest(t, src)
		if !del {
			want["extra"] = digest(t, dst)["extra"]
		}
		if diff := cmp.Diff(want, digest(t, dst)); diff != "" {
			t.Errorf("delete=%v: destination (-want +got):\n%s", del, diff)
		}
		if got := inode(t, dst); got != ino {
			t.Errorf("delete=%v: destination directory replaced: inode %d, was %d", del, got, ino)
		}
		if got := inode(t, filepath.Join(dst, "sub")); got != subIno {
			t.Errorf("delete=%v: subdirectory replaced: inode %d, was %d", del, got, subIno)
		}
		// The held descriptor is the destination, not a deleted directory.
		fd, err := unix.Openat(int(held.Fd()), "sub/c", unix.O_RDONLY, 0)
		if err != nil {
			t.Errorf("delete=%v: open sub/c through the held descriptor: %v", del, err)
		} else {
			unix.Close(fd)
		}
		noStage(t, filepath.Dir(dst))
		noStage(t, dst)
	}
}

// TestReceiveIntoWorkingDirectory is `tether cp NODE:DIR .`: the copy
// lands in the current directory, which stays the current directory.
func TestReceiveIntoWorkingDirectory(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": "a", "sub/b": "b"})
	cwd := filepath.Join(t.TempDir(), "work")
	build(t, cwd, spec{"old": "o"})
	t.Chdir(cwd)
	mustCopy(t, src, ".", Options{})
	if _, err := os.Getwd(); err != nil {
		t.Fatalf("getwd after the copy: %v", err)
	}
	ents, err := os.ReadDir(".")
	fatalIf(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"a", "old", "sub"}, names); diff != "" {
		t.Errorf("current directory after the copy (-want +got):\n%s", diff)
	}
	// A second copy works too (it used to fail with getwd).
	mustCopy(t, src, ".", Options{Delete: true})
	if b, err := os.ReadFile("sub/b"); err != nil || string(b) != "b" {
		t.Errorf("sub/b = %q, %v", b, err)
	}
}

// TestReceiveFollowsDestinationSymlink names a symlink as the destination,
// in every form: it is followed the way cp and scp follow it, and stays a
// symlink.
func TestReceiveFollowsDestinationSymlink(t *testing.T) {
	tree := filepath.Join(t.TempDir(), "tree")
	build(t, tree, spec{"a": "a", "b/c": "c"})
	file := filepath.Join(t.TempDir(), "file.txt")
	fatalIf(t, os.WriteFile(file, []byte("file"), 0o644))

	type layout struct{ link, target string }
	mk := func(t *testing.T, relative bool) layout {
		dir := t.TempDir()
		l := layout{link: filepath.Join(dir, "link"), target: filepath.Join(dir, "real")}
		build(t, l.target, spec{"old": "o"})
		to := l.target
		if relative {
			to = "real"
		}
		fatalIf(t, os.Symlink(to, l.link))
		return l
	}
	isLink := func(t *testing.T, l layout) {
		t.Helper()
		if fi, err := os.Lstat(l.link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is no longer a symlink (%v, %v)", l.link, fi, err)
		}
	}
	for _, relative := range []bool{false, true} {
		name := "absolute"
		if relative {
			name = "relative"
		}
		t.Run(name+"/tree", func(t *testing.T) {
			l := mk(t, relative)
			mustCopy(t, tree, l.link, Options{})
			isLink(t, l)
			want := digest(t, tree)
			want["old"] = node{Type: "file", Mode: 0o644, Mtime: testTime.UnixNano(), Data: digest(t, l.target)["old"].Data}
			if diff := cmp.Diff(want, digest(t, l.target)); diff != "" {
				t.Errorf("target (-want +got):\n%s", diff)
			}
		})
		t.Run(name+"/tree with delete", func(t *testing.T) {
			l := mk(t, relative)
			mustCopy(t, tree, l.link, Options{Delete: true})
			isLink(t, l)
			copyEqual(t, tree, l.target)
		})
		t.Run(name+"/tree with trailing slash", func(t *testing.T) {
			l := mk(t, relative)
			mustCopy(t, tree, l.link+"/", Options{Into: true, Delete: true})
			isLink(t, l)
			copyEqual(t, tree, l.target)
		})
		t.Run(name+"/file", func(t *testing.T) {
			l := mk(t, relative)
			mustCopy(t, file, l.link, Options{})
			isLink(t, l)
			copyEqual(t, file, filepath.Join(l.target, "file.txt"))
		})
		t.Run(name+"/file with trailing slash", func(t *testing.T) {
			l := mk(t, relative)
			mustCopy(t, file, l.link+"/", Options{Into: true, Delete: true})
			isLink(t, l)
			copyEqual(t, file, filepath.Join(l.target, "file.txt"))
			if _, err := os.Stat(filepath.Join(l.target, "old")); err != nil {
				t.Errorf("a file copied into a directory removed its other entries: %v", err)
			}
		})
		t.Run(name+"/file onto a link to a file", func(t *testing.T) {
			dir := t.TempDir()
			l := layout{link: filepath.Join(dir, "link"), target: filepath.Join(dir, "real.txt")}
			fatalIf(t, os.WriteFile(l.target, []byte("old"), 0o644))
			to := l.target
			if relative {
				to = "real.txt"
			}
			fatalIf(t, os.Symlink(to, l.link))
			mustCopy(t, file, l.link, Options{})
			isLink(t, l)
			copyEqual(t, file, l.target)
		})
	}
	// A symlink to a directory inside the tree being written is never
	// followed: it is replaced (what the source has there wins).
	t.Run("below the top", func(t *testing.T) {
		dir := t.TempDir()
		dst, elsewhere := filepath.Join(dir, "dst"), filepath.Join(dir, "elsewhere")
		build(t, elsewhere, spec{"keep": "k"})
		build(t, dst, spec{"b": "-> " + elsewhere})
		before := digest(t, elsewhere)
		mustCopy(t, tree, dst, Options{})
		copyEqual(t, tree, dst)
		if diff := cmp.Diff(before, digest(t, elsewhere)); diff != "" {
			t.Errorf("the copy wrote through a symlink below the destination:\n%s", diff)
		}
	})
}

// mountTmpfs mounts a fresh tmpfs on dir until the test ends, or skips the
// test saying why.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root: run the tests as root to cover mount points")
	}
	fatalIf(t, os.MkdirAll(dir, 0o755))
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s (%v): mount points are not covered here", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// bindMount bind-mounts src on dir until the test ends, or skips.
func bindMount(t *testing.T, src, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root: run the tests as root to cover mount points")
	}
	fatalIf(t, os.MkdirAll(dir, 0o755))
	if err := unix.Mount(src, dir, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount %s on %s (%v): mount points are not covered here", src, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// TestReceiveOntoMountPoint copies onto a directory that is a mount point
// (a tmpfs, then a bind mount), and onto a tree holding one: the copy
// lands on the mounted file system and the mount stays.
func TestReceiveOntoMountPoint(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": "a", "sub/b": "b", "mnt/c": "c"})
	t.Run("tmpfs", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "mnt")
		mountTmpfs(t, dst)
		build(t, dst, spec{"old": "o"})
		mustCopy(t, src, dst, Options{Delete: true})
		copyEqual(t, src, dst)
		var st, parent unix.Stat_t
		fatalIf(t, unix.Stat(dst, &st))
		fatalIf(t, unix.Stat(filepath.Dir(dst), &parent))
		if st.Dev == parent.Dev {
			t.Errorf("%s is no longer a mount point", dst)
		}
		noStage(t, dst)
	})
	t.Run("bind", func(t *testing.T) {
		dir := t.TempDir()
		backing, dst := filepath.Join(dir, "backing"), filepath.Join(dir, "dst")
		build(t, backing, spec{"old": "o"})
		bindMount(t, backing, dst)
		mustCopy(t, src, dst, Options{})
		if b, err := os.ReadFile(filepath.Join(backing, "sub", "b")); err != nil || string(b) != "b" {
			t.Errorf("the copy did not land on the mounted directory: %q, %v", b, err)
		}
	})
	t.Run("inside the tree", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "dst")
		build(t, dst, spec{"a": "old"})
		mountTmpfs(t, filepath.Join(dst, "mnt"))
		build(t, filepath.Join(dst, "mnt"), spec{"old": "o"})
		mustCopy(t, src, dst, Options{Delete: true})
		copyEqual(t, src, dst)
		var st, parent unix.Stat_t
		fatalIf(t, unix.Stat(filepath.Join(dst, "mnt"), &st))
		fatalIf(t, unix.Stat(dst, &parent))
		if st.Dev == parent.Dev {
			t.Errorf("%s is no longer a mount point", filepath.Join(dst, "mnt"))
		}
	})
}

// TestNamesWithAnyBytes copies names Linux allows but that are not UTF-8,
// or hold newlines, backslashes and quotes, as files, directories and
// symlink targets: they arrive byte for byte.
func TestNamesWithAnyBytes(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	names := []string{"\xff\xfe", "caf\xe9", "new\nline", `back\slash`, `"quoted"`, "\x01ctl", "ok-\u00e9"}
	sp := spec{}
	for _, n := range names {
		sp[n] = "file " + n
		sp["dir-"+n+"/inner-"+n] = "inner " + n
		sp["link-"+n] = "-> target-\xff-" + n
	}
	build(t, src, sp)
	dst := filepath.Join(t.TempDir(), "dst")
	mustCopy(t, src, dst, Options{})
	copyEqual(t, src, dst)
	// Unchanged names are recognised in the destination's manifest.
	res, _ := mustCopy(t, src, dst, Options{Checksum: true})
	if res.FilesWritten != 0 {
		t.Errorf("re-copy wrote %d files, want 0", res.FilesWritten)
	}
	// A file whose name is not UTF-8, copied onto a directory.
	one := filepath.Join(t.TempDir(), "\xff.bin")
	fatalIf(t, os.WriteFile(one, []byte("x"), 0o644))
	mustCopy(t, one, dst, Options{})
	if b, err := os.ReadFile(filepath.Join(dst, "\xff.bin")); err != nil || string(b) != "x" {
		t.Errorf("%q = %q, %v", filepath.Join(dst, "\xff.bin"), b, err)
	}
	for _, n := range listDir(t, dst) {
		if strings.Contains(n, "\uFFFD") {
			t.Errorf("name %q was mangled", n)
		}
	}
}

// TestStageBesideDestination looks at the file system in the middle of a
// copy onto an existing directory: what arrived is staged beside the
// destination (in its parent), so the destination shows nothing new until
// the commit, and even a receiver killed then would leave it as it was.
func TestStageBesideDestination(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	build(t, src, spec{"a": "new a!", "sub/big": strings.Repeat("b", 4<<20), "sub/z": "z"})
	parent := t.TempDir()
	dst := filepath.Join(parent, "dst")
	build(t, dst, spec{"a": "old a", "sub/old": "o"})
	before := digest(t, dst)
	a, b := net.Pipe()
	rc := make(chan error, 1)
	looked := false
	go func() {
		_, err := Receive(context.Background(), dst, b, Options{Delete: true, Progress: func(p Progress) {
			if p.Bytes == 0 || p.Bytes == p.TotalBytes || looked {
				return
			}
			looked = true
			if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
				t.Errorf("the destination changed before the commit:\n%s", diff)
			}
			stages := 0
			for _, n := range listDir(t, parent) {
				if strings.HasPrefix(n, tmpPrefix) {
					stages++
				}
			}
			if stages != 1 {
				t.Errorf("parent holds %v, want the destination and one stage", listDir(t, parent))
			}
		}})
		b.Close()
		rc <- err
	}()
	_, err := Send(context.Background(), src, a, Options{})
	a.Close()
	fatalIf(t, errors.Join(err, <-rc))
	if !looked {
		t.Fatal("no progress callback in the middle of the copy")
	}
	copyEqual(t, src, dst)
	noStage(t, parent)
}
