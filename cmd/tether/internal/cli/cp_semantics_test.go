package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// TestCpTypeChangeInsideTree pins the README's rule for an entry of the
// source whose destination counterpart has another type, both ways (push
// and pull): without --delete a file never replaces a non-empty directory
// (its entries would be deleted although --delete was not asked): the file
// is skipped and named, exit 23, the directory kept; a file replaced by a
// directory is (rsync -a's rule) and the summary counts it. With --delete
// the directory is replaced and its entries counted as deleted.
func TestCpTypeChangeInsideTree(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	n := 0
	dirs := func() (local, remote string) {
		n++
		local = filepath.Join(t.TempDir(), "x")
		remote = filepath.Join(f.DataDir("node-0"), "t"+strconv.Itoa(n))
		return local, remote
	}
	mk := func(src, dst string) {
		os.MkdirAll(filepath.Join(src, "f"), 0o755)
		os.WriteFile(filepath.Join(src, "f", "in"), []byte("in"), 0o644)
		os.WriteFile(filepath.Join(src, "d"), []byte("new d"), 0o644)
		os.MkdirAll(filepath.Join(dst, "d", "deep"), 0o755)
		os.WriteFile(filepath.Join(dst, "d", "deep", "precious.txt"), []byte("precious"), 0o644)
		os.WriteFile(filepath.Join(dst, "f"), []byte("old f"), 0o644)
	}
	for _, dir := range []string{"push", "pull"} {
		for _, del := range []bool{false, true} {
			local, remote := dirs()
			src, dst, srcArg, dstArg := local, remote, local, "node-0:"+remote
			if dir == "pull" {
				src, dst, srcArg, dstArg = remote, local, "node-0:"+remote, local
			}
			mk(src, dst)
			args := []string{"cp", "--nats-url", url}
			if del {
				args = append(args, "--delete")
			}
			r := runCLI(testCtx(t), nil, "", append(args, srcArg, dstArg)...)
			name := fmt.Sprintf("%s delete=%v", dir, del)
			got := treeOf(t, dst)
			if !del {
				if r.code != exitPartial || !strings.Contains(r.stderr, "tether: cp: skipped "+srcArg+"/d: ") || !strings.Contains(r.stderr, "--delete") {
					t.Errorf("%s: exit %d, stderr %q; want 23 and d named as skipped", name, r.code, r.stderr)
				}
				if want := map[string]string{"d/deep/precious.txt": "precious", "f/in": "in"}; !equalTrees(got, want) {
					t.Errorf("%s: destination holds %v, want %v", name, got, want)
				}
				if !strings.Contains(r.stderr, "0 deleted, 1 replaced by another type") {
					t.Errorf("%s: stderr %q; want the summary to count f's replacement", name, r.stderr)
				}
				continue
			}
			if r.code != 0 {
				t.Errorf("%s: exit %d, stderr %q", name, r.code, r.stderr)
			}
			if want := map[string]string{"d": "new d", "f/in": "in"}; !equalTrees(got, want) {
				t.Errorf("%s: destination holds %v, want %v", name, got, want)
			}
			if !strings.Contains(r.stderr, "2 deleted, 2 replaced by another type") {
				t.Errorf("%s: stderr %q; want d's entries counted as deleted and d and f as replaced", name, r.stderr)
			}
		}
	}
}
