package mirror

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

// evilLayout is a parent directory holding the destination, next to an
// "outside" directory no copy may touch.
type evilLayout struct {
	top, parent, dst, outside string
}

func newEvilLayout(t testing.TB) evilLayout {
	t.Helper()
	top := t.TempDir()
	l := evilLayout{top: top, parent: filepath.Join(top, "p"), outside: filepath.Join(top, "outside")}
	l.dst = filepath.Join(l.parent, "dst")
	build(t, l.outside, spec{"secret": "s", "x": "outside x"})
	build(t, l.dst, spec{"a": "old a", "sub/b": "old b", "link": "-> ../../outside"})
	return l
}

// check fails if anything outside dst changed, dst changed, or a stage
// remains.
func (l evilLayout) check(t testing.TB, beforeTop, beforeDst map[string]node) {
	t.Helper()
	if diff := cmp.Diff(beforeDst, digest(t, l.dst)); diff != "" {
		t.Errorf("destination changed:\n%s", diff)
	}
	afterTop := digest(t, l.top)
	for p := range afterTop {
		if strings.HasPrefix(p, "p/dst") {
			delete(afterTop, p)
		}
	}
	for p := range beforeTop {
		if strings.HasPrefix(p, "p/dst") {
			delete(beforeTop, p)
		}
	}
	// The parent's own mtime changes (the stage came and went).
	delete(afterTop, "p")
	delete(beforeTop, "p")
	if diff := cmp.Diff(beforeTop, afterTop); diff != "" {
		t.Errorf("something outside the destination changed:\n%s", diff)
	}
	noStage(t, l.parent)
}

func TestMaliciousSender(t *testing.T) {
	mt := testTime.UnixNano()
	file := func(p string, size int64) frame {
		return entryF(protocol.CopyEntry{Path: p, Type: "file", Mode: 0o644, MtimeNS: mt, Size: size})
	}
	dir := func(p string) frame {
		return entryF(protocol.CopyEntry{Path: p, Type: "dir", Mode: 0o755, MtimeNS: mt})
	}
	link := func(p, target string) frame {
		return entryF(protocol.CopyEntry{Path: p, Type: "symlink", MtimeNS: mt, Link: target})
	}
	cat := func(parts ...[]frame) []frame {
		var out []frame
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	one := func(f ...frame) []frame { return f }

	cases := []struct {
		name   string
		frames func(l evilLayout) []frame
		want   string // in the error
	}{
		{"dotdot", func(evilLayout) []frame {
			return cat(one(rootDirF()), fileFrames("../outside/x", "pwned"), one(copyEndF(2, 5)))
		}, "not allowed"},
		{"dotdot in the middle", func(evilLayout) []frame {
			return cat(one(rootDirF(), dir("a")), fileFrames("a/../../x", "pwned"), one(copyEndF(3, 5)))
		}, "must be relative and clean"},
		{"absolute", func(l evilLayout) []frame {
			return cat(one(rootDirF()), fileFrames(filepath.Join(l.outside, "x"), "pwned"), one(copyEndF(2, 5)))
		}, "must be relative and clean"},
		{"root not first", func(evilLayout) []frame {
			return cat(fileFrames("x", "pwned"), one(copyEndF(1, 5)))
		}, "first entry must be the root"},
		{"symlink swap absolute", func(l evilLayout) []frame {
			return cat(one(rootDirF(), link("d", l.outside)), fileFrames("d/x", "pwned"), one(copyEndF(3, 5)))
		}, "is not a directory of this copy"},
		{"symlink swap relative", func(evilLayout) []frame {
			return cat(one(rootDirF(), link("d", "../../outside")), fileFrames("d/x", "pwned"), one(copyEndF(3, 5)))
		}, "is not a directory of this copy"},
		{"symlink into the old tree", func(evilLayout) []frame {
			return cat(one(rootDirF(), link("d", "../dst/sub")), fileFrames("d/b", "pwned"), one(copyEndF(3, 5)))
		}, "is not a directory of this copy"},
		{"symlink then dir of the same name", func(evilLayout) []frame {
			return cat(one(rootDirF(), link("d", "../../outside"), dir("d")), fileFrames("d/x", "pwned"))
		}, "duplicate"},
		{"file then dir of the same path", func(evilLayout) []frame {
			return cat(one(rootDirF()), fileFrames("f", "data"), one(dir("f")), fileFrames("f/x", "pwned"))
		}, "duplicate"},
		{"duplicate file", func(evilLayout) []frame {
			return cat(one(rootDirF()), fileFrames("f", "data"), fileFrames("f", "more"), one(copyEndF(3, 8)))
		}, "duplicate"},
		{"duplicate root", func(evilLayout) []frame {
			return one(rootDirF(), rootDirF(), copyEndF(2, 0))
		}, "duplicate"},
		{"huge size short data", func(evilLayout) []frame {
			return one(rootDirF(), file("f", 1<<40), dataF("short"), endF("short"), copyEndF(2, 5))
		}, "got 5 of"},
		{"more data than size", func(evilLayout) []frame {
			return one(rootDirF(), file("f", 2), dataF("toolong"), endF("toolong"), copyEndF(2, 7))
		}, "more data than its size"},
		{"wrong checksum", func(evilLayout) []frame {
			return one(rootDirF(), file("f", 4), dataF("data"), endF("DATA"), copyEndF(2, 4))
		}, "checksum mismatch"},
		{"data without entry", func(evilLayout) []frame {
			return one(rootDirF(), dataF("orphan"), copyEndF(1, 6))
		}, "file data outside a file entry"},
		{"entry end without entry", func(evilLayout) []frame {
			return one(rootDirF(), endF(""), copyEndF(1, 0))
		}, "entry end outside"},
		{"entry inside a file", func(evilLayout) []frame {
			return one(rootDirF(), file("f", 4), dataF("da"), file("g", 0))
		}, "arrived inside file"},
		{"keep of a missing file", func(evilLayout) []frame {
			return one(rootDirF(), entryF(protocol.CopyEntry{Path: "nothere", Type: "file", Size: 3, Keep: true}), copyEndF(2, 0))
		}, "kept, but"},
		{"keep of a symlink's target", func(evilLayout) []frame {
			return one(rootDirF(), entryF(protocol.CopyEntry{Path: "link", Type: "file", Size: 0, Keep: true}), copyEndF(2, 0))
		}, "kept, but"},
		{"copy end miscounted", func(evilLayout) []frame {
			return cat(one(rootDirF()), fileFrames("f", "abc"), one(copyEndF(5, 3)))
		}, "copy end announces"},
		{"eof before copy end", func(evilLayout) []frame {
			return cat(one(rootDirF()), fileFrames("f", "abc"))
		}, "unexpected EOF"},
		{"eof inside a file", func(evilLayout) []frame {
			return one(rootDirF(), file("f", 10), dataF("abc"))
		}, "unexpected EOF"},
		{"peer error", func(evilLayout) []frame {
			return one(rootDirF(), jsonFrame(protocol.FrameError, protocol.ErrorInfo{Code: "internal", Message: "boom"}))
		}, "boom"},
		{"unexpected frame type", func(evilLayout) []frame {
			return one(rootDirF(), frame{t: protocol.FrameStdout, p: []byte("x")})
		}, "unexpected stdout frame"},
		{"symlink root", func(evilLayout) []frame {
			return one(link(".", "/etc"), copyEndF(1, 0))
		}, "root cannot be a symlink"},
		{"mode bits out of range", func(evilLayout) []frame {
			return one(entryF(protocol.CopyEntry{Path: ".", Type: "dir", Mode: 0o170755}))
		}, "outside 07777"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newEvilLayout(t)
			beforeTop, beforeDst := digest(t, l.top), digest(t, l.dst)
			r := evilSend(t, l.dst, tc.frames(l))
			if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
				t.Errorf("receive error = %v, want one containing %q", r.err, tc.want)
			}
			l.check(t, beforeTop, beforeDst)
		})
	}
}

// TestHostileSymlinksAreKeptAsLinks checks that a sender may create
// symlinks pointing anywhere (they are data), and that nothing is ever
// written through them.
func TestHostileSymlinksAreKeptAsLinks(t *testing.T) {
	l := newEvilLayout(t)
	beforeOutside := digest(t, l.outside)
	frames := []frame{rootDirF(),
		entryF(protocol.CopyEntry{Path: "abs", Type: "symlink", Link: l.outside}),
		entryF(protocol.CopyEntry{Path: "rel", Type: "symlink", Link: "../../outside/x"}),
	}
	frames = append(frames, fileFrames("plain", "data")...)
	frames = append(frames, copyEndF(4, 4))
	r := evilSend(t, l.dst, frames)
	if r.err != nil {
		t.Fatal(r.err)
	}
	for p, want := range map[string]string{"abs": l.outside, "rel": "../../outside/x"} {
		if got, err := os.Readlink(filepath.Join(l.dst, p)); err != nil || got != want {
			t.Errorf("%s -> %q (%v), want %q", p, got, err, want)
		}
	}
	if diff := cmp.Diff(beforeOutside, digest(t, l.outside)); diff != "" {
		t.Errorf("outside changed:\n%s", diff)
	}
}

func TestReceiveRefusesBadDestinations(t *testing.T) {
	r := evilSend(t, "/", nil)
	if r.err == nil || !strings.Contains(r.err.Error(), "is the root directory") {
		t.Errorf("receive onto /: %v, want a refusal", r.err)
	}
	var pe *PeerError
	if errors.As(r.err, &pe) {
		t.Errorf("unexpected peer error %v", r.err)
	}
}
