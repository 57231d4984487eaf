package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

// TestCpDirectoryMergesIntoDestination pins what the README and --help
// say: a directory SRC is copied as `rsync -a SRC/ DST` copies, with or
// without a trailing slash on either side: `tether cp NODE:DIR .` puts
// DIR's contents into ., merged with what is there (no ./DIR), and
// --delete removes the rest.
func TestCpDirectoryMergesIntoDestination(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	app := filepath.Join(f.DataDir("node-0"), "app")
	os.MkdirAll(filepath.Join(app, "sub"), 0o755)
	os.WriteFile(filepath.Join(app, "a"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(app, "sub", "b"), []byte("b"), 0o644)
	for _, tc := range []struct{ src, dst string }{
		{"node-0:" + app, "."},
		{"node-0:" + app + "/", "."},
		{"node-0:" + app, "./"},
		{"node-0:" + app + "/", "./"},
	} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "keep"), []byte("k"), 0o644)
		t.Chdir(dir)
		r := runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, tc.src, tc.dst)
		if r.code != 0 {
			t.Fatalf("cp %s %s: exit %d, stderr %q", tc.src, tc.dst, r.code, r.stderr)
		}
		if got := treeOf(t, dir); !equalTrees(got, map[string]string{"keep": "k", "a": "a", "sub/b": "b"}) {
			t.Errorf("cp %s %s: . holds %v; want app's contents merged into it", tc.src, tc.dst, got)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "keep"), []byte("k"), 0o644)
	t.Chdir(dir)
	if r := runCLI(testCtx(t), nil, "", "cp", "--delete", "--nats-url", url, "node-0:"+app, "."); r.code != 0 {
		t.Fatalf("cp --delete: exit %d, stderr %q", r.code, r.stderr)
	}
	if got := treeOf(t, dir); !equalTrees(got, map[string]string{"a": "a", "sub/b": "b"}) {
		t.Errorf("cp --delete NODE:DIR .: . holds %v; want exactly app's contents", got)
	}
	// Naming the directory gets a directory of that name.
	if r := runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, "node-0:"+app, "./app"); r.code != 0 {
		t.Fatalf("cp NODE:DIR ./app: exit %d, stderr %q", r.code, r.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "app", "sub", "b")); err != nil || string(b) != "b" {
		t.Errorf("cp NODE:DIR ./app: app/sub/b = %q, %v", b, err)
	}
}

// treeOf maps the regular files under dir (slash paths) to their contents.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		m[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func equalTrees(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
