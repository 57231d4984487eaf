package mirror

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/zeebo/xxh3"

	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/protocol"
)

const (
	// stagePrefix starts the name of every staging directory.
	stagePrefix = ".tether-stage-"
	// staleAge is how old an unlocked stage must be before a copy on a
	// file system without flock removes it.
	staleAge = 24 * time.Hour
	// maxStageBase bounds the part of a stage's name copied from the
	// destination's name, so the name fits in NAME_MAX.
	maxStageBase = 200
)

// Receive makes dst a copy of what the peer sends on conn: it sends the
// manifest of dst, receives and verifies every entry into a stage beside
// dst, swaps the stage into place and answers FrameCopyDone with the
// result. dst's parent directory is created if missing (mkdir -p). dst may
// be absent, a directory, a file or anything else; it is replaced by the
// source's type.
//
// On any failure (including ctx ending, the peer's FrameError or
// FrameCancel, and the stream ending early) dst is left as it was, the
// stage is removed, and a FrameError is sent unless the peer aborted or the
// stream is gone. Receive blocks until the copy is committed or failed; it
// does not close conn.
func Receive(ctx context.Context, dst string, conn io.ReadWriter, opts Options) (*protocol.CopyResult, error) {
	c, err := newConn(conn)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dst)
	if err != nil {
		return nil, fmt.Errorf("mirror: receive %s: %w", dst, err)
	}
	r := &receiver{
		c: c, opts: opts, log: opts.logger().With("dst", abs),
		dst: abs, parent: filepath.Dir(abs), base: filepath.Base(abs),
		prog:    progress{fn: opts.Progress},
		created: make(map[string]string),
	}
	stop := c.watch(ctx)
	res, err := r.run()
	stop()
	r.cleanup()
	if err != nil {
		if cerr := context.Cause(ctx); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%w)", err, cerr)
		}
		err = fmt.Errorf("mirror: receive %s: %w", abs, err)
		if !r.committed && !isPeerAbort(err) {
			if ctx.Err() != nil {
				c.final(protocol.FrameCancel, nil)
			} else {
				c.final(protocol.FrameError, &protocol.ErrorInfo{Code: errorCode(err), Message: err.Error()})
			}
		}
		r.log.Debug("copy failed", "err", err)
		return res, err
	}
	return res, nil
}

// errorCode picks the ErrorInfo code for a failed copy.
func errorCode(err error) string {
	var ve *violation
	if errors.As(err, &ve) {
		return protocol.CodeBadRequest
	}
	return protocol.CodeInternal
}

// violation marks a stream that breaks the copy protocol.
type violation struct{ msg string }

func (v *violation) Error() string { return "protocol violation: " + v.msg }

func violationf(format string, args ...any) error {
	return &violation{msg: fmt.Sprintf(format, args...)}
}

// oldEntry is one entry of the destination as it was.
type oldEntry struct {
	rel   string
	typ   string // protocol.Entry* or "other"
	mode  uint32
	mtime int64
	size  int64
}

// dirMeta is a staged directory's final mode and mtime, applied after its
// children.
type dirMeta struct {
	rel   string
	mode  uint32
	mtime int64
}

// receiver is one Receive's state; it is used by one goroutine.
type receiver struct {
	c    *conn
	opts Options
	log  *slog.Logger
	prog progress

	dst, parent, base string

	pf     *os.File // the parent directory: flock and renameat2
	pfd    int      // pf's descriptor
	root   *os.Root // the parent directory
	locked bool

	oldType string // "" if dst is absent
	oldRoot *os.Root
	old     []oldEntry
	oldBy   map[string]*oldEntry

	stage     string   // stage name in the parent; "" until created
	stageRoot *os.Root // the stage, when the source is a directory
	newDirs   dirCache // directories of the stage
	oldDirs   dirCache // directories of the old tree
	rootType  string   // the source root's type
	committed bool

	created map[string]string // staged path -> type, for everything in the new tree
	dirs    []dirMeta
	cur     *incoming

	pool *writerPool // writes small files; nil until the first one

	entries   int   // FrameEntry frames received
	dataBytes int64 // file data bytes received
	res       protocol.CopyResult
	buf       []byte
}

// incoming is the file whose data is arriving: into f, or for a small
// file into buf (then dir holds its directory for the writer).
type incoming struct {
	e       protocol.CopyEntry
	f       *os.File
	buf     []byte
	dir     *dirRef
	h       *xxh3.Hasher
	written int64
}

func (r *receiver) run() (*protocol.CopyResult, error) {
	if r.base == "/" || r.base == "." || r.base == ".." {
		return nil, fmt.Errorf("cannot copy onto %q", r.dst)
	}
	if err := r.open(); err != nil {
		return nil, err
	}
	if err := r.scanOld(); err != nil {
		return nil, err
	}
	if err := r.sendManifest(); err != nil {
		return nil, err
	}
	if err := r.receive(); err != nil {
		return nil, err
	}
	if r.pool != nil {
		// Every small file is written before directory modes and times
		// are applied, and before the commit.
		err := r.pool.wait(false)
		r.pool = nil
		if err != nil {
			return nil, err
		}
	}
	if err := r.finish(); err != nil {
		return nil, err
	}
	if err := r.commit(); err != nil {
		return nil, err
	}
	res := r.res
	r.prog.tick(true)
	if err := r.c.writeJSON(protocol.FrameCopyDone, &res); err != nil {
		return &res, fmt.Errorf("committed, but sending copy-done failed: %w", err)
	}
	if err := r.c.flush(); err != nil {
		return &res, fmt.Errorf("committed, but sending copy-done failed: %w", err)
	}
	r.log.Debug("copy committed", "entries", res.Entries, "written", res.FilesWritten, "kept", res.FilesKept, "bytes", res.BytesWritten, "deleted", res.Deleted)
	return &res, nil
}

// open creates and opens the parent, locks it and removes stale stages.
func (r *receiver) open() error {
	if err := os.MkdirAll(r.parent, 0o755); err != nil {
		return fmt.Errorf("create parent directory: %w", err)
	}
	var err error
	if r.pf, err = os.Open(r.parent); err != nil {
		return fmt.Errorf("open parent directory: %w", err)
	}
	if r.root, err = os.OpenRoot(r.parent); err != nil {
		return fmt.Errorf("open parent directory: %w", err)
	}
	a, err1 := r.pf.Stat()
	b, err2 := r.root.Stat(".")
	if err1 != nil || err2 != nil || !os.SameFile(a, b) || !a.IsDir() {
		return fmt.Errorf("parent directory %s changed while opening it or is not a directory", r.parent)
	}
	r.pfd = int(r.pf.Fd())
	for {
		err := unix.Flock(r.pfd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			r.locked = true
			break
		}
		if err == unix.EINTR {
			continue
		}
		if err != unix.EWOULDBLOCK {
			r.log.Warn("cannot lock the destination's parent; copying unlocked", "parent", r.parent, "err", err)
			break
		}
		// Another copy into this directory is running: wait for it. The
		// stream's abort (ctx) cannot interrupt this wait, so check it.
		if r.c.isAborted() {
			return errors.New("canceled while waiting for another copy into the same directory")
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.removeStale()
	return nil
}

// isStageName reports whether name looks like a stage this package made.
func isStageName(name string) bool {
	if !strings.HasPrefix(name, stagePrefix) || len(name) < len(stagePrefix)+18 {
		return false
	}
	suffix := name[len(name)-17:]
	if suffix[0] != '-' {
		return false
	}
	_, err := hex.DecodeString(suffix[1:])
	return err == nil
}

// removeStale removes stages left by killed copies: every stage in the
// parent when we hold the lock (every copy into the parent takes it), else
// only old ones.
func (r *receiver) removeStale() {
	d, err := r.root.Open(".")
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, name := range names {
		if !isStageName(name) {
			continue
		}
		if !r.locked {
			fi, err := r.root.Lstat(name)
			if err != nil || time.Since(fi.ModTime()) < staleAge {
				continue
			}
		}
		r.log.Info("removing stale copy stage", "stage", filepath.Join(r.parent, name))
		if err := removeTree(r.root, name); err != nil {
			r.log.Warn("cannot remove stale copy stage", "stage", filepath.Join(r.parent, name), "err", err)
		}
	}
}

// scanOld records what dst has.
func (r *receiver) scanOld() error {
	r.oldBy = make(map[string]*oldEntry)
	fi, err := r.root.Lstat(r.base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("lstat destination: %w", err)
	}
	r.oldType = entryType(fi.Mode())
	if r.oldType == "" {
		r.oldType = "other"
	}
	add := func(rel string, fi fs.FileInfo) error {
		t := entryType(fi.Mode())
		if t == "" {
			t = "other"
		}
		r.old = append(r.old, oldEntry{rel: rel, typ: t, mode: modeBits(fi.Mode()), mtime: fi.ModTime().UnixNano(), size: fi.Size()})
		return nil
	}
	switch r.oldType {
	case protocol.EntryFile:
		add(".", fi)
	case protocol.EntryDir:
		if r.oldRoot, err = r.root.OpenRoot(r.base); err != nil {
			return fmt.Errorf("open destination: %w", err)
		}
		r.oldDirs.root = r.oldRoot
		add(".", fi)
		if err := walkTree(r.oldRoot, ".", add); err != nil {
			return fmt.Errorf("scan destination: %w", err)
		}
	}
	for i := range r.old {
		r.oldBy[r.old[i].rel] = &r.old[i]
	}
	return nil
}

// oldPath is an old entry's path in the parent root.
func (r *receiver) oldPath(rel string) string {
	if rel == "." {
		return r.base
	}
	return r.base + "/" + rel
}

// at returns a directory descriptor and a name for the staged entry rel.
// The directory is one this copy created (entry checks that) opened
// through the stage's os.Root, and the name is a single component, so the
// *at calls on them cannot leave the stage.
func (r *receiver) at(rel string) (int, string, error) {
	if rel == "." {
		return r.pfd, r.stage, nil
	}
	fd, err := r.newDirs.fd(parentOf(rel))
	return fd, path.Base(rel), err
}

// oldAt is at for the old tree.
func (r *receiver) oldAt(rel string) (int, string, error) {
	if rel == "." {
		return r.pfd, r.base, nil
	}
	fd, err := r.oldDirs.fd(parentOf(rel))
	return fd, path.Base(rel), err
}

// sendManifest describes dst to the sender.
func (r *receiver) sendManifest() error {
	mw := &manifestWriter{c: r.c}
	if r.oldType == protocol.EntryDir || r.oldType == protocol.EntryFile {
		buf := make([]byte, chunkSize)
		for i := range r.old {
			o := &r.old[i]
			if o.typ == "other" || !utf8.ValidString(o.rel) || len(o.rel) > protocol.MaxCopyPathLen {
				continue // never matches a source entry
			}
			e := protocol.ManifestEntry{Path: o.rel, Type: o.typ, Mode: o.mode, MtimeNS: o.mtime}
			if o.typ == protocol.EntryFile {
				e.Size = o.size
				if r.opts.Checksum {
					sum, _, err := hashFile(r.root, r.oldPath(o.rel), buf)
					if err != nil {
						return fmt.Errorf("hash %q: %w", o.rel, err)
					}
					e.XXH128 = sum
				}
			}
			if err := mw.add(&e); err != nil {
				return fmt.Errorf("send manifest: %w", err)
			}
		}
	}
	if err := mw.end(r.oldType != "", r.oldType); err != nil {
		return fmt.Errorf("send manifest: %w", err)
	}
	return nil
}

// receive applies the sender's entries to the stage until FrameCopyEnd.
func (r *receiver) receive() error {
	for {
		f, err := r.c.next()
		if err != nil {
			if r.cur != nil {
				return fmt.Errorf("receiving %q: %w", r.cur.e.Path, err)
			}
			return err
		}
		switch f.Type {
		case protocol.FrameEntry:
			var e protocol.CopyEntry
			if err := protocol.DecodeJSON(f.Payload, &e); err != nil {
				return violationf("entry: %v", err)
			}
			if err := r.entry(&e); err != nil {
				return err
			}
		case protocol.FrameFileData:
			if err := r.data(f.Payload); err != nil {
				return err
			}
		case protocol.FrameEntryEnd:
			var end protocol.EntryEnd
			if err := protocol.DecodeJSON(f.Payload, &end); err != nil {
				return violationf("entry end: %v", err)
			}
			if err := r.entryEnd(&end); err != nil {
				return err
			}
		case protocol.FrameCopyEnd:
			var end protocol.CopyEnd
			if err := protocol.DecodeJSON(f.Payload, &end); err != nil {
				return violationf("copy end: %v", err)
			}
			if r.cur != nil {
				return violationf("copy ended inside file %q", r.cur.e.Path)
			}
			if r.rootType == "" {
				return violationf("copy ended without a root entry")
			}
			if end.Entries != r.entries || end.Bytes != r.dataBytes {
				return violationf("copy end announces %d entries and %d bytes, received %d and %d", end.Entries, end.Bytes, r.entries, r.dataBytes)
			}
			return nil
		default:
			return violationf("unexpected %s frame", f.Type)
		}
	}
}

// entry starts one entry of the new tree.
func (r *receiver) entry(e *protocol.CopyEntry) error {
	if r.cur != nil {
		return violationf("entry %q arrived inside file %q", e.Path, r.cur.e.Path)
	}
	if err := e.Validate(); err != nil {
		return violationf("%v", err)
	}
	if r.pool != nil {
		if err := r.pool.failure(); err != nil {
			return err
		}
	}
	r.entries++
	if _, dup := r.created[e.Path]; dup {
		return violationf("entry %q: duplicate", e.Path)
	}
	if r.rootType == "" {
		if e.Path != "." {
			return violationf("entry %q: the first entry must be the root \".\"", e.Path)
		}
		if err := r.placeRoot(e); err != nil {
			return err
		}
		if err := r.createStage(e); err != nil {
			return err
		}
	} else if e.Path == "." {
		return violationf("entry \".\": duplicate root")
	} else if r.created[parentOf(e.Path)] != protocol.EntryDir {
		// Only directories this copy created may hold entries: this is
		// what stops a symlink the sender made from being traversed.
		return violationf("entry %q: parent %q is not a directory of this copy", e.Path, parentOf(e.Path))
	}
	r.created[e.Path] = e.Type
	switch e.Type {
	case protocol.EntryDir:
		if e.Path != "." {
			if err := r.mkdir(e.Path); err != nil {
				return fmt.Errorf("entry %q: %w", e.Path, err)
			}
		}
		r.dirs = append(r.dirs, dirMeta{rel: e.Path, mode: e.Mode, mtime: e.MtimeNS})
	case protocol.EntrySymlink:
		if err := r.symlink(e.Link, e.Path, e.MtimeNS); err != nil {
			return fmt.Errorf("entry %q: %w", e.Path, err)
		}
	case protocol.EntryFile:
		if e.Keep {
			r.prog.p.Files++
			r.prog.tick(false)
			return r.keep(e)
		}
		if r.rootType == protocol.EntryDir && e.Size <= smallFile {
			// Gathered in memory, verified, then written by the pool.
			dir, err := r.newDirs.hold(parentOf(e.Path))
			if err != nil {
				return fmt.Errorf("entry %q: open directory: %w", e.Path, err)
			}
			if r.pool == nil {
				r.pool = newWriterPool()
			}
			r.pool.budget.acquire(e.Size)
			r.cur = &incoming{e: *e, dir: dir, buf: make([]byte, 0, e.Size), h: newFileHash()}
			return nil
		}
		f, err := r.createFile(e.Path)
		if err != nil {
			return fmt.Errorf("entry %q: create: %w", e.Path, err)
		}
		r.cur = &incoming{e: *e, f: f, h: newFileHash()}
	}
	return nil
}

// mkdir creates the staged directory rel, private until finish.
func (r *receiver) mkdir(rel string) error {
	fd, name, err := r.at(rel)
	if err == nil {
		err = unix.Mkdirat(fd, name, 0o700)
	}
	if err != nil {
		return fmt.Errorf("mkdir: %w", err)
	}
	return nil
}

// symlink creates the staged symlink rel with its own mtime.
func (r *receiver) symlink(target, rel string, mtime int64) error {
	fd, name, err := r.at(rel)
	if err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	if err := unix.Symlinkat(target, fd, name); err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	if err := setMtimeAt(fd, name, mtime); err != nil {
		return fmt.Errorf("set symlink mtime: %w", err)
	}
	return nil
}

// placeRoot decides where the source root e goes before anything is staged.
// A file copied onto an existing directory, or into one (Options.Into),
// lands inside it at DST/NAME, as cp and scp put it; the receiver then moves
// to that target (its parent, lock and manifest). A directory replaces a
// destination that is not a directory only with Options.Delete: silently
// turning someone's file into a tree is a surprise nobody asked for.
func (r *receiver) placeRoot(e *protocol.CopyEntry) error {
	switch {
	case e.Type == protocol.EntryFile && (r.oldType == protocol.EntryDir || r.opts.Into):
		if r.oldType != "" && r.oldType != protocol.EntryDir {
			return fmt.Errorf("destination %s/ names a directory, but it is a %s", r.dst, r.oldType)
		}
		if e.Name == "" {
			return violationf("root file entry has no name to copy it into directory %s with", r.dst)
		}
		return r.moveInto(e.Name)
	case e.Type == protocol.EntryDir && r.oldType != "" && r.oldType != protocol.EntryDir && !r.opts.Delete:
		return fmt.Errorf("destination %s is a %s; copying a directory onto it would replace it (use --delete to allow that)", r.dst, r.oldType)
	}
	return nil
}

// moveInto retargets the receiver from dst to dst/name, which must not be a
// directory: the old parent is released and the new one opened, locked and
// scanned. Nothing was staged yet.
func (r *receiver) moveInto(name string) error {
	if r.oldRoot != nil {
		r.oldRoot.Close()
		r.oldRoot = nil
	}
	r.oldDirs.close()
	r.oldDirs = dirCache{}
	r.root.Close()
	r.root = nil
	r.pf.Close() // releases the flock
	r.pf, r.locked = nil, false
	r.old, r.oldBy, r.oldType = nil, nil, ""

	r.dst = filepath.Join(r.dst, name)
	r.parent, r.base = filepath.Dir(r.dst), name
	r.log = r.log.With("into", r.dst)
	if err := r.open(); err != nil {
		return err
	}
	if err := r.scanOld(); err != nil {
		return err
	}
	if r.oldType == protocol.EntryDir {
		return fmt.Errorf("cannot copy a file onto %s: it is a directory", r.dst)
	}
	return nil
}

// createStage makes the stage for the root entry e.
func (r *receiver) createStage(e *protocol.CopyEntry) error {
	var rnd [8]byte
	rand.Read(rnd[:])
	base := r.base
	if len(base) > maxStageBase {
		base = base[:maxStageBase]
	}
	name := stagePrefix + base + "-" + hex.EncodeToString(rnd[:])
	r.rootType = e.Type
	r.log.Debug("staging", "stage", name, "type", e.Type)
	if e.TotalFiles > 0 || e.TotalBytes > 0 {
		r.prog.p.TotalFiles, r.prog.p.TotalBytes = e.TotalFiles, e.TotalBytes
	}
	if e.Type == protocol.EntryDir {
		if err := r.root.Mkdir(name, 0o700); err != nil {
			return fmt.Errorf("create stage: %w", err)
		}
		r.stage = name
		sr, err := r.root.OpenRoot(name)
		if err != nil {
			return fmt.Errorf("open stage: %w", err)
		}
		r.stageRoot = sr
		r.newDirs.root = sr
		return nil
	}
	// A file root: the stage is the file itself, created by createFile or
	// keep below.
	r.stage = name
	return nil
}

// createFile creates a new, empty staged file; it never opens an
// existing one.
func (r *receiver) createFile(rel string) (*os.File, error) {
	fd, name, err := r.at(rel)
	if err != nil {
		return nil, err
	}
	return openAt(fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
}

// keep puts the destination's identical file into the stage: a hard link
// when its mode and mtime match too, else a fresh copy, so the old tree is
// never modified.
func (r *receiver) keep(e *protocol.CopyEntry) error {
	o := r.oldBy[e.Path]
	if o == nil || o.typ != protocol.EntryFile || o.size != e.Size {
		return violationf("entry %q: kept, but the destination has no such file", e.Path)
	}
	r.res.FilesKept++
	if o.mode == e.Mode && o.mtime == e.MtimeNS {
		err := r.link(e.Path, o)
		if err == nil {
			return nil
		}
		r.log.Debug("hard link failed; copying", "path", e.Path, "err", err)
	}
	f, err := r.copyOld(e.Path, e.Size)
	if err != nil {
		return fmt.Errorf("entry %q: copy unchanged file: %w", e.Path, err)
	}
	return r.setFileMeta(e.Path, f, e.Mode, e.MtimeNS)
}

// link hard-links the old file o into the stage at rel, if it is still
// the regular file the scan saw.
func (r *receiver) link(rel string, o *oldEntry) error {
	ofd, oname, err := r.oldAt(o.rel)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(ofd, oname, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != o.size {
		return fmt.Errorf("%q changed since the scan", o.rel)
	}
	nfd, nname, err := r.at(rel)
	if err != nil {
		return err
	}
	// Flags 0: a symlink would be linked itself, never followed.
	return unix.Linkat(ofd, oname, nfd, nname, 0)
}

// copyOld copies the old file rel into a new staged file, which it
// returns open.
func (r *receiver) copyOld(rel string, size int64) (*os.File, error) {
	ofd, oname, err := r.oldAt(rel)
	if err != nil {
		return nil, err
	}
	src, err := openAt(ofd, oname, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		return nil, fmt.Errorf("destination file changed during the copy")
	}
	dst, err := r.createFile(rel)
	if err != nil {
		return nil, err
	}
	if r.buf == nil {
		r.buf = make([]byte, chunkSize)
	}
	n, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, r.buf)
	if err == nil && n != size {
		err = fmt.Errorf("destination file changed during the copy")
	}
	if err != nil {
		dst.Close()
		return nil, err
	}
	return dst, nil
}

// setFileMeta chmods the open staged file f, sets its mtime and closes
// it.
func (r *receiver) setFileMeta(rel string, f *os.File, mode uint32, mtime int64) error {
	err := fdMeta(int(f.Fd()), mode, mtime)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("entry %q: %w", rel, err)
	}
	return nil
}

// data appends a data frame to the current file.
func (r *receiver) data(p []byte) error {
	if r.cur == nil {
		return violationf("file data outside a file entry")
	}
	c := r.cur
	if c.written+int64(len(p)) > c.e.Size {
		return violationf("entry %q: more data than its size %d", c.e.Path, c.e.Size)
	}
	if c.buf != nil {
		c.buf = append(c.buf, p...)
	} else if _, err := c.f.Write(p); err != nil {
		return fmt.Errorf("entry %q: write: %w", c.e.Path, err)
	}
	c.h.Write(p)
	c.written += int64(len(p))
	r.dataBytes += int64(len(p))
	r.prog.p.Bytes += int64(len(p))
	r.prog.tick(false)
	return nil
}

// entryEnd verifies and closes the current file.
func (r *receiver) entryEnd(end *protocol.EntryEnd) error {
	if r.cur == nil {
		return violationf("entry end outside a file entry")
	}
	c := r.cur
	if c.written != c.e.Size {
		return violationf("entry %q: got %d of %d bytes", c.e.Path, c.written, c.e.Size)
	}
	if sum := hashHex(c.h); sum != end.XXH128 {
		return violationf("entry %q: checksum mismatch: received data hashes to %s, sender says %s", c.e.Path, sum, end.XXH128)
	}
	r.cur = nil
	if c.buf != nil {
		r.pool.submit(writeJob{rel: c.e.Path, dir: c.dir, name: path.Base(c.e.Path), data: c.buf, mode: c.e.Mode, mtime: c.e.MtimeNS})
	} else if err := r.setFileMeta(c.e.Path, c.f, c.e.Mode, c.e.MtimeNS); err != nil {
		return err
	}
	r.res.FilesWritten++
	r.res.BytesWritten += c.written
	r.prog.p.Files++
	r.prog.tick(false)
	return nil
}

// finish carries over what the source lacks (without Delete), counts
// deletions and applies directory modes and mtimes, deepest first.
func (r *receiver) finish() error {
	if r.rootType == protocol.EntryDir && r.oldType == protocol.EntryDir && !r.opts.Delete {
		for i := range r.old {
			o := &r.old[i]
			if _, ok := r.created[o.rel]; ok || r.created[parentOf(o.rel)] != protocol.EntryDir {
				continue
			}
			if err := r.carry(o); err != nil {
				return err
			}
		}
	}
	for i := range r.old {
		if _, ok := r.created[r.old[i].rel]; !ok {
			r.res.Deleted++
		}
	}
	for i := len(r.dirs) - 1; i >= 0; i-- {
		d := r.dirs[i]
		if err := r.stageRoot.Chmod(d.rel, fileMode(d.mode)); err != nil {
			return fmt.Errorf("entry %q: chmod: %w", d.rel, err)
		}
		if err := r.stageRoot.Chtimes(d.rel, time.Time{}, time.Unix(0, d.mtime)); err != nil {
			return fmt.Errorf("entry %q: set mtime: %w", d.rel, err)
		}
	}
	r.res.Entries = len(r.created)
	return nil
}

// carry puts an old entry the source lacks into the stage unchanged.
func (r *receiver) carry(o *oldEntry) error {
	switch o.typ {
	case protocol.EntryDir:
		if err := r.mkdir(o.rel); err != nil {
			return fmt.Errorf("keep %q: %w", o.rel, err)
		}
		r.dirs = append(r.dirs, dirMeta{rel: o.rel, mode: o.mode, mtime: o.mtime})
	case protocol.EntrySymlink:
		target, err := r.oldRoot.Readlink(o.rel)
		if err != nil {
			return fmt.Errorf("keep %q: readlink: %w", o.rel, err)
		}
		if err := r.symlink(target, o.rel, o.mtime); err != nil {
			return fmt.Errorf("keep %q: %w", o.rel, err)
		}
	case protocol.EntryFile:
		if err := r.link(o.rel, o); err != nil {
			f, err := r.copyOld(o.rel, o.size)
			if err != nil {
				return fmt.Errorf("keep %q: %w", o.rel, err)
			}
			if err := r.setFileMeta(o.rel, f, o.mode, o.mtime); err != nil {
				return err
			}
		}
	default:
		// A special file is linked as it is (linkat never follows).
		ofd, oname, err := r.oldAt(o.rel)
		if err != nil {
			return fmt.Errorf("keep %q: %w", o.rel, err)
		}
		nfd, nname, err := r.at(o.rel)
		if err != nil {
			return fmt.Errorf("keep %q: %w", o.rel, err)
		}
		if err := unix.Linkat(ofd, oname, nfd, nname, 0); err != nil {
			r.log.Warn("cannot keep special file", "path", o.rel, "err", err)
			return nil
		}
	}
	r.created[o.rel] = o.typ
	return nil
}

// commit swaps the stage into place.
func (r *receiver) commit() error {
	pfd := r.pfd
	var err error
	if r.oldType != "" {
		err = unix.Renameat2(pfd, r.stage, pfd, r.base, unix.RENAME_EXCHANGE)
	} else {
		err = unix.Renameat2(pfd, r.stage, pfd, r.base, unix.RENAME_NOREPLACE)
	}
	if err == unix.EINVAL || err == unix.ENOSYS || err == unix.EOPNOTSUPP {
		return r.commitFallback()
	}
	if err != nil {
		return fmt.Errorf("commit: rename stage into place: %w", err)
	}
	// The stage's name now holds the old tree (or nothing).
	r.committed = true
	return nil
}

// commitFallback commits with two plain renames where renameat2 flags are
// not supported: old tree aside under a stage name, new tree into place.
func (r *receiver) commitFallback() error {
	pfd := r.pfd
	if r.oldType == "" {
		if err := unix.Renameat(pfd, r.stage, pfd, r.base); err != nil {
			return fmt.Errorf("commit: rename stage into place: %w", err)
		}
		r.committed = true
		return nil
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	aside := stagePrefix + "old-" + hex.EncodeToString(rnd[:])
	if err := unix.Renameat(pfd, r.base, pfd, aside); err != nil {
		return fmt.Errorf("commit: move old destination aside: %w", err)
	}
	if err := unix.Renameat(pfd, r.stage, pfd, r.base); err != nil {
		if rerr := unix.Renameat(pfd, aside, pfd, r.base); rerr != nil {
			r.log.Error("cannot restore the old destination", "aside", filepath.Join(r.parent, aside), "err", rerr)
		}
		return fmt.Errorf("commit: rename stage into place: %w", err)
	}
	r.stage = aside
	r.committed = true
	return nil
}

// cleanup removes the stage (the new tree after a failure, the old tree
// after a commit) and releases everything.
func (r *receiver) cleanup() {
	if r.cur != nil {
		if r.cur.f != nil {
			r.cur.f.Close()
		}
		if r.cur.dir != nil {
			r.cur.dir.release()
		}
		r.cur = nil
	}
	if r.pool != nil {
		// No writer may touch the stage once its removal starts.
		r.pool.wait(true)
		r.pool = nil
	}
	r.newDirs.close()
	r.oldDirs.close()
	if r.stageRoot != nil {
		r.stageRoot.Close()
	}
	if r.oldRoot != nil {
		r.oldRoot.Close()
	}
	if r.stage != "" && r.root != nil {
		if err := removeTree(r.root, r.stage); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("cannot remove copy stage", "stage", filepath.Join(r.parent, r.stage), "err", err)
		}
	}
	if r.root != nil {
		r.root.Close()
	}
	if r.pf != nil {
		r.pf.Close() // releases the flock
	}
}

// removeTree removes name (a file or a tree) in root, making directories
// writable where that is what stops the removal.
func removeTree(root *os.Root, name string) error {
	err := root.RemoveAll(name)
	if err == nil {
		return nil
	}
	fi, lerr := root.Lstat(name)
	if lerr != nil || !fi.IsDir() {
		return err
	}
	sub, serr := root.OpenRoot(name)
	if serr != nil {
		return err
	}
	sub.Chmod(".", 0o700)
	walkTree(sub, ".", func(rel string, fi fs.FileInfo) error {
		if fi.IsDir() {
			sub.Chmod(rel, 0o700)
		}
		return nil
	})
	sub.Close()
	return root.RemoveAll(name)
}
