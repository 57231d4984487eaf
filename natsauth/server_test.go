package natsauth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/tetherfleet/tether/protocol"
)

// responder serves subject in TETHER (queue group "q", as the micro
// service does): it answers "ok" to every request and hands the request to
// the test.
func responder(tb testing.TB, nc *nats.Conn, subject string) <-chan *nats.Msg {
	tb.Helper()
	ch := make(chan *nats.Msg, 64)
	if _, err := nc.QueueSubscribe(subject, "q", func(m *nats.Msg) {
		ch <- m
		if m.Reply != "" {
			m.Respond([]byte("ok"))
		}
	}); err != nil {
		tb.Fatalf("subscribe %s: %v", subject, err)
	}
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return ch
}

func next(tb testing.TB, ch <-chan *nats.Msg) *nats.Msg {
	tb.Helper()
	select {
	case m := <-ch:
		return m
	case <-timeAfter(wait):
		tb.Fatalf("responder got no request within %v", wait)
		return nil
	}
}

func TestAnonymousAndForeignClientsRefused(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)

	if _, _, err := dial(s, nil); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("anonymous connect: got %v, want %v", err, nats.ErrAuthorization)
	}
	// A well-formed user of another operator's account.
	other := testLayout(t, Config{})
	if _, _, err := dial(s, mintClient(t, other, "mallory")); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("foreign operator's user: got %v, want %v", err, nats.ErrAuthorization)
	}
	// A user JWT claiming our CLIENTS account, signed by a key of its own.
	fake, _ := nkeys.CreateAccount()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.IssuerAccount = l.AccountKey(AccountClients)
	tok, err := uc.Encode(fake)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	forged, err := newCreds(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := dial(s, forged); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("self-signed user of CLIENTS: got %v, want %v", err, nats.ErrAuthorization)
	}
	// A user of the client signing key that carries permissions of its
	// own, and a bearer token of the account key.
	for name, c := range map[string]struct {
		signer nkeys.KeyPair
		issuer string
		edit   func(*jwt.UserClaims)
	}{
		"scoped user with its own permissions": {l.clientSigner, l.AccountKey(AccountClients), func(uc *jwt.UserClaims) { uc.Sub.Allow.Add(">") }},
		"bearer token": {l.accounts[AccountClients], "", func(uc *jwt.UserClaims) {
			uc.SetScoped(false)
			uc.BearerToken = true
		}},
	} {
		ukp, _ := nkeys.CreateUser()
		upub, _ := ukp.PublicKey()
		uc := jwt.NewUserClaims(upub)
		uc.IssuerAccount = c.issuer
		uc.SetScoped(true)
		c.edit(uc)
		tok, err := uc.Encode(c.signer)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := ukp.Seed()
		cr, err := newCreds(tok, seed)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := dial(s, cr); !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("%s: got %v, want %v", name, err, nats.ErrAuthorization)
		}
	}
	// Positive control: a user of the layout connects.
	nc, _ := connect(t, s, mintClient(t, l, "alice"))
	nc.Close()
}

func TestClientRequestIsIdentified(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	reqs := responder(t, coord, protocol.SubjectExec)

	alice := mintClient(t, l, "alice")
	// Through a .creds file and nats.go's own loader: the format is nats.go's.
	path := filepath.Join(t.TempDir(), "alice.creds")
	if err := WriteCreds(path, alice); err != nil {
		t.Fatal(err)
	}
	nc, _ := connect(t, s, nil, nats.UserCredentials(path), nats.CustomInboxPrefix(alice.InboxPrefix()))
	resp, err := nc.Request(protocol.SubjectExec, []byte("{}"), wait)
	if err != nil {
		t.Fatalf("request through the import: %v", err)
	}
	if string(resp.Data) != "ok" {
		t.Fatalf("reply %q", resp.Data)
	}
	m := next(t, reqs)
	id, err := l.Verifier().Identify(m.Header)
	if err != nil {
		t.Fatalf("Identify: %v", err)
	}
	want := Identity{Kind: KindNATS, Name: "alice", Key: alice.PublicKey(), Account: AccountClients}
	if diff := cmp.Diff(want, id); diff != "" {
		t.Errorf("identity (-want +got):\n%s", diff)
	}
	if id.String() != "nats:alice" {
		t.Errorf("String() = %q", id.String())
	}

	// The coordinator's own request (same account) carries no header.
	if _, err := coord.Request(protocol.SubjectExec, nil, wait); err != nil {
		t.Fatal(err)
	}
	m = next(t, reqs)
	if _, err := l.Verifier().Identify(m.Header); !errors.Is(err, ErrNoRequestInfo) {
		t.Errorf("same-account request: Identify = %v, want %v", err, ErrNoRequestInfo)
	}
}

// A client that writes Nats-Request-Info itself (here, a copy of another
// user's real one, twice, and in another spelling) is not believed.
func TestClientWrittenRequestInfoIsReplaced(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	reqs := responder(t, coord, protocol.SubjectExec)
	alice, bob := mintClient(t, l, "alice"), mintClient(t, l, "bob")

	ncB, _ := connect(t, s, bob)
	if _, err := ncB.Request(protocol.SubjectExec, nil, wait); err != nil {
		t.Fatal(err)
	}
	bobInfo := next(t, reqs).Header.Get(server.ClientInfoHdr)
	if !strings.Contains(bobInfo, bob.PublicKey()) {
		t.Fatalf("bob's request info does not name bob: %s", bobInfo)
	}

	ncA, _ := connect(t, s, alice)
	forged := &nats.Msg{Subject: protocol.SubjectExec, Header: nats.Header{
		server.ClientInfoHdr: {bobInfo, `{"acc":"x","user":"y"}`},
		"nats-request-info":  {bobInfo},
	}}
	if _, err := ncA.RequestMsg(forged, wait); err != nil {
		t.Fatal(err)
	}
	m := next(t, reqs)
	if n := len(m.Header[server.ClientInfoHdr]); n != 1 {
		t.Fatalf("%d %s headers arrived, want the server's one", n, server.ClientInfoHdr)
	}
	id, err := l.Verifier().Identify(m.Header)
	if err != nil {
		t.Fatalf("Identify: %v", err)
	}
	if id.Key != alice.PublicKey() || id.Name != "alice" {
		t.Fatalf("the responder believed the forged header: %+v", id)
	}
	// The server removes only the exact name: another spelling passes
	// through, which is why Identify reads the exact name only.
	if got := m.Header["nats-request-info"]; len(got) != 1 || got[0] != bobInfo {
		t.Errorf("lower-case copy: got %q; the server's handling changed, review Identify's lookup", got)
	}
}

// Each attempt a client makes outside its permissions is refused by the
// server with a permissions violation naming the subject.
func TestClientPermissions(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	coordCreds := mintCoordinator(t, l, "c1")
	coord, _ := connect(t, s, coordCreds)
	reqs := responder(t, coord, protocol.SubjectExec)
	alice, bob := mintClient(t, l, "alice"), mintClient(t, l, "bob")

	subs := []struct{ name, subject, queue string }{
		{"everything", ">", ""},
		{"another user's inbox", bob.InboxPrefix() + ".>", ""},
		{"the stock inbox prefix", "_INBOX.>", ""},
		{"JetStream API", "$JS.API.>", ""},
		{"KV bucket", "$KV.tether_locks.>", ""},
		{"the API subject", protocol.SubjectExec, ""},
		{"the service's queue group", protocol.SubjectExec, "q"},
		{"events", "tether.v1.events.>", ""},
	}
	for _, tt := range subs {
		t.Run("subscribe "+tt.name, func(t *testing.T) {
			nc, errs := connect(t, s, alice)
			var err error
			if tt.queue != "" {
				_, err = nc.QueueSubscribeSync(tt.subject, tt.queue)
			} else {
				_, err = nc.SubscribeSync(tt.subject)
			}
			if err != nil {
				t.Fatal(err)
			}
			errs.waitFor(t, "Permissions Violation", "Subscription", `"`+tt.subject+`"`)
		})
	}

	// What alice may not publish to: the coordinator's inbox, bob's, the
	// JetStream API, a KV key.
	var coordInbox string
	{
		in := coord.NewInbox()
		if _, err := coord.SubscribeSync(in); err != nil {
			t.Fatal(err)
		}
		coordInbox = in
	}
	pubs := []struct{ name, subject string }{
		{"the coordinator's inbox", coordInbox},
		{"another user's inbox", bob.InboxPrefix() + ".x"},
		{"JetStream API", "$JS.API.STREAM.LIST"},
		{"KV key", "$KV.tether_locks.n1"},
		// The coordinators' internal routing (coordinator/fleet.go).
		{"a node subject", "tether.v1.node.n1.exec"},
		{"a node subject (stream)", "tether.v1.node.n1~x.stream"},
		{"a run subject", "tether.v1.run.job-1.cancel"},
		{"a coordinator subject", "tether.v1.coord.c1.nodes"},
		{"a coordinator's liveness probe", "tether.v1.coord.c1.ping"},
		{"a job query for a node", "tether.v1.node.n1.job.query"},
		{"a job's run heartbeat", "tether.v1.run.job-1.alive"},
	}
	for _, tt := range pubs {
		t.Run("publish to "+tt.name, func(t *testing.T) {
			nc, errs := connect(t, s, alice)
			if err := nc.Publish(tt.subject, []byte("x")); err != nil {
				t.Fatal(err)
			}
			errs.waitFor(t, "Permissions Violation", "Publish", `"`+tt.subject+`"`)
		})
	}

	t.Run("no JetStream", func(t *testing.T) {
		nc, _ := connect(t, s, alice)
		js, err := nc.JetStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.AccountInfo(); err == nil {
			t.Fatal("a client reached JetStream")
		}
		// Positive control: the coordinator has JetStream.
		cjs, _ := coord.JetStream()
		if _, err := cjs.AccountInfo(); err != nil {
			t.Fatalf("coordinator JetStream: %v", err)
		}
	})

	// While a queue subscription on the API is refused to mallory, alice's
	// requests all go to the coordinator.
	t.Run("queue group hijack", func(t *testing.T) {
		mallory := mintClient(t, l, "mallory")
		ncM, errs := connect(t, s, mallory)
		hijack, err := ncM.QueueSubscribeSync(protocol.SubjectExec, "q")
		if err != nil {
			t.Fatal(err)
		}
		errs.waitFor(t, "Permissions Violation")
		ncA, _ := connect(t, s, alice)
		for i := 0; i < 20; i++ {
			if _, err := ncA.Request(protocol.SubjectExec, nil, wait); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			id, err := l.Verifier().Identify(next(t, reqs).Header)
			if err != nil || id.Key != alice.PublicKey() {
				t.Fatalf("request %d: identity %+v, %v", i, id, err)
			}
		}
		if n, _, _ := hijack.Pending(); n != 0 {
			t.Fatalf("mallory's queue subscription received %d requests", n)
		}
	})

	// A user the CLIENTS account key signs itself, with no permissions of
	// its own, gets the account's default ones: none.
	t.Run("unscoped user gets nothing", func(t *testing.T) {
		l.mu.Lock()
		signer := l.accounts[AccountClients]
		l.mu.Unlock()
		ukp, _ := nkeys.CreateUser()
		upub, _ := ukp.PublicKey()
		uc := jwt.NewUserClaims(upub)
		uc.Name = "eve"
		tok, err := uc.Encode(signer)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := ukp.Seed()
		eve, err := newCreds(tok, seed)
		if err != nil {
			t.Fatal(err)
		}
		nc, errs := connect(t, s, eve)
		if _, err := nc.SubscribeSync(">"); err != nil {
			t.Fatal(err)
		}
		errs.waitFor(t, "Permissions Violation", `">"`)
		if err := nc.Publish(protocol.SubjectExec, nil); err != nil {
			t.Fatal(err)
		}
		errs.waitFor(t, "Permissions Violation", "Publish")
	})
}

// Subjects under tether.v1. that TETHER does not export stay in CLIENTS: a
// client cannot forge events, audit records or node-routed requests.
func TestUnexportedSubjectsStayInClients(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	all, err := coord.SubscribeSync("tether.v1.>")
	if err != nil {
		t.Fatal(err)
	}
	coord.Flush()
	nc, _ := connect(t, s, mintClient(t, l, "alice"))
	for _, subj := range []string{
		protocol.SubjectSandboxEventPrefix + protocol.EventCreated,
		"tether.v1.audit.exec",
		"tether.v1.node.n1.exec",
	} {
		if err := nc.Publish(subj, []byte("forged")); err != nil {
			t.Fatal(err)
		}
	}
	// An exported subject, published last on the same connection, arrives
	// first if nothing else crossed.
	if err := nc.Publish(protocol.SubjectCancel, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, all); m.Subject != protocol.SubjectCancel {
		t.Fatalf("TETHER received %s (%q) from a client", m.Subject, m.Data)
	}
}

// ExportsCoverProtocol: every subject constant of package protocol is
// exported to clients, or listed here as internal on purpose. A new API
// subject fails this test until it is added to ServiceExports.
func TestExportsCoverProtocol(t *testing.T) {
	internal := map[string]bool{
		"SubjectSandboxEventPrefix": true, // coordinators publish events; clients do not
		"SubjectAuditPrefix":        true, // coordinators publish audit events; clients read them through SubjectAuditQuery
	}
	consts := protocolSubjects(t)
	exported := map[string]bool{}
	for _, e := range ServiceExports() {
		exported[e.Subject] = true
	}
	if len(consts) < 10 {
		t.Fatalf("found only %d Subject constants in protocol: the parser broke", len(consts))
	}
	for name, value := range consts {
		if !exported[value] && !internal[name] {
			t.Errorf("protocol.%s = %q is neither exported to clients (ServiceExports) nor listed as internal", name, value)
		}
	}
}

func TestServerConfigFile(t *testing.T) {
	l := testLayout(t, Config{})
	dir := t.TempDir()
	conf := "listen: 127.0.0.1:-1\njetstream { store_dir: " + strconvQuote(filepath.Join(dir, "js")) + " }\n" + l.ServerConfig()
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("parse the generated config: %v\n%s", err, conf)
	}
	opts.NoLog, opts.NoSigs = true, true
	s := runServer(t, opts)

	if _, _, err := dial(s, nil); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("anonymous connect: got %v", err)
	}
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	reqs := responder(t, coord, protocol.SubjectNodes)
	alice := mintClient(t, l, "alice")
	nc, _ := connect(t, s, alice)
	if _, err := nc.Request(protocol.SubjectNodes, nil, wait); err != nil {
		t.Fatal(err)
	}
	id, err := l.Verifier().Identify(next(t, reqs).Header)
	if err != nil || id.Name != "alice" {
		t.Fatalf("identity %+v, %v", id, err)
	}
	cjs, _ := coord.JetStream()
	if _, err := cjs.AccountInfo(); err != nil {
		t.Fatalf("coordinator JetStream on the config-file server: %v", err)
	}
}

func TestRevokeDisconnectsAndRefuses(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	reqs := responder(t, coord, protocol.SubjectNodes)
	alice, bob := mintClient(t, l, "alice"), mintClient(t, l, "bob")
	closed := make(chan struct{})
	ncA, _ := connect(t, s, alice, nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if _, err := ncA.Request(protocol.SubjectNodes, nil, wait); err != nil {
		t.Fatal(err)
	}
	aliceHdr := next(t, reqs).Header
	if _, err := l.Verifier().Identify(aliceHdr); err != nil {
		t.Fatal(err)
	}

	if err := l.Revoke(alice.PublicKey()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Verifier().Identify(aliceHdr); !errors.Is(err, ErrRevoked) {
		t.Errorf("Identify after revoke: %v, want %v", err, ErrRevoked)
	}
	if err := l.UpdateServer(s); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-timeAfter(wait):
		t.Fatal("the server kept the revoked user's connection")
	}
	if _, _, err := dial(s, alice); err == nil {
		t.Error("the revoked user connected again")
	}
	// Bob is unaffected, and so is a fresh Load of the directory.
	ncB, _ := connect(t, s, bob)
	if _, err := ncB.Request(protocol.SubjectNodes, nil, wait); err != nil {
		t.Fatalf("bob after alice's revocation: %v", err)
	}
	if _, err := l.Verifier().Identify(next(t, reqs).Header); err != nil {
		t.Fatalf("bob: %v", err)
	}
	l2, err := Load(l.Dir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l2.Verifier().Identify(aliceHdr); !errors.Is(err, ErrRevoked) {
		t.Errorf("reloaded layout forgot the revocation: %v", err)
	}
}

// A client cannot write the audit log: what it publishes under
// tether.v1.audit. stays in CLIENTS, so the audit stream, which lives in
// TETHER, never stores it; a coordinator's event is stored.
func TestClientCannotWriteAuditStream(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	js, err := jetstream.New(coord)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TETHER_AUDIT", Subjects: []string{protocol.SubjectAuditPrefix + ">"}})
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := connect(t, s, mintClient(t, l, "mallory"))
	for _, subj := range []string{protocol.AuditSubject("exec", protocol.AuditOK), protocol.SubjectAuditPrefix + "x", protocol.SubjectAuditPrefix + "admin.ok"} {
		if err := nc.Publish(subj, []byte(`{"v":1,"id":"forged","identity":"nats:alice","operation":"exec","result":"ok"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Through the JetStream API, with an acknowledgement asked for: the
	// client may not publish there, nor subscribe to the reply.
	if cjs, err := jetstream.New(nc); err == nil {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err := cjs.Publish(pctx, protocol.SubjectAuditPrefix+"exec.ok", []byte("forged")); err == nil {
			t.Error("a client's JetStream publish to the audit stream was acknowledged")
		}
		pcancel()
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The coordinator's event comes after the client's in the stream's
	// queue: once it is stored, the client's would have been.
	if _, err := js.Publish(ctx, protocol.AuditSubject("exec", protocol.AuditOK), []byte(`{"v":1,"id":"real"}`)); err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			if m, err := stream.GetMsg(ctx, seq); err == nil {
				t.Logf("stored %d: %s %q", seq, m.Subject, m.Data)
			}
		}
		t.Fatalf("the audit stream holds %d messages, want only the coordinator's", info.State.Msgs)
	}
}

// No subject a client can reach lies under the audit stream's subjects: a
// request there would be stored as an event.
func TestNoExportUnderAuditPrefix(t *testing.T) {
	for _, e := range ServiceExports() {
		if server.SubjectsCollide(e.Subject, protocol.SubjectAuditPrefix+">") {
			t.Errorf("export %q collides with the audit stream's %q", e.Subject, protocol.SubjectAuditPrefix+">")
		}
	}
}

// TestRequestHost: the client's IP from the header the server stamped;
// nothing from a missing, doubled or malformed header or a host that is
// not an IP.
func TestRequestHost(t *testing.T) {
	for _, tt := range []struct {
		vals []string
		want string
	}{
		{[]string{`{"acc":"A","user":"U","host":"127.0.0.7","id":4}`}, "127.0.0.7"},
		{[]string{`{"host":"::1"}`}, "::1"},
		{nil, ""},
		{[]string{`{"host":"127.0.0.7"}`, `{"host":"127.0.0.8"}`}, ""},
		{[]string{`{"host":`}, ""},
		{[]string{`{"host":"evil.example"}`}, ""},
		{[]string{`{"host":"127.0.0.7:4222"}`}, ""},
	} {
		h := nats.Header{}
		if tt.vals != nil {
			h["Nats-Request-Info"] = tt.vals
		}
		if got := RequestHost(h); got != tt.want {
			t.Errorf("RequestHost(%q) = %q, want %q", tt.vals, got, tt.want)
		}
	}
}

// The header Identify reads is the one the server stamps.
func TestClientInfoHdr(t *testing.T) {
	if clientInfoHdr != server.ClientInfoHdr {
		t.Fatalf("clientInfoHdr is %q, nats-server stamps %q", clientInfoHdr, server.ClientInfoHdr)
	}
}
