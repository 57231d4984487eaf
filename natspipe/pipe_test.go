package natspipe_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const defaultTestTimeout = 10 * time.Second

// runServer starts an embedded nats-server for one test, with Tether's
// NATS layout: every connection authenticates.
func runServer(tb testing.TB) *server.Server {
	tb.Helper()
	e := natsauthtest.Run(tb)
	layouts.Store(e.Server, e.Layout)
	return e.Server
}

// layouts maps each test server to its layout, for connect.
var layouts sync.Map // *server.Server → *natsauth.Layout

// connect connects to s with coordinator credentials: both ends of these
// tests' pipes are in one account, where every inbox is reachable.
func connect(tb testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	l, _ := layouts.Load(s)
	return natsauthtest.Connect(tb, s.ClientURL(), natsauthtest.CoordinatorCreds(tb, l.(*natsauth.Layout), "pipe-end"), opts...)
}

// newBubbleEnv is newEnv for a synctest bubble: the server listens on no
// port and both connections are in-process pipes to it, so every goroutine
// and timer of the server, the clients and the pipes is in the bubble and
// the keepalive schedule runs on the fake clock, however loaded the machine
// is. Call it from a tunneltest.Synctest function (its own process: nats.go
// pools timers across connections, and a timer made in a bubble must never
// be used outside it).
func newBubbleEnv(tb testing.TB) *env {
	tb.Helper()
	opts := &server.Options{DontListen: true, NoLog: true, NoSigs: true}
	l := natsauthtest.NewLayout(tb)
	if err := l.ConfigureServer(opts); err != nil {
		tb.Fatal(err)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		tb.Fatal(err)
	}
	layouts.Store(s, l)
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		tb.Fatal("nats-server not ready")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	e := &env{s: s}
	for _, nc := range []**nats.Conn{&e.ncA, &e.ncB} {
		*nc = connect(tb, s, nats.InProcessServer(s))
	}
	return e
}

// env is a server with two connections: the dialing side's and the
// accepting side's, as client and coordinator have.
type env struct {
	s        *server.Server
	ncA, ncB *nats.Conn
}

func newEnv(tb testing.TB) *env {
	s := runServer(tb)
	return &env{s: s, ncA: connect(tb, s), ncB: connect(tb, s)}
}

// pair opens a pipe through a Dial/Accept handshake: a is the dialer, b the
// acceptor.
func (e *env) pair(tb testing.TB, cfgA, cfgB natspipe.Config) (a, b *natspipe.Pipe) {
	tb.Helper()
	subject := e.ncB.NewInbox()
	ch := make(chan *natspipe.Pipe, 1)
	errc := make(chan error, 1)
	sub, err := e.ncB.Subscribe(subject, func(m *nats.Msg) {
		p, err := natspipe.Accept(e.ncB, m.Reply, cfgB)
		if err != nil {
			errc <- err
			return
		}
		ch <- p
	})
	if err != nil {
		tb.Fatal(err)
	}
	defer sub.Unsubscribe()
	e.ncB.Flush()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	a, err = natspipe.Dial(ctx, e.ncA, subject, nil, []byte("hello"), cfgA)
	if err != nil {
		tb.Fatal(err)
	}
	select {
	case b = <-ch:
	case err := <-errc:
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// checkFor polls f until it returns nil, failing the test after d.
func checkFor(tb testing.TB, d time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %v: %v", d, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitErr waits for an error from ch.
func waitErr(tb testing.TB, ch <-chan error) error {
	tb.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(defaultTestTimeout):
		tb.Fatal("timed out")
		return nil
	}
}

func TestLargeTransferBothWays(t *testing.T) {
	e := newEnv(t)
	cfg := natspipe.Config{Window: 1 << 20, MaxMessage: 64 << 10}
	a, b := e.pair(t, cfg, cfg)
	const size = 24 << 20
	dataAB := randomBytes(size, 1)
	dataBA := randomBytes(size+12345, 2)

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	send := func(p *natspipe.Pipe, data []byte) {
		defer wg.Done()
		// Odd write sizes exercise message splitting.
		for off := 0; off < len(data); {
			n := min(len(data)-off, 100_003)
			if _, err := p.Write(data[off : off+n]); err != nil {
				errs <- err
				return
			}
			off += n
		}
		if err := p.CloseWrite(); err != nil {
			errs <- err
		}
	}
	var gotAB, gotBA [32]byte
	recv := func(p *natspipe.Pipe, sum *[32]byte, viaWriteTo bool) {
		defer wg.Done()
		h := sha256.New()
		var err error
		if viaWriteTo {
			_, err = p.WriteTo(h)
		} else {
			_, err = io.CopyBuffer(struct{ io.Writer }{h}, struct{ io.Reader }{p}, make([]byte, 7777))
		}
		if err != nil {
			errs <- err
		}
		copy(sum[:], h.Sum(nil))
	}
	wg.Add(4)
	go send(a, dataAB)
	go send(b, dataBA)
	go recv(b, &gotAB, true)
	go recv(a, &gotBA, false)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if gotAB != sha256.Sum256(dataAB) {
		t.Error("a->b checksum mismatch")
	}
	if gotBA != sha256.Sum256(dataBA) {
		t.Error("b->a checksum mismatch")
	}
	for _, p := range []*natspipe.Pipe{a, b} {
		if err := p.Err(); err != nil {
			t.Errorf("Err after a clean end: %v", err)
		}
	}
}

func TestHalfClose(t *testing.T) {
	e := newEnv(t)
	a, b := e.pair(t, natspipe.Config{}, natspipe.Config{})
	if _, err := a.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseWrite(); err != nil {
		t.Fatalf("second CloseWrite: %v", err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, natspipe.ErrWriteClosed) {
		t.Fatalf("Write after CloseWrite = %v, want ErrWriteClosed", err)
	}
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "request" {
		t.Fatalf("b read %q, %v", got, err)
	}
	// The other direction is still open.
	if _, err := b.Write([]byte("response")); err != nil {
		t.Fatal(err)
	}
	b.CloseWrite()
	// Close right after CloseWrite: the bytes still arrive, then EOF.
	b.Close()
	got, err = io.ReadAll(a)
	if err != nil || string(got) != "response" {
		t.Fatalf("a read %q, %v", got, err)
	}
	if err := a.Err(); err != nil {
		t.Errorf("a.Err = %v", err)
	}
}

func TestBackPressureBoundsMemory(t *testing.T) {
	e := newEnv(t)
	const window = protocol.PipeInitialCredit
	cfg := natspipe.Config{Window: window, MaxMessage: 16 << 10}
	a, b := e.pair(t, cfg, cfg)
	data := randomBytes(4<<20, 3)
	written := make(chan error, 1)
	go func() {
		_, err := a.Write(data)
		if err == nil {
			err = a.CloseWrite()
		}
		written <- err
	}()
	// The reader does not read: the writer stalls at the window.
	checkFor(t, defaultTestTimeout, func() error {
		if n := b.Buffered(); n < window {
			return errors.New("window not filled yet")
		}
		return nil
	})
	time.Sleep(50 * time.Millisecond) // let any excess arrive (there must be none)
	if n := b.Buffered(); n > window {
		t.Fatalf("receiver buffers %d bytes, over its window of %d", n, window)
	}
	select {
	case err := <-written:
		t.Fatalf("Write returned before the reader read: %v", err)
	default:
	}
	// A slow reader gets everything, and the buffer never exceeds the window.
	h := sha256.New()
	buf := make([]byte, 3000)
	for {
		if n := b.Buffered(); n > window {
			t.Fatalf("receiver buffers %d bytes, over its window of %d", n, window)
		}
		n, err := b.Read(buf)
		h.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := waitErr(t, written); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Sum(nil), sumOf(data)) {
		t.Error("checksum mismatch")
	}
}

func sumOf(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

func TestAbort(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reason error
		want   string
	}{
		{"with reason", errors.New("tunnel to node x lost: EOF"), "closed by peer: tunnel to node x lost: EOF"},
		{"quiet", nil, "closed by peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := natspipe.Config{Window: protocol.PipeInitialCredit}
			a, b := e.pair(t, cfg, cfg)
			// b blocks writing (a does not read) and reading.
			wrote := make(chan error, 1)
			go func() { _, err := b.Write(make([]byte, 1<<20)); wrote <- err }()
			read := make(chan error, 1)
			go func() { _, err := b.Read(make([]byte, 10)); read <- err }()
			checkFor(t, defaultTestTimeout, func() error {
				if a.Buffered() < protocol.PipeInitialCredit {
					return errors.New("not filled")
				}
				return nil
			})
			if err := a.CloseWithError(tc.reason); err != nil {
				t.Fatal(err)
			}
			if err := a.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			for name, ch := range map[string]chan error{"write": wrote, "read": read} {
				err := waitErr(t, ch)
				if !errors.Is(err, natspipe.ErrPeerClosed) || !strings.HasSuffix(err.Error(), tc.want) {
					t.Errorf("b's %s error = %v, want ErrPeerClosed ending in %q", name, err, tc.want)
				}
			}
			if !errors.Is(b.Err(), natspipe.ErrPeerClosed) {
				t.Errorf("b.Err = %v", b.Err())
			}
			if _, err := a.Read(make([]byte, 1)); !errors.Is(err, natspipe.ErrClosed) {
				t.Errorf("a.Read after Close = %v, want ErrClosed", err)
			}
			if _, err := a.Write([]byte("x")); !errors.Is(err, natspipe.ErrClosed) {
				t.Errorf("a.Write after Close = %v, want ErrClosed", err)
			}
		})
	}
}

// TestResetWrite: a reset abandons one direction at once: the writer
// blocked on credit returns, the peer's unread bytes are dropped and its
// reads fail with the reason (before it read them: the reset is out of
// band), while the other direction carries on to its eof.
func TestResetWrite(t *testing.T) {
	e := newEnv(t)
	cfg := natspipe.Config{Window: protocol.PipeInitialCredit}
	a, b := e.pair(t, cfg, cfg)
	// a writes more than b, which does not read, lets it send.
	wrote := make(chan error, 1)
	go func() { _, err := a.Write(make([]byte, 1<<20)); wrote <- err }()
	checkFor(t, defaultTestTimeout, func() error {
		if b.Buffered() < protocol.PipeInitialCredit {
			return errors.New("not filled")
		}
		return nil
	})
	select {
	case <-b.PeerReset():
		t.Fatal("PeerReset closed before the reset")
	default:
	}
	if err := a.ResetWrite(errors.New("cancelled by the user")); err != nil {
		t.Fatal(err)
	}
	if err := a.ResetWrite(nil); err != nil {
		t.Errorf("second ResetWrite = %v, want nil", err)
	}
	if err := waitErr(t, wrote); !errors.Is(err, natspipe.ErrWriteReset) {
		t.Errorf("blocked Write = %v, want ErrWriteReset", err)
	}
	select {
	case <-b.PeerReset():
	case <-time.After(defaultTestTimeout):
		t.Fatal("PeerReset not closed")
	}
	if _, err := b.Read(make([]byte, 10)); !errors.Is(err, natspipe.ErrPeerReset) || !strings.HasSuffix(err.Error(), "peer reset its direction: cancelled by the user") {
		t.Errorf("b.Read after the reset = %v, want ErrPeerReset with the reason", err)
	}
	if n := b.Buffered(); n != 0 {
		t.Errorf("b still buffers %d bytes of the reset direction", n)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, natspipe.ErrWriteReset) {
		t.Errorf("a.Write after ResetWrite = %v, want ErrWriteReset", err)
	}
	if err := a.CloseWrite(); !errors.Is(err, natspipe.ErrWriteReset) {
		t.Errorf("a.CloseWrite after ResetWrite = %v, want ErrWriteReset", err)
	}
	// b → a goes on, past several windows.
	data := randomBytes(3*protocol.PipeInitialCredit+17, 7)
	go b.Write(data)
	got := make([]byte, len(data))
	if _, err := io.ReadFull(a, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("a read %v; want the %d bytes b wrote", err, len(data))
	}
	// Neither end failed; closing both is a clean end.
	select {
	case <-a.Done():
		t.Error("a's Done closed before Close")
	case <-b.Done():
		t.Error("b's Done closed before Close")
	default:
	}
	if a.Err() != nil || b.Err() != nil {
		t.Errorf("Err after a reset: %v, %v; want nil", a.Err(), b.Err())
	}
	a.Close()
	select {
	case <-a.Done():
	default:
		t.Error("Done not closed by Close")
	}
	checkFor(t, defaultTestTimeout, func() error {
		// a's close after its reset cuts only b's write side.
		if _, err := b.Write([]byte("x")); !errors.Is(err, natspipe.ErrPeerClosed) {
			return fmt.Errorf("b.Write after a's close = %v, want ErrPeerClosed", err)
		}
		return nil
	})
	if b.Err() != nil {
		t.Errorf("b.Err = %v after a clean end, want nil", b.Err())
	}
	b.Close()
}

// TestDoneOnFailure: Done is closed when the pipe fails, e.g. by the
// peer's abort.
func TestDoneOnFailure(t *testing.T) {
	e := newEnv(t)
	a, b := e.pair(t, natspipe.Config{}, natspipe.Config{})
	a.Close()
	select {
	case <-b.Done():
	case <-time.After(defaultTestTimeout):
		t.Fatal("b's Done not closed after a's close")
	}
	if !errors.Is(b.Err(), natspipe.ErrPeerClosed) {
		t.Errorf("b.Err = %v, want ErrPeerClosed", b.Err())
	}
}

func TestLocalCloseUnblocks(t *testing.T) {
	e := newEnv(t)
	cfg := natspipe.Config{Window: protocol.PipeInitialCredit}
	a, _ := e.pair(t, cfg, cfg)
	wrote := make(chan error, 1)
	go func() { _, err := a.Write(make([]byte, 1<<20)); wrote <- err }()
	read := make(chan error, 1)
	go func() { _, err := a.Read(make([]byte, 10)); read <- err }()
	time.Sleep(20 * time.Millisecond) // let both block (not needed for correctness)
	a.Close()
	for _, ch := range []chan error{wrote, read} {
		if err := waitErr(t, ch); !errors.Is(err, natspipe.ErrClosed) {
			t.Errorf("got %v, want ErrClosed", err)
		}
	}
}

// A peer that never answers is declared gone after PipeSilenceFactor
// keepalives of silence, not before; meanwhile the pipe pings it every
// KeepAlive, and it tells the peer why it gave up. On the bubble's clock
// the schedule is exact: ticks every 10 ms, pings at 20 and 40 ms, the
// verdict at 60 ms.
func TestPeerSilent(t *testing.T) {
	tunneltest.Synctest(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		// A peer that exists but never answers: just a subscription.
		mute, err := e.ncB.SubscribeSync("mute.peer")
		if err != nil {
			t.Fatal(err)
		}
		defer mute.Unsubscribe()
		e.ncB.Flush()
		start := time.Now()
		p, err := natspipe.New(e.ncA, e.ncA.NewInbox(), "mute.peer", natspipe.Config{KeepAlive: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		_, err = p.Read(make([]byte, 1))
		if !errors.Is(err, natspipe.ErrPeerGone) || err.Error() != "pipe to mute.peer: peer silent for 60ms" {
			t.Fatalf("Read = %v, want ErrPeerGone \"pipe to mute.peer: peer silent for 60ms\"", err)
		}
		if d := time.Since(start); d != 60*time.Millisecond {
			t.Errorf("declared silent after %v, want 60ms (3 keepalives of 20ms)", d)
		}
		synctest.Wait() // the close reaches the mute peer's subscription
		var ops []string
		for {
			m, err := mute.NextMsg(time.Second)
			if err != nil {
				break
			}
			ops = append(ops, m.Header.Get(protocol.HeaderPipeOp))
		}
		if want := []string{"ping", "ping", "close"}; !slices.Equal(ops, want) {
			t.Errorf("peer saw %v, want %v", ops, want)
		}
	})
}

// Pings keep an idle pipe up on both ends: a second (50 silence windows of
// 30 ms) without data leaves both healthy, and data still flows.
func TestKeepAliveKeepsIdlePipe(t *testing.T) {
	tunneltest.Synctest(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		cfg := natspipe.Config{KeepAlive: 10 * time.Millisecond}
		a, b := e.pair(t, cfg, cfg)
		time.Sleep(time.Second)
		if a.Err() != nil || b.Err() != nil {
			t.Fatalf("idle pipe failed: %v / %v", a.Err(), b.Err())
		}
		if _, err := a.Write([]byte("still here")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 20)
		n, err := b.Read(buf)
		if err != nil || string(buf[:n]) != "still here" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
	})
}

func TestSequenceGap(t *testing.T) {
	tests := []struct {
		name string
		msg  func(inbox string) *nats.Msg
		want string
		is   error
	}{
		{"data gap", func(inbox string) *nats.Msg {
			return &nats.Msg{Subject: inbox, Header: nats.Header{protocol.HeaderPipeOp: {"data"}, protocol.HeaderPipeSeq: {"5"}}, Data: []byte("x")}
		}, "message 1 lost (got 5)", natspipe.ErrLost},
		{"eof gap", func(inbox string) *nats.Msg {
			return &nats.Msg{Subject: inbox, Header: nats.Header{protocol.HeaderPipeOp: {"eof"}, protocol.HeaderPipeSeq: {"3"}}}
		}, "message 1 lost (got eof after 3)", natspipe.ErrLost},
		{"bad header", func(inbox string) *nats.Msg {
			return &nats.Msg{Subject: inbox, Header: nats.Header{protocol.HeaderPipeOp: {"rst"}}}
		}, `unknown Tether-Pipe-Op "rst"`, natspipe.ErrProtocol},
		{"over credit", func(inbox string) *nats.Msg {
			return &nats.Msg{Subject: inbox, Header: nats.Header{protocol.HeaderPipeOp: {"data"}, protocol.HeaderPipeSeq: {"1"}}, Data: make([]byte, protocol.MaxPipeMessage-8<<10)}
		}, "past the", natspipe.ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := natspipe.Config{Window: protocol.PipeInitialCredit}
			a, b := e.pair(t, cfg, cfg)
			if _, err := a.Write([]byte("0")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 10)
			if n, err := b.Read(buf); err != nil || string(buf[:n]) != "0" {
				t.Fatalf("first read %q, %v", buf[:n], err)
			}
			// A stranger injects a message into b's inbox.
			if err := e.ncA.PublishMsg(tt.msg(b.LocalInbox())); err != nil {
				t.Fatal(err)
			}
			_, err := b.Read(buf)
			if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Read = %v, want %v containing %q", err, tt.is, tt.want)
			}
			// The failure reaches the other end too.
			if _, err := a.Read(buf); !errors.Is(err, natspipe.ErrPeerClosed) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("peer's Read = %v, want ErrPeerClosed naming the cause", err)
			}
		})
	}
}

func TestDialErrors(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if _, err := natspipe.Dial(ctx, e.ncA, "nobody.home", nil, nil, natspipe.Config{}); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("Dial without responder = %v, want ErrNoResponders", err)
	}

	sub, err := e.ncB.Subscribe("refuse", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set("Nats-Service-Error-Code", "404")
		r.Header.Set("Nats-Service-Error", "node \"x\" is not connected")
		r.Data = []byte(`{"status":404}`)
		m.RespondMsg(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	e.ncB.Flush()
	_, err = natspipe.Dial(ctx, e.ncA, "refuse", nil, nil, natspipe.Config{})
	var rej *natspipe.RejectedError
	if !errors.As(err, &rej) || string(rej.Msg.Data) != `{"status":404}` || !strings.Contains(err.Error(), "is not connected") {
		t.Errorf("Dial refused = %v, want RejectedError with the reply", err)
	}

	// A responder that never answers: ctx bounds the wait.
	silent, _ := e.ncB.SubscribeSync("silent")
	defer silent.Unsubscribe()
	e.ncB.Flush()
	sctx, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer scancel()
	if _, err := natspipe.Dial(sctx, e.ncA, "silent", nil, nil, natspipe.Config{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial to silent responder = %v, want DeadlineExceeded", err)
	}
}

func TestConfigValidate(t *testing.T) {
	c := natspipe.Config{Window: 1, MaxMessage: protocol.MaxPipeMessage + 1, KeepAlive: -1}
	err := c.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, f := range []string{"Window", "MaxMessage", "KeepAlive"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s: %v", f, err)
		}
	}
	d := natspipe.DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Errorf("default config invalid: %v", err)
	}
}

// BenchmarkPipe measures one direction's throughput through the pipe, and,
// as the baseline, raw NATS publishes of the same message size with no flow
// control, in the same run.
func BenchmarkPipe(b *testing.B) {
	s := runServer(b)
	const msgSize = protocol.DefaultPipeMessage
	chunk := randomBytes(1<<20, 9)
	for _, size := range []int{msgSize, 512 << 10} {
		b.Run(fmt.Sprintf("pipe-%dk", size>>10), func(b *testing.B) {
			benchPipe(b, s, chunk, natspipe.Config{MaxMessage: size})
		})
	}
	b.Run("raw-publish-128k", func(b *testing.B) {
		ncA, ncB := connect(b, s), connect(b, s)
		total := int64(b.N) * int64(len(chunk))
		var got int64
		done := make(chan struct{})
		sub, err := ncB.Subscribe("raw", func(m *nats.Msg) {
			got += int64(len(m.Data))
			if got == total {
				close(done)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		sub.SetPendingLimits(-1, -1)
		defer sub.Unsubscribe()
		ncB.Flush()
		b.SetBytes(int64(len(chunk)))
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for off := 0; off < len(chunk); off += msgSize {
				if err := ncA.Publish("raw", chunk[off:off+msgSize]); err != nil {
					b.Fatal(err)
				}
			}
		}
		<-done
	})
}

func benchPipe(b *testing.B, s *server.Server, chunk []byte, cfg natspipe.Config) {
	e := &env{s: s, ncA: connect(b, s), ncB: connect(b, s)}
	a, p := e.pair(b, cfg, cfg)
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	done := make(chan error, 1)
	go func() { _, err := p.WriteTo(io.Discard); done <- err }()
	for i := 0; i < b.N; i++ {
		if _, err := a.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	a.CloseWrite()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
