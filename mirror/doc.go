// Package mirror owns the copy engine behind copy streams (protocol.KindCopy):
// Send walks a source file or tree and streams it, Receive describes what
// the destination has, verifies everything that arrives, stages every new
// or changed entry and puts them all in place at the end. The conversation
// is specified in protocol/copy.go; both the agent (agent/copy.go) and the
// CLI use this package, one on each end.
//
// Semantics are those of rsync -a (with --delete on request): regular
// files, directories and symlinks are copied with their permission bits
// (07777) and modification times; symlinks are copied verbatim as links and
// never followed inside the tree, in the source or in the destination.
// Owners are not copied. Names are any bytes but '/' and NUL (names that
// are not UTF-8 travel base64-encoded, see protocol/copy.go). Entries a
// copy cannot carry (devices, sockets, fifos; files and directories the
// sender cannot read; paths longer than protocol.MaxCopyPathLen; protected
// files) are skipped and named to the receiver, which keeps what the
// destination has at those paths (even with Delete) and reports them in
// CopyResult.SkippedEntries: the copy is partial. Options.Strict makes them
// fail the copy instead, before anything changes. Entries named like a
// stage (".tether-tmp-…", ".tether-stage-…") are another copy's work in
// progress and are never sent.
//
// The path each end names. Send's source and Receive's destination are
// resolved once, in user space, one component at a time on descriptors
// (resolve.go), with every symlink followed, the last one included: a
// source that is a symlink is copied from its target (like rsync -a
// link/ dst), and a destination that is a symlink is written through, as
// cp and scp do (a file lands inside the directory it points to, a tree
// updates that directory). With Options.Roots (the agent's copy roots) the
// walk starts at the root that holds the path and every directory it holds
// stays inside a root: ".." cannot climb above it, a relative symlink
// cannot leave it, and an absolute one continues in the root that holds
// its target or is refused. Options.Within (the paths the coordinator's
// policy granted) narrows the roots: each granted path under a root is
// itself a root, opened by resolving it beneath that root, so the same
// rules keep symlinks inside the grant. Options.Protected (the agent's own state) is
// refused as a destination and as a source, at, above or below it, and
// skipped inside a source, by device and inode; so is another name (a
// hard link) of a file below a protected directory (see protection). Nothing is reopened by
// name later, so a directory swapped for a symlink during the copy cannot
// redirect it: later lookups are openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) from the resolved
// descriptors (one openat(O_NOFOLLOW) per component where the kernel lacks
// openat2), and entries are created, opened and removed by single-component
// *at calls (files with O_EXCL|O_NOFOLLOW).
//
// Safety of the receiver. Every path in the stream is checked with
// protocol.ValidCopyPath, and every entry's parent must be a directory of
// this copy (one the sender sent, so a symlink the sender created earlier
// can never be traversed). Unchanged files whose mode and mtime also match
// are left alone; the others are rewritten. Every file's size and XXH3-128
// checksum are checked before the commit. Any failure, a cancelled context,
// a FrameCancel or FrameError from the peer, or the stream ending before
// FrameCopyEnd removes every staged entry, restores the mtimes of the
// directories they were staged in, and leaves the destination as it was.
//
// Staging and commit. An existing destination directory is updated in
// place: it, and every directory of the tree that the source also has as a
// directory, keeps its identity (inode), so a working directory, an open
// descriptor, a bind mount or a mount point on it keeps working. Each new
// or changed entry is created in one stage directory (".tether-tmp-" with
// the copy's random id) beside the destination, in its parent, so that
// nothing inside the destination changes before the commit, even if the
// receiving process is killed. Where the parent is on another mount (the
// destination is a mount point), unknown (a copy root, reached as such) or
// not writable, the stage goes inside the destination; an entry whose
// directory is on another mount than the stage (a mount inside the tree)
// is staged in that directory under a temporary name instead, so renames
// never cross a mount. A new directory is staged whole, filled under the
// final names inside it. A destination that is absent, or a non-directory
// being replaced, is staged the same way in its parent.
// The commit then, in order: renames every staged entry into place (onto
// a free name with renameat2(RENAME_NOREPLACE); a non-directory over a
// non-directory with rename(2), which replaces it atomically; otherwise
// with renameat2(RENAME_EXCHANGE), the old entry ending under the
// temporary name), moves what the source lacks (with Delete) aside under
// temporary names and gives new read-only directories their modes; a
// failure up to there undoes it all, last first, and the destination is
// as before. Past that point of no return it removes the old entries the
// new ones replaced and the deleted ones, applies the mode and mtime
// changes of unchanged files, and sets the directories' modes and mtimes,
// deepest first, going on past failures and reporting them joined, to the
// peer too (FrameError, copy_failed: "the new tree is in place, but: ...",
// one line naming each entry and the errno), as every failure is unless
// FrameCopyDone is already out. An old directory that another account owns
// (the kernel refuses its chmod or utimes to the copy's account: EPERM,
// owner not the euid) keeps its mode and mtime: the copy only puts entries
// into it, as cp -r src/. dir/ and cp file dir/ do. On
// every exit, success or failure, the receiver removes its temporary
// entries and stage and puts back the modes of old directories it made
// writable for the commit (a normal user cannot rename in a read-only
// one), except when an undo itself fails part-way: then what the undo
// still needs (the old versions of the entries left in place) is kept
// under its temporary names and the error says so. This is the
// window that remains, as with rsync --delay-updates: while the commit
// runs (a rename per changed entry, not a byte of data), a reader may see
// some entries old and others new, never a partial file; a copy killed
// during the commit leaves that mix (each entry whole) and the temporary
// entries not yet renamed, which the next copy removes. Deleting or
// replacing a directory that is or holds a mount point is refused before
// the commit, and a removal never crosses into a mounted file system. An
// unchanged file whose mode or mtime changed gets them set in place at the
// commit, unless it has other hard links (they must not change): then a
// fresh copy replaces it. On file systems without renameat2 flags, a
// replacement that involves a directory moves the old entry aside first,
// which leaves a moment without it. Files are not fsynced (rsync does not
// either).
//
// Concurrency on a destination. Receive holds an exclusive flock, for the
// whole copy, on the directory that holds its stage (the destination's
// parent, usually) and on the destination directory, parent first, so
// copies onto one destination serialize, and so do copies into one
// directory; a copy onto a directory and one onto a directory inside it do
// not. The copy holding a directory's lock removes the stages of killed
// copies it finds there (every copy staging there holds that lock), and,
// inside a destination directory it updates, every temporary entry except
// those below a directory another copy holds locked. Where the file system
// refuses flock (some NFS or Lustre mounts) copies run unlocked and only
// stages older than a day are removed from a parent.
//
// Connections. Send and Receive take the stream as an io.ReadWriter that
// must also implement SetDeadline(time.Time) error (net.Conn, yamux
// streams) or io.Closer: when ctx ends, or the peer aborts while Send is
// writing, they unblock pending I/O with a past deadline (or by closing
// the stream). They never close the stream otherwise: the caller does.
//
// Small files (at most 128 KiB). Per-file system calls, not bytes, bound
// a copy of many small files, so both ends overlap them with the stream
// (pool.go). The sender sends every directory entry before the other
// entries (each kind in walk order, so parents still precede children):
// the receiver builds the directory skeleton first, as rsync's generator
// does. Four reader goroutines open, read and hash the next small files
// (at most 128 files or 16 MiB ahead); results are sent strictly in walk
// order, with the same checks as the streaming path (metadata from the
// open file, a file that changes while read fails the copy). The receiver
// gathers a small file in memory, verifies its size and checksum there,
// and only then hands it to one of two writer goroutines, which create it
// exactly as above (single-component openat with O_EXCL|O_NOFOLLOW on a
// held descriptor of its directory), write it, and set its mode and mtime
// on the open descriptor. At most 16 MiB of verified data waits for the
// writers. The first writer failure fails the copy; every writer is
// finished before directory modes and times are applied, before the
// commit, and before a failed copy's staged entries are removed.
//
// Goroutines. Receive runs in the caller's goroutine, plus the two writer
// goroutines of the first small file on, which it waits for before
// returning. Send starts one reader goroutine for the data phase (it
// watches for the receiver's FrameCopyDone, or an early FrameError or
// FrameCancel that must stop the writes) and the four read-ahead
// goroutines, and waits for all of them before returning. Progress
// callbacks run in the caller's goroutine.
//
// Memory is bounded: large files move in 128 KiB frames through one reused
// buffer; small files in flight are bounded as above (16 MiB per end, plus
// at most 128 files read ahead); the source walk and the destination
// manifest are held in memory (about 200 bytes per entry) and the manifest
// is sent in frames of at most 1 MiB.
//
// This package must not import NATS, the agent, the coordinator or the
// tunnel: it speaks frames over any byte stream.
package mirror
