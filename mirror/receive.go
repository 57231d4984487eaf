package mirror

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/protocol"
)

const (
	// tmpPrefix starts the name of every entry a copy stages: a new or
	// changed entry waits under a temporary name in its final directory
	// until the commit renames it into place.
	tmpPrefix = ".tether-tmp-"
	// stagePrefix starts the staging directories of earlier versions,
	// which a copy removes as stale too.
	stagePrefix = ".tether-stage-"
	// staleAge is how old an unlocked stage must be before a copy on a
	// file system without flock removes it.
	staleAge = 24 * time.Hour
)

// Receive makes dst a copy of what the peer sends on conn: it sends the
// manifest of dst, receives and verifies every entry, stages each new or
// changed one under a temporary name in its final directory, puts them
// all in place at the end and answers FrameCopyDone with the result.
//
// dst is resolved as Options.Roots say, following its symlinks, the last
// one included (as cp and scp do); missing parent directories are created
// (mkdir -p). An existing directory is updated in place, so it keeps its
// identity (its inode: working directories, open descriptors, bind mounts
// and mount points on it keep working); anything else is replaced by the
// source's type (a directory over a non-directory only with
// Options.Delete). Inside the tree, as rsync -a does, an entry of another
// type replaces a file, a symlink or an empty directory (counted in
// CopyResult.Replaced), but a non-empty directory only with
// Options.Delete: without it the source's file or symlink is skipped
// (CopyResult.Skipped, or a failure with Options.Strict) and the directory
// kept. Below dst nothing is ever followed.
//
// On any failure before the commit (including ctx ending, the peer's
// FrameError or FrameCancel, and the stream ending early) dst is left as it
// was, every temporary entry is removed, and a FrameError is sent unless
// the peer aborted or the stream is gone. The commit itself renames one
// entry after another (see the package documentation for that window); a
// failure during or after it is sent as a FrameError too, saying where the
// destination stands.
// Receive blocks until the copy is committed or failed; it does not close
// conn.
func Receive(ctx context.Context, dst string, conn io.ReadWriter, opts Options) (*protocol.CopyResult, error) {
	c, err := newConn(conn)
	if err != nil {
		return nil, err
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	r := &receiver{
		c: c, opts: opts, log: opts.logger().With("dst", dst), dst: dst,
		rsv: opts.resolver(), prot: opts.protected(), id: hex.EncodeToString(rnd[:]),
		prog: progress{fn: opts.Progress}, base: -1,
		created: make(map[string]string), dirs: make(map[string]*rdir), viaStage: make(map[string]bool),
		touched: make(map[string]bool), skipped: make(map[string]bool),
	}
	r.rsv.prot = r.prot
	stop := c.watch(ctx)
	res, err := r.run()
	stop()
	if cerr := r.cleanup(); cerr != nil {
		if err == nil {
			// Committed and reported done: the leftovers are logged.
			r.log.Warn("copy committed, but its cleanup failed", "err", cerr)
		} else {
			err = fmt.Errorf("%w (cleanup: %w)", err, cerr)
		}
	}
	if err != nil {
		if cerr := context.Cause(ctx); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%w)", err, cerr)
		}
		err = &Error{Op: "receive", Path: dst, Err: err}
		// Every failure is reported, a commit's past its point of no
		// return too (the message says the new tree is in place): only a
		// copy-done already on its way, or the peer's own abort, is not
		// followed by an error frame.
		if !r.doneSent && !isPeerAbort(err) {
			if ctx.Err() != nil {
				c.final(protocol.FrameCancel, nil)
			} else {
				c.final(protocol.FrameError, &protocol.ErrorInfo{Code: errorCode(err), Message: peerMessage(err)})
			}
		}
		r.log.Debug("copy failed", "err", err)
		return res, err
	}
	return res, nil
}

// errorCode picks the ErrorInfo code for a failed copy: bad_request for a
// copy that is not allowed or a peer that broke the protocol, else
// copy_failed (a path missing or not permitted, a file system error, the
// source changing while read).
func errorCode(err error) string {
	var ve *violation
	var rf *refusal
	if errors.As(err, &ve) || errors.As(err, &rf) {
		return protocol.CodeBadRequest
	}
	return protocol.CodeCopyFailed
}

// peerMessage is what the peer is told about err: a refusal's own text
// (it names the path and says why, for the user on the other end), else
// the chain below the *Error of Send or Receive (the peer knows which
// path and which way).
func peerMessage(err error) string {
	var rf *refusal
	if errors.As(err, &rf) {
		return rf.msg
	}
	var me *Error
	if errors.As(err, &me) {
		return me.Err.Error()
	}
	return err.Error()
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
	id    fileID
	nlink uint64
	mount bool // a directory on another device than its parent: a mount point
}

// lateMode is a directory of the stage whose final mode waits for the
// renames: meta, and its index in receiver.staged.
type lateMode struct {
	meta dirMeta
	i    int
}

// aside is an old entry a deletion moved to temp in the directory parent
// (its tree path), from rel.
type aside struct {
	rel, parent, temp string
	back              bool // put back by a rollback
}

// dirMeta is a directory's final mode and mtime, applied after its
// children.
type dirMeta struct {
	rel   string
	mode  uint32
	mtime int64
}

// loc is where a directory is: path below the descriptor base.
type loc struct {
	base int
	path string
}

// rdir is a directory of the new tree.
type rdir struct {
	loc loc
	old bool // an existing directory, updated in place
}

// staged is a new or changed entry waiting to be renamed into place: in
// the stage directory, or, where its final directory is on another mount
// than the stage, under a temporary name beside its final one. Everything
// below a staged directory is inside it under its final names.
type staged struct {
	rel      string
	parent   string // its directory in the tree; "" for the root (the destination's parent)
	inStage  bool   // in the stage directory, else beside its final name
	temp     string // its name there
	typ      string // the new entry's type
	replaces string // the old entry's type there, or ""
	placed   bool
	// undo, once placed, puts the old entry back and the new one at
	// temp again, given the descriptors of the stage (or parent) and the
	// parent, and the entry's name; nil where the old entry is gone (a
	// plain rename over it, without renameat2 flags).
	undo func(sfd, dfd int, name string) error
}

// stageDir is the directory a copy stages new and changed entries in:
// beside the destination (in its parent) when that is on the same mount,
// else inside the destination directory itself. It is created when the
// first entry is staged.
type stageDir struct {
	parent int      // descriptor of the directory holding it
	mnt    mountKey // parent's mount
	name   string   // its name there; "" until created
	ref    *dirRef  // its descriptor, lent to the writers
	mtime  int64    // parent's mtime before the stage was created
	seq    int
}

// mountKey identifies the mount a file is on: its mount ID where statx
// reports one (Linux 5.8 on), else its device.
type mountKey struct {
	mnt    uint64
	hasMnt bool
	dev    uint64
}

func mountOf(fd int) mountKey {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_MNT_ID, &stx); err == nil {
		k := mountKey{dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor)}
		if stx.Mask&unix.STATX_MNT_ID != 0 {
			k.mnt, k.hasMnt = stx.Mnt_id, true
		}
		return k
	}
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	return mountKey{dev: uint64(st.Dev)}
}

// same reports whether a rename between files on a and b can work.
func (a mountKey) same(b mountKey) bool {
	if a.hasMnt && b.hasMnt {
		return a.mnt == b.mnt
	}
	return a.dev == b.dev
}

// fix is a metadata update of a kept entry, applied at the commit: a
// file's mode and mtime, a symlink's mtime.
type fix struct {
	rel   string
	typ   string
	mode  uint32
	mtime int64
	id    fileID
}

// receiver is one Receive's state; it is used by one goroutine.
type receiver struct {
	c    *conn
	opts Options
	log  *slog.Logger
	prog progress
	rsv  *resolver
	prot *protection
	id   string // random: this copy's temporary names carry it
	seq  int

	dst string // as named (plus "/NAME" once a file moved into it)

	// The destination: the entry name in the directory pdir, or (name
	// "") the directory ddir itself. ddir is set when the destination is
	// an existing directory.
	pdir    *os.File
	name    string
	ddir    *os.File
	stageP  bool  // the stage goes in pdir (else in ddir)
	locks   []int // the locked directories' descriptors (pdir's, then ddir's)
	pLocked bool  // pdir is locked

	oldType string // "" if dst is absent
	old     []oldEntry
	oldBy   map[string]*oldEntry
	mounts  []string // old directories that are mount points

	base     int              // the destination directory's descriptor, in place
	dirs     map[string]*rdir // directories of the new tree
	cache    dirCache         // directories of the new tree
	stage    stageDir
	viaStage map[string]bool // old directory -> its new entries go through the stage
	rootType string          // the source root's type
	// doneSent: FrameCopyDone is written (or being written): no error
	// frame may follow it.
	doneSent bool
	// final: the commit passed its point of no return (every entry in
	// place, deletions done): what is left is removing the old entries
	// and setting old directories' metadata. Until then every failure
	// rolls the commit back, and cleanup removes what it staged.
	final bool
	// stuck: a rollback stopped part-way; cleanup keeps what a rollback
	// by hand still needs (the old versions of entries still in place).
	stuck bool
	// asides are the old entries the commit's deletions moved to a
	// temporary name beside them (removed at the point of no return, put
	// back by a rollback).
	asides []aside

	created map[string]string // path -> type, for every entry of the source
	staged  []staged
	touched map[string]bool // old directories holding a temporary entry beside its final one
	fixes   []fix
	dirMeta []dirMeta
	// lateModes are the new directories moved from the stage to another
	// parent whose final mode lacks u+w: moving a directory to another
	// parent needs write permission on it (its ".." changes), so they
	// stay u+w until every entry is in place.
	lateModes []lateMode
	skipped   map[string]bool // paths the sender could not carry, or the receiver refused
	// refused are the source entries the receiver skipped: a file or
	// symlink whose destination is a non-empty directory, without
	// Options.Delete (see refuse).
	refused map[string]bool
	// parents are the old directories holding entries; built on first
	// use by holdsEntries.
	parents map[string]bool
	cur     *incoming

	pool *writerPool // writes small files; nil until the first one

	entries   int   // FrameEntry frames received
	skips     int   // FrameCopySkip frames received
	dataBytes int64 // file data bytes received
	res       protocol.CopyResult
	buf       []byte
}

// incoming is the file whose data is arriving: into f, or for a small
// file into buf (then dir and name say where the writer creates it).
type incoming struct {
	e       protocol.CopyEntry
	f       *os.File
	buf     []byte
	dir     *dirRef
	name    string
	h       *xxh3.Hasher
	written int64
	discard bool // a refused file: its data is verified, not written
}

func (r *receiver) run() (*protocol.CopyResult, error) {
	t, err := r.rsv.resolve(r.dst, true)
	if err != nil {
		return nil, err
	}
	if err := r.open(t); err != nil {
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
	wire := res
	wire.EncodeNames()
	r.doneSent = true
	if err := r.c.writeJSON(protocol.FrameCopyDone, &wire); err != nil {
		return &res, fmt.Errorf("committed, but sending copy-done failed: %w", err)
	}
	if err := r.c.flush(); err != nil {
		return &res, fmt.Errorf("committed, but sending copy-done failed: %w", err)
	}
	r.log.Debug("copy committed", "entries", res.Entries, "written", res.FilesWritten, "kept", res.FilesKept, "bytes", res.BytesWritten, "deleted", res.Deleted, "skipped", res.Skipped)
	return &res, nil
}

// open takes the resolved destination t: it opens the destination
// directory if there is one and locks what the copy changes: the
// directory that will hold the stage (the destination's parent, unless it
// is on another mount or unknown: a copy root, the working directory), and
// the destination directory. Locks are taken parent first, so copies never
// wait for each other in a cycle. It checks the destination is not
// protected and removes stale stages from a locked parent.
func (r *receiver) open(t target) error {
	for attempt := 0; ; attempt++ {
		if attempt == 8 {
			t.dir.Close()
			return fmt.Errorf("destination %s keeps changing while the copy opens it", r.dst)
		}
		if t.name == "" {
			r.ddir = t.dir
			if err := r.lock(int(r.ddir.Fd())); err != nil {
				return err
			}
			break
		}
		pfd := int(t.dir.Fd())
		var st unix.Stat_t
		err := unix.Fstatat(pfd, t.name, &st, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
			fd, err := openBeneath(pfd, t.name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				continue // replaced since the fstatat
			}
			d := os.NewFile(uintptr(fd), t.name)
			stageP := mountOf(pfd).same(mountOf(fd))
			pLocked := false
			if stageP {
				if err := r.lock(pfd); err != nil {
					d.Close()
					t.dir.Close()
					return err
				}
				pLocked = len(r.locks) > 0
			}
			if err := r.lock(fd); err != nil {
				d.Close()
				t.dir.Close()
				return err
			}
			var now unix.Stat_t
			if id, err := fdID(fd); err != nil || unix.Fstatat(pfd, t.name, &now, unix.AT_SYMLINK_NOFOLLOW) != nil || idOf(&now) != id {
				r.unlock()
				d.Close()
				continue // replaced while we waited for the lock
			}
			r.pdir, r.name, r.ddir, r.stageP, r.pLocked = t.dir, t.name, d, stageP, pLocked
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
			// A symlink appeared after the resolver followed the path:
			// follow it again.
			t.dir.Close()
			if t, err = r.rsv.resolve(r.dst, true); err != nil {
				return err
			}
			continue
		case err != nil && err != unix.ENOENT:
			t.dir.Close()
			return fmt.Errorf("lstat destination: %w", err)
		default:
			if err := r.lock(pfd); err != nil {
				t.dir.Close()
				return err
			}
			var now unix.Stat_t
			if unix.Fstatat(pfd, t.name, &now, unix.AT_SYMLINK_NOFOLLOW) == nil && now.Mode&unix.S_IFMT == unix.S_IFDIR {
				r.unlock()
				continue // became a directory while we waited for the lock
			}
			r.pdir, r.name, r.stageP, r.pLocked = t.dir, t.name, true, len(r.locks) == 1
		}
		break
	}
	if r.ddir != nil {
		var st unix.Stat_t
		if id, err := fdID(int(r.ddir.Fd())); err == nil && unix.Stat("/", &st) == nil && id == idOf(&st) {
			return refusef("copy destination %s is the root directory /: copy to a directory below it", r.dst)
		}
		if err := checkProtected(int(r.ddir.Fd()), "", r.prot, "copy destination "+r.dst); err != nil {
			return err
		}
	} else if err := checkProtected(int(r.pdir.Fd()), r.name, r.prot, "copy destination "+r.dst); err != nil {
		return err
	}
	if r.stageP {
		r.removeStale()
	}
	return nil
}

// lock takes an exclusive flock on the directory fd, waiting for another
// copy that holds it; where the file system refuses flock the copy runs
// unlocked.
func (r *receiver) lock(fd int) error {
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			r.locks = append(r.locks, fd)
			return nil
		}
		if err == unix.EINTR {
			continue
		}
		if err != unix.EWOULDBLOCK {
			r.log.Warn("cannot lock the destination; copying unlocked", "err", err)
			return nil
		}
		// Another copy onto this destination is running: wait for it.
		// The stream's abort (ctx) cannot interrupt this wait, so check it.
		if r.c.isAborted() {
			return errors.New("canceled while waiting for another copy onto the same destination")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *receiver) unlock() {
	for _, fd := range r.locks {
		unix.Flock(fd, unix.LOCK_UN)
	}
	r.locks = r.locks[:0]
}

// isTempName reports whether name looks like an entry this package
// staged: tmpPrefix, 16 hex digits, '-', a sequence number; or a stage
// directory of earlier versions.
func isTempName(name string) bool {
	if rest, ok := strings.CutPrefix(name, tmpPrefix); ok {
		id, seq, ok := strings.Cut(rest, "-")
		if !ok || len(id) != 16 || seq == "" {
			return false
		}
		if _, err := hex.DecodeString(id); err != nil {
			return false
		}
		_, err := strconv.ParseUint(seq, 10, 64)
		return err == nil
	}
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

// tempName returns a new temporary name.
func (r *receiver) tempName() string {
	r.seq++
	return tmpPrefix + r.id + "-" + strconv.Itoa(r.seq)
}

// removeStale removes what killed copies staged in the destination's
// parent: every stage when we hold its lock (every copy staging there
// takes it), else only old ones.
func (r *receiver) removeStale() {
	pfd := int(r.pdir.Fd())
	fd, err := openAt1(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return
	}
	d := os.NewFile(uintptr(fd), ".")
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, name := range names {
		if !isTempName(name) {
			continue
		}
		if !r.pLocked {
			var st unix.Stat_t
			if unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || time.Since(time.Unix(st.Mtim.Unix())) < staleAge {
				continue
			}
		}
		r.log.Info("removing stale copy stage", "stage", name)
		if err := removeAt(pfd, name); err != nil {
			r.log.Warn("cannot remove stale copy stage", "stage", name, "err", err)
		}
	}
}

// scanOld records what the destination has. In a directory it also
// removes the temporary entries of killed copies, except below a
// directory another copy holds locked (that copy is alive), and refuses a
// destination holding a protected file.
func (r *receiver) scanOld() error {
	r.oldBy = make(map[string]*oldEntry)
	add := func(rel string, fi *statInfo, parentDev uint64) {
		t := entryType(fi.Mode())
		if t == "" {
			t = "other"
		}
		r.old = append(r.old, oldEntry{rel: rel, typ: t, mode: modeBits(fi.Mode()), mtime: fi.ModTime().UnixNano(),
			size: fi.Size(), id: fi.id, nlink: fi.nlink, mount: t == protocol.EntryDir && fi.id.dev != parentDev})
	}
	switch {
	case r.ddir != nil:
		var st unix.Stat_t
		if err := unix.Fstat(int(r.ddir.Fd()), &st); err != nil {
			return fmt.Errorf("stat destination: %w", err)
		}
		r.oldType = protocol.EntryDir
		root := newStatInfo(".", &st)
		add(".", root, root.id.dev)
		busy := map[string]bool{}
		devs := map[string]uint64{".": root.id.dev}
		var stale []string
		w := walker{base: int(r.ddir.Fd())}
		w.dir = func(rel string, fd int) error {
			if rel == "." {
				return nil
			}
			b := busy[parentOf(rel)]
			if !b {
				if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err == unix.EWOULDBLOCK {
					b = true
				} else if err == nil {
					unix.Flock(fd, unix.LOCK_UN)
				}
			}
			busy[rel] = b
			return nil
		}
		w.entry = func(rel string, fi *statInfo) error {
			if isTempName(fi.Name()) {
				if len(r.locks) > 0 && !busy[parentOf(rel)] {
					stale = append(stale, rel)
				}
				return errSkipDir
			}
			switch k, p := r.prot.match(fi.id, fi.Mode().IsRegular(), fi.nlink); k {
			case isProtected:
				return refusef("copy destination %s holds the agent's own state (%s at %q): never copied onto", r.dst, p, rel)
			case maybeProtected:
				return refusef("copy destination %s holds %q, which has other hard links and cannot be told apart from the agent's own state (%s): never copied onto", r.dst, rel, p)
			}
			add(rel, fi, devs[parentOf(rel)])
			if fi.IsDir() {
				devs[rel] = fi.id.dev
			}
			return nil
		}
		if err := w.walk("."); err != nil {
			var rf *refusal
			if errors.As(err, &rf) {
				return err
			}
			return fmt.Errorf("scan destination: %w", err)
		}
		if len(stale) > 0 {
			oc := dirCache{base: int(r.ddir.Fd())}
			for _, rel := range stale {
				r.log.Info("removing stale copy stage", "stage", rel)
				fd, err := oc.fd(parentOf(rel))
				if err == nil {
					err = removeAt(fd, path.Base(rel))
				}
				if err != nil {
					r.log.Warn("cannot remove stale copy stage", "stage", rel, "err", err)
				}
			}
			oc.close()
		}
		for i := range r.old {
			if r.old[i].mount && r.old[i].rel != "." {
				r.mounts = append(r.mounts, r.old[i].rel)
			}
		}
	default:
		var st unix.Stat_t
		err := unix.Fstatat(int(r.pdir.Fd()), r.name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == unix.ENOENT {
			return nil
		}
		if err != nil {
			return fmt.Errorf("lstat destination: %w", err)
		}
		fi := newStatInfo(r.name, &st)
		add(".", fi, fi.id.dev)
		r.oldType = r.old[0].typ
	}
	for i := range r.old {
		r.oldBy[r.old[i].rel] = &r.old[i]
	}
	return nil
}

// openOld opens the old file rel for reading and checks it is still the
// regular file the scan saw.
func (r *receiver) openOld(rel string, cache *dirCache) (*os.File, error) {
	o := r.oldBy[rel]
	var f *os.File
	var err error
	if rel == "." {
		f, err = openAt(int(r.pdir.Fd()), r.name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	} else {
		var fd int
		if fd, err = cache.fd(parentOf(rel)); err == nil {
			f, err = openAt(fd, path.Base(rel), unix.O_RDONLY|unix.O_NONBLOCK, 0)
		}
	}
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || idOf(&st) != o.id {
		f.Close()
		return nil, fmt.Errorf("%q changed since the scan", rel)
	}
	return f, nil
}

// sendManifest describes dst to the sender.
func (r *receiver) sendManifest() error {
	mw := &manifestWriter{c: r.c}
	if r.oldType == protocol.EntryDir || r.oldType == protocol.EntryFile {
		buf := make([]byte, chunkSize)
		var oc dirCache
		if r.ddir != nil {
			oc.base = int(r.ddir.Fd())
		}
		defer oc.close()
		for i := range r.old {
			o := &r.old[i]
			if o.typ == "other" || len(o.rel) > protocol.MaxCopyPathLen {
				continue // never matches a source entry
			}
			e := protocol.ManifestEntry{Path: o.rel, Type: o.typ, Mode: o.mode, MtimeNS: o.mtime}
			if o.typ == protocol.EntryFile {
				e.Size = o.size
				if r.opts.Checksum {
					f, err := r.openOld(o.rel, &oc)
					if err == nil {
						e.XXH128, err = hashFd(f, buf)
						f.Close()
					}
					if err != nil {
						return fmt.Errorf("hash %q: %w", o.rel, err)
					}
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

// receive applies the sender's entries until FrameCopyEnd.
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
			if err := e.DecodeNames(); err != nil {
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
		case protocol.FrameCopySkip:
			var sk protocol.CopySkip
			if err := protocol.DecodeJSON(f.Payload, &sk); err != nil {
				return violationf("copy skip: %v", err)
			}
			if err := r.skip(&sk); err != nil {
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
			if end.Entries != r.entries || end.Bytes != r.dataBytes || end.Skipped != r.skips {
				return violationf("copy end announces %d entries, %d bytes and %d skips, received %d, %d and %d",
					end.Entries, end.Bytes, end.Skipped, r.entries, r.dataBytes, r.skips)
			}
			return nil
		default:
			return violationf("unexpected %s frame", f.Type)
		}
	}
}

// skip records an entry the sender could not carry.
func (r *receiver) skip(sk *protocol.CopySkip) error {
	if err := sk.DecodeNames(); err != nil {
		return violationf("%v", err)
	}
	if err := sk.Validate(); err != nil {
		return violationf("%v", err)
	}
	if r.rootType == "" {
		return violationf("copy skip %q before the root entry", sk.Path)
	}
	if r.cur != nil {
		return violationf("copy skip %q inside file %q", sk.Path, r.cur.e.Path)
	}
	r.skips++
	r.skipped[sk.Path] = true
	r.res.Skipped++
	if len(r.res.SkippedEntries) < protocol.MaxReportedSkips {
		r.res.SkippedEntries = append(r.res.SkippedEntries, *sk)
	}
	return nil
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
	if _, dup := r.created[e.Path]; dup || r.refused[e.Path] {
		return violationf("entry %q: duplicate", e.Path)
	}
	if r.rootType == "" {
		if e.Path != "." {
			return violationf("entry %q: the first entry must be the root \".\"", e.Path)
		}
		if err := r.placeRoot(e); err != nil {
			return err
		}
		r.created["."] = e.Type
		return r.startRoot(e)
	}
	if e.Path == "." {
		return violationf("entry \".\": duplicate root")
	}
	parent := r.dirs[parentOf(e.Path)]
	if parent == nil {
		// Only directories of this copy may hold entries: this is what
		// stops a symlink the sender made from being traversed.
		return violationf("entry %q: parent %q is not a directory of this copy", e.Path, parentOf(e.Path))
	}
	var o *oldEntry
	if parent.old {
		o = r.oldBy[e.Path]
	}
	if e.Type != protocol.EntryDir && o != nil && o.typ == protocol.EntryDir && !r.opts.Delete && r.holdsEntries(o.rel) {
		return r.refuse(e)
	}
	r.created[e.Path] = e.Type
	name := path.Base(e.Path)
	switch e.Type {
	case protocol.EntryDir:
		r.dirMeta = append(r.dirMeta, dirMeta{rel: e.Path, mode: e.Mode, mtime: e.MtimeNS})
		if o != nil && o.typ == protocol.EntryDir {
			r.dirs[e.Path] = &rdir{loc: loc{parent.loc.base, joinPhys(parent.loc.path, name)}, old: true}
			return nil
		}
		ref, at, err := r.newEntry(e, parent, o)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(ref.fd, at.name, 0o700)
		ref.release()
		if err != nil {
			return writeError(r.destPath(e.Path), err)
		}
		r.dirs[e.Path] = &rdir{loc: at.loc}
	case protocol.EntrySymlink:
		if o != nil && o.typ == protocol.EntrySymlink {
			fd, err := r.cache.fd(parentOf(e.Path))
			if err != nil {
				return fmt.Errorf("entry %q: %w", e.Path, err)
			}
			if link, err := readlinkAt(fd, name); err == nil && link == e.Link {
				if o.mtime != e.MtimeNS {
					r.fixes = append(r.fixes, fix{rel: e.Path, typ: e.Type, mtime: e.MtimeNS})
				}
				return nil
			}
		}
		ref, at, err := r.newEntry(e, parent, o)
		if err != nil {
			return err
		}
		defer ref.release()
		if err := unix.Symlinkat(e.Link, ref.fd, at.name); err != nil {
			return writeError(r.destPath(e.Path), err)
		}
		if err := setMtimeAt(ref.fd, at.name, e.MtimeNS); err != nil {
			return fmt.Errorf("entry %q: set symlink mtime: %w", e.Path, err)
		}
	case protocol.EntryFile:
		if e.Keep {
			r.prog.p.Files++
			r.prog.tick(false)
			return r.keep(e, o)
		}
		ref, at, err := r.newEntry(e, parent, o)
		if err != nil {
			return err
		}
		if e.Size <= smallFile {
			// Gathered in memory, verified, then written by the pool,
			// which releases ref.
			if r.pool == nil {
				r.pool = newWriterPool()
			}
			r.pool.budget.acquire(e.Size)
			r.cur = &incoming{e: *e, dir: ref, name: at.name, buf: make([]byte, 0, e.Size), h: newFileHash()}
			return nil
		}
		f, err := openAt(ref.fd, at.name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
		ref.release()
		if err != nil {
			return writeError(r.destPath(e.Path), err)
		}
		r.cur = &incoming{e: *e, f: f, h: newFileHash()}
	}
	return nil
}

// holdsEntries reports whether the old directory rel holds entries.
func (r *receiver) holdsEntries(rel string) bool {
	if r.parents == nil {
		r.parents = make(map[string]bool)
		for i := range r.old {
			if o := &r.old[i]; o.rel != "." {
				r.parents[parentOf(o.rel)] = true
			}
		}
	}
	return r.parents[rel]
}

// refuse skips the source entry e, a file or symlink whose destination
// is a non-empty directory, as rsync -a does without --delete: replacing
// the directory would delete the entries it holds, which the source
// lacks. The directory stays whole, e is reported as skipped (a partial
// copy), and a file's data is received and verified but not written. With
// Options.Strict the copy fails instead.
func (r *receiver) refuse(e *protocol.CopyEntry) error {
	why := "the destination has a non-empty directory there; replacing it with a " + e.Type + " needs --delete"
	if r.opts.Strict {
		return fmt.Errorf("entry %q: %s", e.Path, why)
	}
	if r.refused == nil {
		r.refused = make(map[string]bool)
	}
	r.refused[e.Path] = true
	r.skipped[e.Path] = true
	r.res.Skipped++
	if len(r.res.SkippedEntries) < protocol.MaxReportedSkips {
		r.res.SkippedEntries = append(r.res.SkippedEntries, protocol.CopySkip{Path: e.Path, Reason: why})
	}
	r.log.Info("skipped an entry that would replace a non-empty directory", "path", e.Path, "type", e.Type)
	if e.Type == protocol.EntryFile && !e.Keep {
		r.cur = &incoming{e: *e, h: newFileHash(), discard: true}
	}
	return nil
}

// joinPhys joins a directory's physical path and a name.
func joinPhys(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}

// where is where a new entry is created: name in a directory, which is
// at loc.
type where struct {
	name string
	loc  loc // the new entry's own location (for a directory)
}

// newEntry decides where the new entry e (whose old version is o, if any)
// is created and returns its directory, held for the caller to release.
// Below a new directory it is created under its own name; in an old
// directory it is staged for the commit: in the stage directory, or
// beside its final name where that directory is on another mount.
func (r *receiver) newEntry(e *protocol.CopyEntry, parent *rdir, o *oldEntry) (*dirRef, where, error) {
	prel := parentOf(e.Path)
	if !parent.old {
		ref, err := r.cache.hold(prel)
		if err != nil {
			return nil, where{}, fmt.Errorf("entry %q: %w", e.Path, err)
		}
		name := path.Base(e.Path)
		return ref, where{name: name, loc: loc{parent.loc.base, joinPhys(parent.loc.path, name)}}, nil
	}
	s := staged{rel: e.Path, parent: prel, typ: e.Type}
	if o != nil {
		s.replaces = o.typ
	}
	via, ok := r.viaStage[prel]
	if !ok {
		fd, err := r.cache.fd(prel)
		if err != nil {
			return nil, where{}, fmt.Errorf("entry %q: %w", e.Path, err)
		}
		via = mountOf(fd).same(r.stage.mnt)
		r.viaStage[prel] = via
	}
	var ref *dirRef
	var w where
	if via {
		var err error
		if ref, w, err = r.inStage(); err != nil {
			return nil, where{}, fmt.Errorf("entry %q: %w", e.Path, err)
		}
		s.inStage, s.temp = true, w.name
	} else {
		var err error
		if ref, err = r.cache.hold(prel); err != nil {
			return nil, where{}, fmt.Errorf("entry %q: %w", e.Path, err)
		}
		s.temp = r.tempName()
		w = where{name: s.temp, loc: loc{parent.loc.base, joinPhys(parent.loc.path, s.temp)}}
		r.touched[prel] = true
	}
	r.staged = append(r.staged, s)
	return ref, w, nil
}

// stageError words err, from creating the stage (the copy's temporary
// directory) in its parent: the directory named as the user knows it, and
// why, without the receiver's word "stage". /proc and other virtual file
// systems answer ENOENT for a directory that exists: said so.
func (r *receiver) stageError(err error) error {
	dir := filepath.Dir(r.dst) // the stage is beside the destination
	if r.ddir != nil && r.stage.parent == int(r.ddir.Fd()) {
		dir = r.dst // or in it, an existing directory
	}
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("cannot create the copy's temporary directory in %s: %w (the file system there takes no new entries)", dir, err)
	}
	return fmt.Errorf("cannot create the copy's temporary directory in %s: %w", dir, err)
}

// inStage returns the stage directory, held, and a new name in it; the
// stage is created on first use.
func (r *receiver) inStage() (*dirRef, where, error) {
	st := &r.stage
	if st.ref == nil {
		var pst unix.Stat_t
		if unix.Fstat(st.parent, &pst) == nil {
			st.mtime = pst.Mtim.Nano()
		}
		name := r.tempName()
		err := unix.Mkdirat(st.parent, name, 0o700)
		if (err == unix.EACCES || err == unix.EPERM || err == unix.EROFS) && r.ddir != nil && st.parent != int(r.ddir.Fd()) {
			// The parent is not ours to write (a home directory's
			// parent): stage inside the destination, on the same mount.
			st.parent = int(r.ddir.Fd())
			if unix.Fstat(st.parent, &pst) == nil {
				st.mtime = pst.Mtim.Nano()
			}
			err = unix.Mkdirat(st.parent, name, 0o700)
		}
		if err != nil {
			return nil, where{}, r.stageError(err)
		}
		st.name = name
		fd, err := openBeneath(st.parent, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil, where{}, fmt.Errorf("open stage: %w", err)
		}
		st.ref = &dirRef{fd: fd}
		st.ref.refs.Store(1)
		r.log.Debug("staging", "stage", name)
	}
	st.seq++
	name := strconv.Itoa(st.seq)
	st.ref.refs.Add(1)
	return st.ref, where{name: name, loc: loc{st.ref.fd, name}}, nil
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
// directory: the old destination is released and the new one resolved
// (a symlink there is followed too), locked and scanned. Nothing was
// staged yet.
func (r *receiver) moveInto(name string) error {
	r.release()
	r.old, r.oldBy, r.oldType, r.mounts = nil, nil, "", nil
	r.dst = strings.TrimSuffix(r.dst, "/") + "/" + name
	r.log = r.log.With("into", r.dst)
	t, err := r.rsv.resolve(r.dst, true)
	if err != nil {
		return err
	}
	if err := r.open(t); err != nil {
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

// release closes the destination's descriptors, which drops the locks.
func (r *receiver) release() {
	r.cache.close()
	r.locks, r.pLocked, r.stageP = nil, false, false
	if r.ddir != nil {
		r.ddir.Close()
		r.ddir = nil
	}
	if r.pdir != nil {
		r.pdir.Close()
		r.pdir = nil
	}
}

// startRoot sets up the new tree for the root entry e: in place in an
// existing directory, else staged.
func (r *receiver) startRoot(e *protocol.CopyEntry) error {
	r.rootType = e.Type
	if e.TotalFiles > 0 || e.TotalBytes > 0 {
		r.prog.p.TotalFiles, r.prog.p.TotalBytes = e.TotalFiles, e.TotalBytes
	}
	if r.stageP {
		r.stage.parent = int(r.pdir.Fd())
	} else {
		r.stage.parent = int(r.ddir.Fd())
	}
	r.stage.mnt = mountOf(r.stage.parent)
	r.cache = dirCache{loc: r.loc}
	if e.Type == protocol.EntryDir && r.oldType == protocol.EntryDir {
		r.base = int(r.ddir.Fd())
		r.dirs["."] = &rdir{loc: loc{r.base, "."}, old: true}
		r.dirMeta = append(r.dirMeta, dirMeta{rel: ".", mode: e.Mode, mtime: e.MtimeNS})
		r.log.Debug("updating in place", "type", e.Type)
		return nil
	}
	// Absent, or a non-directory that the source replaces.
	if e.Type == protocol.EntryFile && e.Keep {
		r.prog.p.Files++
		r.prog.tick(false)
		return r.keep(e, r.oldBy["."])
	}
	ref, w, err := r.inStage()
	if err != nil {
		return err
	}
	defer ref.release()
	r.staged = append(r.staged, staged{rel: ".", inStage: true, temp: w.name, typ: e.Type, replaces: r.oldType})
	switch e.Type {
	case protocol.EntryDir:
		if err := unix.Mkdirat(ref.fd, w.name, 0o700); err != nil {
			return fmt.Errorf("create the new directory in the copy's temporary directory: %w", err)
		}
		r.dirs["."] = &rdir{loc: w.loc}
		r.dirMeta = append(r.dirMeta, dirMeta{rel: ".", mode: e.Mode, mtime: e.MtimeNS})
	case protocol.EntryFile:
		f, err := openAt(ref.fd, w.name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("create the new file in the copy's temporary directory: %w", err)
		}
		r.cur = &incoming{e: *e, f: f, h: newFileHash()}
	}
	return nil
}

// loc maps a directory of the new tree to where it is.
func (r *receiver) loc(rel string) (int, string) {
	if d := r.dirs[rel]; d != nil {
		return d.loc.base, d.loc.path
	}
	return r.base, rel
}

// keep handles a file the destination already has (o, the same size):
// nothing to do when its mode and mtime match; else they are set at the
// commit, or, for a file with other hard links (whose other names must not
// change), a fresh copy replaces it.
func (r *receiver) keep(e *protocol.CopyEntry, o *oldEntry) error {
	if o == nil || o.typ != protocol.EntryFile || o.size != e.Size {
		return violationf("entry %q: kept, but the destination has no such file", e.Path)
	}
	r.res.FilesKept++
	if o.mode == e.Mode && o.mtime == e.MtimeNS {
		return nil
	}
	if o.nlink <= 1 {
		r.fixes = append(r.fixes, fix{rel: e.Path, typ: protocol.EntryFile, mode: e.Mode, mtime: e.MtimeNS, id: o.id})
		return nil
	}
	src, err := r.openOld(e.Path, &r.cache)
	if err != nil {
		return fmt.Errorf("entry %q: copy unchanged file: %w", e.Path, err)
	}
	defer src.Close()
	var ref *dirRef
	var w where
	if e.Path == "." {
		if ref, w, err = r.inStage(); err != nil {
			return fmt.Errorf("entry %q: %w", e.Path, err)
		}
		r.staged = append(r.staged, staged{rel: ".", inStage: true, temp: w.name, typ: e.Type, replaces: o.typ})
	} else if ref, w, err = r.newEntry(e, r.dirs[parentOf(e.Path)], o); err != nil {
		return err
	}
	dst, err := openAt(ref.fd, w.name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	ref.release()
	if err != nil {
		return fmt.Errorf("entry %q: copy unchanged file: %w", e.Path, err)
	}
	if r.buf == nil {
		r.buf = make([]byte, chunkSize)
	}
	n, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, r.buf)
	if err == nil && n != e.Size {
		err = errors.New("destination file changed during the copy")
	}
	if err != nil {
		dst.Close()
		return fmt.Errorf("entry %q: copy unchanged file: %w", e.Path, err)
	}
	return r.setFileMeta(e.Path, dst, e.Mode, e.MtimeNS)
}

// setFileMeta chmods the open staged file f, sets its mtime and closes
// it.
func (r *receiver) setFileMeta(rel string, f *os.File, mode uint32, mtime int64) error {
	err := fdMeta(int(f.Fd()), mode, mtime)
	cerr := f.Close()
	if err != nil {
		return fmt.Errorf("entry %q: %w", rel, err)
	}
	if cerr != nil {
		// A file system that delays its writes (NFS) reports a full
		// disk at close.
		return writeError(r.destPath(rel), cerr)
	}
	return nil
}

// dataWriteHook, when set by a test, runs before data of the streamed file
// rel is written: an error fails the write.
var dataWriteHook func(rel string) error

// write writes p to c's staged file.
func (r *receiver) write(c *incoming, p []byte) error {
	if dataWriteHook != nil {
		if err := dataWriteHook(c.e.Path); err != nil {
			return err
		}
	}
	_, err := c.f.Write(p)
	return err
}

// destPath is the path the entry rel of the copy is copied to: the
// destination itself for the root, else a path under it.
func (r *receiver) destPath(rel string) string {
	if rel == "." {
		return r.dst
	}
	return strings.TrimSuffix(r.dst, "/") + "/" + rel
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
	if c.discard {
		// a refused file: nothing is written
	} else if c.buf != nil {
		c.buf = append(c.buf, p...)
	} else if err := r.write(c, p); err != nil {
		return writeError(r.destPath(c.e.Path), err)
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
	if c.discard {
		r.prog.p.Files++
		r.prog.tick(false)
		return nil
	}
	if c.buf != nil {
		r.pool.submit(writeJob{rel: c.e.Path, path: r.destPath(c.e.Path), dir: c.dir, name: c.name, data: c.buf, mode: c.e.Mode, mtime: c.e.MtimeNS})
	} else if err := r.setFileMeta(c.e.Path, c.f, c.e.Mode, c.e.MtimeNS); err != nil {
		return err
	}
	r.res.FilesWritten++
	r.res.BytesWritten += c.written
	r.prog.p.Files++
	r.prog.tick(false)
	return nil
}

// kept reports whether the old entry rel is spared by a skip: the sender
// could not carry it (or a directory holding it), so the destination's
// version stays.
func (r *receiver) kept(rel string) bool {
	if len(r.skipped) == 0 {
		return false
	}
	for p := rel; ; p = parentOf(p) {
		if r.skipped[p] {
			return true
		}
		if p == "." {
			return false
		}
	}
}

// deletions lists the old entries the commit removes (Options.Delete):
// the topmost ones the source lacks inside directories updated in place,
// except those a skip spares. It also counts the entries of the new tree
// and the old entries that go.
func (r *receiver) deletions() []*oldEntry {
	var del []*oldEntry
	entries, deleted := len(r.created), 0
	for i := range r.old {
		o := &r.old[i]
		if _, ok := r.created[o.rel]; ok || o.rel == "." {
			continue
		}
		// The nearest ancestor in the new tree decides.
		top, a := o.rel, parentOf(o.rel)
		for {
			if _, ok := r.created[a]; ok {
				break
			}
			top, a = a, parentOf(a)
		}
		d := r.dirs[a]
		switch {
		case d == nil || !d.old:
			deleted++ // below an old entry the new tree replaced
		case !r.opts.Delete || r.kept(top):
			entries++
		default:
			deleted++
			if top == o.rel {
				del = append(del, o)
			}
		}
	}
	replaced := 0
	for _, s := range r.staged {
		if s.replaces != "" && s.replaces != s.typ {
			replaced++
		}
	}
	r.res.Entries, r.res.Deleted, r.res.Replaced = entries, deleted, replaced
	return del
}

// holdsMount reports whether the old directory rel is, or holds, a mount
// point.
func (r *receiver) holdsMount(rel string) bool {
	for _, m := range r.mounts {
		if m == rel || strings.HasPrefix(m, rel+"/") {
			return true
		}
	}
	return false
}

// finish prepares the commit: it refuses to delete or replace a mount
// point (before anything changed), and applies the modes and mtimes of
// the directories this copy created, deepest first.
func (r *receiver) finish() error {
	for _, o := range r.deletions() {
		if o.typ == protocol.EntryDir && r.holdsMount(o.rel) {
			return fmt.Errorf("cannot delete %q: it is or holds a mount point", o.rel)
		}
	}
	for _, s := range r.staged {
		if s.replaces == protocol.EntryDir && s.rel != "." && r.holdsMount(s.rel) {
			return fmt.Errorf("cannot replace %q with a %s: it is or holds a mount point", s.rel, s.typ)
		}
	}
	moved := map[string]int{}
	for i, s := range r.staged {
		if s.inStage && s.typ == protocol.EntryDir {
			moved[s.rel] = i
		}
	}
	for i := len(r.dirMeta) - 1; i >= 0; i-- {
		d := r.dirMeta[i]
		if r.dirs[d.rel].old {
			continue // at the commit
		}
		if i, ok := moved[d.rel]; ok && d.mode&0o200 == 0 {
			r.lateModes = append(r.lateModes, lateMode{meta: d, i: i})
			d.mode |= 0o200
		}
		if err := r.setDirMeta(d, false); err != nil {
			return err
		}
	}
	return nil
}

// applyLateModes gives the placed directories of lateModes their final
// modes (and mtimes again: a rename leaves them, so this is harmless). It
// goes on past a failure and returns the first.
func (r *receiver) applyLateModes() error {
	var first error
	for _, l := range r.lateModes {
		s := &r.staged[l.i]
		if !s.placed {
			continue // removed with the stage
		}
		dfd, name, err := r.placedAt(s)
		if err == nil {
			err = hook(stepLateMode, s.rel)
		}
		if err == nil {
			var fd int
			if fd, err = openFd(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0); err == nil {
				err = fdMeta(fd, l.meta.mode, l.meta.mtime)
				unix.Close(fd)
			}
		}
		if err != nil && first == nil {
			first = fmt.Errorf("entry %q: set mode %#o after the renames: %w", s.rel, l.meta.mode&0o7777, err)
		}
	}
	return first
}

// writableParents gives u+w to the old directories the commit adds
// entries to or removes entries from, where they lack it: a normal user
// cannot change a read-only directory. The old directories' final modes
// come after the renames (commit's last pass), and cleanup puts back the
// old mode after a failure (they are marked touched).
func (r *receiver) writableParents() error {
	parents := map[string]bool{}
	for _, s := range r.staged {
		if s.rel != "." {
			parents[s.parent] = true
		}
	}
	if r.opts.Delete {
		for _, o := range r.deletions() {
			parents[parentOf(o.rel)] = true
		}
	}
	for rel := range parents {
		o, d := r.oldBy[rel], r.dirs[rel]
		if o == nil || d == nil || !d.old || o.typ != protocol.EntryDir || o.mode&0o200 != 0 {
			continue
		}
		if err := hook(stepWritable, rel); err != nil {
			return fmt.Errorf("entry %q: make it writable for the commit: %w", rel, err)
		}
		base, p := r.loc(rel)
		fd, err := openBeneath(base, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return fmt.Errorf("entry %q: open: %w", rel, err)
		}
		err = unix.Fchmod(fd, o.mode&0o7777|0o200)
		foreign := err != nil && r.notOurs(rel, fd, err)
		unix.Close(fd)
		if foreign {
			// Another account's: its group or other bits decide, as
			// the renames will tell.
			continue
		}
		if err != nil {
			return fmt.Errorf("entry %q: make it writable for the commit: %w", rel, err)
		}
		if r.touched == nil {
			r.touched = map[string]bool{}
		}
		r.touched[rel] = true
	}
	return nil
}

// commitHook, when set by a test, runs before the staged entry rel is put
// in place; an error fails the commit there.
var commitHook func(rel string) error

// stepHook, when set by a test, runs before step (one of the step*
// values) of the commit or its rollback on the entry rel; an error fails
// that step there, as the file system would.
var stepHook func(step, rel string) error

// Steps of stepHook.
const (
	stepWritable = "writable" // writableParents, per directory
	stepDelete   = "delete"   // a deletion (moving the old entry aside)
	stepLateMode = "latemode" // applyLateModes, per directory
	stepUndo     = "undo"     // rollback, per entry put back
	stepRemove   = "remove"   // removing an old entry after the point of no return
	stepFix      = "fix"      // a kept entry's metadata
	stepDirMeta  = "dirmeta"  // an old directory's final metadata
)

// hook runs stepHook, if set.
func hook(step, rel string) error {
	if stepHook == nil {
		return nil
	}
	return stepHook(step, rel)
}

// rollback undoes the renames of a commit that failed part-way, last
// first: the deletions' (their old entries come back from aside), then
// the staged entries' (the old entries come back, the new ones go to
// their temporary names again). It marks the old directories whose mtimes
// the renames changed for cleanup to put back, and stops at the first
// entry it cannot put back.
func (r *receiver) rollback() error {
	for i := len(r.asides) - 1; i >= 0; i-- {
		a := &r.asides[i]
		if a.back {
			continue
		}
		err := hook(stepUndo, a.rel)
		if err == nil {
			var fd int
			if fd, err = r.cache.fd(a.parent); err == nil {
				err = unix.Renameat2(fd, a.temp, fd, path.Base(a.rel), unix.RENAME_NOREPLACE)
				if err == unix.EINVAL || err == unix.ENOSYS {
					err = unix.Renameat(fd, a.temp, fd, path.Base(a.rel))
				}
			}
		}
		if err != nil {
			return fmt.Errorf("put back deleted %q: %w", a.rel, err)
		}
		a.back = true
		r.touched[a.parent] = true
	}
	for i := len(r.staged) - 1; i >= 0; i-- {
		s := &r.staged[i]
		if !s.placed {
			continue
		}
		if s.undo == nil {
			return fmt.Errorf("entry %q replaced its old version for good", s.rel)
		}
		err := hook(stepUndo, s.rel)
		if err == nil {
			var dfd int
			var name string
			if dfd, name, err = r.placedAt(s); err == nil {
				sfd := dfd
				if s.inStage {
					sfd = r.stage.ref.fd
				}
				err = s.undo(sfd, dfd, name)
			}
		}
		if err != nil {
			return fmt.Errorf("put back %q: %w", s.rel, err)
		}
		s.placed = false
		if s.rel != "." {
			r.touched[s.parent] = true
		}
	}
	return nil
}

// writableToMove gives the old directory name in dfd u+w when the staged
// entry s, from the stage, replaces it: the exchange moves it to another
// parent. The function it returns puts the old mode back on the old
// directory when it is at name in dfd (after a failed or undone exchange).
func (r *receiver) writableToMove(s *staged, dfd int, name string) func(dfd int, name string) {
	nop := func(int, string) {}
	if !s.inStage || s.replaces != protocol.EntryDir {
		return nop
	}
	fd, err := openFd(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nop
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&0o200 != 0 || unix.Fchmod(fd, st.Mode&0o7777|0o200) != nil {
		return nop
	}
	id := idOf(&st)
	return func(dfd int, name string) {
		fd, err := openFd(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		var now unix.Stat_t
		if unix.Fstat(fd, &now) == nil && idOf(&now) == id {
			unix.Fchmod(fd, st.Mode&0o7777)
		}
	}
}

// placedAt is the directory and name the staged entry s goes to.
func (r *receiver) placedAt(s *staged) (int, string, error) {
	if s.rel == "." {
		return int(r.pdir.Fd()), r.name, nil
	}
	dfd, err := r.cache.fd(s.parent)
	if err != nil {
		return 0, "", err
	}
	return dfd, path.Base(s.rel), nil
}

// setDirMeta sets the directory d's mode and mtime (only where they
// differ, with onlyChanged). An old directory that another account owns
// keeps them (see notOurs).
func (r *receiver) setDirMeta(d dirMeta, onlyChanged bool) error {
	base, p := r.loc(d.rel)
	fd, err := openBeneath(base, p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("entry %q: open: %w", d.rel, err)
	}
	defer unix.Close(fd)
	if onlyChanged {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err == nil && uint32(st.Mode)&0o7777 == d.mode&0o7777 && st.Mtim.Nano() == d.mtime {
			return nil
		}
	}
	if err := fdMeta(fd, d.mode, d.mtime); err != nil {
		if r.notOurs(d.rel, fd, err) {
			r.log.Debug("an existing directory of another account keeps its mode and mtime", "path", d.rel)
			return nil
		}
		return fmt.Errorf("entry %q: %w", d.rel, err)
	}
	return nil
}

// notOurs reports whether err, from changing the metadata of the
// directory rel (open as fd), is the kernel refusing it to a non-owner: an
// old directory (not one this copy created) owned by another account than
// the one the copy runs as. Such a directory, a shared one such as root's
// 0777 or 1777 directory that the copy only writes into, keeps its mode
// and mtime, as `cp -r src/. dir/` and `cp file dir/` leave it: only its
// owner could change them, and the entries are what the copy is for.
func (r *receiver) notOurs(rel string, fd int, err error) bool {
	if !errors.Is(err, unix.EPERM) {
		return false
	}
	if d := r.dirs[rel]; d == nil || !d.old {
		return false
	}
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && int(st.Uid) != os.Geteuid()
}

// commit puts every staged entry in place, moves aside what the source
// lacks (with Options.Delete) and gives the placed directories their late
// modes; a failure up to there rolls it all back (the destination is as
// before) and leaves the rest to cleanup. Past that point of no return it
// removes the old entries the new ones replaced or the deletions moved
// aside and the stage, and applies the metadata of kept entries and old
// directories, deepest first, going on past failures and returning them
// joined (the destination holds the new tree).
func (r *receiver) commit() error {
	var garbage []staged // old entries swapped out beside their names
	placed := 0
	fail := func(err error) error {
		if placed == 0 && len(r.asides) == 0 {
			return fmt.Errorf("commit: %w", err)
		}
		uerr := r.rollback()
		if uerr == nil {
			what := fmt.Sprintf("the %d entries already put in place were", placed)
			if placed == 1 {
				what = "the entry already put in place was"
			}
			return fmt.Errorf("commit: %w (%s put back: the destination is as before)", err, what)
		}
		r.log.Warn("cannot undo the commit", "err", uerr)
		placed = 0 // what the rollback left
		for _, s := range r.staged {
			if s.placed {
				placed++
			}
		}
		r.stuck = true
		if merr := r.applyLateModes(); merr != nil {
			r.log.Warn("cannot set a directory's mode", "err", merr)
			uerr = joinErrors(uerr, merr)
		}
		return fmt.Errorf("commit failed after %d of %d changed entries were put in place, and putting them back failed (the destination holds those new entries and the old others; the old versions of the new entries are kept under their temporary names beside them or in the stage): %w", placed, len(r.staged), joinErrors(err, uerr))
	}
	if err := r.writableParents(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	for i := range r.staged {
		s := &r.staged[i]
		dfd, name, err := r.placedAt(s)
		if err != nil {
			return fail(err)
		}
		sfd := dfd
		if s.inStage {
			sfd = r.stage.ref.fd
		}
		if commitHook != nil {
			if err := commitHook(s.rel); err != nil {
				return fail(fmt.Errorf("put %q in place: %w", s.rel, err))
			}
		}
		temp := s.temp
		back := func(sfd, dfd int, name string) error { return unix.Renameat(dfd, name, sfd, temp) }
		exchange := func(sfd, dfd int, name string) error {
			return unix.Renameat2(sfd, temp, dfd, name, unix.RENAME_EXCHANGE)
		}
		switch {
		case s.replaces == "":
			err = unix.Renameat2(sfd, s.temp, dfd, name, unix.RENAME_NOREPLACE)
			if err == unix.EINVAL || err == unix.ENOSYS {
				err = unix.Renameat(sfd, s.temp, dfd, name)
			}
			s.undo = back
		default:
			// The old entry ends under the temporary name (removed with
			// the stage, or below), so that a failure later can put it
			// back. An old directory going to the stage needs u+w to
			// move (its ".." changes); it is removed there, or gets its
			// mode back if the exchange fails or is undone.
			restore := r.writableToMove(s, dfd, name)
			err = exchange(sfd, dfd, name)
			if err != nil {
				restore(dfd, name)
			}
			s.undo = func(sfd, dfd int, name string) error {
				err := exchange(sfd, dfd, name)
				if err == nil {
					restore(dfd, name)
				}
				return err
			}
			switch {
			case (err == unix.EINVAL || err == unix.ENOSYS) && s.typ != protocol.EntryDir && s.replaces != protocol.EntryDir:
				err = unix.Renameat(sfd, s.temp, dfd, name)
				s.undo = nil
			case err == unix.EINVAL || err == unix.ENOSYS:
				// No renameat2 flags here: the old entry goes aside
				// first, which leaves a moment without it.
				aside := r.tempName()
				if err = unix.Renameat(dfd, name, dfd, aside); err == nil {
					if err = unix.Renameat(sfd, s.temp, dfd, name); err != nil {
						unix.Renameat(dfd, aside, dfd, name)
					} else {
						garbage = append(garbage, staged{rel: s.rel, parent: s.parent, temp: aside})
						s.undo = func(sfd, dfd int, name string) error {
							if err := back(sfd, dfd, name); err != nil {
								return err
							}
							return unix.Renameat(dfd, aside, dfd, name)
						}
					}
				}
			case err == nil && !s.inStage:
				garbage = append(garbage, *s)
			}
		}
		if err != nil {
			return fail(fmt.Errorf("put %q in place: %w", s.rel, err))
		}
		s.placed = true
		placed++
	}
	if r.opts.Delete {
		// Moved aside, not removed: a failure up to the point of no
		// return puts them back.
		for _, o := range r.deletions() {
			temp := r.tempName()
			parent := parentOf(o.rel)
			err := hook(stepDelete, o.rel)
			if err == nil {
				var fd int
				if fd, err = r.cache.fd(parent); err == nil {
					err = unix.Renameat2(fd, path.Base(o.rel), fd, temp, unix.RENAME_NOREPLACE)
					if err == unix.EINVAL || err == unix.ENOSYS {
						err = unix.Renameat(fd, path.Base(o.rel), fd, temp)
					}
				}
			}
			if err != nil {
				return fail(fmt.Errorf("delete %q: %w", o.rel, err))
			}
			r.asides = append(r.asides, aside{rel: o.rel, parent: parent, temp: temp})
		}
	}
	if err := r.applyLateModes(); err != nil {
		return fail(err)
	}

	// The point of no return: the new tree is in place.
	r.final = true
	var errs []error
	for _, a := range r.asides {
		garbage = append(garbage, staged{rel: a.rel, parent: a.parent, temp: a.temp})
	}
	for _, g := range garbage {
		dfd := int(0)
		err := hook(stepRemove, g.rel)
		if g.rel == "." {
			dfd = int(r.pdir.Fd())
		} else if err == nil {
			dfd, err = r.cache.fd(g.parent)
		}
		if err == nil {
			err = removeAt(dfd, g.temp)
		}
		if err != nil {
			r.log.Warn("cannot remove the replaced entry", "path", g.rel, "err", err)
			errs = append(errs, fmt.Errorf("remove the old version of %q (%s): %w", g.rel, g.temp, err))
		}
	}
	if err := r.removeStage(r.ddir != nil && r.stageP); err != nil {
		errs = append(errs, err)
	}
	for _, f := range r.fixes {
		err := hook(stepFix, f.rel)
		if err != nil {
			err = fmt.Errorf("entry %q: %w", f.rel, err) // as applyFix names it
		} else {
			err = r.applyFix(f)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(r.dirMeta) - 1; i >= 0; i-- {
		d := r.dirMeta[i]
		if !r.dirs[d.rel].old {
			continue // set before the commit
		}
		err := hook(stepDirMeta, d.rel)
		if err != nil {
			err = fmt.Errorf("entry %q: %w", d.rel, err) // as setDirMeta names it
		} else {
			err = r.setDirMeta(d, true)
		}
		if err != nil {
			errs = append(errs, err)
			// Not left with the u+w writableParents gave it: its old
			// mode, if that can be set.
			if o := r.oldBy[d.rel]; o != nil && r.touched[d.rel] {
				if rerr := r.setDirMeta(dirMeta{rel: d.rel, mode: o.mode, mtime: o.mtime}, true); rerr != nil {
					errs = append(errs, fmt.Errorf("restore the mode of %q: %w", d.rel, rerr))
				}
			}
		}
	}
	r.touched = map[string]bool{} // each has its final metadata, or its old one
	if err := joinErrors(errs...); err != nil {
		return fmt.Errorf("commit: the new tree is in place, but: %w", err)
	}
	return nil
}

// removeStage removes the stage directory with what is left in it (the
// entries the new tree replaced, or everything after a failure), and puts
// back its parent's mtime when restore is set.
func (r *receiver) removeStage(restore bool) error {
	st := &r.stage
	if st.ref == nil {
		return nil
	}
	st.ref.release()
	st.ref = nil
	var err error
	if err = removeAt(st.parent, st.name); err != nil {
		r.log.Warn("cannot remove the copy's stage", "stage", st.name, "err", err)
		err = fmt.Errorf("remove the copy's stage %s: %w", st.name, err)
	}
	if restore && st.mtime != 0 {
		futimens(st.parent, st.mtime)
	}
	return err
}

// applyFix sets a kept entry's metadata in place.
func (r *receiver) applyFix(f fix) error {
	dfd, name := 0, r.name
	if f.rel != "." {
		var err error
		if dfd, err = r.cache.fd(parentOf(f.rel)); err != nil {
			return fmt.Errorf("entry %q: %w", f.rel, err)
		}
		name = path.Base(f.rel)
	} else {
		dfd = int(r.pdir.Fd())
	}
	if f.typ == protocol.EntrySymlink {
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			return fmt.Errorf("entry %q: changed during the copy", f.rel)
		}
		if err := setMtimeAt(dfd, name, f.mtime); err != nil {
			return fmt.Errorf("entry %q: set symlink mtime: %w", f.rel, err)
		}
		return nil
	}
	fd, err := openFd(dfd, name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("entry %q: %w", f.rel, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || idOf(&st) != f.id {
		return fmt.Errorf("entry %q: changed during the copy", f.rel)
	}
	if err := fdMeta(fd, f.mode, f.mtime); err != nil {
		return fmt.Errorf("entry %q: %w", f.rel, err)
	}
	return nil
}

// cleanup removes what a failed copy staged, restores the modes and
// mtimes of the old directories it made writable or staged in, and
// releases everything. It runs on every exit path, goes on past failures
// and returns them joined. It never removes what a rollback by hand
// still needs: after a rollback that stopped part-way (stuck), the old
// versions of the entries still in place stay under their temporary names
// (beside them, or in the stage, which then stays).
func (r *receiver) cleanup() error {
	var errs []error
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
		// No writer may touch a staged entry once its removal starts.
		r.pool.wait(true)
		r.pool = nil
	}
	keepStage := false
	if !r.final {
		for i := len(r.staged) - 1; i >= 0; i-- {
			s := r.staged[i]
			if s.placed {
				// Its old version is at its temporary name (or in the
				// stage): kept.
				keepStage = keepStage || s.inStage
				if !s.inStage {
					r.log.Warn("the old version of an entry the commit could not put back is kept", "path", s.rel, "as", s.temp)
				}
				continue
			}
			if s.inStage {
				continue // removed with the stage
			}
			fd, err := r.cache.fd(s.parent)
			if err == nil {
				err = removeAt(fd, s.temp)
			}
			if err != nil {
				r.log.Warn("cannot remove a staged entry", "path", s.rel, "stage", s.temp, "err", err)
				errs = append(errs, fmt.Errorf("remove the staged entry %q (%s): %w", s.rel, s.temp, err))
			}
		}
		for _, a := range r.asides {
			if !a.back {
				r.log.Warn("an entry the commit deleted and could not put back is kept", "path", a.rel, "as", a.temp)
			}
		}
	}
	// Creating and removing temporary entries changed their directories'
	// mtimes, and the commit made read-only ones writable: put them back
	// (none are left once the commit passed its point of no return: it
	// set their final metadata, or their old one).
	for rel := range r.touched {
		if o := r.oldBy[rel]; o != nil && o.typ == protocol.EntryDir && r.dirs[rel] != nil {
			if err := r.setDirMeta(dirMeta{rel: rel, mode: o.mode, mtime: o.mtime}, true); err != nil {
				errs = append(errs, fmt.Errorf("restore the mode of %q: %w", rel, err))
			}
		}
	}
	if keepStage {
		r.log.Warn("the copy's stage holds old versions the commit could not put back; kept", "stage", r.stage.name)
		r.stage.ref.release()
		r.stage.ref = nil
	} else if err := r.removeStage(true); err != nil {
		errs = append(errs, err)
	}
	r.release()
	return joinErrors(errs...)
}

// joinedErrors is errors.Join on one line: the errors apart by "; ", for a
// message the peer shows as one (an error frame's).
type joinedErrors []error

func (e joinedErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

// Unwrap gives errors.Is and errors.As every error.
func (e joinedErrors) Unwrap() []error { return e }

// joinErrors joins the non-nil errs as errors.Join does, on one line; nil
// if none, the error itself if only one.
func joinErrors(errs ...error) error {
	var out joinedErrors
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	switch len(out) {
	case 0:
		return nil
	case 1:
		return out[0]
	}
	return out
}
