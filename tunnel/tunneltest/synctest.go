package tunneltest

import (
	"context"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// synctestEnv names the environment variable that tells a child test
// process which test to run inside its bubble.
const synctestEnv = "TETHER_TUNNELTEST_SYNCTEST"

// Synctest runs f inside a testing/synctest bubble, so that f's timers and
// sleeps run on the bubble's fake clock: a test of a 15 s keepalive bound
// takes milliseconds, and "detected within 15 s" is asserted on fake time,
// which machine load cannot stretch.
//
// The bubble runs in a child process of the test binary that runs only the
// calling test. yamux keeps the timers of its writes in a package-level
// sync.Pool, and the runtime kills the process when a timer made inside a
// bubble is used outside it, or one made outside is used inside (it never
// fires on the fake clock). In a process that runs nothing else, every
// yamux timer is made inside the one bubble. The child inherits the test
// binary's flags that matter here (race detection is compiled in) and the
// parent test's deadline; its output is logged when it fails, or with -v.
//
// Synctest must be called from the test function itself (not a subtest's
// goroutine), at most once per test, before the test starts goroutines.
func Synctest(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	if os.Getenv(synctestEnv) == t.Name() {
		synctest.Test(t, f)
		return
	}
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	args := []string{"-test.run=" + strings.Join(parts, "/"), "-test.count=1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		// The child times out first, so that its goroutine dump shows
		// where a hung bubble is stuck.
		args = append(args, "-test.timeout="+max(time.Until(d)*9/10, time.Second).String())
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), synctestEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("synctest child process for %s: %v\n%s", t.Name(), err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("synctest child process did not run %s:\n%s", t.Name(), out)
	}
	if testing.Verbose() {
		t.Logf("synctest child process:\n%s", out)
	}
}

// FrozenConn wraps this side's end of a connection whose peer can be
// frozen: once Freeze is called, the connection behaves as if the peer
// process was stopped (SIGSTOP) with its TCP connection left open. What
// this side writes is accepted and lost (it fills the stopped peer's kernel
// buffers), and nothing more arrives (no data, no FIN, no RST). Before
// Freeze everything passes through. Close closes the wrapped conn and ends a
// blocked Read.
type FrozenConn struct {
	net.Conn
	frozen    chan struct{}
	closed    chan struct{}
	freezeOne sync.Once
	closeOne  sync.Once
}

// NewFrozenConn wraps c; see FrozenConn.
func NewFrozenConn(c net.Conn) *FrozenConn {
	return &FrozenConn{Conn: c, frozen: make(chan struct{}), closed: make(chan struct{})}
}

// Freeze stops the peer, as described on FrozenConn. It may be called more
// than once.
func (f *FrozenConn) Freeze() { f.freezeOne.Do(func() { close(f.frozen) }) }

func (f *FrozenConn) isFrozen() bool {
	select {
	case <-f.frozen:
		return true
	default:
		return false
	}
}

// Read returns what the peer sends until Freeze; from then on it blocks
// until Close (what a Read in progress receives after Freeze is dropped).
func (f *FrozenConn) Read(p []byte) (int, error) {
	if !f.isFrozen() {
		n, err := f.Conn.Read(p)
		if !f.isFrozen() {
			return n, err
		}
	}
	<-f.closed
	return 0, net.ErrClosed
}

// Write forwards p until Freeze; from then on it reports p written and
// drops it.
func (f *FrozenConn) Write(p []byte) (int, error) {
	if f.isFrozen() {
		return len(p), nil
	}
	return f.Conn.Write(p)
}

// Close closes the wrapped conn and ends a blocked Read.
func (f *FrozenConn) Close() error {
	f.closeOne.Do(func() { close(f.closed) })
	return f.Conn.Close()
}
