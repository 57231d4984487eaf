package sshgate

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
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
