package agent

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childPipe: the agent's end takes deadlines (it is in the poller), the
// child's end is blocking (a child must not see EAGAIN on its stdout),
// both ends close on exec, and bytes flow the way asked.
func TestChildPipe(t *testing.T) {
	for _, childReads := range []bool{false, true} {
		mine, child, err := childPipe(childReads)
		if err != nil {
			t.Fatal(err)
		}
		// (Through SyscallConn: Fd would make the agent's end blocking.)
		flags := func(f *os.File, cmd int) int {
			sc, err := f.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var v int
			sc.Control(func(fd uintptr) { v, err = unix.FcntlInt(fd, cmd, 0) })
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		for _, f := range []*os.File{mine, child} {
			if flags(f, unix.F_GETFD)&unix.FD_CLOEXEC == 0 {
				t.Errorf("childReads=%v: %s is not close-on-exec", childReads, f.Name())
			}
		}
		if flags(child, unix.F_GETFL)&unix.O_NONBLOCK != 0 {
			t.Errorf("childReads=%v: the child's end is non-blocking", childReads)
		}
		if flags(mine, unix.F_GETFL)&unix.O_NONBLOCK == 0 {
			t.Errorf("childReads=%v: the agent's end is blocking", childReads)
		}
		if childReads {
			// The agent writes, the child reads.
			if _, err := mine.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			var b [1]byte
			if n, err := child.Read(b[:]); n != 1 || err != nil || b[0] != 'x' {
				t.Fatalf("child read %d %q, %v", n, b[:n], err)
			}
		} else {
			// The agent reads with a deadline: nothing written, it
			// times out instead of blocking a thread for good.
			mine.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			var b [1]byte
			if _, err := mine.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("agent read with a deadline: %v, want a deadline error", err)
			}
			mine.SetReadDeadline(time.Time{})
			child.Write([]byte("y"))
			if n, err := mine.Read(b[:]); n != 1 || err != nil || b[0] != 'y' {
				t.Fatalf("agent read %d %q, %v", n, b[:n], err)
			}
		}
		mine.Close()
		child.Close()
	}
	a, err := devNull()
	b, err2 := devNull()
	if err != nil || err2 != nil || a != b {
		t.Fatalf("devNull: %v %v, same file %v", err, err2, a == b)
	}
}
