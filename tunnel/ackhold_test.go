package tunnel

import (
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// ackWrite returns the index of the first write in log that starts with
// the ACK of stream id, and that write, or -1.
func ackWrite(log *writeLog, id uint32) (int, []byte) {
	log.mu.Lock()
	defer log.mu.Unlock()
	for i, w := range log.writes {
		if len(w) >= yamuxHeaderSize && w[1] == yamuxTypeWindowUpdate &&
			binary.BigEndian.Uint16(w[2:4])&yamuxFlagACK != 0 && binary.BigEndian.Uint32(w[4:8]) == id {
			return i, w
		}
	}
	return -1, nil
}

// acceptPair is a session pair over a pipe whose accepting side's writes
// are logged.
func acceptPair(t *testing.T) (cli, srv *Session, log *writeLog) {
	t.Helper()
	a, b := net.Pipe()
	log = &writeLog{Conn: b}
	cli, err := Client(a, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	srv, err = Server(log, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return cli, srv, log
}

// TestAcceptSendsACKWithFirstReply: the accepting side's ACK of a stream
// leaves in one write with the stream's first reply frame (an exec's
// exit frame), not in a write of its own, and the opener reads the reply
// unchanged.
func TestAcceptSendsACKWithFirstReply(t *testing.T) {
	cli, srv, log := acceptPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		st, _, err := srv.Accept(ctx)
		if err != nil {
			return
		}
		defer st.Close()
		protocol.WriteFrame(st, protocol.FrameStdout, []byte("reply"))
	}()
	st, err := cli.Open(ctx, protocol.KindExec, protocol.ExecParams{Argv: []string{"/bin/true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f, err := protocol.NewFrameReader(st).Next()
	if err != nil || f.Type != protocol.FrameStdout || string(f.Payload) != "reply" {
		t.Fatalf("opener read %v %q, %v; want the stdout frame \"reply\"", f.Type, f.Payload, err)
	}
	i, w := ackWrite(log, st.StreamID())
	if i < 0 {
		t.Fatalf("no write starts with stream %d's ACK", st.StreamID())
	}
	rest := w[yamuxHeaderSize:]
	if len(rest) < yamuxHeaderSize || rest[1] != yamuxTypeData || binary.BigEndian.Uint32(rest[4:8]) != st.StreamID() {
		t.Fatalf("write %d carries stream %d's ACK alone (%d bytes), not with its first reply", i, st.StreamID(), len(w))
	}
}

// TestAcceptACKOfSilentStreamLeaves: an accepted stream that sends nothing
// still has its ACK written (the hold is bounded), so the opener's backlog
// slot and the stream's full window come back.
func TestAcceptACKOfSilentStreamLeaves(t *testing.T) {
	cli, srv, log := acceptPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan struct{})
	go func() {
		st, _, err := srv.Accept(ctx)
		if err != nil {
			return
		}
		close(accepted)
		<-ctx.Done() // silent until the test ends
		st.Close()
	}()
	st, err := cli.Open(ctx, protocol.KindExec, protocol.ExecParams{Argv: []string{"sleep", "9"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	<-accepted
	for {
		if i, _ := ackWrite(log, st.StreamID()); i >= 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stream %d's ACK not written while the stream stays silent", st.StreamID())
		case <-time.After(time.Millisecond):
		}
	}
}
