package mirror

import (
	"context"
	"github.com/tetherfleet/tether/mirror/mirrortest"
	"net"
	"path/filepath"
	"strconv"
	"testing"
)

// The benchmarks copy through an in-process TCP loopback connection and
// measure `rsync -a` of the same source into a fresh destination through
// an rsync daemon on 127.0.0.1 in the same run (skipped if rsync is not
// installed). Besides the standard figures they report tether-MB/s,
// rsync-MB/s and x-rsync (tether's speed over rsync's; >= 1 means not
// slower).

// BenchmarkCopy1GiB copies a directory holding one 1 GiB file.
func BenchmarkCopy1GiB(b *testing.B) {
	benchCopy(b, mirrortest.BigFileSource(b, 1<<30), 1<<30)
}

// BenchmarkCopyTree10k copies 10,000 files of 1 KiB in 100 directories.
func BenchmarkCopyTree10k(b *testing.B) {
	benchCopy(b, mirrortest.TreeSource(b, 100, 100, 1024), 10000*1024)
}

// benchCopy copies src through an in-process TCP loopback connection.
func benchCopy(b *testing.B, src string, size int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	out := b.TempDir()
	ctx := context.Background()
	mirrortest.CompareWithRsync(b, src, size, func(i int) string {
		dst := filepath.Join(out, "t"+strconv.Itoa(i))
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
		return dst
	})
}
