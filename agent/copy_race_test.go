package agent

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// raceIterations is how many copies each direction of the swap race runs
// (a tenth with -short).
func raceIterations() int {
	if testing.Short() {
		return 200
	}
	return 2000
}

// TestCopyRootsHoldUnderSymlinkRace swaps a directory inside the copy root
// with a symlink to a directory outside it, as fast as the kernel allows
// (renameat2 RENAME_EXCHANGE, so the name is always one or the other),
// while pushes write below the directory and pulls read from it. A copy may
// be refused or land inside the root; none may write outside the root or
// read what lies outside it.
func TestCopyRootsHoldUnderSymlinkRace(t *testing.T) {
	outside := t.TempDir()
	h := newHarness(t, func(c *Config) { c.Logger = slog.New(slog.DiscardHandler) })
	root := h.a.cfg.DataDir
	writeTree(t, outside, map[string]string{"secret": "OUTSIDE", "tree/secret": "OUTSIDE"})
	writeTree(t, filepath.Join(root, "d"), map[string]string{"secret": "inside", "tree/secret": "inside"})
	if err := os.Symlink(outside, filepath.Join(root, "d-link")); err != nil {
		t.Fatal(err)
	}
	rfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)

	stop := make(chan struct{})
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(rfd, "d", rfd, "d-link", unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("swap: %v", err)
				return
			}
			swaps.Add(1)
		}
	}()
	stopRacer := func() {
		close(stop)
		wg.Wait()
	}
	defer func() {
		select {
		case <-stop:
		default:
			stopRacer()
		}
	}()

	srcFile := filepath.Join(t.TempDir(), "pushed")
	if err := os.WriteFile(srcFile, []byte("pushed"), 0o644); err != nil {
		t.Fatal(err)
	}
	srcTree := t.TempDir()
	writeTree(t, srcTree, map[string]string{"pushed": "pushed"})

	n := raceIterations()
	t.Run("push", func(t *testing.T) {
		var ok, refused int
		for i := range n {
			src := srcFile
			if i%2 == 1 {
				src = srcTree
			}
			dst := filepath.Join(root, "d", "p"+strconv.Itoa(i))
			st := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst})
			_, err := mirror.Send(copyCtx(t), src, st.st, mirror.Options{})
			st.st.Close()
			var pe *mirror.PeerError
			switch {
			case err == nil:
				ok++
			case errors.As(err, &pe):
				refused++
			default:
				t.Fatalf("push %d: %v", i, err)
			}
		}
		ents, err := os.ReadDir(outside)
		if err != nil {
			t.Fatal(err)
		}
		escapes := 0
		for _, e := range ents {
			if e.Name() != "secret" && e.Name() != "tree" {
				escapes++
			}
		}
		t.Logf("push: %d copies (%d landed, %d refused) during %d swaps: %d wrote outside the copy root", n, ok, refused, swaps.Load(), escapes)
		if escapes != 0 {
			t.Errorf("%d of %d pushes wrote outside the copy root", escapes, n)
		}
	})

	t.Run("pull", func(t *testing.T) {
		var ok, refused, escapes int
		for i := range n {
			src, what := filepath.Join(root, "d", "secret"), "secret"
			if i%2 == 1 {
				src, what = filepath.Join(root, "d", "tree"), "tree/secret"
			}
			st := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: src})
			local := filepath.Join(t.TempDir(), "got")
			_, err := mirror.Receive(copyCtx(t), local, st.st, mirror.Options{})
			st.st.Close()
			var pe *mirror.PeerError
			switch {
			case err == nil:
				ok++
				p := local
				if what != "secret" {
					p = filepath.Join(local, "secret")
				}
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatalf("pull %d: %v", i, err)
				}
				if string(b) != "inside" {
					escapes++
				}
			case errors.As(err, &pe):
				refused++
			default:
				t.Fatalf("pull %d: %v", i, err)
			}
		}
		t.Logf("pull: %d copies (%d read, %d refused) during %d swaps: %d read from outside the copy root", n, ok, refused, swaps.Load(), escapes)
		if escapes != 0 {
			t.Errorf("%d of %d pulls read from outside the copy root", escapes, n)
		}
	})
	stopRacer()
}
