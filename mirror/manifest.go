package mirror

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/protocol"
)

// maxManifestEntries bounds the manifest a sender accepts, so a hostile
// receiver cannot exhaust its memory.
const maxManifestEntries = 4 << 20

// errSkipDir, returned by a walk's entry function for a directory, says
// not to descend into it.
var errSkipDir = errors.New("skip this directory")

// walker lists a tree below a directory descriptor, parents before
// children, names in byte order. It never follows symlinks: they are
// reported, not entered. Paths are slash separated and relative to base;
// every directory is opened with openBeneath from base and every entry
// stat'ed relative to its directory's descriptor (fstatat), never by a
// path from the root.
type walker struct {
	base int
	// entry is called for every entry below the walk's start. For a
	// directory it may return errSkipDir.
	entry func(rel string, fi *statInfo) error
	// dir, if set, is called with each directory's open descriptor (the
	// start included) before its entries.
	dir func(rel string, fd int) error
	// bad, if set, is told about a directory that cannot be opened or
	// read; returning nil goes on without its entries. Unset, the walk
	// fails.
	bad func(rel string, err error) error
}

// walk lists the tree below the directory rel.
func (w *walker) walk(rel string) error {
	fd, err := openBeneath(w.base, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return w.failed(rel, fmt.Errorf("open directory %q: %w", rel, err))
	}
	d := os.NewFile(uintptr(fd), rel)
	if w.dir != nil {
		if err := w.dir(rel, fd); err != nil {
			d.Close()
			return err
		}
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return w.failed(rel, fmt.Errorf("read directory %q: %w", rel, err))
	}
	slices.Sort(names)
	infos := make([]*statInfo, 0, len(names))
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				continue // removed while walking
			}
			d.Close()
			return fmt.Errorf("lstat %q: %w", path.Join(rel, name), err)
		}
		infos = append(infos, newStatInfo(name, &st))
	}
	d.Close()
	for _, fi := range infos {
		p := fi.Name()
		if rel != "." {
			p = rel + "/" + p
		}
		err := w.entry(p, fi)
		if err == errSkipDir {
			continue
		}
		if err != nil {
			return err
		}
		if fi.IsDir() {
			if err := w.walk(p); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *walker) failed(rel string, err error) error {
	if w.bad == nil {
		return err
	}
	return w.bad(rel, err)
}

// statInfo is an fs.FileInfo made from a unix.Stat_t, with the file's
// identity and link count.
type statInfo struct {
	name  string
	size  int64
	mode  fs.FileMode
	mtime time.Time
	id    fileID
	nlink uint64
}

func newStatInfo(name string, st *unix.Stat_t) *statInfo {
	fi := &statInfo{name: name, size: st.Size, mtime: time.Unix(st.Mtim.Unix()), id: idOf(st), nlink: uint64(st.Nlink)}
	fi.mode = fs.FileMode(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fi.mode |= fs.ModeDir
	case unix.S_IFLNK:
		fi.mode |= fs.ModeSymlink
	case unix.S_IFREG:
	case unix.S_IFIFO:
		fi.mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		fi.mode |= fs.ModeSocket
	case unix.S_IFCHR:
		fi.mode |= fs.ModeDevice | fs.ModeCharDevice
	default:
		fi.mode |= fs.ModeDevice
	}
	if st.Mode&unix.S_ISUID != 0 {
		fi.mode |= fs.ModeSetuid
	}
	if st.Mode&unix.S_ISGID != 0 {
		fi.mode |= fs.ModeSetgid
	}
	if st.Mode&unix.S_ISVTX != 0 {
		fi.mode |= fs.ModeSticky
	}
	return fi
}

func (fi *statInfo) Name() string       { return fi.name }
func (fi *statInfo) Size() int64        { return fi.size }
func (fi *statInfo) Mode() fs.FileMode  { return fi.mode }
func (fi *statInfo) ModTime() time.Time { return fi.mtime }
func (fi *statInfo) IsDir() bool        { return fi.mode.IsDir() }
func (fi *statInfo) Sys() any           { return nil }

// dirCache keeps the directory of the last entry open, so that entries of
// one directory (consecutive in walk order) are reached with
// single-component *at calls on its descriptor instead of a path walk
// each time. Directories are opened with openBeneath from a held
// descriptor, at the path loc gives for them (base and the directory's
// own path when loc is nil), so no symlink is ever followed. It is used by
// one goroutine; hold lends the open directory to another (a writer or
// reader worker), which keeps it open until released.
type dirCache struct {
	base int
	loc  func(rel string) (base int, path string)
	rel  string
	dir  *dirRef
}

// dirRef is an open directory shared by its owner (a dirCache, a stage)
// and the workers it lent it to; the last release closes it.
type dirRef struct {
	fd   int // valid until the last release
	refs atomic.Int32
}

func (d *dirRef) release() {
	if d.refs.Add(-1) == 0 {
		unix.Close(d.fd)
	}
}

// fd returns a descriptor of the directory rel.
func (c *dirCache) fd(rel string) (int, error) {
	if c.dir != nil && c.rel == rel {
		return c.dir.fd, nil
	}
	c.close()
	base, p := c.base, rel
	if c.loc != nil {
		base, p = c.loc(rel)
	}
	fd, err := openBeneath(base, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open directory", Path: rel, Err: err}
	}
	c.dir, c.rel = &dirRef{fd: fd}, rel
	c.dir.refs.Store(1)
	return c.dir.fd, nil
}

// hold returns the directory rel open, for the caller to release.
func (c *dirCache) hold(rel string) (*dirRef, error) {
	if _, err := c.fd(rel); err != nil {
		return nil, err
	}
	c.dir.refs.Add(1)
	return c.dir, nil
}

func (c *dirCache) close() {
	if c.dir != nil {
		c.dir.release()
		c.dir = nil
	}
}

// openAt opens name in the directory dfd without following a symlink.
func openAt(dfd int, name string, flags int, perm uint32) (*os.File, error) {
	for {
		fd, err := unix.Openat(dfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "openat", Path: name, Err: err}
		}
		return os.NewFile(uintptr(fd), name), nil
	}
}

// setMtimeAt sets the mtime of name in dfd (itself if a symlink), leaving
// the atime alone.
func setMtimeAt(dfd int, name string, mtime int64) error {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime)}
	return unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// hashFd returns the hex XXH3-128 of the open file f's content.
func hashFd(f *os.File, buf []byte) (string, error) {
	h := newFileHash()
	if _, err := io.CopyBuffer(h, struct{ io.Reader }{f}, buf); err != nil {
		return "", err
	}
	return hashHex(h), nil
}

// manifestWriter batches manifest entries into frames of at most
// MaxFrameSize bytes.
type manifestWriter struct {
	c     *conn
	buf   []byte
	count int
}

func (m *manifestWriter) add(e *protocol.ManifestEntry) error {
	e.EncodeNames()
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
				if e == nil || e.DecodeNames() != nil || protocol.ValidCopyPath(e.Path) != nil {
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
