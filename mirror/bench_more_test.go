package mirror

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tetherfleet/tether/mirror/mirrortest"
)

// The benchmarks below complete those of bench_test.go with the cases that
// do not start from an absent destination: a re-copy onto an identical
// tree (what a NeMo Gym run does at every step) and a copy into an
// existing, empty directory (every entry is new in an old directory).

// BenchmarkCopyTree10kUnchanged re-copies 10,000 files of 1 KiB onto an
// identical destination: only the manifest and the entries travel.
func BenchmarkCopyTree10kUnchanged(b *testing.B) {
	benchUnchanged(b, mirrortest.TreeSource(b, 100, 100, 1024))
}

// BenchmarkCopy1GiBUnchanged re-copies one 1 GiB file onto an identical
// destination.
func BenchmarkCopy1GiBUnchanged(b *testing.B) {
	benchUnchanged(b, mirrortest.BigFileSource(b, 1<<30))
}

// BenchmarkCopyTree10kIntoEmpty copies 10,000 files of 1 KiB into an
// existing, empty directory (a fresh one each iteration).
func BenchmarkCopyTree10kIntoEmpty(b *testing.B) {
	src := mirrortest.TreeSource(b, 100, 100, 1024)
	out := b.TempDir()
	b.SetBytes(10000 * 1024)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		dst := filepath.Join(out, "e"+strconv.Itoa(i))
		if err := os.Mkdir(dst, 0o755); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		loopbackCopy(b, src, dst)
		b.StopTimer()
		os.RemoveAll(dst)
		b.StartTimer()
	}
}

func benchUnchanged(b *testing.B, src string) {
	dst := filepath.Join(b.TempDir(), "dst")
	loopbackCopy(b, src, dst)
	b.ResetTimer()
	for range b.N {
		loopbackCopy(b, src, dst)
	}
}

// loopbackCopy copies src to dst through an in-process TCP loopback
// connection.
func loopbackCopy(b *testing.B, src, dst string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ctx := context.Background()
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
}
