// Package mirrortest builds copy sources and the rsync baseline for the copy
// benchmarks of mirror and fleettest. Only tests and benchmarks import it.
package mirrortest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// WriteRandom writes size bytes of seeded random data to path.
func WriteRandom(tb testing.TB, path string, size int64) {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	r := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		r.Read(buf)
		if _, err := f.Write(buf[:min(int64(len(buf)), left)]); err != nil {
			tb.Fatal(err)
		}
	}
}

// BigFileSource returns a directory holding one file of size bytes.
func BigFileSource(tb testing.TB, size int64) string {
	src := filepath.Join(tb.TempDir(), "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		tb.Fatal(err)
	}
	WriteRandom(tb, filepath.Join(src, "big"), size)
	return src
}

// TreeSource returns a directory of dirs×files files of size bytes each.
func TreeSource(tb testing.TB, dirs, files, size int) string {
	src := filepath.Join(tb.TempDir(), "src")
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, size)
	for d := range dirs {
		dir := filepath.Join(src, fmt.Sprintf("d%03d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		for f := range files {
			for i := range buf {
				buf[i] = byte(r.Uint32())
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", f)), buf, 0o644); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return src
}

// Rsyncd runs an rsync daemon serving dir as module "mod" on a free loopback
// port until the test ends, and returns the module's URL
// ("rsync://127.0.0.1:PORT/mod/"), or "" when rsync is not installed.
func Rsyncd(tb testing.TB, dir string) string {
	tb.Helper()
	if _, err := exec.LookPath("rsync"); err != nil {
		tb.Log("rsync not installed: no baseline")
		return ""
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	conf := filepath.Join(tb.TempDir(), "rsyncd.conf")
	ids := ""
	if os.Geteuid() == 0 {
		ids = "uid = root\ngid = root\n"
	}
	os.WriteFile(conf, fmt.Appendf(nil, "address = 127.0.0.1\nport = %d\nuse chroot = no\n%s[mod]\npath = %s\nread only = no\n", port, ids, dir), 0o644)
	cmd := exec.Command("rsync", "--daemon", "--no-detach", "--config="+conf)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("rsync daemon did not listen: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Sprintf("rsync://127.0.0.1:%d/mod/", port)
}

// Rsync copies src into the module path name with `rsync -a src/ URL/name/`
// and returns how long it took.
func Rsync(tb testing.TB, src, url, name string) time.Duration {
	tb.Helper()
	start := time.Now()
	if o, err := exec.Command("rsync", "-a", src+"/", url+name+"/").CombinedOutput(); err != nil {
		tb.Fatalf("rsync: %v: %s", err, o)
	}
	return time.Since(start)
}

// CompareWithRsync times copyOnce(i) for b.N iterations, each copying src
// (size bytes) to a fresh destination that copyOnce returns, and alternates
// every iteration with `rsync -a` of src to an rsync daemon on loopback, so
// both see the same machine (page cache, write-back, other load). Only
// copyOnce runs under the benchmark's timer. It reports tether-MB/s and, when
// rsync is installed, rsync-MB/s and x-rsync (tether's speed over rsync's:
// at least 1 means not slower). Destinations are removed between iterations.
func CompareWithRsync(b *testing.B, src string, size int64, copyOnce func(i int) (dst string)) {
	b.Helper()
	rsyncDir := b.TempDir()
	url := Rsyncd(b, rsyncDir)
	var tether, rs time.Duration
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		dst := copyOnce(i)
		tether += time.Since(start)
		b.StopTimer()
		os.RemoveAll(dst)
		if url != "" {
			name := "r" + fmt.Sprint(i)
			rs += Rsync(b, src, url, name)
			os.RemoveAll(filepath.Join(rsyncDir, name))
		}
		b.StartTimer()
	}
	b.StopTimer()
	t := float64(size) * float64(b.N) / tether.Seconds() / 1e6
	b.ReportMetric(t, "tether-MB/s")
	if url != "" {
		r := float64(size) * float64(b.N) / rs.Seconds() / 1e6
		b.ReportMetric(r, "rsync-MB/s")
		b.ReportMetric(t/r, "x-rsync")
	}
}
