package mirror

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

const (
	// chunkSize is the payload of a file data frame.
	chunkSize = 128 << 10
	// bufSize sizes the buffered writer on the stream (many small frames
	// go out in one write; data frames bypass it).
	bufSize = 256 << 10
	// readBufSize sizes the buffered reader: small frames come out of it,
	// most of a data frame's payload is read straight into place.
	readBufSize = 64 << 10
	// finalTimeout bounds writing the last frame (error, cancel) once the
	// copy already failed.
	finalTimeout = 2 * time.Second
	// progressEvery is the least time between two progress callbacks.
	progressEvery = 100 * time.Millisecond
)

// ErrCanceled is returned when the peer sent FrameCancel.
var ErrCanceled = errors.New("mirror: copy canceled by the peer")

// Error is how Send and Receive fail: Op ("send" or "receive") of the path
// this end named, and why (Err: a *PeerError when the peer failed,
// ErrCanceled, a file system error, a protocol violation, the stream's
// own failure). It reads "mirror: OP PATH: ERR".
type Error struct {
	Op   string
	Path string
	Err  error
}

func (e *Error) Error() string { return fmt.Sprintf("mirror: %s %s: %v", e.Op, e.Path, e.Err) }

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// WriteError is a receiver's failure to write an entry's copy: to create
// it (a file, a directory, a symlink), write its data or close it. Those
// writes go to the copy's temporary directory before anything is
// committed, so the destination is as it was. Path is where the entry was
// being copied to (the destination, or a path under it: never the
// temporary name); Err is the system's reason, an errno such as ENOSPC
// for a full disk or EDQUOT for a quota. It reads "PATH: REASON (the
// destination is unchanged)", PATH quoted when a terminal would not show it
// as it is.
type WriteError struct {
	Path string
	Err  error
}

func (e *WriteError) Error() string {
	return protocol.QuoteName(e.Path) + ": " + e.Err.Error() + " (the destination is unchanged)"
}

// Unwrap returns Err.
func (e *WriteError) Unwrap() error { return e.Err }

// writeError is err, from writing the copy of the entry copied to path, as
// a *WriteError: without the operation and the temporary name an
// *fs.PathError carries ("write 1").
func writeError(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &WriteError{Path: path, Err: err}
}

// PeerError is the error the peer reported with FrameError.
type PeerError struct {
	Info protocol.ErrorInfo
}

func (e *PeerError) Error() string { return "peer failed: " + e.Info.Error() }

// Unwrap gives access to the peer's ErrorInfo with errors.As.
func (e *PeerError) Unwrap() error { return &e.Info }

// Options tune a copy. The zero value copies by size and mtime and keeps
// destination entries the source lacks.
type Options struct {
	// Delete removes destination entries the source lacks (rsync
	// --delete). Only the receiver uses it.
	Delete bool
	// Into says the destination names a directory (a trailing slash): a
	// file source is copied into it as DST/NAME, creating it if needed.
	// Only the receiver uses it. (A file onto an existing directory lands
	// inside it even without Into.)
	Into bool
	// Checksum compares files by XXH3-128 instead of size and mtime. Both
	// ends must agree: the receiver puts digests in its manifest, the
	// sender hashes its files to compare.
	Checksum bool
	// Strict makes the copy all or nothing: an entry the sender cannot
	// carry (a special file, a file or directory it cannot read, a name
	// longer than protocol.MaxCopyPathLen, a protected file) fails the
	// copy instead of being skipped and named in the result's
	// SkippedEntries. Only the sender uses it.
	Strict bool
	// Roots, if set, confine the path this end names (Receive's dst,
	// Send's src) to these absolute directories: the path must lie in
	// one, and symlinks on the way (including the last component, which
	// is followed as cp follows it) may not lead out of them; this is
	// checked on descriptors, one component at a time, so a directory
	// swapped for a symlink during the copy cannot redirect it (see
	// resolve.go). Unset, the path is resolved as the kernel would, from
	// the working directory's descriptor if relative: the local end of
	// `tether cp`.
	Roots []string
	// Within, if set, narrows Roots to the paths the coordinator's policy
	// granted this copy (protocol.CopyParams.Roots): the copy resolves
	// beneath EffectiveRoots(Roots, Within) instead, each Within entry
	// under a root being opened beneath that root (symlinks on its way
	// stay in Roots), so symlinks cannot take the path out of what was
	// granted. Nothing in common refuses every path. Without Roots,
	// Within entries are the roots.
	Within []string
	// Protected names files and directories no copy may write, replace,
	// delete or read, whatever Roots allow: a destination at, above or
	// below one is refused, a source below one too, and a source holding
	// one skips it (named in SkippedEntries). They are identified by
	// device and inode when the copy starts (a missing one is ignored), so
	// a hard link or another path to them is caught as well; so are hard
	// links, anywhere, to the files below a protected directory (the
	// directories are listed when the copy first meets a file with more
	// than one link; see protection).
	Protected []string
	// Progress, if set, is called from the copying goroutine at most every
	// 100 ms and once at the end of a successful copy.
	Progress func(Progress)
	// Logger receives debug and warning logs. Nil discards them.
	Logger *slog.Logger
}

// Progress is a copy's progress so far.
type Progress struct {
	// Files counts the file entries handled (sent or kept), of TotalFiles
	// in the source.
	Files, TotalFiles int
	// Bytes counts the file data bytes moved, of TotalBytes that must move
	// (kept files do not count). The sender knows the totals after its
	// walk; the receiver learns them from the root entry.
	Bytes, TotalBytes int64
}

// resolver returns the resolver for the path this end names.
func (o *Options) resolver() *resolver {
	if len(o.Roots) == 0 && len(o.Within) == 0 {
		return &resolver{}
	}
	return newResolver(o.Roots, o.Within)
}

// protected returns the protection of o.Protected (nil without).
func (o *Options) protected() *protection {
	return newProtection(o.Protected, o.logger())
}

func (o *Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

// progress rate-limits Options.Progress.
type progress struct {
	fn   func(Progress)
	last time.Time
	p    Progress
}

func (p *progress) tick(force bool) {
	if p.fn == nil {
		return
	}
	now := time.Now()
	if !force && now.Sub(p.last) < progressEvery {
		return
	}
	p.last = now
	p.fn(p.p)
}

// deadliner is what net.Conn and yamux streams offer to unblock I/O.
type deadliner interface {
	SetDeadline(time.Time) error
}

// conn is the framed stream of one copy: buffered in both directions, with
// a way to unblock pending I/O (abort).
type conn struct {
	rw     io.ReadWriter
	dl     deadliner // nil if rw has no deadlines
	closer io.Closer // used when dl is nil
	fr     *protocol.FrameReader
	bw     *bufio.Writer
	hdr    [5]byte

	mu      sync.Mutex // guards aborted (abort may run from AfterFunc)
	aborted bool
}

func newConn(rw io.ReadWriter) (*conn, error) {
	c := &conn{rw: rw, bw: bufio.NewWriterSize(rw, bufSize)}
	c.fr = protocol.NewFrameReader(bufio.NewReaderSize(rw, readBufSize))
	if d, ok := rw.(deadliner); ok {
		c.dl = d
	} else if cl, ok := rw.(io.Closer); ok {
		c.closer = cl
	} else {
		return nil, errors.New("mirror: the stream must implement SetDeadline or io.Closer")
	}
	return c, nil
}

// abort unblocks every pending and future read and write on the stream.
func (c *conn) abort() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted {
		return
	}
	c.aborted = true
	if c.dl != nil {
		c.dl.SetDeadline(time.Unix(1, 0))
	} else {
		c.closer.Close()
	}
}

func (c *conn) isAborted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.aborted
}

// watch aborts the stream when ctx ends. The returned stop function
// returns once no abort from ctx can happen any more.
func (c *conn) watch(ctx context.Context) (stop func()) {
	done := make(chan struct{})
	s := context.AfterFunc(ctx, func() {
		defer close(done)
		c.abort()
	})
	return func() {
		if !s() && ctx.Err() != nil {
			<-done
		}
	}
}

// writeFrame buffers one frame.
func (c *conn) writeFrame(t protocol.FrameType, payload []byte) error {
	if len(payload) > protocol.MaxFrameSize {
		return fmt.Errorf("write %s frame of %d bytes: %w", t, len(payload), protocol.ErrTooLarge)
	}
	c.hdr[0] = byte(t)
	binary.BigEndian.PutUint32(c.hdr[1:], uint32(len(payload)))
	if _, err := c.bw.Write(c.hdr[:]); err != nil {
		return err
	}
	_, err := c.bw.Write(payload)
	return err
}

// writeData writes a data frame built in place: frame[:5] is free for the
// header and frame[5:] is the payload. It bypasses the buffer (flushing
// what is in it first) so that the payload is not copied.
func (c *conn) writeData(frame []byte) error {
	frame[0] = byte(protocol.FrameFileData)
	binary.BigEndian.PutUint32(frame[1:5], uint32(len(frame)-5))
	if c.bw.Buffered() > 0 {
		if err := c.bw.Flush(); err != nil {
			return err
		}
	}
	_, err := c.rw.Write(frame)
	return err
}

// writeJSON buffers one JSON frame.
func (c *conn) writeJSON(t protocol.FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s frame: %w", t, err)
	}
	return c.writeFrame(t, b)
}

func (c *conn) flush() error { return c.bw.Flush() }

// final writes a last frame (error or cancel) after the copy failed, best
// effort and bounded by finalTimeout when the stream has deadlines. It
// must not run concurrently with other I/O on the stream.
func (c *conn) final(t protocol.FrameType, v any) {
	if c.dl == nil && c.isAborted() {
		return // closed
	}
	if c.dl != nil {
		c.dl.SetDeadline(time.Now().Add(finalTimeout))
		defer c.dl.SetDeadline(time.Time{})
	}
	var payload []byte
	if v != nil {
		payload, _ = json.Marshal(v)
	}
	if c.bw.Flush() == nil {
		if c.writeFrame(t, payload) == nil {
			c.bw.Flush()
		}
		return
	}
	// The buffered writer is broken; the frame goes straight out.
	protocol.WriteFrame(c.rw, t, payload)
}

// next reads the next frame, turning the peer's FrameError and FrameCancel
// into errors (*PeerError, ErrCanceled) and a clean EOF into
// io.ErrUnexpectedEOF: no copy conversation may end between frames.
func (c *conn) next() (protocol.Frame, error) {
	f, err := c.fr.Next()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return f, fmt.Errorf("read frame: %w", err)
	}
	switch f.Type {
	case protocol.FrameError:
		pe := &PeerError{}
		if err := protocol.DecodeJSON(f.Payload, &pe.Info); err != nil {
			return f, fmt.Errorf("peer failed with an unreadable error frame: %w", err)
		}
		return f, pe
	case protocol.FrameCancel:
		return f, ErrCanceled
	}
	return f, nil
}

// isPeerAbort reports whether err came from the peer (so it must not be
// echoed back).
func isPeerAbort(err error) bool {
	var pe *PeerError
	return errors.As(err, &pe) || errors.Is(err, ErrCanceled)
}

// modeBits converts a FileMode's permission and special bits to the
// 07777 bits of the wire.
func modeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// fileMode converts 07777 wire bits to a FileMode for chmod.
func fileMode(b uint32) fs.FileMode {
	m := fs.FileMode(b & 0o777)
	if b&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if b&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if b&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// entryType is the wire type of a FileInfo, or "" for types a copy skips.
func entryType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return protocol.EntryDir
	case m.IsRegular():
		return protocol.EntryFile
	case m&fs.ModeSymlink != 0:
		return protocol.EntrySymlink
	}
	return ""
}
