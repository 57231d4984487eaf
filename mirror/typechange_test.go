package mirror

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTypeChangeInsideTree pins the rule for a source entry whose
// destination counterpart is of another type, inside the tree, as rsync -a
// has it: without Delete a non-empty directory is never removed to make
// room for a file or symlink (that would delete entries the source lacks):
// the source entry is skipped and named, the directory kept whole; an
// empty directory, a file or a symlink is replaced, and counted as
// replaced. With Delete the non-empty directory goes, its entries counted
// as deleted.
func TestTypeChangeInsideTree(t *testing.T) {
	setup := func(t *testing.T) (src, dst string) {
		src, dst = filepath.Join(t.TempDir(), "src"), filepath.Join(t.TempDir(), "dst")
		fatalIf(t, os.MkdirAll(filepath.Join(src, "f"), 0o755))
		fatalIf(t, os.WriteFile(filepath.Join(src, "f", "in"), []byte("in"), 0o644))
		fatalIf(t, os.WriteFile(filepath.Join(src, "d"), []byte("new d"), 0o644))
		fatalIf(t, os.WriteFile(filepath.Join(src, "e"), []byte("new e"), 0o644))
		fatalIf(t, os.Symlink("target", filepath.Join(src, "l")))
		fatalIf(t, os.MkdirAll(filepath.Join(dst, "d", "deep"), 0o755))
		fatalIf(t, os.WriteFile(filepath.Join(dst, "d", "deep", "precious.txt"), []byte("precious"), 0o644))
		fatalIf(t, os.MkdirAll(filepath.Join(dst, "e"), 0o755))
		fatalIf(t, os.WriteFile(filepath.Join(dst, "f"), []byte("old f"), 0o644))
		fatalIf(t, os.WriteFile(filepath.Join(dst, "l"), []byte("old l"), 0o644))
		return src, dst
	}
	t.Run("without delete", func(t *testing.T) {
		src, dst := setup(t)
		res, _ := mustCopy(t, src, dst, Options{})
		if b, err := os.ReadFile(filepath.Join(dst, "d", "deep", "precious.txt")); err != nil || string(b) != "precious" {
			t.Errorf("d/deep/precious.txt = %q, %v; want it kept: the source's file d must not replace a non-empty directory without Delete", b, err)
		}
		if res.Skipped != 1 || len(res.SkippedEntries) != 1 || res.SkippedEntries[0].Path != "d" || res.SkippedEntries[0].Reason == "" {
			t.Errorf("skipped %d %+v; want d, with a reason", res.Skipped, res.SkippedEntries)
		}
		if res.Deleted != 0 {
			t.Errorf("deleted %d, want 0 without Delete", res.Deleted)
		}
		if b, err := os.ReadFile(filepath.Join(dst, "e")); err != nil || string(b) != "new e" {
			t.Errorf("e = %q, %v; want the source's file in place of the empty directory", b, err)
		}
		if b, err := os.ReadFile(filepath.Join(dst, "f", "in")); err != nil || string(b) != "in" {
			t.Errorf("f/in = %q, %v; want the source's directory in place of the file", b, err)
		}
		if l, err := os.Readlink(filepath.Join(dst, "l")); err != nil || l != "target" {
			t.Errorf("l -> %q, %v; want the source's symlink in place of the file", l, err)
		}
		if res.Replaced != 3 {
			t.Errorf("replaced %d, want 3 (e, f, l)", res.Replaced)
		}
		noStage(t, filepath.Dir(dst))
	})
	t.Run("with delete", func(t *testing.T) {
		src, dst := setup(t)
		res, _ := mustCopy(t, src, dst, Options{Delete: true})
		copyEqual(t, src, dst)
		if res.Skipped != 0 || res.Replaced != 4 || res.Deleted != 2 {
			t.Errorf("skipped %d, replaced %d, deleted %d; want 0, 4 (d, e, f, l) and 2 (d/deep, d/deep/precious.txt)", res.Skipped, res.Replaced, res.Deleted)
		}
	})
	t.Run("strict", func(t *testing.T) {
		src, dst := setup(t)
		before := digest(t, dst)
		_, r, _ := runCopy(t, src, dst, Options{Strict: true})
		if r.err == nil {
			t.Fatalf("strict copy replacing a non-empty directory by a file succeeded")
		}
		if got := digest(t, dst); len(got) != len(before) {
			t.Errorf("strict copy that failed changed the destination")
		}
	})
}
