package fleettest_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/mirror/mirrortest"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkCopy pushes a tree to an agent the way `tether cp` does (client →
// NATS pipe → coordinator relay → TLS tunnel → agent, which verifies and
// commits it) and, alternating in the same run, copies it with `rsync -a`
// to an rsync daemon on loopback (the baseline; skipped without rsync).
// x-rsync is tether's speed over rsync's: at least 1 means not slower.
func BenchmarkCopy(b *testing.B) {
	b.Run("1GiB", func(b *testing.B) {
		benchFleetCopy(b, mirrortest.BigFileSource(b, 1<<30), 1<<30)
	})
	b.Run("tree10k", func(b *testing.B) {
		benchFleetCopy(b, mirrortest.TreeSource(b, 100, 100, 1024), 10000*1024)
	})
}

func benchFleetCopy(b *testing.B, src string, size int64) {
	f := fleettest.Start(b, fleettest.Options{})
	root := f.DataDir("node-0")
	ctx := context.Background()
	mirrortest.CompareWithRsync(b, src, size, func(i int) string {
		dst := filepath.Join(root, "dst"+strconv.Itoa(i))
		st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindCopy, &protocol.CopyParams{Direction: protocol.CopyPush, Path: dst})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := mirror.Send(ctx, src, st, mirror.Options{}); err != nil {
			b.Fatal(err)
		}
		st.Close()
		return dst
	})
}
