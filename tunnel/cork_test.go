package tunnel

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

func TestCorkGathersABurst(t *testing.T) {
	rc := &recordConn{}
	c := &corkConn{Conn: rc}
	c.Write([]byte("before"))
	c.cork()
	parts := [][]byte{[]byte("a"), bytes.Repeat([]byte{1}, 20<<10), []byte("z")}
	for _, p := range parts {
		if n, err := c.Write(p); n != len(p) || err != nil {
			t.Fatalf("corked Write = %d, %v", n, err)
		}
	}
	if len(rc.writes) != 1 {
		t.Fatalf("corked writes reached the connection before the uncork: %d writes", len(rc.writes))
	}
	if err := c.uncork(); err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("after"))
	if len(rc.writes) != 3 {
		t.Fatalf("got %d writes, want 3 (before, the burst, after)", len(rc.writes))
	}
	if want := bytes.Join(parts, nil); !bytes.Equal(rc.writes[1], want) {
		t.Fatal("the burst's bytes changed")
	}
	if c.buf != nil {
		t.Fatal("an uncorked connection still holds a buffer")
	}
}

func TestCorkBurstLargerThanBuffer(t *testing.T) {
	rc := &recordConn{}
	c := &corkConn{Conn: rc}
	c.cork()
	var want bytes.Buffer
	for i := range 40 {
		p := bytes.Repeat([]byte{byte(i)}, 16<<10+29) // a TLS record's size
		c.Write(p)
		want.Write(p)
	}
	big := bytes.Repeat([]byte{9}, corkMax+1)
	c.Write(big)
	want.Write(big)
	c.Write([]byte("tail"))
	want.WriteString("tail")
	if err := c.uncork(); err != nil {
		t.Fatal(err)
	}
	if got := bytes.Join(rc.writes, nil); !bytes.Equal(got, want.Bytes()) {
		t.Fatal("bytes changed or reordered")
	}
	for i, w := range rc.writes {
		if len(w) > corkMax && !bytes.Equal(w, big) {
			t.Fatalf("write %d is %d bytes, over corkMax", i, len(w))
		}
	}
}

type failConn struct{ net.Conn }

var errBroken = errors.New("broken pipe")

func (failConn) Write(p []byte) (int, error) { return 0, errBroken }

func TestCorkUncorkReportsTheFailedWrite(t *testing.T) {
	c := &corkConn{Conn: failConn{}}
	c.cork()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatalf("corked Write failed early: %v", err)
	}
	if err := c.uncork(); !errors.Is(err, errBroken) {
		t.Fatalf("uncork = %v, want the connection's error", err)
	}
}

// TestCorkedSessionStream: a session over TLS over Cork finds the cork and
// carries frames of every size, small and larger than the gathering
// buffer, unchanged.
func TestCorkedSessionStream(t *testing.T) {
	c, s := corkedTLSPair(t)
	if corkOf(c) == nil || corkOf(s) == nil {
		t.Fatal("corkOf did not find the cork beneath the TLS")
	}
	cfg := DefaultConfig()
	cfg.KeepAliveInterval = 0
	cs, ss := sessionPair(t, c, s, cfg)
	ctx := t.Context()
	errc := make(chan error, 1)
	var got bytes.Buffer
	go func() {
		st, _, err := ss.Accept(ctx)
		if err != nil {
			errc <- err
			return
		}
		_, err = io.Copy(&got, st)
		errc <- err
	}()
	st, err := cs.Open(ctx, protocol.KindExec, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for _, n := range []int{1, 100, 16 << 10, 64 << 10, corkMax + 12345, 3} {
		p := bytes.Repeat([]byte{byte(n)}, n)
		if _, err := st.Write(p); err != nil {
			t.Fatal(err)
		}
		want.Write(p)
	}
	st.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("stream carried %d bytes, want %d, or changed them", got.Len(), want.Len())
	}
}

// A corked transport still shows its socket (the coordinator peeks at the
// first byte through it before the TLS handshake) and half-closes (its busy
// refusal is followed by a FIN).
func TestCorkKeepsSocketAndHalfClose(t *testing.T) {
	c, s := tcpPair(t)
	defer s.Close()
	k := Cork(c)
	defer k.Close()
	sc, ok := k.(syscall.Conn)
	if !ok {
		t.Fatal("corked conn is not a syscall.Conn")
	}
	if _, err := sc.SyscallConn(); err != nil {
		t.Fatal(err)
	}
	k.Write([]byte("x"))
	if err := k.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "x" {
		t.Fatalf("peer read %q, %v; want x then EOF", got, err)
	}
}
