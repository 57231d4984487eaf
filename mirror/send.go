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
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/protocol"
)

// Send streams src (a file or a directory tree) to the receiver on conn: it
// reads the receiver's manifest, walks src, sends every entry (only the
// data of files that differ), and waits for the receiver's FrameCopyDone,
// whose result it returns. Symlinks below src are sent as links; src itself
// is followed if it is a symlink. Other file types are skipped.
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
	abs, err := filepath.Abs(src)
	if err != nil {
		return nil, fmt.Errorf("mirror: send %s: %w", src, err)
	}
	s := &sender{c: c, opts: opts, log: opts.logger().With("src", abs), abs: abs, prog: progress{fn: opts.Progress}}
	stop := c.watch(ctx)
	res, err := s.run()
	stop()
	s.dirs.close()
	if s.root != nil {
		s.root.Close()
	}
	if err == nil {
		return res, nil
	}
	if cerr := context.Cause(ctx); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", err, cerr)
	}
	err = fmt.Errorf("mirror: send %s: %w", abs, err)
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
		c.final(protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeInternal, Message: err.Error()})
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

	abs  string
	root *os.Root // the source directory; nil for a file source
	dirs dirCache // directories of root

	entries []srcEntry
	buf     []byte // for hashing
	frame   []byte // a data frame: header and chunk

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
		err = s.c.writeJSON(protocol.FrameCopyEnd, &protocol.CopyEnd{Entries: len(s.entries), Bytes: s.prog.p.Bytes})
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
	return done{res: &res}
}

// walk lists the source.
func (s *sender) walk() error {
	fi, err := os.Stat(s.abs)
	if err != nil {
		return fmt.Errorf("stat source: %w", err)
	}
	add := func(rel string, fi fs.FileInfo) error {
		t := entryType(fi.Mode())
		if t == "" {
			s.log.Warn("skipping special file", "path", rel, "mode", fi.Mode().String())
			return nil
		}
		if !utf8.ValidString(rel) {
			return fmt.Errorf("source path %q is not valid UTF-8: a copy cannot carry it", rel)
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
			link, err := s.root.Readlink(rel)
			if err != nil {
				return fmt.Errorf("readlink %q: %w", rel, err)
			}
			e.Link = link
		}
		s.entries = append(s.entries, e)
		return nil
	}
	switch {
	case fi.IsDir():
		if s.root, err = os.OpenRoot(s.abs); err != nil {
			return fmt.Errorf("open source: %w", err)
		}
		s.dirs.root = s.root
		add(".", fi)
		if err := walkTree(s.root, ".", add); err != nil {
			return err
		}
		dirsFirst(s.entries)
		return nil
	case fi.Mode().IsRegular():
		return add(".", fi)
	}
	return fmt.Errorf("source is neither a file nor a directory (%s)", fi.Mode().Type())
}

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
			m = man[filepath.Base(s.abs)]
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
		s.entries[0].Name = filepath.Base(s.abs)
	}
	s.prog.p.TotalFiles, s.prog.p.TotalBytes = files, bytes
	return nil
}

// open opens a source file, never following a symlink below the root.
func (s *sender) open(rel string) (*os.File, error) {
	if s.root == nil {
		return os.Open(s.abs)
	}
	fd, err := s.dirs.fd(parentOf(rel))
	if err != nil {
		return nil, err
	}
	return openAt(fd, path.Base(rel), unix.O_RDONLY, 0)
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
		if e.send && s.root != nil && e.Size <= smallFile {
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
		if err := s.c.writeJSON(protocol.FrameEntry, &e.CopyEntry); err != nil {
			return fmt.Errorf("send entry %q: %w", e.Path, err)
		}
		if e.Type == protocol.EntryFile {
			s.prog.p.Files++
			s.prog.tick(false)
		}
	}
	return nil
}

// sendRead sends a file read ahead by the pool, or streams it if it grew
// too big since the walk.
func (s *sender) sendRead(e *srcEntry, j *readJob) error {
	if j.err != nil {
		s.local = true
		return j.err
	}
	if j.big {
		return s.sendFile(e)
	}
	ce := e.CopyEntry
	ce.Mode, ce.MtimeNS, ce.Size = modeBits(newStatInfo("", &j.st).Mode()), j.st.Mtim.Nano(), j.st.Size
	if err := s.c.writeJSON(protocol.FrameEntry, &ce); err != nil {
		return fmt.Errorf("send entry %q: %w", e.Path, err)
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
	f, err := s.open(e.Path)
	if err != nil {
		s.local = true
		return fmt.Errorf("open %q: %w", e.Path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		s.local = true
		return fmt.Errorf("source file %q changed while copying (no longer a regular file)", e.Path)
	}
	ce := e.CopyEntry
	ce.Mode, ce.MtimeNS, ce.Size = modeBits(fi.Mode()), fi.ModTime().UnixNano(), fi.Size()
	if err := s.c.writeJSON(protocol.FrameEntry, &ce); err != nil {
		return fmt.Errorf("send entry %q: %w", e.Path, err)
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
