package countcopy

import (
	"os"

	"golang.org/x/sys/unix"
)

// GrowPipe asks the kernel to make f's pipe hold size bytes
// (F_SETPIPE_SZ), when f is a pipe; it does nothing for any other file
// and is best effort: past /proc/sys/fs/pipe-max-size, or past the
// user's pipe allowance, the pipe keeps its size (64 KiB by default). A
// bulk copy through a bigger pipe takes fewer, larger reads and writes,
// and so fewer wake-ups of the process at the other end. It goes through
// SyscallConn, not Fd, which would make f blocking (no deadlines).
func GrowPipe(f *os.File, size int) {
	if f == nil {
		return
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		return
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		if cur, err := unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0); err == nil && cur >= size {
			return // never shrink a pipe someone already grew
		}
		unix.FcntlInt(fd, unix.F_SETPIPE_SZ, size)
	})
}
