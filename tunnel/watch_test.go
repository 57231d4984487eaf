package tunnel

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
)

// watchedPair opens a stream from client to server and returns both ends,
// the server's accepted with its header read.
func watchedPair(t *testing.T, client, server *Session) (w, r *yamux.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	ch := make(chan *yamux.Stream, 1)
	go func() {
		st, _, err := server.Accept(ctx)
		if err != nil {
			t.Error(err)
		}
		ch <- st
	}()
	w, err := client.Open(ctx, protocol.KindControl, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	r = <-ch
	if r == nil {
		t.FailNow()
	}
	return w, r
}

// collector is a Watch callback that drains its stream with PollRead into
// got, and records EOF and any overlap of its calls.
type collector struct {
	st      *yamux.Stream
	mu      sync.Mutex
	got     bytes.Buffer
	eof     bool
	err     error
	running atomic.Int32
	overlap atomic.Bool
	changed chan struct{}
}

func newCollector(st *yamux.Stream) *collector {
	return &collector{st: st, changed: make(chan struct{}, 1)}
}

func (c *collector) run() {
	if c.running.Add(1) != 1 {
		c.overlap.Store(true)
	}
	defer c.running.Add(-1)
	buf := make([]byte, 1000) // smaller than a burst: several reads per call
	for {
		n, err := PollRead(c.st, buf)
		c.mu.Lock()
		c.got.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			c.eof = true
		} else if err != nil {
			c.err = err
		}
		c.mu.Unlock()
		if n == 0 || err != nil {
			break
		}
	}
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// waitFor waits until cond holds of the collected state.
func (c *collector) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(defaultTestTimeout)
	for {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c.changed:
		case <-deadline:
			c.mu.Lock()
			defer c.mu.Unlock()
			t.Fatalf("%s: not reached; %d bytes collected, eof=%v err=%v", what, c.got.Len(), c.eof, c.err)
		}
	}
}

// A watched stream's data reaches its callback with no goroutine reading
// it: what was sent before Watch, small messages one at a time (each one
// must arrive alone, without more data behind it to push it through),
// messages interleaved with another stream's bulk transfer (frames split
// across the connection's reads), and finally the peer's close as EOF.
func TestWatchDeliversWithoutReader(t *testing.T) {
	for name, mk := range transports(t) {
		t.Run(name, func(t *testing.T) {
			c, s := mk()
			client, server := sessionPair(t, c, s, testConfig())
			w, r := watchedPair(t, client, server)

			if _, err := w.Write([]byte("before-watch;")); err != nil {
				t.Fatal(err)
			}
			col := newCollector(r)
			server.Watch(r, col.run)
			want := []byte("before-watch;")
			col.waitFor(t, "bytes sent before Watch", func() bool { return bytes.Equal(col.got.Bytes(), want) })

			for i := range 20 {
				msg := []byte{byte('a' + i)}
				if _, err := w.Write(msg); err != nil {
					t.Fatal(err)
				}
				want = append(want, msg...)
				col.waitFor(t, "message "+string(msg), func() bool { return bytes.Equal(col.got.Bytes(), want) })
			}

			// Bulk on a second stream, messages on the watched one.
			bw, br := watchedPair(t, client, server)
			bulk := make([]byte, 4<<20)
			rand.Read(bulk)
			var wg sync.WaitGroup
			wg.Add(2)
			var bulkGot []byte
			go func() {
				defer wg.Done()
				bulkGot, _ = io.ReadAll(br)
			}()
			go func() {
				defer wg.Done()
				for off := 0; off < len(bulk); off += 100 << 10 {
					bw.Write(bulk[off:min(off+100<<10, len(bulk))])
				}
				bw.Close()
			}()
			for i := range 200 {
				msg := []byte{byte('0' + i%10)}
				if _, err := w.Write(msg); err != nil {
					t.Fatal(err)
				}
				want = append(want, msg...)
			}
			wg.Wait()
			if !bytes.Equal(bulkGot, bulk) {
				t.Fatalf("bulk stream: %d of %d bytes intact", len(bulkGot), len(bulk))
			}
			col.waitFor(t, "messages interleaved with bulk", func() bool { return bytes.Equal(col.got.Bytes(), want) })

			w.Close()
			col.waitFor(t, "EOF after the peer's close", func() bool { return col.eof })
			if col.overlap.Load() {
				t.Error("Watch callback calls overlapped")
			}
			if col.err != nil {
				t.Errorf("PollRead error: %v", col.err)
			}
		})
	}
}

// PollRead returns at once with nothing buffered, and never consumes more
// than is there.
func TestPollReadDoesNotWait(t *testing.T) {
	c, s := tcpPair(t)
	client, server := sessionPair(t, c, s, testConfig())
	_, r := watchedPair(t, client, server)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := PollRead(r, make([]byte, 10))
		if n != 0 || err != nil {
			t.Errorf("PollRead on an empty stream = %d, %v; want 0, nil", n, err)
		}
	}()
	select {
	case <-done:
	case <-time.After(defaultTestTimeout):
		t.Fatal("PollRead on an empty stream waited")
	}
}

// OnClose runs once for every end of a session: the peer's close, a local
// Close, and a registration after the session was closed.
func TestOnClose(t *testing.T) {
	c, s := tcpPair(t)
	client, server := sessionPair(t, c, s, testConfig())
	fired := make(chan string, 4)
	server.OnClose(func() { fired <- "server" })
	client.OnClose(func() { fired <- "client" })
	client.Close() // the server sees its connection end
	got := map[string]bool{}
	for range 2 {
		select {
		case who := <-fired:
			if got[who] {
				t.Fatalf("%s's OnClose ran twice", who)
			}
			got[who] = true
		case <-time.After(defaultTestTimeout):
			t.Fatalf("OnClose ran for %v only", got)
		}
	}
	server.Close() // again: must not run a second time
	server.OnClose(func() { fired <- "late" })
	select {
	case who := <-fired:
		if who != "late" {
			t.Fatalf("%s's OnClose ran again", who)
		}
	case <-time.After(defaultTestTimeout):
		t.Fatal("OnClose registered after the close never ran")
	}
}

// Sessions started with equal Configs share one yamux configuration (a
// yamux.Config per session is a measurable share of an idle agent's cost
// on a coordinator); distinct Configs get their own, and past the cache's
// bound each session still gets a valid one.
func TestSessionsShareYamuxConfig(t *testing.T) {
	// Other tests of the package may have filled the cache: start empty.
	yamuxConfigs.Lock()
	keys, vals := yamuxConfigs.keys, yamuxConfigs.vals
	yamuxConfigs.keys, yamuxConfigs.vals = nil, nil
	yamuxConfigs.Unlock()
	t.Cleanup(func() {
		yamuxConfigs.Lock()
		yamuxConfigs.keys, yamuxConfigs.vals = keys, vals
		yamuxConfigs.Unlock()
	})
	a := DefaultConfig()
	a.AcceptBacklog = 3 // a Config no other test uses
	b := a
	if a.sharedYamux() != b.sharedYamux() {
		t.Fatal("equal Configs got distinct yamux configurations")
	}
	c := a
	c.AcceptBacklog = 4
	if a.sharedYamux() == c.sharedYamux() {
		t.Fatal("distinct Configs share a yamux configuration")
	}
	for i := range 2 * maxSharedConfigs {
		d := a
		d.AcceptBacklog = 100 + i
		yc := d.sharedYamux()
		if yc.AcceptBacklog != d.AcceptBacklog || yc.MaxStreamWindowSize != d.MaxStreamWindow {
			t.Fatalf("config %d: yamux configuration %+v does not follow it", i, yc)
		}
	}
	// A session over the shared configuration works.
	c1, c2 := net.Pipe()
	cs, ss := sessionPair(t, c1, c2, a)
	if _, err := cs.Ping(); err != nil {
		t.Fatalf("ping over a shared configuration: %v", err)
	}
	_ = ss
}
