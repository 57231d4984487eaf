package mirror

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// The benchmarks copy through an in-process TCP loopback connection and
// measure `rsync -a` of the same source into a fresh destination through
// an rsync daemon on 127.0.0.1 in the same run (skipped if rsync is not
// installed). Besides the standard figures they report tether-MB/s,
// rsync-MB/s and x-rsync (tether's speed over rsync's; >= 1 means not
// slower).

// BenchmarkCopy1GiB copies a directory holding one 1 GiB file.
func BenchmarkCopy1GiB(b *testing.B) {
	src := filepath.Join(b.TempDir(), "src")
	os.MkdirAll(src, 0o755)
	writeRandom(b, filepath.Join(src, "big"), 1<<30)
	benchCopy(b, src, 1<<30)
}

// BenchmarkCopyTree10k copies 10,000 files of 1 KiB in 100 directories.
func BenchmarkCopyTree10k(b *testing.B) {
	src := filepath.Join(b.TempDir(), "src")
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1024)
	for d := range 100 {
		dir := filepath.Join(src, fmt.Sprintf("d%03d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 100 {
			for i := range buf {
				buf[i] = byte(r.Uint32())
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", f)), buf, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	benchCopy(b, src, 10000*1024)
}

func writeRandom(b *testing.B, p string, size int64) {
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	r := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		r.Read(buf)
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func benchCopy(b *testing.B, src string, size int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	out := b.TempDir()
	rsyncURL := startRsyncd(b, out)
	ctx := context.Background()
	b.SetBytes(size)
	b.ResetTimer()
	// Iterations alternate tether and rsync so that both see the same
	// machine (page cache, write-back, other load); only tether's run
	// under the benchmark's timer.
	var tether, rs time.Duration
	for i := range b.N {
		dst := filepath.Join(out, "t"+strconv.Itoa(i))
		start := time.Now()
		rc := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				rc <- err
				return
			}
			defer c.Close()
			_, err = Receive(ctx, dst, c, Options{})
			rc <- err
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		_, serr := Send(ctx, src, c, Options{})
		c.Close()
		if err := <-rc; err != nil || serr != nil {
			b.Fatalf("copy: send %v, receive %v", serr, err)
		}
		tether += time.Since(start)
		b.StopTimer()
		os.RemoveAll(dst)
		if rsyncURL != "" {
			name := "r" + strconv.Itoa(i)
			start := time.Now()
			cmd := exec.Command("rsync", "-a", src+"/", rsyncURL+name+"/")
			if o, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("rsync: %v: %s", err, o)
			}
			rs += time.Since(start)
			os.RemoveAll(filepath.Join(out, name))
		}
		b.StartTimer()
	}
	b.StopTimer()
	tetherMBps := float64(size) * float64(b.N) / tether.Seconds() / 1e6
	b.ReportMetric(tetherMBps, "tether-MB/s")
	if rsyncURL != "" {
		rsyncMBps := float64(size) * float64(b.N) / rs.Seconds() / 1e6
		b.ReportMetric(rsyncMBps, "rsync-MB/s")
		b.ReportMetric(tetherMBps/rsyncMBps, "x-rsync")
	}
}

// startRsyncd runs an rsync daemon serving dir as module "mod" on a free
// loopback port until the benchmark ends, and returns the module's URL, or
// "" when rsync is not installed.
func startRsyncd(b *testing.B, dir string) string {
	if _, err := exec.LookPath("rsync"); err != nil {
		b.Log("rsync not installed: no baseline")
		return ""
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	conf := filepath.Join(b.TempDir(), "rsyncd.conf")
	os.WriteFile(conf, fmt.Appendf(nil, "address = 127.0.0.1\nport = %d\nuse chroot = no\n[mod]\npath = %s\nread only = no\n", port, dir), 0o644)
	if os.Geteuid() == 0 {
		os.WriteFile(conf, fmt.Appendf(nil, "address = 127.0.0.1\nport = %d\nuse chroot = no\nuid = root\ngid = root\n[mod]\npath = %s\nread only = no\n", port, dir), 0o644)
	}
	cmd := exec.Command("rsync", "--daemon", "--no-detach", "--config="+conf)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
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
			b.Fatalf("rsync daemon did not listen: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Sprintf("rsync://127.0.0.1:%d/mod/", port)
}
