package fleettest_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/mirror/mirrortest"
	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkCopyUnchanged re-pushes a tree onto an identical destination
// on an agent, the way `tether cp` does (see BenchmarkCopy): only the
// manifest and the entries travel.
func BenchmarkCopyUnchanged(b *testing.B) {
	b.Run("tree10k", func(b *testing.B) {
		benchFleetUnchanged(b, mirrortest.TreeSource(b, 100, 100, 1024))
	})
	b.Run("1GiB", func(b *testing.B) {
		benchFleetUnchanged(b, mirrortest.BigFileSource(b, 1<<30))
	})
}

func benchFleetUnchanged(b *testing.B, src string) {
	f := fleettest.Start(b, fleettest.Options{})
	dst := filepath.Join(f.DataDir("node-0"), "dst")
	ctx := context.Background()
	push := func() {
		st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindCopy, &protocol.CopyParams{Direction: protocol.CopyPush, Path: dst})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := mirror.Send(ctx, src, st, mirror.Options{}); err != nil {
			b.Fatal(err)
		}
		st.Close()
	}
	push()
	b.ResetTimer()
	for range b.N {
		push()
	}
}
