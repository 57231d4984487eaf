package natsauth

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
)

func timeAfter(d time.Duration) <-chan time.Time { return time.After(d) }

func strconvQuote(s string) string { return strconv.Quote(s) }

// protocolSubjects parses package protocol's non-test files and returns its
// string constants named Subject*.
func protocolSubjects(tb testing.TB) map[string]string {
	tb.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir("../protocol")
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join("../protocol", e.Name()), nil, 0)
		if err != nil {
			tb.Fatal(err)
		}
		{
			for _, d := range f.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if !strings.HasPrefix(n.Name, "Subject") || i >= len(vs.Values) {
							continue
						}
						lit, ok := vs.Values[i].(*ast.BasicLit)
						if !ok || lit.Kind != token.STRING {
							tb.Fatalf("protocol.%s is not a string literal", n.Name)
						}
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							tb.Fatal(err)
						}
						out[n.Name] = v
					}
				}
			}
		}
	}
	return out
}

// pending is the number of response mappings TETHER holds for an export.
func pending(tb testing.TB, s *server.Server, l *Layout, export string) int {
	tb.Helper()
	acc, err := s.LookupAccount(l.AccountKey(AccountTether))
	if err != nil {
		tb.Fatal(err)
	}
	return acc.NumPendingResponses(export)
}

// waitPending waits until TETHER holds want response mappings for export.
func waitPending(tb testing.TB, s *server.Server, l *Layout, export string, want int) {
	tb.Helper()
	deadline := time.Now().Add(wait)
	for {
		n := pending(tb, s, l, export)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("TETHER holds %d response mappings for %s after %v, want %d", n, export, wait, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noResponders publishes a probe (as the coordinator's job keeper does) to
// reply with a reply subject of the coordinator's, and reports whether the
// server answered 503 "no responders". The server queues a 503 while it
// processes the publish, before it answers the PING of the Flush that
// follows, so after Flush the answer is either there or never comes.
func noResponders(tb testing.TB, coord *nats.Conn, reply string) bool {
	tb.Helper()
	inbox := coord.NewInbox()
	sub, err := coord.SubscribeSync(inbox)
	if err != nil {
		tb.Fatal(err)
	}
	defer sub.Unsubscribe()
	h := nats.Header{protocol.HeaderType: {protocol.ReplyProbe}}
	if err := coord.PublishMsg(&nats.Msg{Subject: reply, Reply: inbox, Header: h}); err != nil {
		tb.Fatal(err)
	}
	if err := coord.Flush(); err != nil {
		tb.Fatal(err)
	}
	n, _, err := sub.Pending()
	if err != nil || n == 0 {
		return false
	}
	// nats.go reports a 503 status message as ErrNoResponders.
	_, err = sub.NextMsg(wait)
	return errors.Is(err, nats.ErrNoResponders)
}

// assertDropped publishes a late response to oldReply from coord and checks
// that the client does not receive it on oldSub: the client then makes a
// fresh request, whose answer coord publishes after the late one, so the
// late one, had it been delivered, would be queued on oldSub first.
func assertDropped(tb testing.TB, coord, nc *nats.Conn, reqs <-chan *nats.Msg, oldReply string, oldSub *nats.Subscription) {
	tb.Helper()
	if err := coord.PublishMsg(&nats.Msg{Subject: oldReply, Data: []byte("late")}); err != nil {
		tb.Fatal(err)
	}
	if err := coord.Flush(); err != nil {
		tb.Fatal(err)
	}
	if _, err := nc.Request(protocol.SubjectExec, nil, wait); err != nil {
		tb.Fatal(err)
	}
	next(tb, reqs)
	if n, _, _ := oldSub.Pending(); n != 0 {
		tb.Errorf("%d late responses reached the client", n)
	}
}

// A streamed reply (exec) stays mapped across the import for as long as
// responses keep coming, well past the response threshold, and ends when
// the client's reply subscription ends or the threshold passes in silence.
// The threshold is shortened to 1 s to exercise what the 2-minute default
// does in production.
func TestStreamedRepliesOutliveThreshold(t *testing.T) {
	const threshold = time.Second
	l := testLayout(t, Config{ResponseThreshold: threshold})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	reqs := responder(t, coord, protocol.SubjectExec)
	alice := mintClient(t, l, "alice")
	nc, _ := connect(t, s, alice)

	inbox := nc.NewInbox()
	if !strings.HasPrefix(inbox, alice.InboxPrefix()+".") {
		t.Fatalf("inbox %s is not under the private prefix", inbox)
	}
	replies, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(protocol.SubjectExec, inbox, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	req := next(t, reqs)
	recv(t, replies) // the responder's "ok"

	// Keepalives (header-only, as the coordinator sends them) every 50 ms
	// for 4 thresholds; each must arrive, and the mapping must stay.
	start := time.Now()
	seq := 0
	for time.Since(start) < 4*threshold {
		h := nats.Header{protocol.HeaderType: {protocol.ReplyKeepAlive}, protocol.HeaderSeq: {strconv.Itoa(seq)}}
		if err := coord.PublishMsg(&nats.Msg{Subject: req.Reply, Header: h}); err != nil {
			t.Fatal(err)
		}
		m := recv(t, replies)
		if got := m.Header.Get(protocol.HeaderSeq); got != strconv.Itoa(seq) {
			t.Fatalf("reply %d: got seq %q", seq, got)
		}
		seq++
		time.Sleep(50 * time.Millisecond)
	}
	if n := pending(t, s, l, protocol.SubjectExec); n != 1 {
		t.Fatalf("after %v of keepalives TETHER holds %d mappings, want 1", time.Since(start), n)
	}
	if err := coord.PublishMsg(&nats.Msg{Subject: req.Reply, Data: []byte("result")}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, replies); string(m.Data) != "result" {
		t.Fatalf("final reply %q", m.Data)
	}

	// Silence: the server drops the mapping once the threshold passes, and
	// a later response reaches nobody.
	waitPending(t, s, l, protocol.SubjectExec, 0)
	assertDropped(t, coord, nc, reqs, req.Reply, replies)
}

// An empty response (no header, no body) ends a streamed mapping; a
// header-only one, as every pipe ack, ping, eof and keepalive is, does not.
// Our protocol must never send the former on a streamed reply.
func TestEmptyResponseEndsMapping(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	reqs := responder(t, coord, protocol.SubjectExec)
	nc, _ := connect(t, s, mintClient(t, l, "alice"))
	inbox := nc.NewInbox()
	replies, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(protocol.SubjectExec, inbox, nil); err != nil {
		t.Fatal(err)
	}
	req := next(t, reqs)
	recv(t, replies) // "ok"

	if err := coord.PublishMsg(&nats.Msg{Subject: req.Reply, Header: nats.Header{protocol.HeaderPipeOp: {"ping"}}}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, replies); m.Header.Get(protocol.HeaderPipeOp) != "ping" {
		t.Fatalf("header-only reply arrived as %+v", m)
	}
	if n := pending(t, s, l, protocol.SubjectExec); n != 1 {
		t.Fatalf("a header-only reply changed the mappings to %d", n)
	}

	if err := coord.Publish(req.Reply, nil); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, replies); len(m.Data) != 0 || len(m.Header) != 0 {
		t.Fatalf("empty reply arrived as %+v", m)
	}
	waitPending(t, s, l, protocol.SubjectExec, 0)
	assertDropped(t, coord, nc, reqs, req.Reply, replies)
}

// The coordinator's liveness probe (publish to the client's reply subject,
// with a reply subject of its own, and count 503 "no responders" answers)
// does not work across the import: the server delivers responses through
// an internal subscription that always counts as a delivery, so a probe to
// a client that stopped listening is dropped silently, never answered 503.
// Within one account (a control, today's setup) the same probe is answered
// 503. The coordinator needs another sign that a client is gone.
func TestProbeAcrossImportGetsNoAnswer(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	reqs := responder(t, coord, protocol.SubjectExec)
	nc, _ := connect(t, s, mintClient(t, l, "alice"))
	inbox := nc.NewInbox()
	replies, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(protocol.SubjectExec, inbox, nil); err != nil {
		t.Fatal(err)
	}
	req := next(t, reqs)
	recv(t, replies)

	if noResponders(t, coord, req.Reply) {
		t.Fatal("a probe to a listening client was answered 503")
	}
	if m := recv(t, replies); m.Header.Get(protocol.HeaderType) != protocol.ReplyProbe {
		t.Fatalf("probe arrived as %+v", m)
	}
	if err := replies.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The server drops the mapping when the client's interest goes...
	waitPending(t, s, l, protocol.SubjectExec, 0)
	// ...and says nothing to a probe.
	if noResponders(t, coord, req.Reply) {
		t.Error("a probe across the import was answered 503: nats-server changed; the coordinator's probes may work again")
	}

	// Control: within TETHER, a probe to a reply subject nobody listens to
	// is answered 503.
	other, _ := connect(t, s, mintCoordinator(t, l, "c2"))
	gone := other.NewInbox()
	if !noResponders(t, coord, gone) {
		t.Error("a same-account probe to nobody was not answered 503")
	}
}

// Revoking one user (an update of the CLIENTS account on the running
// server) leaves another user's streamed reply mapped and the exports'
// thresholds as they were.
func TestRevokeKeepsOtherStreams(t *testing.T) {
	const threshold = 5 * time.Second
	l := testLayout(t, Config{ResponseThreshold: threshold})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	reqs := responder(t, coord, protocol.SubjectExec)
	nc, _ := connect(t, s, mintClient(t, l, "alice"))
	inbox := nc.NewInbox()
	replies, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(protocol.SubjectExec, inbox, nil); err != nil {
		t.Fatal(err)
	}
	req := next(t, reqs)
	recv(t, replies)

	if err := l.Revoke(mintClient(t, l, "bob").PublicKey()); err != nil {
		t.Fatal(err)
	}
	if err := l.UpdateServer(s); err != nil {
		t.Fatal(err)
	}
	if err := coord.PublishMsg(&nats.Msg{Subject: req.Reply, Data: []byte("still here")}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, replies); string(m.Data) != "still here" {
		t.Fatalf("reply %q", m.Data)
	}
	acc, err := s.LookupAccount(l.AccountKey(AccountTether))
	if err != nil {
		t.Fatal(err)
	}
	if th, err := acc.ServiceExportResponseThreshold(protocol.SubjectExec); err != nil || th != threshold {
		t.Errorf("threshold after a CLIENTS update: %v, %v; want %v", th, err, threshold)
	}
}

// A natspipe pipe across the import: the client dials tether.v1.stream;
// the coordinator's end receives on an exported pipe subject
// (PipeSubject), and sends on the streamed reply. Bytes flow both ways,
// the pipe survives 2 response thresholds of idleness on its pings alone,
// and every client-to-coordinator message carries the opener's identity,
// so the coordinator can drop what another client publishes to the pipe.
func TestPipeAcrossImport(t *testing.T) {
	// Pings every 2-3 s keep a mapping of 8 s and a silence window of
	// PipeSilenceFactor×2 s: margins a loaded machine's late timers fit in
	// (1 s pings against a 3 s threshold failed once at load 45).
	const threshold = 8 * time.Second
	l := testLayout(t, Config{ResponseThreshold: threshold})
	s := startServer(t, l)
	coordCreds := mintCoordinator(t, l, "c1")
	coord, _ := connect(t, s, coordCreds)
	// The coordinator's pipe ends: until natspipe.Accept takes a local
	// subject, a connection whose inboxes are pipe subjects does it.
	pipePrefix, err := PipeSubject("c1", "p")
	if err != nil {
		t.Fatal(err)
	}
	pipePrefix = strings.TrimSuffix(pipePrefix, ".p")
	pipeConn, _ := connect(t, s, coordCreds, nats.CustomInboxPrefix(pipePrefix))
	// A TETHER observer of every pipe message, as the coordinator would
	// check them.
	observed, err := coord.SubscribeSync(PipeSubjectPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	coord.Flush()

	// Pings every KeepAlive to 1.5 KeepAlive when idle: within the
	// threshold.
	cfg := natspipe.Config{KeepAlive: 2 * time.Second}
	v := l.Verifier()
	accepted := make(chan *natspipe.Pipe, 1)
	var owner Identity
	var wg sync.WaitGroup
	if _, err := coord.Subscribe(protocol.SubjectStream, func(m *nats.Msg) {
		id, err := v.Identify(m.Header)
		if err != nil {
			t.Errorf("stream request: %v", err)
			return
		}
		owner = id
		p, err := natspipe.Accept(pipeConn, m.Reply, cfg)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		accepted <- p
	}); err != nil {
		t.Fatal(err)
	}
	coord.Flush()

	alice := mintClient(t, l, "alice")
	nc, _ := connect(t, s, alice)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cp, err := natspipe.Dial(ctx, nc, protocol.SubjectStream, nil, []byte(`{}`), cfg)
	if err != nil {
		t.Fatalf("dial a pipe through the import: %v", err)
	}
	defer cp.Close()
	var sp *natspipe.Pipe
	select {
	case sp = <-accepted:
	case <-timeAfter(wait):
		t.Fatal("the coordinator accepted no pipe")
	}
	defer sp.Close()
	if owner.Key != alice.PublicKey() {
		t.Fatalf("pipe opened by %+v", owner)
	}
	if !strings.HasPrefix(cp.Peer(), pipePrefix+".") {
		t.Fatalf("the client sends to %s, not to a pipe subject", cp.Peer())
	}

	// The coordinator end echoes.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := io.Copy(sp, sp); err != nil {
			t.Errorf("echo: %v", err)
		}
		sp.CloseWrite()
	}()
	exchange := func(n int) {
		t.Helper()
		data := make([]byte, n)
		rand.Read(data)
		errc := make(chan error, 1)
		go func() {
			_, err := cp.Write(data)
			errc <- err
		}()
		got := make([]byte, n)
		if _, err := io.ReadFull(cp, got); err != nil {
			t.Fatalf("read the echo: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("write: %v", err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("the echo differs")
		}
	}
	exchange(3 << 20)
	time.Sleep(2 * threshold) // idle: only pings keep the reply mapped
	if n := pending(t, s, l, protocol.SubjectStream); n != 1 {
		t.Fatalf("after an idle spell TETHER holds %d mappings for the pipe's reply, want 1", n)
	}
	exchange(64 << 10)
	if err := cp.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(cp); err != nil || len(rest) != 0 {
		t.Fatalf("after eof: %d bytes, %v", len(rest), err)
	}
	wg.Wait()

	// Every message the client sent to the pipe subject carried alice's
	// identity.
	n, _, err := observed.Pending()
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("the observer saw no pipe message")
	}
	for i := 0; i < n; i++ {
		m := recv(t, observed)
		acc, user, err := RequestUser(m.Header)
		if err != nil || acc != l.AccountKey(AccountClients) || user != alice.PublicKey() {
			t.Fatalf("pipe message %d of %d: account %s user %s, %v", i, n, acc, user, err)
		}
	}

	// Another client writing to the pipe subject is told apart.
	mallory := mintClient(t, l, "mallory")
	ncM, _ := connect(t, s, mallory)
	if err := ncM.PublishMsg(&nats.Msg{Subject: cp.Peer(), Header: nats.Header{protocol.HeaderPipeOp: {"close"}}}); err != nil {
		t.Fatal(err)
	}
	// Alice's end may still ping meanwhile: find the injected close.
	m := recv(t, observed)
	for m.Header.Get(protocol.HeaderPipeOp) != "close" {
		m = recv(t, observed)
	}
	if _, user, _ := RequestUser(m.Header); user != mallory.PublicKey() {
		t.Fatalf("injected pipe message attributed to %s", user)
	}
}
