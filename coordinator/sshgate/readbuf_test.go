package sshgate

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// countingListener counts the reads of its connections, and the bytes
// they returned.
type countingListener struct {
	net.Listener
	reads, bytes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, l: l}, nil
}

type countingConn struct {
	net.Conn
	l *countingListener
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.l.reads.Add(1)
	c.l.bytes.Add(int64(n))
	return n, err
}

// A bulk upload through a direct-tcpip channel is read from the client's
// socket in reads of more than one 32 KiB packet's half: x/crypto/ssh's
// own 4 KiB read buffer alone takes two reads (at least) per packet.
func TestBulkReadsAreLarge(t *testing.T) {
	e := newEnv(t)
	e.nodes.drain = true
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{Listener: tl}
	go e.gate.Serve(l)
	c, err := ssh.Dial("tcp", tl.Addr().String(), &ssh.ClientConfig{
		User: "whoever", Auth: []ssh.AuthMethod{ssh.PublicKeys(e.bob.signer)},
		HostKeyCallback: ssh.FixedHostKey(e.gate.HostKey()), HostKeyAlgorithms: []string{ssh.KeyAlgoED25519},
		Timeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, reqs, err := c.OpenChannel("direct-tcpip", ssh.Marshal(directTCPIP{Host: "node-a", Port: 22, OriginHost: "127.0.0.1", OriginPort: 1}))
	if err != nil {
		t.Fatal(err)
	}
	go ssh.DiscardRequests(reqs)
	before := l.reads.Load()
	beforeBytes := l.bytes.Load()
	const total = 16 << 20
	block := bytes.Repeat([]byte{'x'}, 1<<20)
	for range total >> 20 {
		if _, err := ch.Write(block); err != nil {
			t.Fatal(err)
		}
	}
	ch.Close()
	// The channel's close is read once every data packet before it was.
	for l.bytes.Load()-beforeBytes < total {
		time.Sleep(10 * time.Millisecond)
	}
	reads := l.reads.Load() - before
	got := l.bytes.Load() - beforeBytes
	if avg := got / reads; avg <= 24<<10 {
		t.Fatalf("%d bytes of a bulk upload took %d reads of the client's socket, %d bytes each on average; want more than 24 KiB", got, reads, avg)
	}
	t.Logf("%d bytes in %d reads", got, reads)
}

// tcpPair is a connected loopback TCP pair: the accepted end (whose
// receive buffer holds 4 MiB), then the dialled one.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	server.(*net.TCPConn).SetReadBuffer(4 << 20)
	return server, client
}

// queued waits until the socket c has n bytes to read (FIONREAD), however
// long a loaded machine takes to deliver them.
func queued(t *testing.T, c net.Conn, n int) {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for q := 0; q < n; {
		rc.Control(func(fd uintptr) { q, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
		if q < n {
			time.Sleep(time.Millisecond)
		}
	}
}

// Under bulk, an authenticated connection's reads take everything the
// socket holds (up to clientReadAhead) in one read-ahead, and serve the
// transport's small reads from it; once drained, the buffer goes back, so
// a connection waiting for its client holds none; every byte arrives once,
// in order.
func TestReadAheadUnderBulkAndNoneWhenIdle(t *testing.T) {
	server, client := tcpPair(t)
	rb := &readBuffered{Conn: server}
	rb.buffer()
	if rb.rc == nil {
		t.Fatal("a TCP connection got no read-ahead")
	}
	const burst = 200 << 10
	sent := make([]byte, burst)
	for i := range sent {
		sent[i] = byte(i * 7)
	}
	go client.Write(sent)
	queued(t, server, burst)
	var got []byte
	p := make([]byte, 4096) // x/crypto/ssh's bufio fill
	n, err := rb.Read(p)
	if err != nil || n != len(p) {
		t.Fatalf("first read = %d, %v", n, err)
	}
	got = append(got, p[:n]...)
	big := make([]byte, 32<<10) // the rest of a packet
	n, err = rb.Read(big)
	if err != nil || n != len(big) {
		t.Fatalf("second read = %d, %v", n, err)
	}
	got = append(got, big[:n]...)
	if rb.buf == nil || rb.end != burst-4096 {
		t.Fatalf("the read-ahead took %d bytes of the %d waiting; want all of them", rb.end, burst-4096)
	}
	for len(got) < burst {
		n, err := rb.Read(big)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, big[:n]...)
	}
	if !bytes.Equal(got, sent) {
		t.Fatal("the bytes read differ from the bytes sent")
	}
	if rb.buf != nil {
		t.Fatal("a drained read-ahead still holds its buffer")
	}
	// Idle: the next read waits in a plain read, holding no buffer.
	done := make(chan []byte)
	go func() {
		n, err := rb.Read(big)
		if err != nil {
			t.Error(err)
		}
		done <- big[:n]
	}()
	client.Write([]byte("x"))
	if b := <-done; string(b) != "x" {
		t.Fatalf("read after idle = %q, want x", b)
	}
	if rb.buf != nil {
		t.Fatal("a connection that waited for its client holds a read-ahead buffer")
	}
}

// A connection that is not a plain socket (net.Pipe here; a listener's
// wrapper) reads through a clientReadBuf buffer once authenticated, never
// ahead on a descriptor beneath it.
func TestReadBufferedWithoutDescriptor(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	rb := &readBuffered{Conn: a}
	rb.buffer()
	if rb.r.Load() == nil || rb.rc != nil {
		t.Fatal("a net.Pipe end got no fallback buffer")
	}
	go b.Write([]byte("hello"))
	p := make([]byte, 16)
	n, err := rb.Read(p)
	if err != nil || string(p[:n]) != "hello" {
		t.Fatalf("read = %q, %v", p[:n], err)
	}
}

// peekedConn is a listener's wrapper that offers its socket's descriptor
// (it embeds the *net.TCPConn) but may hold bytes of its own.
type peekedConn struct{ *net.TCPConn }

// A wrapper that offers a descriptor is still not read ahead on: a read of
// the descriptor would skip the bytes the wrapper holds.
func TestReadBufferedWrapperNotReadAhead(t *testing.T) {
	server, _ := tcpPair(t)
	rb := &readBuffered{Conn: peekedConn{server.(*net.TCPConn)}}
	rb.buffer()
	if rb.rc != nil || rb.r.Load() == nil {
		t.Fatal("a wrapped socket is read ahead on its descriptor; want the fallback buffer")
	}
}
