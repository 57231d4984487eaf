//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/mirror/mirrortest"
)

// treeHash hashes every path, mode, symlink target and file content under
// root, so two calls agree only if nothing changed.
func treeHash(t *testing.T, root string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fmt.Fprintf(h, "%s %v %d\n", rel, fi.Mode(), fi.Size())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			fmt.Fprintln(h, l)
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			io.Copy(h, f)
			f.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// peakRSSKiB reads a process's peak resident set (VmHWM).
func peakRSSKiB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

func TestCopyEndToEnd(t *testing.T) {
	top := t // processes started in subtests but used after them belong here
	f := startFleet(t)
	root := t.TempDir()
	// The agent is built without -race: the race detector's shadow memory
	// would swamp the RSS bound this test checks.
	plain := plainBinary(t)
	agent := f.startAgentBin(t, plain, "e2e-copy", "role=copy", f.tokenFile, "--copy-root", root)
	f.waitNodes(t, "e2e-copy")

	t.Run("1 GiB with bounded agent memory", func(t *testing.T) {
		if testing.Short() {
			t.Skip("copies 1 GiB")
		}
		needDisk(t, 4<<30)
		src := mirrortest.BigFileSource(t, 1<<30)
		dst := filepath.Join(root, "big")
		_, errOut, code := runCLI(t, f.natsURL, "", "cp", src, "e2e-copy:"+dst)
		if code != 0 {
			t.Fatalf("cp: code %d: %s", code, errOut)
		}
		if got, want := treeHash(t, dst), treeHash(t, src); got != want {
			t.Fatal("copied tree differs from the source")
		}
		if rss := peakRSSKiB(t, agent.cmd.Process.Pid); rss > 64<<10 {
			t.Fatalf("agent peak RSS %d KiB during a 1 GiB copy, want under 64 MiB", rss)
		}
		os.RemoveAll(dst)
	})

	t.Run("agent killed mid-copy leaves the old tree intact", func(t *testing.T) {
		needDisk(t, 4<<30)
		dst := filepath.Join(root, "tree")
		old := filepath.Join(t.TempDir(), "old")
		os.MkdirAll(filepath.Join(old, "sub"), 0o755)
		os.WriteFile(filepath.Join(old, "keep.txt"), []byte("old contents\n"), 0o644)
		os.WriteFile(filepath.Join(old, "sub", "x"), []byte("x"), 0o600)
		if _, errOut, code := runCLI(t, f.natsURL, "", "cp", old, "e2e-copy:"+dst); code != 0 {
			t.Fatalf("seed copy: %s", errOut)
		}
		before := treeHash(t, dst)

		src := mirrortest.BigFileSource(t, 1<<30)
		os.WriteFile(filepath.Join(src, "keep.txt"), []byte("new contents\n"), 0o644)
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		cmd := cliCommand(ctx, f.natsURL, "cp", "--delete", "--progress", "always", src, "e2e-copy:"+dst)
		var stderr bytes.Buffer
		pr, pw := io.Pipe()
		cmd.Stderr = io.MultiWriter(&stderr, pw)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill the agent once the progress line passes half the bytes.
		waitProgress(t, pr, 50)
		agent.cmd.Process.Kill()
		<-agent.done
		err := cmd.Wait()
		pw.Close()
		if err == nil {
			t.Fatalf("cp succeeded although its agent was killed: %s", stderr.String())
		}
		if got := treeHash(t, dst); got != before {
			t.Fatal("the destination changed although the copy did not finish")
		}
		// A restarted agent copies it whole and removes the stale stage.
		agent = f.startAgentBin(top, plain, "e2e-copy", "role=copy", f.tokenFile, "--copy-root", root)
		f.waitNodes(t, "e2e-copy")
		if _, errOut, code := runCLI(t, f.natsURL, "", "cp", "--delete", src, "e2e-copy:"+dst); code != 0 {
			t.Fatalf("copy after restart: %s", errOut)
		}
		if got, want := treeHash(t, dst), treeHash(t, src); got != want {
			t.Fatal("copy after restart differs from the source")
		}
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tether-stage-") || strings.HasPrefix(e.Name(), ".tether-tmp-") {
				t.Errorf("stale stage %s left in %s", e.Name(), root)
			}
		}
	})

	t.Run("traversal outside the copy root is refused", func(t *testing.T) {
		src := t.TempDir()
		os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
		outside := filepath.Join(t.TempDir(), "victim")
		for _, dst := range []string{outside, root + "/../escape", "/etc/tether-e2e"} {
			_, errOut, code := runCLI(t, f.natsURL, "", "cp", src, "e2e-copy:"+dst)
			if code == 0 {
				t.Errorf("cp to %s succeeded", dst)
			}
			if !strings.Contains(errOut, "copy root") {
				t.Errorf("cp to %s: error %q does not say it is outside the copy roots", dst, errOut)
			}
		}
		if _, err := os.Stat(outside); err == nil {
			t.Fatal("a refused copy created its destination")
		}
	})
}

// waitProgress reads a progress stream until a percentage ≥ pct shows.
func waitProgress(t *testing.T, r io.Reader, pct float64) {
	t.Helper()
	buf := make([]byte, 4096)
	var acc []byte
	deadline := time.Now().Add(defaultTestTimeout)
	for time.Now().Before(deadline) {
		n, err := r.Read(buf)
		acc = append(acc, buf[:n]...)
		for _, line := range strings.FieldsFunc(string(acc), func(r rune) bool { return r == '\r' || r == '\n' }) {
			for _, w := range strings.Fields(line) {
				if v, ok := strings.CutSuffix(w, "%"); ok {
					if p, err := strconv.ParseFloat(v, 64); err == nil && p >= pct {
						go io.Copy(io.Discard, r)
						return
					}
				}
			}
		}
		if err != nil {
			t.Fatalf("progress ended before %v%%: %s", pct, acc)
		}
	}
	t.Fatalf("no progress past %v%%: %s", pct, acc)
}

var (
	plainOnce sync.Once
	plainBin  string
	plainErr  error
)

// plainBinary builds tether without the race detector, once per test run.
func plainBinary(t *testing.T) string {
	t.Helper()
	plainOnce.Do(func() {
		plainBin = filepath.Join(filepath.Dir(*tetherBin), "tether-plain")
		out, err := exec.Command("go", "build", "-o", plainBin, "../cmd/tether").CombinedOutput()
		if err != nil {
			plainErr = fmt.Errorf("build plain tether: %v: %s", err, out)
		}
	})
	if plainErr != nil {
		t.Fatal(plainErr)
	}
	return plainBin
}

func (f *fleet) startAgentBin(t *testing.T, bin, id, labels, tokenFile string, extra ...string) *proc {
	return startBin(t, bin, "agent-"+id, append([]string{"agent", "--coordinator", f.tunnelAddr, "--token-file", tokenFile,
		"--ca-file", filepath.Join(f.dataDir, "pki", "ca.crt"), "--node-id", id, "--labels", labels,
		"--data-dir", t.TempDir()}, extra...)...)
}

// cliCommand prepares the tether CLI with TETHER_NATS_URL set.
func cliCommand(ctx context.Context, natsURL string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, *tetherBin, args...)
	cmd.Env = append(os.Environ(), "TETHER_NATS_URL="+natsURL)
	return cmd
}

// needDisk skips a test that needs bytes of free space in the temp dir,
// saying so, rather than failing it on a full disk.
func needDisk(t *testing.T, bytes uint64) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(os.TempDir(), &st); err != nil {
		return
	}
	if free := st.Bavail * uint64(st.Bsize); free < bytes {
		t.Skipf("needs %d MiB free in %s, has %d MiB", bytes>>20, os.TempDir(), free>>20)
	}
}
