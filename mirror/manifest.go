package mirror

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"

	"github.com/tetherfleet/tether/protocol"
)

// maxManifestEntries bounds the manifest a sender accepts, so a hostile
// receiver cannot exhaust its memory.
const maxManifestEntries = 4 << 20

// walkTree calls fn for every entry below root's directory rel (not rel
// itself), parents before children, names in byte order. It never follows
// symlinks: they are reported, not entered. Paths are slash separated and
// relative to root.
func walkTree(root *os.Root, rel string, fn func(rel string, fi fs.FileInfo) error) error {
	d, err := root.Open(rel)
	if err != nil {
		return fmt.Errorf("open directory %q: %w", rel, err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("read directory %q: %w", rel, err)
	}
	slices.Sort(names)
	for _, name := range names {
		p := name
		if rel != "." {
			p = rel + "/" + name
		}
		fi, err := root.Lstat(p)
		if err != nil {
			if os.IsNotExist(err) {
				continue // removed while walking
			}
			return fmt.Errorf("lstat %q: %w", p, err)
		}
		if err := fn(p, fi); err != nil {
			return err
		}
		if fi.IsDir() {
			if err := walkTree(root, p, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// hashFile returns the hex SHA-256 of the file name in root and its size.
func hashFile(root *os.Root, name string, buf []byte) (string, int64, error) {
	f, err := root.Open(name)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, struct{ io.Reader }{f}, buf)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// manifestWriter batches manifest entries into frames of at most
// MaxFrameSize bytes.
type manifestWriter struct {
	c     *conn
	buf   []byte
	count int
}

func (m *manifestWriter) add(e *protocol.ManifestEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if len(m.buf)+len(b)+2 > protocol.MaxFrameSize {
		if err := m.flush(); err != nil {
			return err
		}
	}
	if len(m.buf) == 0 {
		m.buf = append(m.buf, '[')
	} else {
		m.buf = append(m.buf, ',')
	}
	m.buf = append(m.buf, b...)
	m.count++
	return nil
}

func (m *manifestWriter) flush() error {
	if len(m.buf) == 0 {
		return nil
	}
	m.buf = append(m.buf, ']')
	err := m.c.writeFrame(protocol.FrameManifest, m.buf)
	m.buf = m.buf[:0]
	return err
}

// end flushes the last batch and writes FrameManifestEnd.
func (m *manifestWriter) end(exists bool, typ string) error {
	if err := m.flush(); err != nil {
		return err
	}
	if err := m.c.writeJSON(protocol.FrameManifestEnd, &protocol.ManifestEnd{Exists: exists, Type: typ, Entries: m.count}); err != nil {
		return err
	}
	return m.c.flush()
}

// readManifest reads the receiver's manifest into a map by path.
func readManifest(c *conn) (map[string]*protocol.ManifestEntry, *protocol.ManifestEnd, error) {
	man := make(map[string]*protocol.ManifestEntry)
	for {
		f, err := c.next()
		if err != nil {
			return nil, nil, fmt.Errorf("read manifest: %w", err)
		}
		switch f.Type {
		case protocol.FrameManifest:
			var batch []*protocol.ManifestEntry
			if err := protocol.DecodeJSON(f.Payload, &batch); err != nil {
				return nil, nil, fmt.Errorf("read manifest: %w", err)
			}
			for _, e := range batch {
				if e == nil || protocol.ValidCopyPath(e.Path) != nil {
					return nil, nil, fmt.Errorf("read manifest: %w: bad entry", protocol.ErrUnexpected)
				}
				man[e.Path] = e
			}
			if len(man) > maxManifestEntries {
				return nil, nil, fmt.Errorf("read manifest: more than %d entries", maxManifestEntries)
			}
		case protocol.FrameManifestEnd:
			var end protocol.ManifestEnd
			if err := protocol.DecodeJSON(f.Payload, &end); err != nil {
				return nil, nil, fmt.Errorf("read manifest end: %w", err)
			}
			if end.Entries != len(man) {
				return nil, nil, fmt.Errorf("read manifest: got %d distinct entries, receiver announced %d", len(man), end.Entries)
			}
			return man, &end, nil
		default:
			return nil, nil, fmt.Errorf("read manifest: %w: %s frame", protocol.ErrUnexpected, f.Type)
		}
	}
}

// parentOf is path.Dir for copy paths ("." for top-level entries).
func parentOf(p string) string { return path.Dir(p) }
