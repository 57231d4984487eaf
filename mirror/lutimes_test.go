package mirror

import (
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func lutimes(t testing.TB, p string, ts []syscall.Timespec) {
	t.Helper()
	uts := []unix.Timespec{unix.Timespec(ts[0]), unix.Timespec(ts[1])}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, uts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}
