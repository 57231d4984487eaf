package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// openPair opens one exec stream from client to server and returns both
// ends.
func openPair(t *testing.T, client, server *Session) (opened, accepted io.ReadWriteCloser) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	type acc struct {
		st  io.ReadWriteCloser
		err error
	}
	ch := make(chan acc, 1)
	go func() {
		st, _, err := server.Accept(ctx)
		ch <- acc{st, err}
	}()
	st, err := client.Open(ctx, protocol.KindExec, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	a := <-ch
	if a.err != nil {
		t.Fatal(a.err)
	}
	return st, a.st
}

// TestBodyReadEndsWithEOF reads data frames through watchConn the way
// yamux's receive loop does (a bufio.Reader of yamux's size, an
// io.LimitedReader per body, io.Copy into a bytes.Buffer made for the
// body's length) and checks that no body grows its buffer: before
// watchConn answered the read of a body's end with io.EOF,
// bytes.Buffer.ReadFrom doubled every such buffer (allocating and zeroing
// twice the frame, and copying it) before the read that found the end.
// Bodies of up to twice yamuxReadBuf may end inside bufio's own buffer
// and are left as they were.
func TestBodyReadEndsWithEOF(t *testing.T) {
	sizes := []int{2*yamuxReadBuf + 1, 16<<10 + 12, 64 << 10, 256 << 10, 3 << 20}
	var wire bytes.Buffer
	for i, n := range sizes {
		var hdr [yamuxHeaderSize]byte
		hdr[1] = yamuxTypeData
		binary.BigEndian.PutUint32(hdr[4:], uint32(2*i+1))
		binary.BigEndian.PutUint32(hdr[8:], uint32(n))
		wire.Write(hdr[:])
		wire.Write(bytes.Repeat([]byte{byte(i + 1)}, n))
		// A window update between them: no body.
		hdr[1] = yamuxTypeWindowUpdate
		wire.Write(hdr[:])
	}
	c1, c2 := net.Pipe()
	go func() { c1.Write(wire.Bytes()); c1.Close() }()
	wc := &watchConn{Conn: c2}
	br := bufio.NewReaderSize(wc, yamuxReadBuf)
	for i, n := range sizes {
		hdr := make([]byte, yamuxHeaderSize)
		if _, err := io.ReadFull(br, hdr); err != nil {
			t.Fatalf("frame %d: header: %v", i, err)
		}
		if got := int(binary.BigEndian.Uint32(hdr[8:])); got != n {
			t.Fatalf("frame %d: length %d, want %d", i, got, n)
		}
		buf := bytes.NewBuffer(make([]byte, 0, n))
		m, err := io.Copy(buf, &io.LimitedReader{R: br, N: int64(n)})
		if err != nil || m != int64(n) {
			t.Fatalf("frame %d: body: %d of %d bytes, %v", i, m, n, err)
		}
		if buf.Cap() != n {
			t.Errorf("frame %d: a %d-byte body grew its %d-byte buffer to %d", i, n, n, buf.Cap())
		}
		if !bytes.Equal(buf.Bytes(), bytes.Repeat([]byte{byte(i + 1)}, n)) {
			t.Fatalf("frame %d: body corrupted", i)
		}
		if _, err := io.ReadFull(br, hdr); err != nil || hdr[1] != yamuxTypeWindowUpdate {
			t.Fatalf("frame %d: the window update after it: %v %v", i, hdr, err)
		}
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the frames: %v, want EOF", err)
	}
}

// TestFrameBodiesOfEverySize: bodies of the sizes around watchConn's
// read of a body's end (yamuxReadBuf and one either side, a TLS record,
// a record and a header, yamux's largest frames) and random ones arrive
// intact and in order, over every transport, and the session carries on
// after each.
func TestFrameBodiesOfEverySize(t *testing.T) {
	sizes := []int{1, 12, yamuxReadBuf - 1, yamuxReadBuf, yamuxReadBuf + 1, 8 << 10, 8<<10 + 1,
		16 << 10, 16<<10 + 12, 64 << 10, 256<<10 - 1, 256 << 10, 1 << 20, 3<<20 + 5}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 40 {
		sizes = append(sizes, 1+rng.IntN(600<<10))
	}
	for name, mk := range transports(t) {
		t.Run(name, func(t *testing.T) {
			c, s := mk()
			client, server := sessionPair(t, c, s, testConfig())
			w, r := openPair(t, client, server)
			var want []byte
			var parts [][]byte
			for _, n := range sizes {
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				parts = append(parts, p)
				want = append(want, p...)
			}
			errc := make(chan error, 1)
			go func() {
				for _, p := range parts {
					if _, err := w.Write(p); err != nil {
						errc <- err
						return
					}
				}
				errc <- w.Close()
			}()
			got, err := io.ReadAll(r)
			if err != nil {
				t.Fatalf("read after %d of %d bytes: %v", len(got), len(want), err)
			}
			if err := <-errc; err != nil {
				t.Fatalf("write: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%d bytes received of %d, intact=false", len(got), len(want))
			}
			// The session still carries a new stream.
			w2, r2 := openPair(t, client, server)
			go func() { w2.Write([]byte("after")); w2.Close() }()
			if b, err := io.ReadAll(r2); err != nil || string(b) != "after" {
				t.Fatalf("a stream after the bodies: %q, %v", b, err)
			}
		})
	}
}
