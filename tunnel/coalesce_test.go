package tunnel

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
)

// recordConn records each Write as a separate record.
type recordConn struct {
	net.Conn
	writes [][]byte
}

func (r *recordConn) Write(p []byte) (int, error) {
	r.writes = append(r.writes, append([]byte(nil), p...))
	return len(p), nil
}

func yamuxHeader(typ byte, flags uint16, id, length uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], id)
	binary.BigEndian.PutUint32(h[8:12], length)
	return h
}

func TestCoalesceConn(t *testing.T) {
	small := []byte("hello")
	large := bytes.Repeat([]byte{7}, coalesceMax*3)
	windowUpdate := yamuxHeader(1, 0, 3, 1<<20) // type 1: length is a window delta, no body follows
	synOnly := yamuxHeader(0, 1, 5, 0)          // data header with no body

	rc := &recordConn{}
	c := &coalesceConn{Conn: rc}
	steps := [][]byte{
		yamuxHeader(0, 0, 3, uint32(len(small))), small,
		windowUpdate,
		synOnly,
		yamuxHeader(0, 0, 3, uint32(len(large))), large,
	}
	var want bytes.Buffer
	for _, s := range steps {
		n, err := c.Write(s)
		if err != nil || n != len(s) {
			t.Fatalf("Write = %d, %v; want %d", n, err, len(s))
		}
		want.Write(s)
	}
	if got := bytes.Join(rc.writes, nil); !bytes.Equal(got, want.Bytes()) {
		t.Fatal("byte stream changed by coalescing")
	}
	// header+small in one write; window update; syn; header+first part of
	// large; rest of large.
	if len(rc.writes) != 5 {
		t.Fatalf("got %d writes, want 5", len(rc.writes))
	}
	if len(rc.writes[0]) != yamuxHeaderSize+len(small) {
		t.Errorf("first write is %d bytes, want header+body %d", len(rc.writes[0]), yamuxHeaderSize+len(small))
	}
	if len(rc.writes[3]) != coalesceMax {
		t.Errorf("large body's first write is %d bytes, want %d", len(rc.writes[3]), coalesceMax)
	}
}

// TestCoalesceHoldsArmedSYN: an armed stream SYN waits for the next frame
// and leaves in the same write (with a data frame, or with any other
// frame); an unarmed SYN, and any SYN of a stock coalescer, goes at once.
// The byte stream never changes.
func TestCoalesceHoldsArmedSYN(t *testing.T) {
	small := []byte("header")
	syn := func(id uint32) []byte { return yamuxHeader(yamuxTypeWindowUpdate, yamuxFlagSYN, id, 0) }
	fin := yamuxHeader(yamuxTypeWindowUpdate, 4, 3, 0) // FIN: a frame with no body

	rc := &recordConn{}
	c := &coalesceConn{Conn: rc}
	var want bytes.Buffer
	write := func(p []byte) {
		t.Helper()
		if n, err := c.Write(p); err != nil || n != len(p) {
			t.Fatalf("Write = %d, %v; want %d", n, err, len(p))
		}
		want.Write(p)
	}
	c.armSYNHold()
	write(syn(1))
	if len(rc.writes) != 0 {
		t.Fatalf("an armed SYN was written at once (%d writes)", len(rc.writes))
	}
	write(yamuxHeader(yamuxTypeData, 0, 1, uint32(len(small))))
	write(small)
	if len(rc.writes) != 1 || len(rc.writes[0]) != 2*yamuxHeaderSize+len(small) {
		t.Fatalf("SYN, header and body took %d writes, want 1 of all three", len(rc.writes))
	}
	write(syn(3)) // not armed: at once
	if len(rc.writes) != 2 {
		t.Fatalf("an unarmed SYN was held (%d writes)", len(rc.writes))
	}
	c.armSYNHold()
	write(syn(5))
	write(fin) // any frame releases it
	if len(rc.writes) != 3 || len(rc.writes[2]) != 2*yamuxHeaderSize {
		t.Fatalf("held SYN and the next frame took %d writes, want 1 of both", len(rc.writes)-2)
	}
	c.armSYNHold()
	c.disarmSYNHold() // an open that failed
	write(syn(7))
	if len(rc.writes) != 4 {
		t.Fatal("a disarmed SYN was held")
	}
	if got := bytes.Join(rc.writes, nil); !bytes.Equal(got, want.Bytes()) {
		t.Fatal("byte stream changed by holding SYNs")
	}

	stock := &coalesceConn{Conn: &recordConn{}, stock: true}
	stock.armSYNHold()
	stock.Write(syn(1))
	if n := len(stock.Conn.(*recordConn).writes); n != 1 {
		t.Fatalf("a stock coalescer held a SYN (%d writes)", n)
	}
}

// TestCoalesceSYNArmingsDoNotOutliveTheirSYNs: an arming is used up by
// its SYN even when that SYN cannot be held (another is held already: it
// leaves with it), so no arming is left over for a later unarmed SYN,
// which would then wait for a frame nobody promised.
func TestCoalesceSYNArmingsDoNotOutliveTheirSYNs(t *testing.T) {
	syn := func(id uint32) []byte { return yamuxHeader(yamuxTypeWindowUpdate, yamuxFlagSYN, id, 0) }
	rc := &recordConn{}
	c := &coalesceConn{Conn: rc}
	c.armSYNHold()
	c.armSYNHold()  // two opens under way at once
	c.Write(syn(1)) // held
	c.Write(syn(3)) // released with it
	if len(rc.writes) != 1 {
		t.Fatalf("two SYNs took %d writes, want 1", len(rc.writes))
	}
	c.Write(syn(5)) // nobody armed it: at once
	if len(rc.writes) != 2 {
		t.Fatalf("an unarmed SYN was held after two armed ones passed (%d writes, want 2)", len(rc.writes))
	}
}
