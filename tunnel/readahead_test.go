package tunnel

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A whole cork burst (corkMax bytes: a 256 KiB frame's records, which a
// corked peer writes in one system call) waiting in the socket is taken by
// one read-ahead, not left partly in the socket for another read.
func TestReadAheadTakesAWholeCorkBurst(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	w, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer r.Close()
	// Room for the whole burst in the receiving socket before it is read.
	r.(*net.TCPConn).SetReadBuffer(4 << 20)
	burst := bytes.Repeat([]byte{7}, corkMax)
	go w.Write(burst)

	rc := rawConnOf(r)
	if rc == nil {
		t.Fatal("no raw conn for a TCP connection")
	}
	// Wait until the kernel queued the whole burst (the property the
	// read-ahead then acts on), however long a loaded machine takes.
	for queued := 0; queued < corkMax; {
		rc.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
		if queued < corkMax {
			time.Sleep(time.Millisecond)
		}
	}
	ahead := aheadReader{rc: rc, bulk: true}
	p := make([]byte, 16<<10) // about what TLS asks for: one record
	n, err := ahead.read(r, p)
	if err != nil || n != len(p) {
		t.Fatalf("read = %d, %v; want %d", n, err, len(p))
	}
	if ahead.buf == nil || ahead.end != corkMax {
		t.Fatalf("the read-ahead took %d bytes of a %d-byte burst in the socket; want all of it", ahead.end, corkMax)
	}
	got := n
	for got < corkMax {
		n, err := ahead.read(r, p)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		got += n
	}
	if ahead.buf != nil {
		t.Fatal("a drained read-ahead still holds its buffer")
	}
}
