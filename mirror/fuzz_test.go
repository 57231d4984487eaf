package mirror

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

// fuzzConn feeds fixed bytes to Receive and swallows what it writes.
type fuzzConn struct {
	io.Reader
}

func (fuzzConn) Write(p []byte) (int, error) { return len(p), nil }
func (fuzzConn) Close() error                { return nil }

// FuzzReceive feeds arbitrary frame sequences to Receive and checks that
// nothing outside the destination's parent is created or changed, and that
// the parent holds nothing but the destination afterwards.
func FuzzReceive(f *testing.F) {
	mt := testTime.UnixNano()
	seeds := [][]frame{
		append(append([]frame{rootDirF()}, fileFrames("a", "new a")...), copyEndF(2, 5)),
		{rootDirF(), entryF(protocol.CopyEntry{Path: "d", Type: "symlink", Link: "../../outside"}),
			entryF(protocol.CopyEntry{Path: "d/x", Type: "file", Size: 1}), dataF("x"), endF("x"), copyEndF(3, 1)},
		{rootDirF(), entryF(protocol.CopyEntry{Path: "a", Type: "file", Size: 5, Keep: true, Mode: 0o644, MtimeNS: mt}), copyEndF(2, 0)},
		{entryF(protocol.CopyEntry{Path: ".", Type: "file", Size: 3, Mode: 0o600}), dataF("abc"), endF("abc"), copyEndF(1, 3)},
		{rootDirF(), entryF(protocol.CopyEntry{Path: "sub", Type: "dir", Mode: 0o500}), entryF(protocol.CopyEntry{Path: "sub/l", Type: "symlink", Link: "/"}), copyEndF(3, 0)},
		{rootDirF(), jsonFrame(protocol.FrameCopySkip, protocol.CopySkip{Path: "a", Reason: "named pipe"}),
			jsonFrame(protocol.FrameCopyEnd, protocol.CopyEnd{Entries: 1, Skipped: 1})},
		{rootDirF(), entryF(protocol.CopyEntry{PathB64: "/w==", Type: "symlink", LinkB64: "Li4vLi4vb3V0c2lkZf8="}),
			entryF(protocol.CopyEntry{PathB64: "/y94", Type: "file", Size: 1}), dataF("x"), endF("x"), copyEndF(3, 1)},
		{rootDirF(), entryF(protocol.CopyEntry{Path: "sub", Type: "dir", Mode: 0o755})},
	}
	for _, s := range seeds {
		f.Add(encode(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		l := newEvilLayout(t)
		writableOnCleanup(t, l.dst)
		beforeTop := digest(t, l.top)
		for p := range beforeTop {
			if strings.HasPrefix(p, "p/dst") || p == "p" {
				delete(beforeTop, p)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		Receive(ctx, l.dst, fuzzConn{bytes.NewReader(data)}, Options{Delete: len(data)%2 == 0})
		after := digest(t, l.top)
		for p := range after {
			if strings.HasPrefix(p, "p/dst") || p == "p" {
				delete(after, p)
			}
		}
		if diff := cmp.Diff(beforeTop, after); diff != "" {
			t.Fatalf("changed outside the destination:\n%s", diff)
		}
		names, err := os.ReadDir(l.parent)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if n.Name() != "dst" {
				t.Fatalf("left %s in the parent", filepath.Join(l.parent, n.Name()))
			}
		}
	})
}
