package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// foreignDir makes a root-owned 0777 directory under the test user's base
// (a shared directory such as /tmp/play/...: the user may write in it, but
// not change it) and returns it with its mode and mtime.
func foreignDir(t *testing.T, u *testUser, name string) (string, os.FileInfo) {
	t.Helper()
	dd := filepath.Join(u.base, name)
	if err := os.Mkdir(dd, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dd, 0o777) // past the umask
	fi, err := os.Stat(dd)
	if err != nil {
		t.Fatal(err)
	}
	return dd, fi
}

// TestCopyAsUserIntoForeignDirectory: a push as another account onto an
// existing directory that account does not own (root's, mode 0777)
// succeeds, as `cp -r src/. dd/` does as that user: the files land inside,
// and the directory keeps its mode and owner, which only its owner may
// change (fresh21: the copy landed, then failed with `entry ".": chmod:
// operation not permitted` in the agent's log and a bare stream end on the
// client, exit 255). A file pushed into it (`tether cp FILE NODE:dd`) too.
func TestCopyAsUserIntoForeignDirectory(t *testing.T) {
	u := newTestUser(t)
	h := newHarness(t, withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\ncopy_roots: [%s]\n", u.name, u.base)))
	dd, before := foreignDir(t, u, "dd")
	src := t.TempDir()
	writeTree(t, src, map[string]string{"e1": "one", "sub/e2": "two"})
	os.Chmod(src, 0o755)

	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dd, User: u.name})
	res, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{})
	if err != nil || res.FilesWritten != 2 {
		t.Fatalf("push of a tree onto root's 0777 directory as %s: %+v, %v; want it copied", u.name, res, err)
	}
	if got := readTree(t, dd); !equalMaps(got, map[string]string{"e1": "one", "sub/e2": "two"}) {
		t.Errorf("the directory holds %v", got)
	}
	if uid := statUID(mustStat(t, filepath.Join(dd, "e1"))); uid != u.uid {
		t.Errorf("e1 is owned by uid %d, want %d", uid, u.uid)
	}
	after := mustStat(t, dd)
	if after.Mode() != before.Mode() || statUID(after) != 0 {
		t.Errorf("the directory is %v (uid %d) after the copy; want it left %v, root's", after.Mode(), statUID(after), before.Mode())
	}

	// A file into it.
	file := filepath.Join(t.TempDir(), "e3")
	os.WriteFile(file, []byte("three"), 0o640)
	s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dd, User: u.name})
	if res, err := mirror.Send(copyCtx(t), file, s.st, mirror.Options{}); err != nil || res.FilesWritten != 1 {
		t.Fatalf("push of a file into root's 0777 directory as %s: %+v, %v", u.name, res, err)
	}
	if b, err := os.ReadFile(filepath.Join(dd, "e3")); err != nil || string(b) != "three" {
		t.Errorf("dd/e3: %q, %v", b, err)
	}
	if after := mustStat(t, dd); after.Mode() != before.Mode() || statUID(after) != 0 {
		t.Errorf("the directory is %v (uid %d) after the file's copy; want %v, root's", after.Mode(), statUID(after), before.Mode())
	}
	noTempEntries(t, dd)
}

// TestCopyAsUserCommitFailureReachesClient: a failure of the commit past
// its point of no return (the new tree in place, but a kept file's mode
// cannot be set: root owns it) reaches the client as an error frame
// (copy_failed, `tether cp`'s exit 1) naming the entry and the errno, not as
// a stream that ends before the copy did (the agent only logged it).
func TestCopyAsUserCommitFailureReachesClient(t *testing.T) {
	u := newTestUser(t)
	h := newHarness(t, withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\ncopy_roots: [%s]\n", u.name, u.base)))
	dd, _ := foreignDir(t, u, "dd")
	// Root's file, with the content the source has and another mode: with
	// --checksum it is kept and only its mode set, which root's file
	// refuses to the user.
	os.WriteFile(filepath.Join(dd, "same"), []byte("same"), 0o666)
	os.Chmod(filepath.Join(dd, "same"), 0o666)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"same": "same", "new": "n"})
	os.Chmod(src, 0o755)

	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dd, User: u.name, Checksum: true})
	_, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{Checksum: true})
	var pe *mirror.PeerError
	if !errors.As(err, &pe) {
		t.Fatalf("push whose commit fails past its point of no return: %v; want the agent's error frame", err)
	}
	if pe.Info.Code != protocol.CodeCopyFailed || !strings.Contains(pe.Info.Message, `entry "same"`) ||
		!strings.Contains(pe.Info.Message, "operation not permitted") || !strings.Contains(pe.Info.Message, "the new tree is in place") {
		t.Errorf("error frame %+v; want copy_failed naming entry \"same\", the errno and that the new tree is in place", pe.Info)
	}
	if got := readTree(t, dd); !equalMaps(got, map[string]string{"same": "same", "new": "n"}) {
		t.Errorf("the directory holds %v; want the new tree", got)
	}
}

func mustStat(t *testing.T, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// noTempEntries fails if dir holds a copy's temporary entry or stage.
func noTempEntries(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tether-") {
			t.Errorf("%s holds %s", dir, e.Name())
		}
	}
}
