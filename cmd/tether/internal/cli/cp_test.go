package cli

import (
	"bytes"
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

func TestParseCopyEnd(t *testing.T) {
	for _, tt := range []struct {
		in         string
		node, path string
		bad        bool
	}{
		{in: "./dir", path: "./dir"},
		{in: "/abs/x", path: "/abs/x"},
		{in: "node-a:/srv/x", node: "node-a", path: "/srv/x"},
		{in: "node-a:/srv/x/../y", node: "node-a", path: "/srv/y"},
		{in: "./a:b", path: "./a:b"},
		{in: "dir/a:b", path: "dir/a:b"},
		{in: "node-a:relative", bad: true},
		{in: "bad node:/x", bad: true},
		{in: "", bad: true},
	} {
		got, err := parseCopyEnd(tt.in)
		if (err != nil) != tt.bad || (!tt.bad && (got.node != tt.node || got.path != tt.path)) {
			t.Errorf("parseCopyEnd(%q) = %+v, %v", tt.in, got, err)
		}
	}
}

func TestCpUsage(t *testing.T) {
	for _, args := range [][]string{
		{"cp", "a", "b"},
		{"cp", "n1:/a", "n2:/b"},
		{"cp", "only-one"},
		{"cp", "--progress", "sometimes", "a", "n:/b"},
	} {
		if r := runCLI(testCtx(t), nil, "", args...); r.code != 2 {
			t.Errorf("%v: code %d (%s), want usage error 2", args, r.code, r.stderr)
		}
	}
}

func TestCpFleet(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	root := f.DataDir("node-0")

	src := filepath.Join(t.TempDir(), "src")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	big := make([]byte, 3<<20)
	rand.Read(big)
	os.WriteFile(filepath.Join(src, "big.bin"), big, 0o640)
	os.WriteFile(filepath.Join(src, "sub", "a.txt"), []byte("a\n"), 0o600)
	os.Symlink("sub/a.txt", filepath.Join(src, "link"))

	remote := filepath.Join(root, "dst")
	os.MkdirAll(remote, 0o755)
	os.WriteFile(filepath.Join(remote, "extra"), []byte("x"), 0o644)

	r := runCLI(testCtx(t), nil, "", "cp", "--delete", "--nats-url", url, src, "node-0:"+remote)
	if r.code != 0 || !strings.Contains(r.stderr, "2 files written") {
		t.Fatalf("push: code %d stderr %q", r.code, r.stderr)
	}
	if got, _ := os.ReadFile(filepath.Join(remote, "big.bin")); !bytes.Equal(got, big) {
		t.Fatal("big.bin differs after push")
	}
	if _, err := os.Stat(filepath.Join(remote, "extra")); !os.IsNotExist(err) {
		t.Fatalf("--delete kept the extra file: %v", err)
	}
	if l, _ := os.Readlink(filepath.Join(remote, "link")); l != "sub/a.txt" {
		t.Fatalf("symlink = %q", l)
	}
	if fi, _ := os.Stat(filepath.Join(remote, "sub", "a.txt")); fi == nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode not kept: %v", fi)
	}

	// A second push sends nothing.
	r = runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, src, "node-0:"+remote)
	if r.code != 0 || !strings.Contains(r.stderr, "0 files written") {
		t.Fatalf("re-push: code %d stderr %q", r.code, r.stderr)
	}

	// Pull it back.
	back := filepath.Join(t.TempDir(), "back")
	r = runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, "node-0:"+remote, back)
	if r.code != 0 {
		t.Fatalf("pull: code %d stderr %q", r.code, r.stderr)
	}
	if got, _ := os.ReadFile(filepath.Join(back, "big.bin")); !bytes.Equal(got, big) {
		t.Fatal("big.bin differs after pull")
	}

	// A file onto a directory lands inside it (push and pull), never
	// replacing the directory.
	one := filepath.Join(t.TempDir(), "one.txt")
	os.WriteFile(one, []byte("one\n"), 0o644)
	r = runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, one, "node-0:"+remote)
	if r.code != 0 || !strings.Contains(r.stderr, "1 file written") {
		t.Fatalf("file onto remote dir: code %d stderr %q", r.code, r.stderr)
	}
	if got, _ := os.ReadFile(filepath.Join(remote, "one.txt")); string(got) != "one\n" {
		t.Fatalf("file onto remote dir: %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(remote, "big.bin")); !bytes.Equal(got, big) {
		t.Fatal("file onto remote dir changed the directory's other files")
	}
	r = runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, one, "node-0:"+filepath.Join(root, "newdir")+"/")
	if got, _ := os.ReadFile(filepath.Join(root, "newdir", "one.txt")); r.code != 0 || string(got) != "one\n" {
		t.Fatalf("file into new remote dir/: code %d stderr %q content %q", r.code, r.stderr, got)
	}
	r = runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, "node-0:"+filepath.Join(remote, "one.txt"), back)
	if got, _ := os.ReadFile(filepath.Join(back, "one.txt")); r.code != 0 || string(got) != "one\n" {
		t.Fatalf("pull file onto local dir: code %d stderr %q content %q", r.code, r.stderr, got)
	}
	if got, _ := os.ReadFile(filepath.Join(back, "big.bin")); !bytes.Equal(got, big) {
		t.Fatal("pulling a file onto a local dir replaced the directory")
	}

	// An unknown node: the coordinator's reason once, with its code.
	r = runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, one, "nosuch:/x")
	if r.code != 255 || strings.Count(r.stderr, "tether:") != 1 || !strings.Contains(r.stderr, "(unknown_node)") {
		t.Fatalf("unknown node: code %d stderr %q", r.code, r.stderr)
	}

	// Outside the agent's copy roots: refused, nothing written.
	outside := filepath.Join(t.TempDir(), "outside")
	r = runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, src, "node-0:"+outside)
	// The node's own reason is shown, without the local layers it
	// travelled through.
	if r.code != 1 || !strings.Contains(r.stderr, outside) || !strings.Contains(r.stderr, "not under a copy root") || strings.Contains(r.stderr, "mirror:") {
		t.Fatalf("outside roots: code %d stderr %q", r.code, r.stderr)
	}
	if _, err := os.Stat(outside); !os.IsNotExist(err) {
		t.Fatalf("refused copy created %s", outside)
	}
}

// TestCpIntoWorkingDirectory is `tether cp NODE:DIR .`: the current
// directory keeps its identity, so the shell is not left in a deleted
// directory, and the next copy works too.
func TestCpIntoWorkingDirectory(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	remote := filepath.Join(f.DataDir("node-0"), "dir")
	os.MkdirAll(filepath.Join(remote, "sub"), 0o755)
	os.WriteFile(filepath.Join(remote, "sub", "a"), []byte("a"), 0o644)
	cwd := filepath.Join(t.TempDir(), "work")
	os.MkdirAll(cwd, 0o755)
	before, _ := os.Stat(cwd)
	t.Chdir(cwd)
	for i := range 2 {
		r := runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, "node-0:"+remote, ".")
		if r.code != 0 {
			t.Fatalf("pull %d into .: code %d stderr %q", i, r.code, r.stderr)
		}
		if _, err := os.Getwd(); err != nil {
			t.Fatalf("pull %d into .: the current directory is gone: %v", i, err)
		}
		if b, err := os.ReadFile(filepath.Join("sub", "a")); err != nil || string(b) != "a" {
			t.Fatalf("pull %d into .: sub/a = %q, %v", i, b, err)
		}
	}
	if after, err := os.Stat(cwd); err != nil || !os.SameFile(before, after) {
		t.Fatalf("%s was replaced by the pull (%v)", cwd, err)
	}
}

// TestCpPartialExitCode copies a tree holding entries a copy cannot carry
// (a named pipe, a socket): they are named, the rest is copied, and the
// exit code is 23 (rsync's "partial transfer"), both ways. With --strict
// nothing changes and the copy fails.
func TestCpPartialExitCode(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	root := f.DataDir("node-0")
	mkTree := func(dir string) {
		os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
		os.WriteFile(filepath.Join(dir, "ok.txt"), []byte("ok"), 0o644)
		os.WriteFile(filepath.Join(dir, "sub", "b"), []byte("b"), 0o644)
		if err := syscall.Mkfifo(filepath.Join(dir, "sub", "fifo"), 0o644); err != nil {
			t.Fatal(err)
		}
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "sock"), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
	}
	local := filepath.Join(t.TempDir(), "src")
	mkTree(local)
	remote := filepath.Join(root, "src")
	mkTree(remote)

	check := func(what string, r result, dst string) {
		t.Helper()
		if r.code != 23 {
			t.Errorf("%s: code %d, want 23 (partial); stderr %q", what, r.code, r.stderr)
		}
		for _, name := range []string{"sub/fifo", "sock"} {
			if !strings.Contains(r.stderr, name) {
				t.Errorf("%s: stderr %q does not name the skipped %s", what, r.stderr, name)
			}
		}
		for _, p := range []string{"ok.txt", "sub/b"} {
			if _, err := os.Stat(filepath.Join(dst, p)); err != nil {
				t.Errorf("%s: %s was not copied: %v", what, p, err)
			}
		}
	}
	pushed := filepath.Join(root, "pushed")
	check("push", runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, local, "node-0:"+pushed), pushed)
	pulled := filepath.Join(t.TempDir(), "pulled")
	check("pull", runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, "node-0:"+remote, pulled), pulled)

	// --strict: all or nothing.
	strictPush := filepath.Join(root, "strict")
	r := runCLI(testCtx(t), nil, "", "cp", "--strict", "--nats-url", url, local, "node-0:"+strictPush)
	if r.code == 0 || r.code == 23 || r.code == 2 || !strings.Contains(r.stderr, "sub/fifo") {
		t.Errorf("strict push: code %d stderr %q, want a failure naming sub/fifo", r.code, r.stderr)
	}
	if _, err := os.Lstat(strictPush); !os.IsNotExist(err) {
		t.Errorf("a failed strict push created %s (%v)", strictPush, err)
	}
	strictPull := filepath.Join(t.TempDir(), "strict")
	r = runCLI(testCtx(t), nil, "", "cp", "--strict", "--nats-url", url, "node-0:"+remote, strictPull)
	if r.code == 0 || r.code == 23 || r.code == 2 || !strings.Contains(r.stderr, "sub/fifo") {
		t.Errorf("strict pull: code %d stderr %q, want a failure naming sub/fifo", r.code, r.stderr)
	}
	if _, err := os.Lstat(strictPull); !os.IsNotExist(err) {
		t.Errorf("a failed strict pull created %s (%v)", strictPull, err)
	}
}
