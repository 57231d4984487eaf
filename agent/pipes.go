package agent

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// childPipe makes a pipe between the agent and a child process: mine, the
// agent's end, is non-blocking and in the runtime's poller (reads and
// writes take deadlines and block no thread); child, the end the child
// gets as its stdin, stdout or stderr, stays a plain blocking descriptor,
// as a child expects, that the agent closes once the child started.
// childReads says which way the data flows (true: the agent writes,
// the child reads).
//
// os.Pipe makes both ends pollable, then os/exec turns the child's end
// back to blocking: that is two fcntl calls and an epoll registration
// and removal spent on an end the agent never reads nor writes, several
// system calls per pipe before every exec's fork (issue 12).
func childPipe(childReads bool) (mine, child *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	m, c := p[0], p[1]
	if childReads {
		m, c = p[1], p[0]
	}
	if err := unix.SetNonblock(m, true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, fmt.Errorf("pipe: set non-blocking: %w", err)
	}
	// os.NewFile sees the non-blocking descriptor and puts it in the
	// poller; the blocking one it leaves alone.
	return os.NewFile(uintptr(m), "|agent"), os.NewFile(uintptr(c), "|child"), nil
}

// devNull is /dev/null, opened once for reading and shared by every
// process started with no stdin: os/exec would open and close it for each
// (an open, an fcntl and a close before every fork). Closing it is never
// needed (it lives as long as the agent); a child gets its own copy.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })
