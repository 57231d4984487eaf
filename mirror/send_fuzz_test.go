package mirror

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

// captureConn feeds fixed bytes to Send and keeps what it writes.
type captureConn struct {
	io.Reader
	out bytes.Buffer
}

func (c *captureConn) Write(p []byte) (int, error) { return c.out.Write(p) }

// FuzzSend plays the receiver of a pull (the agent's side of `tether cp
// NODE:PATH .`): arbitrary bytes as the receiver's manifest and answers,
// against Send of a small tree holding a symlink to a file outside it.
// Send ends within its deadline, changes nothing in the source, and
// writes a well-formed frame stream whose entries validate and in which
// the outside file's bytes never appear.
func FuzzSend(f *testing.F) {
	man := func(entries []*protocol.ManifestEntry, end protocol.ManifestEnd) []byte {
		frames := []frame{}
		if entries != nil {
			frames = append(frames, jsonFrame(protocol.FrameManifest, entries))
		}
		return encode(append(frames, jsonFrame(protocol.FrameManifestEnd, end)))
	}
	f.Add(man(nil, protocol.ManifestEnd{}), false)
	f.Add(man([]*protocol.ManifestEntry{{Path: "a", Type: "file", Size: 5}}, protocol.ManifestEnd{Exists: true, Type: "dir", Entries: 1}), true)
	f.Add(append(man(nil, protocol.ManifestEnd{Exists: true, Type: "dir"}), encode([]frame{jsonFrame(protocol.FrameCopyDone, protocol.CopyResult{Entries: 4})})...), false)
	f.Add(man([]*protocol.ManifestEntry{{Path: "../x"}}, protocol.ManifestEnd{Entries: 1}), false)
	f.Add(man([]*protocol.ManifestEntry{{PathB64: "/w==", Type: "file"}}, protocol.ManifestEnd{Entries: 2}), false)
	f.Add(encode([]frame{jsonFrame(protocol.FrameError, protocol.ErrorInfo{Code: "x", Message: "y"})}), false)
	f.Add([]byte{byte(protocol.FrameManifest), 0xff, 0xff, 0xff, 0xff}, true)
	f.Fuzz(func(t *testing.T, data []byte, checksum bool) {
		top := t.TempDir()
		src := filepath.Join(top, "src")
		secret := []byte("SECRET-OUTSIDE-THE-ROOT")
		for p, content := range map[string]string{"a": "hello", "d/b": "world"} {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(src, p)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(src, p), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(top, "secret"), secret, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../secret", filepath.Join(src, "l")); err != nil {
			t.Fatal(err)
		}
		before := digest(t, top)
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		c := &captureConn{Reader: bytes.NewReader(data)}
		start := time.Now()
		Send(ctx, src, c, Options{Checksum: checksum})
		if ctx.Err() != nil {
			t.Fatalf("Send ran into its %v deadline (after %v)", defaultTestTimeout, time.Since(start))
		}
		if diff := cmp.Diff(before, digest(t, top)); diff != "" {
			t.Fatalf("Send changed files:\n%s", diff)
		}
		if bytes.Contains(c.out.Bytes(), secret) {
			t.Fatalf("the file outside the root was sent")
		}
		fr := protocol.NewFrameReader(bytes.NewReader(c.out.Bytes()))
		for {
			fm, err := fr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("Send wrote a malformed stream: %v", err)
			}
			if fm.Type != protocol.FrameEntry {
				continue
			}
			var e protocol.CopyEntry
			if err := protocol.DecodeJSON(fm.Payload, &e); err != nil {
				t.Fatalf("entry %q: %v", fm.Payload, err)
			}
			if err := e.DecodeNames(); err != nil {
				t.Fatalf("entry %q: %v", fm.Payload, err)
			}
			if err := e.Validate(); err != nil {
				t.Fatalf("Send wrote an invalid entry %q: %v", fm.Payload, err)
			}
		}
	})
}
