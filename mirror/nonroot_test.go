package mirror

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// nobodyID is the uid and gid the non-root tests run as when the test
// binary runs as root (CI): root's CAP_DAC_OVERRIDE hides the permission
// checks a normal user meets.
const nobodyID = 65534

// asNonRoot runs the test named name again as a normal user: directly when
// the test binary is not root (it returns true: go on), else in a copy of
// the test binary started as nobody (it returns false after checking the
// child passed). The child gets its own TMPDIR it can write.
func asNonRoot(t *testing.T, name string) bool {
	t.Helper()
	if os.Geteuid() != 0 {
		return true
	}
	exe, err := os.Executable()
	fatalIf(t, err)
	// t.TempDir's parent is 0700; nobody needs to reach the binary and
	// its TMPDIR.
	dir, err := os.MkdirTemp("", "mirror-nonroot-")
	fatalIf(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	fatalIf(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "mirror.test")
	in, err := os.Open(exe)
	fatalIf(t, err)
	out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	fatalIf(t, err)
	_, err = io.Copy(out, in)
	in.Close()
	fatalIf(t, err)
	fatalIf(t, out.Close())
	tmp := filepath.Join(dir, "tmp")
	fatalIf(t, os.Mkdir(tmp, 0o755))
	fatalIf(t, os.Chown(tmp, nobodyID, nobodyID))
	cmd := exec.Command(bin, "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "HOME="+tmp, "GOCOVERDIR=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyID, Gid: nobodyID}}
	got, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(err.Error(), "operation not permitted") {
		t.Skipf("cannot start the test as uid %d: %v", nobodyID, err)
	}
	if err != nil || !strings.Contains(string(got), "--- PASS: "+name) {
		t.Fatalf("%s as uid %d: %v\n%s", name, nobodyID, err, got)
	}
	t.Logf("%s passed as uid %d", name, nobodyID)
	return false
}

// writableOnCleanup gives every directory under root u+w when the test
// ends, so that t.TempDir's removal can empty read-only directories as a
// normal user. Call it after the t.TempDir holding root.
func writableOnCleanup(t testing.TB, root string) {
	t.Cleanup(func() {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				if fi, err := d.Info(); err == nil && fi.Mode().Perm()&0o700 != 0o700 {
					os.Chmod(p, fi.Mode().Perm()|0o700)
				}
			}
			return nil
		})
	})
}

// TestCopyReadOnlyDirsAsNonRoot: as a normal user, a tree with read-only
// (0555) directories copies onto an existing destination, new and
// replacing read-only directories included, and the modes come out exact
// (F27). Moving a directory to another parent needs write permission on
// it, which root alone does not need.
func TestCopyReadOnlyDirsAsNonRoot(t *testing.T) {
	if !asNonRoot(t, "TestCopyReadOnlyDirsAsNonRoot") {
		return
	}
	src := filepath.Join(t.TempDir(), "src")
	writableOnCleanup(t, src)
	richTree(t, src)
	build(t, src, spec{"ro2/sub/f": "f", "was-dir": "now a file"})
	fatalIf(t, os.Chmod(filepath.Join(src, "ro2/sub"), 0o500))
	fatalIf(t, os.Chmod(filepath.Join(src, "ro2"), 0o555))

	dst := filepath.Join(t.TempDir(), "dst")
	writableOnCleanup(t, dst)
	build(t, dst, spec{"keep": "old", "was-dir/x": "x", "gone/": ""})
	fatalIf(t, os.Chmod(filepath.Join(dst, "was-dir"), 0o555))
	fatalIf(t, os.Chmod(filepath.Join(dst, "gone"), 0o555))
	mustCopy(t, src, dst, Options{Delete: true, Logger: testLogger(t)})
	copyEqual(t, src, dst)
	noStage(t, filepath.Dir(dst))

	// Again, with nothing changed, and onto a new destination.
	mustCopy(t, src, dst, Options{Delete: true})
	copyEqual(t, src, dst)
	// A changed file in a read-only directory the destination has, and
	// one the source no longer has there.
	fatalIf(t, os.Chmod(filepath.Join(dst, "ro2"), 0o755))
	build(t, dst, spec{"ro2/extra": ""})
	fatalIf(t, os.Chmod(filepath.Join(src, "ro"), 0o755))
	fatalIf(t, os.Remove(filepath.Join(src, "ro/file")))
	build(t, src, spec{"ro/file": "changed, longer"})
	fatalIf(t, os.Chmod(filepath.Join(src, "ro"), 0o555))
	fatalIf(t, os.Chmod(filepath.Join(dst, "ro2"), 0o555))
	mustCopy(t, src, dst, Options{Delete: true})
	copyEqual(t, src, dst)
	noStage(t, filepath.Dir(dst))
	fresh := filepath.Join(t.TempDir(), "fresh")
	writableOnCleanup(t, fresh)
	mustCopy(t, src, fresh, Options{})
	copyEqual(t, src, fresh)
	// A read-only source root, onto a new destination.
	fresh2 := filepath.Join(t.TempDir(), "fresh2")
	writableOnCleanup(t, fresh2)
	mustCopy(t, filepath.Join(src, "ro2"), fresh2, Options{})
	copyEqual(t, filepath.Join(src, "ro2"), fresh2)
}

// testFailedCommitRollsBack fails a commit at each of its renames in turn
// and checks the destination is as before each time, with nothing staged
// left: the renames already done are put back.
func testFailedCommitRollsBack(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	writableOnCleanup(t, src)
	richTree(t, src)
	build(t, src, spec{"was-dir": "now a file", "was-file/x": "x", "keep": "new"})
	oldTree := spec{"keep": "older", "a.txt": "old a.txt", "was-dir/x": "x", "was-file": "f", "ro/": "", "link-rel": "-> keep", "gone": "g"}
	fatalErr := errors.New("injected failure")
	for k := 1; ; k++ {
		dst := filepath.Join(t.TempDir(), "dst")
		writableOnCleanup(t, dst)
		build(t, dst, oldTree)
		fatalIf(t, os.Chmod(filepath.Join(dst, "was-dir"), 0o555))
		fatalIf(t, os.Chmod(filepath.Join(dst, "ro"), 0o555))
		before := digest(t, dst)
		n := 0
		commitHook = func(rel string) error {
			if n++; n == k {
				return fatalErr
			}
			return nil
		}
		_, r, _ := runCopy(t, src, dst, Options{Delete: true, Logger: testLogger(t)})
		commitHook = nil
		if n < k {
			if r.err != nil {
				t.Fatalf("copy without a failure: %v", r.err)
			}
			copyEqual(t, src, dst)
			if k < 3 {
				t.Fatalf("only %d renames: the test covers too little", n)
			}
			break
		}
		if r.err == nil || !errors.Is(r.err, fatalErr) {
			t.Fatalf("commit failing at rename %d: %v, want the injected failure", k, r.err)
		}
		if k > 1 && !strings.Contains(r.err.Error(), "put back") {
			t.Errorf("commit failing at rename %d: %v, want it to say the entries were put back", k, r.err)
		}
		if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
			t.Fatalf("commit failing at rename %d changed the destination (-before +after):\n%s", k, diff)
		}
		noStage(t, filepath.Dir(dst))
	}
}

func TestFailedCommitRollsBack(t *testing.T) { testFailedCommitRollsBack(t) }

// TestFailedCommitRollsBackAsNonRoot: the same as a normal user, whose
// read-only directories must stay movable until the renames are undone.
func TestFailedCommitRollsBackAsNonRoot(t *testing.T) {
	if asNonRoot(t, "TestFailedCommitRollsBackAsNonRoot") {
		testFailedCommitRollsBack(t)
	}
}
