// Package mirror owns the copy engine behind copy streams (protocol.KindCopy):
// Send walks a source file or tree and streams it, Receive describes what
// the destination has, verifies everything that arrives, builds the new
// tree in a staging directory beside the destination and swaps it into
// place atomically. The conversation is specified in protocol/copy.go; both
// the agent (agent/copy.go) and the CLI use this package, one on each end.
//
// Semantics are those of rsync -a (with --delete on request): regular
// files, directories and symlinks are copied with their permission bits
// (07777) and modification times; symlinks are copied verbatim as links and
// never followed, in the source or in the destination. Other file types
// (devices, sockets, fifos) are skipped by the sender. Owners are not
// copied. Send follows the source root if it is itself a symlink (the user
// named it: like `rsync -a link/ dst`), but nothing below it.
//
// Safety of the receiver. Every path in the stream is checked with
// protocol.ValidCopyPath; every entry's parent must be a directory this
// copy created in the stage (so a symlink the sender created earlier can
// never be traversed); every staged entry is created by a single-component
// *at call (files with O_EXCL|O_NOFOLLOW) on such a directory, opened
// through an os.Root on the stage (which refuses symlink escapes a second
// time); the old tree is only read and hard-linked (linkat without
// following), never written. Unchanged files whose mode and mtime also
// match are hard-linked from the old tree; the others are rewritten. Every file's size
// and XXH3-128 checksum are checked before the commit. Any failure, a cancelled
// context, a FrameCancel or FrameError from the peer, or the stream ending
// before FrameCopyEnd removes the stage and leaves the destination as it
// was.
//
// Commit. The stage is swapped with the destination by
// renameat2(RENAME_EXCHANGE) (or renamed into place with RENAME_NOREPLACE
// when the destination is absent); the stage, now holding the old tree, is
// then removed. On file systems without renameat2 flags the commit falls
// back to two renames (old aside, new into place), which leaves a moment
// without a destination. Files are not fsynced (rsync does not either).
//
// Concurrency on a destination. Receive holds an exclusive flock on the
// destination's parent directory for the whole copy, so copies into one
// directory serialize (also copies to different names in it), and removes
// every stale stage (".tether-stage-*" left by a killed process) it finds
// there. Where the file system refuses flock (some NFS or Lustre mounts)
// copies run unlocked and only stages older than an hour are removed.
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
// held descriptor of a directory this copy created), write it, and set
// its mode and mtime on the open descriptor. At most 16 MiB of verified
// data waits for the writers. The first writer failure fails the copy;
// every writer is finished before directory modes and times are applied,
// before the commit, and before a failed copy's stage is removed.
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
