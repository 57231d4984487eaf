package mirror

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

const defaultTestTimeout = 30 * time.Second

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// countConn counts the bytes written through a net.Conn.
type countConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// result is one side's outcome.
type result struct {
	res *protocol.CopyResult
	err error
}

// runCopy copies src to dst through a net.Pipe, Send and Receive each in
// its own goroutine, and returns both outcomes and the bytes the sender
// wrote.
func runCopy(t testing.TB, src, dst string, opts Options) (send, recv result, sent int64) {
	t.Helper()
	writableOnCleanup(t, src)
	writableOnCleanup(t, dst)
	a, b := net.Pipe()
	sc := &countConn{Conn: a}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	rc := make(chan result, 1)
	ropts := opts
	ropts.Progress = nil
	go func() {
		res, err := Receive(ctx, dst, b, ropts)
		b.Close()
		rc <- result{res, err}
	}()
	res, err := Send(ctx, src, sc, opts)
	a.Close()
	send = result{res, err}
	recv = <-rc
	return send, recv, sc.written.Load()
}

// mustCopy copies and fails the test on any error.
func mustCopy(t testing.TB, src, dst string, opts Options) (*protocol.CopyResult, int64) {
	t.Helper()
	s, r, n := runCopy(t, src, dst, opts)
	if s.err != nil || r.err != nil {
		t.Fatalf("copy %s -> %s: send: %v; receive: %v", src, dst, s.err, r.err)
	}
	if diff := cmp.Diff(r.res, s.res); diff != "" {
		t.Errorf("sender's result differs from receiver's (-recv +send):\n%s", diff)
	}
	return r.res, n
}

// node describes one entry of a tree for comparisons.
type node struct {
	Type  string
	Mode  fs.FileMode
	Mtime int64
	Data  string // content digest of a file, target of a symlink
}

// digest describes the tree (or file) at p, by relative path. Mtimes of
// symlinks are included; the root's own metadata too.
func digest(t testing.TB, p string) map[string]node {
	t.Helper()
	out := map[string]node{}
	err := filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(p, q)
		fi, err := os.Lstat(q)
		if err != nil {
			return err
		}
		n := node{Mode: fi.Mode(), Mtime: fi.ModTime().UnixNano()}
		switch {
		case fi.IsDir():
			n.Type = "dir"
		case fi.Mode().IsRegular():
			n.Type = "file"
			b, err := os.ReadFile(q)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			n.Data = hex.EncodeToString(sum[:8])
		case fi.Mode()&fs.ModeSymlink != 0:
			n.Type = "symlink"
			n.Data, _ = os.Readlink(q)
		default:
			n.Type = "other"
		}
		out[filepath.ToSlash(rel)] = n
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}

// listDir names the entries of dir.
func listDir(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// noStage fails if a staged entry is left in dir or below it.
func noStage(t testing.TB, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if n := d.Name(); strings.HasPrefix(n, stagePrefix) || strings.HasPrefix(n, tmpPrefix) {
			t.Errorf("staged entry %s left", p)
		}
		return nil
	})
}

var testTime = time.Date(2024, 5, 1, 12, 0, 0, 123456789, time.UTC)

// spec is a tree to build: path -> content; a trailing "/" makes a
// directory, "-> target" a symlink.
type spec map[string]string

// build creates the entries of sp under root, with fixed mtimes.
func build(t testing.TB, root string, sp spec) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// Directories first, then the rest, then directory times.
	var dirs []string
	for p := range sp {
		if strings.HasSuffix(p, "/") {
			dirs = append(dirs, strings.TrimSuffix(p, "/"))
			if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for p, v := range sp {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			continue
		}
		os.MkdirAll(filepath.Dir(full), 0o755)
		if target, ok := strings.CutPrefix(v, "-> "); ok {
			if err := os.Symlink(target, full); err != nil {
				t.Fatal(err)
			}
			ts := []syscall.Timespec{syscall.NsecToTimespec(testTime.UnixNano()), syscall.NsecToTimespec(testTime.UnixNano())}
			lutimes(t, full, ts)
			continue
		}
		if err := os.WriteFile(full, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(full, testTime, testTime); err != nil {
			t.Fatal(err)
		}
	}
	dirs = append(dirs, ".")
	for _, d := range dirs {
		os.Chtimes(filepath.Join(root, d), testTime, testTime)
	}
}

// copyEqual fails unless dst mirrors src.
func copyEqual(t testing.TB, src, dst string) {
	t.Helper()
	if diff := cmp.Diff(digest(t, src), digest(t, dst)); diff != "" {
		t.Errorf("%s does not mirror %s (-src +dst):\n%s", dst, src, diff)
	}
}

// frame is one hand-made frame.
type frame struct {
	t protocol.FrameType
	p []byte
}

func jsonFrame(t protocol.FrameType, v any) frame {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return frame{t, b}
}

func entryF(e protocol.CopyEntry) frame { return jsonFrame(protocol.FrameEntry, e) }
func dataF(s string) frame              { return frame{protocol.FrameFileData, []byte(s)} }
func endF(data string) frame {
	h := newFileHash()
	h.Write([]byte(data))
	return jsonFrame(protocol.FrameEntryEnd, protocol.EntryEnd{XXH128: hashHex(h)})
}
func copyEndF(entries int, bytes int64) frame {
	return jsonFrame(protocol.FrameCopyEnd, protocol.CopyEnd{Entries: entries, Bytes: bytes})
}

// fileFrames is a complete file entry.
func fileFrames(p, data string) []frame {
	return []frame{entryF(protocol.CopyEntry{Path: p, Type: "file", Mode: 0o644, MtimeNS: testTime.UnixNano(), Size: int64(len(data))}), dataF(data), endF(data)}
}

func rootDirF() frame {
	return entryF(protocol.CopyEntry{Path: ".", Type: "dir", Mode: 0o755, MtimeNS: testTime.UnixNano()})
}

// encode serialises frames.
func encode(frames []frame) []byte {
	var b strings.Builder
	for _, f := range frames {
		protocol.WriteFrame(&b, f.t, f.p)
	}
	return []byte(b.String())
}

// evilSend plays a hand-crafted sender against Receive into dst: it reads
// the manifest, writes frames and returns Receive's outcome.
func evilSend(t testing.TB, dst string, frames []frame) result {
	t.Helper()
	writableOnCleanup(t, dst)
	a, b := net.Pipe()
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	rc := make(chan result, 1)
	go func() {
		res, err := Receive(ctx, dst, b, Options{Logger: testLogger(t)})
		b.Close()
		rc <- result{res, err}
	}()
	fr := protocol.NewFrameReader(a)
	for {
		f, err := fr.Next()
		if err != nil {
			// The receiver failed before its manifest.
			a.Close()
			return <-rc
		}
		if f.Type == protocol.FrameManifestEnd {
			break
		}
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		io.Copy(io.Discard, a)
	}()
	for _, f := range frames {
		if err := protocol.WriteFrame(a, f.t, f.p); err != nil {
			break
		}
	}
	// The receiver has taken every byte (net.Pipe writes return when read)
	// and sees the end of the stream after them.
	// A complete stream gets its answer first.
	var r result
	if len(frames) > 0 && frames[len(frames)-1].t == protocol.FrameCopyEnd {
		select {
		case r = <-rc:
			a.Close()
			<-drained
			return r
		case <-time.After(5 * time.Second):
		}
	}
	a.Close()
	r = <-rc
	<-drained
	return r
}

func fatalIf(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
