package tunnel

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// writeLog is a connection that records each Write it passes on.
type writeLog struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, append([]byte(nil), p...))
	w.mu.Unlock()
	return w.Conn.Write(p)
}

// TestOpenSendsSYNWithHeader: a stream opened with Open reaches the peer
// as one write holding both its SYN and its header, so the peer's accept
// finds the header already there (one write and one wake-up fewer per
// stream on each side), and the peer reads the header unchanged.
func TestOpenSendsSYNWithHeader(t *testing.T) {
	a, b := net.Pipe()
	log := &writeLog{Conn: a}
	cli, err := Client(log, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv, err := Server(b, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	params := protocol.ExecParams{Argv: []string{"/bin/true"}}
	type accepted struct {
		h   protocol.Header
		err error
	}
	got := make(chan accepted, 1)
	go func() {
		st, h, err := srv.Accept(ctx)
		if st != nil {
			defer st.Close()
		}
		got <- accepted{h, err}
	}()
	st, err := cli.Open(ctx, protocol.KindExec, params)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := <-got
	if r.err != nil || r.h.Kind != protocol.KindExec {
		t.Fatalf("peer accepted kind %v, err %v", r.h.Kind, r.err)
	}
	var p protocol.ExecParams
	if err := r.h.DecodeParams(&p); err != nil || len(p.Argv) != 1 || p.Argv[0] != "/bin/true" {
		t.Fatalf("peer read params %+v, %v", p, err)
	}

	log.mu.Lock()
	defer log.mu.Unlock()
	id := st.StreamID()
	for i, w := range log.writes {
		// The SYN is a window update (type 1) with flag 1 for id.
		if len(w) < yamuxHeaderSize || w[1] != yamuxTypeWindowUpdate ||
			binary.BigEndian.Uint16(w[2:4])&yamuxFlagSYN == 0 || binary.BigEndian.Uint32(w[4:8]) != id {
			continue
		}
		rest := w[yamuxHeaderSize:]
		if len(rest) < yamuxHeaderSize || rest[1] != yamuxTypeData || binary.BigEndian.Uint32(rest[4:8]) != id ||
			len(rest)-yamuxHeaderSize < int(binary.BigEndian.Uint32(rest[8:12])) {
			t.Fatalf("write %d carries stream %d's SYN (%d bytes) without its header frame", i, id, len(w))
		}
		return
	}
	t.Fatalf("no write starts with stream %d's SYN (%d writes)", id, len(log.writes))
}
