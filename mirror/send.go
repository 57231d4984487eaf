package mirror

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/protocol"
)

// Send streams src (a file or a directory tree) to the receiver on conn: it
// reads the receiver's manifest, walks src, sends every entry (only the
// data of files that differ), and waits for the receiver's FrameCopyDone,
// whose result it returns. src is resolved as Options.Roots say, following
// its symlinks (the user named it); below it nothing is followed: symlinks
// are sent as links. An entry it cannot carry (a special file, an
// unreadable file or directory, a name longer than
// protocol.MaxCopyPathLen, a protected file) is named to the receiver and
// skipped, and the result counts it (Skipped), unless Options.Strict
// makes that fail the copy.
//
// On a local failure (src unreadable, a file changing while it is read)
// Send reports it to the receiver with FrameError; when ctx ends it sends
// FrameCancel; when the receiver fails, Send returns the receiver's error
// (a *PeerError). Send blocks until the copy is done or failed; it does
// not close conn.
func Send(ctx context.Context, src string, conn io.ReadWriter, opts Options) (*protocol.CopyResult, error) {
	c, err := newConn(conn)
	if err != nil {
		return nil, err
	}
	s := &sender{c: c, opts: opts, log: opts.logger().With("src", src), src: src, base: -1, fileFd: -1, prog: progress{fn: opts.Progress}}
	stop := c.watch(ctx)
	res, err := s.run()
	stop()
	s.dirs.close()
	if s.base >= 0 {
		unix.Close(s.base)
	}
	if s.fileFd >= 0 {
		unix.Close(s.fileFd)
	}
	if err == nil {
		return res, nil
	}
	if cerr := context.Cause(ctx); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", err, cerr)
	}
	err = &Error{Op: "send", Path: src, Err: err}
	// The reader must be gone before a final frame resets the deadlines,
	// except after a local failure, where the reader may still be reading
	// and the final frame goes first (abort clears the reader after it).
	stopReader := func() {
		if s.readerDone != nil {
			c.abort()
			<-s.readerDone
		}
	}
	switch {
	case isPeerAbort(err):
		stopReader()
	case ctx.Err() != nil:
		stopReader()
		c.final(protocol.FrameCancel, nil)
	case s.local:
		// The receiver has not been told yet.
		c.final(protocol.FrameError, &protocol.ErrorInfo{Code: errorCode(err), Message: peerMessage(err)})
		stopReader()
	default:
		stopReader()
	}
	return nil, err
}

// srcEntry is one entry of the source walk.
type srcEntry struct {
	protocol.CopyEntry
	send bool // the file's data must travel
}

// sender is one Send's state, used by one goroutine (plus the reader,
// which only touches c's reading side and its own channel).
type sender struct {
	c    *conn
	opts Options
	log  *slog.Logger
	prog progress

	src    string      // as named
	name   string      // its base name, for a file copied into a directory
	base   int         // the source directory, or -1 for a file source
	prot   *protection // Options.Protected, for the walk and each file opened
	fileFd int         // the source file, or -1 for a directory source
	dirs   dirCache    // directories below base

	entries []srcEntry
	skips   []protocol.CopySkip // found by the walk, sent after the entries
	sent    int                 // FrameEntry frames sent
	skipped int                 // FrameCopySkip frames sent
	long    map[string]bool     // directories already skipped for overlong names
	buf     []byte              // for hashing
	frame   []byte              // a data frame: header and chunk

	// local says the failure is ours (the receiver must be told).
	local bool
	// readerDone is closed when the reader goroutine returned.
	readerDone chan struct{}
}

// done is what the reader goroutine saw.
type done struct {
	res *protocol.CopyResult
	err error
}

func (s *sender) run() (*protocol.CopyResult, error) {
	man, _, err := readManifest(s.c)
	if err != nil {
		return nil, err
	}
	s.buf = make([]byte, chunkSize)
	s.frame = make([]byte, 5+chunkSize)
	if err := s.walk(); err != nil {
		s.local = true
		return nil, err
	}
	if err := s.plan(man); err != nil {
		s.local = true
		return nil, err
	}

	// The reader watches for the receiver's answer while we write, so an
	// early FrameError or FrameCancel stops the writes instead of leaving
	// them blocked on a receiver that stopped reading.
	var sentEnd atomic.Bool
	ch := make(chan done, 1)
	s.readerDone = make(chan struct{})
	go func() {
		defer close(s.readerDone)
		d := s.readDone(&sentEnd)
		if d.err != nil {
			s.c.abort()
		}
		ch <- d
	}()

	err = s.sendEntries()
	if err == nil {
		err = s.c.writeJSON(protocol.FrameCopyEnd, &protocol.CopyEnd{Entries: s.sent, Bytes: s.prog.p.Bytes, Skipped: s.skipped})
		if err == nil {
			sentEnd.Store(true)
			err = s.c.flush()
		}
	}
	if err != nil {
		if !s.local {
			// A write failed: the receiver may have said why.
			select {
			case d := <-ch:
				if d.err != nil {
					return nil, d.err
				}
			case <-time.After(time.Second):
			}
		}
		return nil, err
	}
	d := <-ch
	if d.err != nil {
		return nil, d.err
	}
	<-s.readerDone
	s.prog.tick(true)
	return d.res, nil
}

// readDone reads the receiver's final frame.
func (s *sender) readDone(sentEnd *atomic.Bool) done {
	f, err := s.c.next()
	if err != nil {
		return done{err: fmt.Errorf("wait for copy-done: %w", err)}
	}
	if f.Type != protocol.FrameCopyDone || !sentEnd.Load() {
		return done{err: fmt.Errorf("wait for copy-done: %w: %s frame", protocol.ErrUnexpected, f.Type)}
	}
	var res protocol.CopyResult
	if err := protocol.DecodeJSON(f.Payload, &res); err != nil {
		return done{err: fmt.Errorf("copy-done: %w", err)}
	}
	if err := res.DecodeNames(); err != nil {
		return done{err: fmt.Errorf("copy-done: %w", err)}
	}
	return done{res: &res}
}

// walk resolves the source and lists it.
func (s *sender) walk() error {
	t, err := s.opts.resolver().resolve(s.src, false)
	if err != nil {
		return err
	}
	defer t.dir.Close()
	s.name = path.Base(path.Clean(filepath.ToSlash(s.src)))
	prot := s.opts.protected()
	s.prot = prot
	if err := checkProtected(int(t.dir.Fd()), t.name, prot, "copy source "+s.src); err != nil {
		return err
	}
	var fd int
	if t.name == "" {
		fd, err = openAt1(int(t.dir.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	} else {
		fd, err = openSource(int(t.dir.Fd()), t.name)
	}
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return refusef("copy source %s: no such file or directory", s.src)
		}
		return fmt.Errorf("open source: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fmt.Errorf("stat source: %w", err)
	}
	fi := newStatInfo(".", &st)
	if !fi.IsDir() {
		s.fileFd = fd
		return s.add(".", fi)
	}
	s.base = fd
	s.dirs.base = fd
	if err := s.add(".", fi); err != nil {
		return err
	}
	w := walker{base: fd, bad: func(rel string, err error) error {
		if rel == "." {
			return err
		}
		return s.skip(rel, "cannot read the directory: "+errText(err))
	}}
	w.entry = func(rel string, fi *statInfo) error {
		if isTempName(fi.Name()) {
			// Another copy's stage, in progress or left by a killed
			// one: never data of the source.
			return errSkipDir
		}
		if k, what := prot.match(fi.id, fi.Mode().IsRegular(), fi.nlink); k != notProtected {
			s.log.Debug("skipping protected entry", "path", rel, "protected", what)
			if err := s.skip(rel, protReason(k, what, prot.byID(fi.id) != "")); err != nil {
				return err
			}
			return errSkipDir
		}
		if len(rel) > protocol.MaxCopyPathLen {
			dir := parentOf(rel)
			if s.long[dir] {
				return errSkipDir
			}
			if s.long == nil {
				s.long = make(map[string]bool)
			}
			s.long[dir] = true
			if err := s.skip(dir, fmt.Sprintf("holds names whose paths are longer than %d bytes: they are not copied", protocol.MaxCopyPathLen)); err != nil {
				return err
			}
			return errSkipDir
		}
		return s.add(rel, fi)
	}
	if err := w.walk("."); err != nil {
		return err
	}
	if s.opts.Strict && len(s.skips) > 0 {
		return s.strictFailure()
	}
	dirsFirst(s.entries)
	return nil
}

// protReason is why a source entry matched as k (protection.match, with
// what) is skipped; direct says it is a Protected entry itself.
func protReason(k matchKind, what string, direct bool) string {
	switch {
	case k == maybeProtected:
		return "has other hard links, and cannot be told apart from the agent's own state (" + what + "): never copied"
	case !direct:
		return "the agent's own state (a hard link to " + what + "): never copied"
	}
	return "the agent's own state: never copied"
}

// protectedNow checks the source file rel, opened to be sent, with
// identity id and nlink links, against the protection once more: a name
// swapped for a hard link to the agent's state since the walk is caught.
// A protected file fails a single-file copy, or a strict one, and is
// skipped (the receiver told) otherwise; skipped says so.
func (s *sender) protectedNow(rel string, id fileID, nlink uint64) (skipped bool, err error) {
	k, what := s.prot.match(id, true, nlink)
	if k == notProtected {
		return false, nil
	}
	reason := protReason(k, what, s.prot.byID(id) != "")
	switch {
	case s.fileFd >= 0:
		s.local = true
		return true, refusef("copy source %s changed while copying: %s", s.src, reason)
	case s.opts.Strict:
		s.local = true
		return true, fmt.Errorf("cannot copy %q: %s (a strict copy is all or nothing: nothing was changed)", rel, reason)
	}
	s.log.Warn("skipping source entry", "path", rel, "reason", reason)
	return true, s.writeSkip(protocol.CopySkip{Path: rel, Reason: reason})
}

// openSource opens the source entry name in dfd for reading, without
// following a symlink and without opening anything but a directory or a
// regular file (opening a device or a fifo can block or have effects).
func openSource(dfd int, name string) (int, error) {
	pfd, err := openBeneath(dfd, name, unix.O_PATH, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return openAt1(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	case unix.S_IFREG:
		fd, err := openBeneath(dfd, name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			return -1, err
		}
		if id, err := fdID(fd); err != nil || id != idOf(&st) {
			unix.Close(fd)
			return -1, fmt.Errorf("%q changed while being opened", name)
		}
		return fd, nil
	}
	return -1, refusef("source is neither a file nor a directory (%s)", newStatInfo(name, &st).Mode().Type())
}

// add records the walk's entry rel.
func (s *sender) add(rel string, fi *statInfo) error {
	t := entryType(fi.Mode())
	if t == "" {
		if err := s.skip(rel, specialName(fi.Mode())+": only files, directories and symlinks are copied"); err != nil {
			return err
		}
		return nil
	}
	if err := protocol.ValidCopyPath(rel); err != nil {
		return fmt.Errorf("source entry: %w", err)
	}
	e := srcEntry{CopyEntry: protocol.CopyEntry{
		Path: rel, Type: t, Mode: modeBits(fi.Mode()), MtimeNS: fi.ModTime().UnixNano(),
	}}
	switch t {
	case protocol.EntryFile:
		e.Size = fi.Size()
	case protocol.EntrySymlink:
		e.Mode = 0
		fd, err := s.dirs.fd(parentOf(rel))
		if err != nil {
			return s.skip(rel, "cannot read the directory holding it: "+errText(err))
		}
		link, err := readlinkAt(fd, path.Base(rel))
		if err != nil {
			return s.skip(rel, "readlink: "+errText(err))
		}
		if len(link) > protocol.MaxCopyPathLen {
			return s.skip(rel, fmt.Sprintf("symlink target longer than %d bytes", protocol.MaxCopyPathLen))
		}
		e.Link = link
	}
	s.entries = append(s.entries, e)
	return nil
}

// skip records that the walk found an entry rel that cannot be copied
// (which fails a strict copy once the walk is done).
func (s *sender) skip(rel, reason string) error {
	if !s.opts.Strict {
		s.log.Warn("skipping source entry", "path", rel, "reason", reason)
	}
	s.skips = append(s.skips, protocol.CopySkip{Path: rel, Reason: reason})
	return nil
}

// strictFailure is the error of a strict copy whose walk found entries it
// cannot carry: it names them (the first 10).
func (s *sender) strictFailure() error {
	var b strings.Builder
	for i, sk := range s.skips {
		if i == 10 {
			fmt.Fprintf(&b, "; and %d more", len(s.skips)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%q: %s", sk.Path, sk.Reason)
	}
	return fmt.Errorf("cannot copy %d %s (a strict copy is all or nothing: nothing was changed): %s",
		len(s.skips), pluralEntries(len(s.skips)), b.String())
}

func pluralEntries(n int) string {
	if n == 1 {
		return "entry"
	}
	return "entries"
}

// specialName names the type of a file a copy does not carry.
func specialName(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	}
	return "special file (" + m.Type().String() + ")"
}

// errText is the system's word for err (the errno's text) without the
// operation and path around it.
func errText(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// skipReason says whether an error opening a source file found in the walk
// makes it a skipped entry rather than a failed copy, and why.
func skipReason(err error) (string, bool) {
	switch {
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "open: permission denied", true
	case errors.Is(err, unix.ENOENT):
		return "vanished while copying", true
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ENXIO), errors.Is(err, errNotRegular):
		return "changed while copying: no longer a regular file", true
	}
	return "", false
}

// errNotRegular says a source file is not a regular file any more.
var errNotRegular = errors.New("no longer a regular file")

// plan decides which files travel, comparing with the manifest.
func (s *sender) plan(man map[string]*protocol.ManifestEntry) error {
	var files int
	var bytes int64
	for i := range s.entries {
		e := &s.entries[i]
		if e.Type != protocol.EntryFile {
			continue
		}
		files++
		m := man[e.Path]
		if e.Path == "." && man["."] != nil && man["."].Type == protocol.EntryDir {
			// A file onto a directory lands inside it (see Receive), so
			// compare with what the directory holds under the file's name.
			m = man[s.name]
		}
		e.send = true
		if m != nil && m.Type == protocol.EntryFile && m.Size == e.Size {
			if s.opts.Checksum {
				if m.XXH128 != "" {
					sum, err := s.hash(e.Path)
					if err != nil {
						return err
					}
					e.send = sum != m.XXH128
				}
			} else {
				e.send = m.MtimeNS != e.MtimeNS
			}
		}
		e.Keep = !e.send
		if e.send {
			bytes += e.Size
		}
	}
	s.entries[0].TotalFiles, s.entries[0].TotalBytes = files, bytes
	if s.entries[0].Type == protocol.EntryFile {
		// A file copied onto a directory lands inside it under this name.
		s.entries[0].Name = s.name
	}
	s.prog.p.TotalFiles, s.prog.p.TotalBytes = files, bytes
	return nil
}

// open opens a source file for reading, never following a symlink below
// the source: the file source itself (from its start), or rel below the
// source directory.
func (s *sender) open(rel string) (*os.File, error) {
	if s.fileFd >= 0 {
		fd, err := unix.Dup(s.fileFd)
		if err != nil {
			return nil, err
		}
		f := os.NewFile(uintptr(fd), s.src)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	fd, err := s.dirs.fd(parentOf(rel))
	if err != nil {
		return nil, err
	}
	return openAt(fd, path.Base(rel), unix.O_RDONLY|unix.O_NONBLOCK, 0)
}

func (s *sender) hash(rel string) (string, error) {
	f, err := s.open(rel)
	if err != nil {
		return "", fmt.Errorf("open %q: %w", rel, err)
	}
	defer f.Close()
	h := newFileHash()
	if _, err := io.CopyBuffer(h, struct{ io.Reader }{f}, s.buf); err != nil {
		return "", fmt.Errorf("read %q: %w", rel, err)
	}
	return hashHex(h), nil
}

// sendEntries writes every entry and the data of the files that travel.
// Small files are read ahead by a pool (in walk order, within a window
// bounded in files and bytes) while earlier ones go out.
func (s *sender) sendEntries() error {
	var pool *readerPool
	ahead := make(map[int]*readJob) // read-ahead jobs by entry index
	next := 0                       // the next entry to consider for read-ahead
	defer func() {
		if pool != nil {
			pool.stop()
		}
		for _, j := range ahead {
			<-j.done
		}
	}()
	for i := range s.entries {
		e := &s.entries[i]
		if e.send && s.base >= 0 && e.Size <= smallFile {
			if pool == nil {
				pool = newReaderPool()
			}
			next = max(next, i)
			for ; next < len(s.entries) && len(ahead) < maxReadAhead; next++ {
				n := &s.entries[next]
				if !n.send || n.Size > smallFile {
					continue
				}
				if next > i && !pool.budget.tryAcquire(n.Size) {
					break
				}
				if next == i {
					pool.budget.acquire(n.Size)
				}
				dir, err := s.dirs.hold(parentOf(n.Path))
				if err != nil {
					pool.budget.release(n.Size)
					if next == i {
						s.local = true
						return fmt.Errorf("open %q: %w", n.Path, err)
					}
					break // reported when its turn comes
				}
				j := &readJob{rel: n.Path, dir: dir, name: path.Base(n.Path), size: n.Size, done: make(chan struct{})}
				ahead[next] = j
				pool.jobs <- j
			}
			j := ahead[i]
			if j == nil {
				return fmt.Errorf("internal error: no read-ahead for %q", e.Path)
			}
			select {
			case <-j.done:
			default:
				// Let the receiver work on what is buffered meanwhile.
				if err := s.c.flush(); err != nil {
					return fmt.Errorf("send entry %q: %w", e.Path, err)
				}
				<-j.done
			}
			delete(ahead, i)
			err := s.sendRead(e, j)
			pool.budget.release(j.size)
			if err != nil {
				return err
			}
			continue
		}
		if e.send {
			if err := s.sendFile(e); err != nil {
				return err
			}
			continue
		}
		if err := s.writeEntry(e.CopyEntry); err != nil {
			return err
		}
		if e.Type == protocol.EntryFile {
			s.prog.p.Files++
			s.prog.tick(false)
		}
	}
	// What the walk could not carry, named last: the receiver keeps what
	// it has at those paths.
	for i := range s.skips {
		if err := s.writeSkip(s.skips[i]); err != nil {
			return err
		}
	}
	return nil
}

// writeEntry sends one entry.
func (s *sender) writeEntry(ce protocol.CopyEntry) error {
	p := ce.Path
	ce.EncodeNames()
	if err := s.c.writeJSON(protocol.FrameEntry, &ce); err != nil {
		return fmt.Errorf("send entry %q: %w", p, err)
	}
	s.sent++
	return nil
}

// writeSkip names an entry the copy does not carry.
func (s *sender) writeSkip(sk protocol.CopySkip) error {
	p := sk.Path
	sk.EncodeNames()
	if err := s.c.writeJSON(protocol.FrameCopySkip, &sk); err != nil {
		return fmt.Errorf("send skip of %q: %w", p, err)
	}
	s.skipped++
	return nil
}

// skipLate skips a file found by the walk that cannot be opened now, or
// fails the copy if it is strict or the error is not one a skip covers.
func (s *sender) skipLate(rel string, err error) error {
	reason, ok := skipReason(err)
	if !ok || s.opts.Strict {
		s.local = true
		if ok {
			return fmt.Errorf("cannot copy %q: %s (a strict copy is all or nothing: nothing was changed)", rel, reason)
		}
		return err
	}
	s.log.Warn("skipping source entry", "path", rel, "reason", reason)
	return s.writeSkip(protocol.CopySkip{Path: rel, Reason: reason})
}

// sendRead sends a file read ahead by the pool, or streams it if it grew
// too big since the walk.
func (s *sender) sendRead(e *srcEntry, j *readJob) error {
	if j.openErr != nil {
		return s.skipLate(e.Path, j.openErr)
	}
	if j.err != nil {
		s.local = true
		return j.err
	}
	if j.big {
		return s.sendFile(e)
	}
	if skipped, err := s.protectedNow(e.Path, idOf(&j.st), uint64(j.st.Nlink)); skipped {
		return err
	}
	ce := e.CopyEntry
	ce.Mode, ce.MtimeNS, ce.Size = modeBits(newStatInfo("", &j.st).Mode()), j.st.Mtim.Nano(), j.st.Size
	if err := s.writeEntry(ce); err != nil {
		return err
	}
	if len(j.data) > 0 {
		if err := s.c.writeFrame(protocol.FrameFileData, j.data); err != nil {
			return fmt.Errorf("send data of %q: %w", e.Path, err)
		}
	}
	if err := s.c.writeJSON(protocol.FrameEntryEnd, &protocol.EntryEnd{XXH128: j.sum}); err != nil {
		return fmt.Errorf("send end of %q: %w", e.Path, err)
	}
	s.prog.p.Bytes += int64(len(j.data))
	s.prog.p.Files++
	s.prog.tick(false)
	return nil
}

// sendFile sends one file's entry, data and checksum. Its metadata is
// taken from the open file, and a file that changes while it is read
// fails the copy.
func (s *sender) sendFile(e *srcEntry) error {
	if smallIOHook != nil && s.fileFd < 0 {
		if err := smallIOHook("open", e.Path); err != nil {
			return s.skipLate(e.Path, fmt.Errorf("open %q: %w", e.Path, err))
		}
	}
	f, err := s.open(e.Path)
	if err != nil {
		if s.fileFd >= 0 {
			s.local = true
			return fmt.Errorf("open %q: %w", e.Path, err)
		}
		return s.skipLate(e.Path, fmt.Errorf("open %q: %w", e.Path, err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		if s.fileFd >= 0 {
			s.local = true
			return fmt.Errorf("source file %q changed while copying (no longer a regular file)", e.Path)
		}
		return s.skipLate(e.Path, errNotRegular)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok {
		s.local = true
		return fmt.Errorf("stat %q: no device and inode", e.Path)
	} else if skipped, err := s.protectedNow(e.Path, fileID{uint64(st.Dev), uint64(st.Ino)}, uint64(st.Nlink)); skipped {
		return err
	}
	ce := e.CopyEntry
	ce.Mode, ce.MtimeNS, ce.Size = modeBits(fi.Mode()), fi.ModTime().UnixNano(), fi.Size()
	if err := s.writeEntry(ce); err != nil {
		return err
	}
	h := newFileHash()
	for left := ce.Size; left > 0; {
		n := min(int64(len(s.frame)-5), left)
		chunk := s.frame[5 : 5+n]
		if _, err := io.ReadFull(f, chunk); err != nil {
			s.local = true
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("source file %q shrank while being read (to less than %d of %d bytes)", e.Path, ce.Size-left+n, ce.Size)
			}
			return fmt.Errorf("read %q: %w", e.Path, err)
		}
		h.Write(chunk)
		if err := s.c.writeData(s.frame[:5+n]); err != nil {
			return fmt.Errorf("send data of %q: %w", e.Path, err)
		}
		left -= n
		s.prog.p.Bytes += n
		s.prog.tick(false)
	}
	// A file that grew, shrank or was rewritten in place while we read
	// it shows a new size or mtime.
	if fi2, err := f.Stat(); err != nil || fi2.Size() != fi.Size() || !fi2.ModTime().Equal(fi.ModTime()) {
		s.local = true
		return fmt.Errorf("source file %q changed while being read", e.Path)
	}
	if err := s.c.writeJSON(protocol.FrameEntryEnd, &protocol.EntryEnd{XXH128: hashHex(h)}); err != nil {
		return fmt.Errorf("send end of %q: %w", e.Path, err)
	}
	s.prog.p.Files++
	s.prog.tick(false)
	return nil
}

// dirsFirst reorders a walk (parents before children) so that every
// directory comes before every other entry, keeping the walk's order
// within each kind, so parents still precede children. The receiver then
// creates the whole directory skeleton before the first file, the way
// rsync's generator runs ahead of its receiver; on ext4 this spreads the
// new directories (and so their files' inodes) better and makes file
// creation markedly cheaper when a tree was just deleted nearby.
func dirsFirst(entries []srcEntry) {
	slices.SortStableFunc(entries, func(a, b srcEntry) int {
		return cmp.Compare(kindRank(a.Type), kindRank(b.Type))
	})
}

func kindRank(t string) int {
	if t == protocol.EntryDir {
		return 0
	}
	return 1
}
