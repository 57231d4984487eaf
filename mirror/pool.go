package mirror

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Small files dominate trees like source checkouts and datasets of many
// samples, and on them a copy is bound by per-file system calls (creating
// a file costs far more than writing 1 KiB), not by bytes. Both ends
// therefore move small files through a few workers: the receiver verifies
// a small file in memory and hands it to a writer that creates, writes,
// chmods and timestamps it in the stage while the receiving goroutine
// decodes the next frames; the sender opens, reads and hashes the next
// small files ahead of the one on the wire.
const (
	// smallFile is the largest file moved whole through the workers.
	smallFile = chunkSize
	// writers and readers are the worker counts of each end.
	// Creating files in one directory serializes on the directory's lock,
	// so more writers only spin; two keep one creating while the other
	// writes and closes.
	writers = 2
	readers = 4
	// maxInFlight bounds the bytes of small files held in memory by
	// each end (queued, being written, or read ahead).
	maxInFlight = 16 << 20
	// maxReadAhead bounds how many files the sender reads ahead.
	maxReadAhead = 128
)

// smallIOHook, when set by a test, runs before a small file rel is written
// ("write") or read ("read"), and before any source file is opened
// ("open"): an error fails that file (for "open", as the open's error).
var smallIOHook func(op, rel string) error

// budget bounds the bytes held by in-flight small files.
type budget struct {
	mu   sync.Mutex
	cond sync.Cond
	used int64
}

// acquire waits until n more bytes fit (one file always fits when none is
// held).
func (b *budget) acquire(n int64) {
	b.mu.Lock()
	if b.cond.L == nil {
		b.cond.L = &b.mu
	}
	for b.used > 0 && b.used+n > maxInFlight {
		b.cond.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

// tryAcquire takes n bytes if they fit now.
func (b *budget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used > 0 && b.used+n > maxInFlight {
		return false
	}
	b.used += n
	return true
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	if b.cond.L != nil {
		b.cond.Broadcast()
	}
}

// writeJob is a verified small file to create in the stage: name in dir,
// a directory this copy created.
type writeJob struct {
	rel   string
	path  string // where rel is copied to, for errors (receiver.destPath)
	dir   *dirRef
	name  string
	data  []byte
	mode  uint32
	mtime int64
}

// writerPool writes verified small files into the stage. The receiving
// goroutine submits; the first failure is kept, later jobs are skipped,
// and wait returns the failure once every worker is gone.
type writerPool struct {
	jobs   chan writeJob
	wg     sync.WaitGroup
	budget budget
	failed atomic.Bool
	mu     sync.Mutex
	err    error
}

func newWriterPool() *writerPool {
	p := &writerPool{jobs: make(chan writeJob, 4*writers)}
	p.wg.Add(writers)
	for range writers {
		go p.work()
	}
	return p
}

func (p *writerPool) work() {
	defer p.wg.Done()
	for j := range p.jobs {
		if !p.failed.Load() {
			if err := writeSmall(&j); err != nil {
				p.fail(err)
			}
		}
		j.dir.release()
		p.budget.release(int64(len(j.data)))
	}
}

func (p *writerPool) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	p.failed.Store(true)
}

// failure returns the first failure so far.
func (p *writerPool) failure() error {
	if !p.failed.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// submit queues j; its data must have been acquired from p.budget.
func (p *writerPool) submit(j writeJob) { p.jobs <- j }

// wait stops the workers once the queue is done and returns the first
// failure. With abort, queued jobs are skipped.
func (p *writerPool) wait(abort bool) error {
	if abort {
		p.fail(errors.New("copy aborted"))
	}
	close(p.jobs)
	p.wg.Wait()
	return p.failure()
}

// writeSmall creates j's file (never opening an existing one or following
// a symlink), writes it, and sets its mode and mtime on the open file.
// Failing to create, write or close it is a *WriteError.
func writeSmall(j *writeJob) error {
	fd, err := openFd(j.dir.fd, j.name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return writeError(j.path, err)
	}
	if smallIOHook != nil {
		if err := smallIOHook("write", j.rel); err != nil {
			unix.Close(fd)
			return writeError(j.path, err)
		}
	}
	for b := j.data; len(b) > 0; {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return writeError(j.path, err)
		}
		b = b[n:]
	}
	if err := fdMeta(fd, j.mode, j.mtime); err != nil {
		unix.Close(fd)
		return fmt.Errorf("entry %q: %w", j.rel, err)
	}
	if err := unix.Close(fd); err != nil {
		return writeError(j.path, err)
	}
	return nil
}

// fdMeta sets the open file's permission bits, then its mtime (after the
// writes, which would change it, and after chmod, which a write by a
// non-owner would undo for setuid bits).
func fdMeta(fd int, mode uint32, mtime int64) error {
	if err := unix.Fchmod(fd, mode&0o7777); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := futimens(fd, mtime); err != nil {
		return fmt.Errorf("set mtime: %w", err)
	}
	return nil
}

// futimens sets the mtime of the open file fd, leaving its atime alone:
// utimensat(fd, NULL, ...), which Linux applies to fd itself.
func futimens(fd int, mtime int64) error {
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime)}
	for {
		_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

// openFd opens name in the directory dfd without following a symlink and
// returns the raw descriptor.
func openFd(dfd int, name string, flags int, perm uint32) (int, error) {
	for {
		fd, err := unix.Openat(dfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// readJob is a small source file read ahead: the file's metadata as
// fstat saw it when it was opened, its content and digest, or why it could
// not be read. big says it grew past smallFile: it must be streamed.
type readJob struct {
	rel  string
	dir  *dirRef
	name string
	size int64 // the walk's size: what the budget holds

	done chan struct{}
	st   unix.Stat_t
	data []byte
	sum  string
	big  bool
	// openErr says the file could not be opened as a regular file (the
	// sender may skip it); err that reading it failed.
	openErr error
	err     error // always the source's fault
}

// readerPool reads small source files ahead of the sender.
type readerPool struct {
	jobs   chan *readJob
	wg     sync.WaitGroup
	budget budget
}

func newReaderPool() *readerPool {
	p := &readerPool{jobs: make(chan *readJob, maxReadAhead)}
	p.wg.Add(readers)
	for range readers {
		go p.work()
	}
	return p
}

func (p *readerPool) work() {
	defer p.wg.Done()
	for j := range p.jobs {
		readSmall(j)
		j.dir.release()
		close(j.done)
	}
}

// stop waits for the workers; jobs queued are still read (and dropped).
func (p *readerPool) stop() {
	close(p.jobs)
	p.wg.Wait()
}

// readSmall reads j's file whole. Like the streaming path it takes the
// metadata from the open file and fails if the file changes while read.
func readSmall(j *readJob) {
	if smallIOHook != nil {
		if err := smallIOHook("open", j.rel); err != nil {
			j.openErr = fmt.Errorf("open %q: %w", j.rel, err)
			return
		}
		if j.err = smallIOHook("read", j.rel); j.err != nil {
			return
		}
	}
	// O_NONBLOCK: a fifo swapped in since the walk must not block.
	fd, err := openFd(j.dir.fd, j.name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		j.openErr = fmt.Errorf("open %q: %w", j.rel, err)
		return
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &j.st); err != nil || j.st.Mode&unix.S_IFMT != unix.S_IFREG {
		j.openErr = fmt.Errorf("source file %q changed while copying: %w", j.rel, errNotRegular)
		return
	}
	if j.st.Size > smallFile || j.st.Size > j.size {
		j.big = true // grew since the walk: the streaming path copes
		return
	}
	data := make([]byte, j.st.Size)
	for off := 0; off < len(data); {
		n, err := unix.Read(fd, data[off:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			j.err = fmt.Errorf("read %q: %w", j.rel, err)
			return
		}
		if n == 0 {
			j.err = fmt.Errorf("source file %q shrank while being read (to %d of %d bytes): %w", j.rel, off, len(data), io.ErrUnexpectedEOF)
			return
		}
		off += n
	}
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil || st2.Size != j.st.Size || st2.Mtim != j.st.Mtim {
		j.err = fmt.Errorf("source file %q changed while being read", j.rel)
		return
	}
	h := newFileHash()
	h.Write(data)
	j.data, j.sum = data, hashHex(h)
}
