//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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

// heapStats are an agent's Go heap figures from its /metrics, in bytes.
type heapStats struct {
	live  uint64 // what the last collection found live (go_gc_heap_live_bytes)
	inuse uint64 // heap spans in use: live objects and garbage not yet swept
	sys   uint64 // heap address space from the OS; it never shrinks
}

// heapMetrics are the metrics agentHeap reads, by where they go.
func (h *heapStats) metrics() map[string]*uint64 {
	return map[string]*uint64{
		"go_gc_heap_live_bytes":        &h.live,
		"go_memstats_heap_inuse_bytes": &h.inuse,
		"go_memstats_heap_sys_bytes":   &h.sys,
	}
}

// agentHeap reads the heap figures from the /metrics at metricsAddr.
func agentHeap(metricsAddr string) (heapStats, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+metricsAddr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return heapStats{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return heapStats{}, err
	}
	var h heapStats
	want := h.metrics()
	for _, line := range strings.Split(string(body), "\n") {
		name, v, ok := strings.Cut(line, " ")
		dst := want[name]
		if !ok || dst == nil {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return heapStats{}, fmt.Errorf("%s at %s: %q: %v", name, metricsAddr, v, err)
		}
		*dst = uint64(f)
		delete(want, name)
	}
	for name := range want {
		return heapStats{}, fmt.Errorf("metrics at %s lack %s", metricsAddr, name)
	}
	return h, nil
}

// heapPeak is what sampleHeap saw.
type heapPeak struct {
	first, peak heapStats // peak: the greatest of each figure
	samples     int
	err         error // the first failed sample
}

// sampleHeap samples the agent's heap every 20 ms until stop is called,
// which takes one last sample and returns the peaks. The live heap changes
// only when a collection ends, and holds until the next; an in-use peak
// between two samples can be missed (by less than a cycle's growth); the
// heap's address space (sys) only grows.
func sampleHeap(metricsAddr string) (stop func() heapPeak) {
	var p heapPeak
	take := func() {
		h, err := agentHeap(metricsAddr)
		if err != nil {
			if p.err == nil {
				p.err = err
			}
			return
		}
		if p.samples == 0 {
			p.first = h
		}
		p.samples++
		p.peak.live = max(p.peak.live, h.live)
		p.peak.inuse = max(p.peak.inuse, h.inuse)
		p.peak.sys = max(p.peak.sys, h.sys)
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			take()
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() heapPeak {
		close(done)
		<-finished
		take()
		return p
	}
}

// peakRSSKiB reads a process's peak resident set (VmHWM), for the log
// only: it counts the binary's pages, the runtime and stacks as well, and
// a loaded machine moves it.
func peakRSSKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return -1
}

const mib = 1 << 20

// Bounds on the agent's heap while it receives 1 GiB (TestCopyEndToEnd).
// What it holds for a copy is the stream's receive window (16 MiB,
// tunnel.DefaultConfig) and the mirror's fixed buffers. A disk slower than
// the network (a loaded machine) fills the window, which yamux keeps in a
// bytes.Buffer that doubles as it fills: up to 32 MiB, with the old 16 MiB
// still live while it is copied. Hence at most about 52 MiB live, whatever
// the load; the file itself (1 GiB) is never held. The heap in use also
// counts garbage, up to as much again before the collector runs (GOGC=100).
const (
	maxCopyHeapLive  = 64 * mib
	maxCopyHeapInuse = 2 * maxCopyHeapLive
)

func TestCopyEndToEnd(t *testing.T) {
	top := t // processes started in subtests but used after them belong here
	f := startFleet(t)
	root := t.TempDir()
	// The agent is built without -race: the race detector's allocations
	// would swamp the heap bound this test checks.
	plain := plainBinary(t)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agent := f.startAgentBin(t, plain, "e2e-copy", "role=copy", f.tokenFile, "--copy-root", root, "--metrics-addr", metricsAddr)
	f.waitNodes(t, "e2e-copy")

	t.Run("1 GiB with bounded agent memory", func(t *testing.T) {
		if testing.Short() {
			t.Skip("copies 1 GiB")
		}
		needDisk(t, 4<<30)
		src, srcHash := copySource(t, 1<<30)
		dst := filepath.Join(root, "big")
		start := time.Now()
		// What the agent buffers is on its Go heap: sampled through the
		// copy, it must stay a small fraction of the 1 GiB it moves. (Its
		// RSS also counts the binary, the runtime and stacks, and moves
		// with the machine's load; it is logged, not checked.)
		stop := sampleHeap(metricsAddr)
		_, errOut, code := runCLIWithin(t, bulkTimeout, f.natsURL, "", "cp", src, "e2e-copy:"+dst)
		heap := stop()
		if code != 0 {
			t.Fatalf("cp: code %d: %s", code, errOut)
		}
		t.Logf("copied 1 GiB in %v", time.Since(start).Round(time.Millisecond))
		if treeHash(t, dst) != srcHash {
			t.Fatal("copied tree differs from the source")
		}
		t.Logf("agent heap during the 1 GiB copy (%d samples), before → peak: live %.1f → %.1f MiB, in use %.1f → %.1f MiB, reserved %.1f → %.1f MiB; peak RSS %.1f MiB",
			heap.samples, float64(heap.first.live)/mib, float64(heap.peak.live)/mib,
			float64(heap.first.inuse)/mib, float64(heap.peak.inuse)/mib,
			float64(heap.first.sys)/mib, float64(heap.peak.sys)/mib, float64(peakRSSKiB(agent.cmd.Process.Pid))/1024)
		if heap.err != nil {
			t.Fatalf("sampling the agent's heap: %v", heap.err)
		}
		if heap.samples < 2 {
			t.Fatalf("%d heap samples, want at least one during the copy and one after", heap.samples)
		}
		if heap.peak.live > maxCopyHeapLive {
			t.Errorf("agent's live heap peaked at %.1f MiB during a 1 GiB copy, want under %d MiB", float64(heap.peak.live)/mib, maxCopyHeapLive/mib)
		}
		if heap.peak.inuse > maxCopyHeapInuse {
			t.Errorf("agent's heap in use peaked at %.1f MiB during a 1 GiB copy, want under %d MiB", float64(heap.peak.inuse)/mib, maxCopyHeapInuse/mib)
		}
		os.RemoveAll(dst)
	})

	t.Run("agent killed mid-copy leaves the old tree intact", func(t *testing.T) {
		needDisk(t, 1<<30)
		dst := filepath.Join(root, "tree")
		old := filepath.Join(t.TempDir(), "old")
		os.MkdirAll(filepath.Join(old, "sub"), 0o755)
		os.WriteFile(filepath.Join(old, "keep.txt"), []byte("old contents\n"), 0o644)
		os.WriteFile(filepath.Join(old, "sub", "x"), []byte("x"), 0o600)
		if _, errOut, code := runCLI(t, f.natsURL, "", "cp", old, "e2e-copy:"+dst); code != 0 {
			t.Fatalf("seed copy: %s", errOut)
		}
		before := treeHash(t, dst)

		// Large enough that the kill (once half the bytes were sent)
		// lands mid-copy: 128 MiB short of the end, far more than the
		// stream's window holds. More proves nothing more, and each GiB
		// costs minutes at load 30.
		src, srcHash := copySource(t, 256<<20)
		ctx, cancel := context.WithTimeout(context.Background(), bulkTimeout)
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
		agent = f.startAgentBin(top, plain, "e2e-copy", "role=copy", f.tokenFile, "--copy-root", root, "--metrics-addr", metricsAddr)
		f.waitNodes(t, "e2e-copy")
		if _, errOut, code := runCLIWithin(t, bulkTimeout, f.natsURL, "", "cp", "--delete", src, "e2e-copy:"+dst); code != 0 {
			t.Fatalf("copy after restart: code %d: %s", code, errOut)
		}
		if treeHash(t, dst) != srcHash {
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

// copySource makes a directory holding a file "big" of size bytes and a
// small "keep.txt", and returns it with its treeHash. The big file's
// 1 MiB blocks are one random block, each stamped with its index: unlike
// mirrortest.WriteRandom's stream it costs no CPU to speak of (a race-built
// ChaCha8 stream took minutes per GiB at load 30), and no two blocks are
// alike.
func copySource(t *testing.T, size int64) (src, hash string) {
	t.Helper()
	start := time.Now()
	src = filepath.Join(t.TempDir(), "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(src, "big"))
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{1}).Read(block)
	for i := int64(0); i*int64(len(block)) < size; i++ {
		binary.LittleEndian.PutUint64(block, uint64(i))
		if _, err := f.Write(block[:min(int64(len(block)), size-i*int64(len(block)))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "keep.txt"), []byte("new contents\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hash = treeHash(t, src)
	t.Logf("made and hashed a %d MiB source in %v", size>>20, time.Since(start).Round(time.Millisecond))
	return src, hash
}

// waitProgress reads a progress stream until a percentage ≥ pct shows.
func waitProgress(t *testing.T, r io.Reader, pct float64) {
	t.Helper()
	buf := make([]byte, 4096)
	var acc []byte
	deadline := time.Now().Add(bulkTimeout)
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
	cmd.Env = append(os.Environ(), natsEnv(natsURL)...)
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
