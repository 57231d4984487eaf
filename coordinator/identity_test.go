package coordinator_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/enroll"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// testClock is the identity store's clock: the real one, shifted.
type testClock struct{ off atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *testClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// idHarness is a harness whose coordinator has per-node identity: a node
// CA and an identity store on the harness's NATS server.
type idHarness struct {
	*harness
	ca    *tunnel.NodeCA
	store *enroll.Store
	clock *testClock
}

// newIDHarness starts a coordinator with per-node identity; shared keeps
// the harness's shared token (--allow-shared-token).
func newIDHarness(t *testing.T, shared bool, mutate func(*coordinator.Config)) *idHarness {
	t.Helper()
	ih := &idHarness{clock: &testClock{}}
	ih.harness = newHarness(t, func(c *coordinator.Config) {
		ca, err := tunnel.NewTestCA("tether node CA (test)")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		store, err := enroll.Open(ctx, enroll.Config{NATS: c.NATS, Now: ih.clock.now, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(store.Close) // after the coordinator stopped (cleanups run last-in first-out)
		ih.ca, ih.store = ca, store
		c.NodeCA, c.Identities = ca, store
		if !shared {
			c.Token = ""
		}
		if mutate != nil {
			mutate(c)
		}
	})
	return ih
}

// token mints a join token in the store.
func (ih *idHarness) token(t testing.TB, uses int, ttl time.Duration, labels map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	tok, _, err := ih.store.CreateToken(ctx, ttl, uses, labels, "test")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// enrollAs enrolls node with token over a fresh connection, as an agent
// does, and returns its certificate, or the coordinator's reject.
func (ih *idHarness) enrollAs(t testing.TB, node, token string) (*tls.Certificate, *protocol.ErrorInfo) {
	t.Helper()
	c, rej, err := enrollRaw(ih.addr, ih.clientTLS, node, token)
	if err != nil {
		t.Fatalf("enroll %s: %v", node, err)
	}
	return c, rej
}

// enrollRaw is enrollAs without a test (benchmarks run it concurrently).
func enrollRaw(addr string, clientTLS *tls.Config, node, token string) (*tls.Certificate, *protocol.ErrorInfo, error) {
	key, err := tunnel.NewNodeKey()
	if err != nil {
		return nil, nil, err
	}
	csr, err := tunnel.NewNodeCSR(key, node)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	conn, err := tunnel.DialTLS(ctx, addr, clientTLS)
	if err != nil {
		return nil, nil, err
	}
	sess, err := tunnel.Client(conn, tunnel.DefaultConfig())
	if err != nil {
		return nil, nil, err
	}
	defer sess.Close()
	ctl, err := sess.Open(ctx, protocol.KindControl, protocol.ControlParams{})
	if err != nil {
		return nil, nil, err
	}
	werr := protocol.WriteJSONFrame(ctl, protocol.FrameEnroll, &protocol.Enroll{ProtocolVersion: protocol.Version, Token: token, NodeID: node, CSR: csr})
	ctl.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	f, err := protocol.NewFrameReader(ctl).Next()
	if err != nil {
		return nil, nil, fmt.Errorf("read enroll answer: %w (write: %v)", err, werr)
	}
	switch f.Type {
	case protocol.FrameEnrolled:
		var e protocol.Enrolled
		if err := json.Unmarshal(f.Payload, &e); err != nil {
			return nil, nil, err
		}
		cert, err := x509.ParseCertificate(e.Certificate)
		if err != nil {
			return nil, nil, err
		}
		return &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}, nil, nil
	case protocol.FrameReject:
		var info protocol.ErrorInfo
		if err := json.Unmarshal(f.Payload, &info); err != nil {
			return nil, nil, err
		}
		return nil, &info, nil
	}
	return nil, nil, fmt.Errorf("got %s frame, want enrolled or reject", f.Type)
}

// signFor issues a certificate for node from ca without enrolling it
// (listed nowhere), valid from notBefore for ttl.
func signFor(t testing.TB, ca *tunnel.NodeCA, node string, notBefore time.Time, ttl time.Duration) *tls.Certificate {
	t.Helper()
	key, err := tunnel.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := tunnel.NewNodeCSR(key, node)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := tunnel.ParseNodeCSR(der, node)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Sign(csr, node, notBefore, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
}

func mustEnroll(t testing.TB, ih *idHarness, node, token string) *tls.Certificate {
	t.Helper()
	c, rej := ih.enrollAs(t, node, token)
	if rej != nil {
		t.Fatalf("enroll %s refused: %v", node, rej)
	}
	return c
}

func TestEnrollThenCertificateSession(t *testing.T) {
	ih := newIDHarness(t, false, nil)
	tok := ih.token(t, 1, time.Hour, map[string]string{"zone": "eu"})
	cert := mustEnroll(t, ih, "n1", tok)
	id, err := tunnel.NodeIDOf(cert.Leaf)
	if err != nil || id != "n1" {
		t.Fatalf("certificate names %q (%v), want n1", id, err)
	}
	if u := cert.Leaf.URIs; len(u) != 1 || u[0].String() != "urn:tether:node:n1" || cert.Leaf.Subject.CommonName != "n1" {
		t.Errorf("certificate URIs %v CN %q", u, cert.Leaf.Subject.CommonName)
	}
	if life := cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore); life != coordinator.DefaultCertTTL {
		t.Errorf("certificate lifetime %v, want %v", life, coordinator.DefaultCertTTL)
	}
	a := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, heartbeat: true, labels: map[string]string{"zone": "us", "role": "web"}})
	if a.reject != nil {
		t.Fatalf("certificate session refused: %v", a.reject)
	}
	nodes := ih.c.Nodes(protocol.Selector{})
	if len(nodes) != 1 {
		t.Fatalf("nodes %+v", nodes)
	}
	// The token's labels win over the agent's own.
	if diff := cmp.Diff(map[string]string{"zone": "eu", "role": "web"}, nodes[0].Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if got := ih.metric("tether_coordinator_enrollments_total", "result", "ok"); got != 1 {
		t.Errorf("enrollments{ok} = %v, want 1", got)
	}
}

// TestImpostorCannotTakeOverEnrolledNode is the attack of issue 9: an
// impostor holding the fleet's join token waits until the real n1 missed
// two heartbeats (its process stopped), registers as n1, receives n1's
// next job with its secret env value, answers a forged exit 0 and keeps
// the real agent out as duplicate_node. On main 3ded359 (hello + shared
// token) every step of it succeeded. Now n1 is enrolled: without its
// certificate neither a Hello (shared token or none) nor a fresh
// enrollment gets the id, the job reaches nobody but n1, and n1's
// certificate takes its stale session back.
func TestImpostorCannotTakeOverEnrolledNode(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow_shared_token=%v", shared), func(t *testing.T) {
			ih := newIDHarness(t, shared, func(c *coordinator.Config) {
				// The stopped agent's session stays open (its TCP
				// connection is alive) for the whole test.
				c.Tunnel = tunnel.DefaultConfig()
				c.Tunnel.KeepAliveInterval = 0
				c.Tunnel.IdleTimeout = time.Minute
			})
			fleetToken := ih.token(t, -1, time.Hour, nil) // the token every agent of the fleet has
			cert := mustEnroll(t, ih, "n1", fleetToken)
			// The real agent sends one Hello, then no heartbeat and no
			// ping: stopped (it still has its streams served, to see
			// which jobs reach it).
			var realExecs atomic.Int32
			real := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, silent: true, instance: "real",
				handler: func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
					if p.Env["DB_PASSWORD"] == "hunter2" {
						realExecs.Add(1)
					}
					protocol.WriteJSONFrame(st, protocol.FrameExit, &protocol.ExitStatus{ExitCode: 7})
				}})
			if real.reject != nil {
				t.Fatal(real.reject)
			}
			checkFor(t, defaultTestTimeout, func() error {
				ns := ih.c.Nodes(protocol.Selector{})
				if len(ns) != 1 || time.Since(ns[0].LastHeartbeat) < 2*time.Second { // 2 heartbeat intervals
					return errors.New("n1 has not missed two heartbeats yet")
				}
				return nil
			})

			var impostorExecs atomic.Int32
			steal := func(o agentOpts) *protocol.ErrorInfo {
				o.id, o.instance, o.heartbeat = "n1", "impostor", true
				o.handler = func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
					impostorExecs.Add(1)
					protocol.WriteJSONFrame(st, protocol.FrameExit, &protocol.ExitStatus{})
				}
				a := ih.dialAgent(t, o)
				if a.reject == nil {
					t.Errorf("impostor registered as n1 (%+v)", o)
				}
				return a.reject
			}
			if shared {
				if rej := steal(agentOpts{}); rej == nil || rej.Code != protocol.CodeCertRequired {
					t.Errorf("impostor hello with the shared token: %+v, want %s", rej, protocol.CodeCertRequired)
				}
			}
			// A join token is for enrolling only; in a Hello it is no
			// shared token.
			wantCode := protocol.CodeCertRequired
			if shared {
				wantCode = protocol.CodeAuth
			}
			if rej := steal(agentOpts{token: fleetToken}); rej == nil || rej.Code != wantCode {
				t.Errorf("impostor hello with the join token: %+v, want %s", rej, wantCode)
			}
			if _, rej := ih.enrollAs(t, "n1", fleetToken); rej == nil || rej.Code != protocol.CodeEnrollRefused || !strings.Contains(rej.Message, "already enrolled") {
				t.Errorf("impostor enrolling as n1: %+v, want %s naming already enrolled", rej, protocol.CodeEnrollRefused)
			}
			// A certificate of another node does not do either.
			other := mustEnroll(t, ih, "n2", fleetToken)
			if rej := steal(agentOpts{token: "-", clientCert: other}); rej == nil || rej.Code != protocol.CodeCertRefused {
				t.Errorf("impostor with n2's certificate: %+v, want %s", rej, protocol.CodeCertRefused)
			}

			// n1's next job, with its secret, goes to the real n1 only.
			r := ih.exec(map[string]any{"target": map[string]any{"node": "n1"}, "argv": []string{"ok"},
				"env": map[string]string{"DB_PASSWORD": "hunter2"}})
			if impostorExecs.Load() != 0 {
				t.Fatalf("the impostor received %d of n1's jobs", impostorExecs.Load())
			}
			if realExecs.Load() != 1 || r.result == nil || len(r.result.Results) != 1 || r.result.Results[0].ExitCode != 7 {
				t.Errorf("n1's job: %+v (error %v), real n1 ran %d, want the real n1's exit 7", r.result, r.err, realExecs.Load())
			}

			// The real agent, restarted (another instance), takes its
			// stale session back with its certificate.
			back := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, heartbeat: true, instance: "real-restarted"})
			if back.reject != nil {
				t.Fatalf("the real n1 was kept out: %v", back.reject)
			}
			real.waitClosed()
		})
	}
}

func TestCertificateRefusals(t *testing.T) {
	ih := newIDHarness(t, false, nil)
	tok := ih.token(t, -1, time.Hour, nil)
	n2 := mustEnroll(t, ih, "n2", tok)
	n3 := mustEnroll(t, ih, "n3", tok)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if _, err := ih.store.Revoke(ctx, "n3"); err != nil {
		t.Fatal(err)
	}
	foreign, err := tunnel.NewTestCA("someone else's CA")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, node string
		cert       *tls.Certificate
		code       string
		reason     string
		msg        string
	}{
		{"wrong node", "n1", n2, protocol.CodeCertRefused, "wrong_node", `hello names node "n1" but the client certificate is node n2's`},
		{"expired", "n4", signFor(t, ih.ca, "n4", time.Now().Add(-48*time.Hour), time.Hour), protocol.CodeCertRefused, "expired_cert", "expired"},
		{"revoked", "n3", n3, protocol.CodeCertRefused, "revoked", "revoked"},
		{"foreign CA", "n5", signFor(t, foreign, "n5", time.Now(), time.Hour), protocol.CodeCertRefused, "foreign_ca", "not issued by this coordinator's node CA"},
		{"signed but never enrolled", "n6", signFor(t, ih.ca, "n6", time.Now(), time.Hour), protocol.CodeCertRefused, "unknown_cert", "no identity record"},
		{"no certificate", "n7", nil, protocol.CodeCertRequired, "cert_required", "admits agents by certificate only"},
	}
	// The WebSocket transport refuses the same way: its identity is the
	// same TLS handshake's client certificate.
	for _, transport := range []string{"tls", "wss"} {
		for _, tt := range tests {
			t.Run(transport+"/"+tt.name, func(t *testing.T) {
				before := ih.metric("tether_coordinator_auth_failures_total", "reason", tt.reason)
				a := ih.dialAgent(t, agentOpts{id: tt.node, token: "-", clientCert: tt.cert, ws: transport == "wss"})
				if a.reject == nil || a.reject.Code != tt.code || !strings.Contains(a.reject.Message, tt.msg) {
					t.Fatalf("reject %+v, want %s saying %q", a.reject, tt.code, tt.msg)
				}
				if got := ih.metric("tether_coordinator_auth_failures_total", "reason", tt.reason); got != before+1 {
					t.Errorf("auth_failures{%s} = %v, want %v", tt.reason, got, before+1)
				}
			})
		}
	}
	if n := ih.c.Nodes(protocol.Selector{}); len(n) != 0 {
		t.Errorf("refused agents registered: %+v", n)
	}
}

func TestEnrollmentRefusals(t *testing.T) {
	ih := newIDHarness(t, false, nil)
	count := func(result string) float64 {
		return ih.metric("tether_coordinator_enrollments_total", "result", result)
	}
	once := ih.token(t, 1, time.Hour, nil)
	mustEnroll(t, ih, "n1", once)
	refused := func(node, token, result, msg string) {
		t.Helper()
		before := count(result)
		_, rej := ih.enrollAs(t, node, token)
		if rej == nil || rej.Code != protocol.CodeEnrollRefused || !strings.Contains(rej.Message, msg) {
			t.Errorf("enroll %s: reject %+v, want %s saying %q", node, rej, protocol.CodeEnrollRefused, msg)
		}
		if strings.Contains(fmt.Sprint(rej), token) {
			t.Errorf("reject leaks the token: %v", rej)
		}
		if got := count(result); got != before+1 {
			t.Errorf("enrollments{%s} = %v, want %v", result, got, before+1)
		}
	}
	refused("n2", once, "token_used", "already used up")

	expiring := ih.token(t, 5, time.Minute, nil)
	ih.clock.advance(2 * time.Minute)
	refused("n3", expiring, "token_expired", "expired")

	refused("n4", "tjt_not-a-token", "bad_token", "not valid")

	many := ih.token(t, -1, time.Hour, nil)
	refused("n1", many, "already_enrolled", "already enrolled")

	// A revoked node is re-admitted only with a token created after the
	// revocation.
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if _, err := ih.store.Revoke(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	refused("n1", many, "revoked_node", "create a new token to re-admit it")
	ih.clock.advance(time.Second)
	mustEnroll(t, ih, "n1", ih.token(t, 1, time.Hour, nil))
	if got := count("ok"); got != 2 {
		t.Errorf("enrollments{ok} = %v, want 2", got)
	}
}

// revokeReq asks the NATS API to revoke node.
func (ih *idHarness) revokeReq(t testing.TB, node string) protocol.NodeRevokeResponse {
	t.Helper()
	m := ih.request(protocol.SubjectNodesRevoke, protocol.NodeRevokeRequest{Node: node})
	var r protocol.NodeRevokeResponse
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Node != node {
		t.Fatalf("revoke reply %q: %v", m.Data, err)
	}
	return r
}

func TestRevokeCutsSessionAndRefusesReconnect(t *testing.T) {
	ih := newIDHarness(t, false, nil)
	tok := ih.token(t, -1, time.Hour, nil)
	cert := mustEnroll(t, ih, "n1", tok)
	a := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, heartbeat: true})
	if a.reject != nil {
		t.Fatal(a.reject)
	}
	r := ih.revokeReq(t, "n1")
	// The coordinator closed the session before it answered: within
	// one heartbeat interval whatever the interval.
	if !r.SessionClosed || len(r.Serials) != 1 || r.Serials[0] != tunnel.SerialHex(cert.Leaf) {
		t.Errorf("revoke reply %+v, want the session closed and serial %s", r, tunnel.SerialHex(cert.Leaf))
	}
	a.waitClosed()
	again := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, instance: "again"})
	if again.reject == nil || again.reject.Code != protocol.CodeCertRefused || !strings.Contains(again.reject.Message, "revoked") {
		t.Errorf("reconnect after revoke: %+v, want %s revoked", again.reject, protocol.CodeCertRefused)
	}
	// An unknown node is a 404.
	m := ih.request(protocol.SubjectNodesRevoke, protocol.NodeRevokeRequest{Node: "nobody"})
	var e protocol.APIError
	if json.Unmarshal(m.Data, &e); e.Code != protocol.ErrCodeNotFound {
		t.Errorf("revoke unknown node: %q, want not_found", m.Data)
	}
}

// TestRevokeElsewhereCutsSession revokes through the identity store, as
// another coordinator sharing it does: this coordinator sees the change
// with its bucket watcher and cuts the session.
func TestRevokeElsewhereCutsSession(t *testing.T) {
	ih := newIDHarness(t, false, nil)
	cert := mustEnroll(t, ih, "n1", ih.token(t, 1, time.Hour, nil))
	a := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, heartbeat: true})
	if a.reject != nil {
		t.Fatal(a.reject)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	other, err := enroll.Open(ctx, enroll.Config{NATS: ih.env.Coordinator(t, nats.Name("another coordinator"))})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Revoke(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	a.waitClosed()
}

func TestTokenCreateAPI(t *testing.T) {
	ih := newIDHarness(t, false, nil)
	m := ih.request(protocol.SubjectTokensCreate, protocol.TokenCreateRequest{TTLSeconds: 600, Uses: 2, Labels: map[string]string{"rack": "r7"}})
	var r protocol.TokenCreateResponse
	if err := json.Unmarshal(m.Data, &r); err != nil || !strings.HasPrefix(r.Token, enroll.TokenPrefix) || r.Uses != 2 || r.ID == "" {
		t.Fatalf("token create reply %q: %v", m.Data, err)
	}
	if d := time.Until(r.ExpiresAt); d <= 0 || d > 10*time.Minute {
		t.Errorf("expires at %v, want within 10 minutes", r.ExpiresAt)
	}
	mustEnroll(t, ih, "n1", r.Token)
	mustEnroll(t, ih, "n2", r.Token)
	if _, rej := ih.enrollAs(t, "n3", r.Token); rej == nil {
		t.Error("a two-use token enrolled a third node")
	}
	if rec, ok := ih.store.Record("n2"); !ok || rec.Labels["rack"] != "r7" {
		t.Errorf("n2's record %+v, want label rack=r7", rec)
	}
	m = ih.request(protocol.SubjectTokensCreate, protocol.TokenCreateRequest{Uses: -2})
	var e protocol.APIError
	if json.Unmarshal(m.Data, &e); e.Code != protocol.ErrCodeInvalid {
		t.Errorf("uses -2: %q, want invalid_request", m.Data)
	}
}

func TestRenewalOnControlStreamKeepsSession(t *testing.T) {
	ih := newIDHarness(t, false, nil)
	cert := mustEnroll(t, ih, "n1", ih.token(t, 1, time.Hour, nil))
	a := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, heartbeat: true})
	if a.reject != nil {
		t.Fatal(a.reject)
	}
	key, _ := tunnel.NewNodeKey()
	csr, _ := tunnel.NewNodeCSR(key, "n1")
	if err := protocol.WriteJSONFrame(a.ctrl, protocol.FrameRenew, &protocol.Renew{CSR: csr}); err != nil {
		t.Fatal(err)
	}
	a.ctrl.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	f, err := protocol.NewFrameReader(a.ctrl).Next()
	if err != nil || f.Type != protocol.FrameRenewed {
		t.Fatalf("renew answer %v %q: %v", f.Type, f.Payload, err)
	}
	var e protocol.Enrolled
	json.Unmarshal(f.Payload, &e)
	nc, err := x509.ParseCertificate(e.Certificate)
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := tunnel.NodeIDOf(nc); id != "n1" || tunnel.SerialHex(nc) == tunnel.SerialHex(cert.Leaf) {
		t.Fatalf("renewed certificate is node %q serial %s", id, tunnel.SerialHex(nc))
	}
	// The session goes on.
	ns := ih.c.Nodes(protocol.Selector{})
	if len(ns) != 1 || ns[0].SessionID != a.welcome.SessionID || a.sess.IsClosed() {
		t.Fatalf("after renewal: nodes %+v, want session %s kept", ns, a.welcome.SessionID)
	}
	if got := ih.metric("tether_coordinator_enrollments_total", "result", "renewed"); got != 1 {
		t.Errorf("enrollments{renewed} = %v", got)
	}
	// Both certificates are accepted until the old one expires; a CSR
	// for another node is refused, and the session still goes on.
	if err := ih.store.CheckCert("n1", tunnel.SerialHex(cert.Leaf)); err != nil {
		t.Errorf("old certificate: %v", err)
	}
	if err := ih.store.CheckCert("n1", tunnel.SerialHex(nc)); err != nil {
		t.Errorf("new certificate: %v", err)
	}
	bad, _ := tunnel.NewNodeCSR(key, "n2")
	protocol.WriteJSONFrame(a.ctrl, protocol.FrameRenew, &protocol.Renew{CSR: bad})
	f, err = protocol.NewFrameReader(a.ctrl).Next()
	if err != nil || f.Type != protocol.FrameReject || !strings.Contains(string(f.Payload), "n2") {
		t.Fatalf("renew for n2: %v %q: %v, want a reject", f.Type, f.Payload, err)
	}
	if a.sess.IsClosed() {
		t.Error("a refused renewal closed the session")
	}
	a.close()
	// The old session must be gone first: another instance's hello while
	// it is still registered is refused as a duplicate node (CI saw the
	// redial win the race against the deregistration by 9 ms).
	checkFor(t, defaultTestTimeout, func() error {
		if ns := ih.c.Nodes(protocol.Selector{}); len(ns) != 0 {
			return fmt.Errorf("nodes after the close: %+v", ns)
		}
		return nil
	})
	b := ih.dialAgent(t, agentOpts{id: "n1", token: "-", heartbeat: true, instance: "renewed",
		clientCert: &tls.Certificate{Certificate: [][]byte{nc.Raw}, PrivateKey: key, Leaf: nc}})
	if b.reject != nil {
		t.Fatalf("session with the renewed certificate: %v", b.reject)
	}
}

func TestSharedTokenOnlyBehindFlag(t *testing.T) {
	var logs logBuffer
	ih := newIDHarness(t, true, func(c *coordinator.Config) { c.Logger = testLoggerTo(t, &logs) })
	a := ih.dialAgent(t, agentOpts{id: "legacy", heartbeat: true})
	if a.reject != nil {
		t.Fatalf("shared-token agent refused with the flag on: %v", a.reject)
	}
	if !strings.Contains(logs.String(), "agent admitted with the deprecated shared token") || strings.Contains(logs.String(), testToken) {
		t.Errorf("log lacks the deprecation warning (or shows the token):\n%s", logs.String())
	}
	// The shared token enrolls too (migration), and then the node's
	// certificate takes over its shared-token session at once.
	cert := mustEnroll(t, ih, "legacy", testToken)
	b := ih.dialAgent(t, agentOpts{id: "legacy", token: "-", clientCert: cert, heartbeat: true, instance: "enrolled"})
	if b.reject != nil {
		t.Fatalf("certificate session refused: %v", b.reject)
	}
	a.waitClosed()
	c := ih.dialAgent(t, agentOpts{id: "legacy", instance: "third", heartbeat: true})
	if c.reject == nil || c.reject.Code != protocol.CodeCertRequired {
		t.Errorf("shared-token hello for an enrolled node: %+v, want %s", c.reject, protocol.CodeCertRequired)
	}

	off := newIDHarness(t, false, nil)
	d := off.dialAgent(t, agentOpts{id: "legacy"})
	if d.reject == nil || d.reject.Code != protocol.CodeCertRequired {
		t.Errorf("shared-token hello without the flag: %+v, want %s", d.reject, protocol.CodeCertRequired)
	}
	if _, rej := off.enrollAs(t, "legacy", testToken); rej == nil || rej.Code != protocol.CodeEnrollRefused {
		t.Errorf("enroll with the shared token without the flag: %+v, want %s", rej, protocol.CodeEnrollRefused)
	}
}

func TestCertHolderTakeoverRules(t *testing.T) {
	ih := newIDHarness(t, false, func(c *coordinator.Config) { c.HeartbeatInterval = 200 * time.Millisecond })
	cert := mustEnroll(t, ih, "n1", ih.token(t, 1, time.Hour, nil))
	a := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, heartbeat: true, instance: "one"})
	if a.reject != nil {
		t.Fatal(a.reject)
	}
	// Two live processes holding one certificate: the newcomer is
	// refused, so that they do not replace each other forever.
	b := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, heartbeat: true, instance: "two"})
	if b.reject == nil || b.reject.Code != protocol.CodeDuplicate {
		t.Fatalf("second live holder: %+v, want %s", b.reject, protocol.CodeDuplicate)
	}
	// Once the first stopped heartbeating, the holder takes it over.
	a.cancel()
	checkFor(t, defaultTestTimeout, func() error {
		c := ih.dialAgent(t, agentOpts{id: "n1", token: "-", clientCert: cert, heartbeat: true, instance: "three"})
		if c.reject != nil {
			return c.reject
		}
		return nil
	})
}

// TestRealAgentEnrollsRenewsAndRestarts runs the agent package against
// the coordinator: it enrolls with its join token, stores its
// certificate 0600, renews it on the live session (certificates of 3 s,
// renewed at 2 s) and, restarted without a token, connects with it.
func TestRealAgentEnrollsRenewsAndRestarts(t *testing.T) {
	ih := newIDHarness(t, false, func(c *coordinator.Config) { c.CertTTL = 3 * time.Second })
	dataDir := t.TempDir()
	run := func(token string) (stop func()) {
		cfg := agent.Config{
			NodeID:       "real-1",
			Coordinators: []string{ih.addr},
			Token:        token,
			TLS:          ih.clientTLS,
			DataDir:      dataDir,
			Capacity:     &protocol.Capacity{CPUs: 1},
			Backoff:      tunnel.Backoff{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond},
			Logger:       testLogger(t),
		}
		a, err := agent.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent Run: %v", err)
			}
		}
	}
	session := func() string {
		var id string
		checkFor(t, defaultTestTimeout, func() error {
			ns := ih.c.Nodes(protocol.Selector{})
			if len(ns) != 1 {
				return fmt.Errorf("%d nodes", len(ns))
			}
			id = ns[0].SessionID
			return nil
		})
		return id
	}
	stop := run(ih.token(t, 1, time.Hour, map[string]string{"pool": "gpu"}))
	first := session()
	// Three times: by the third, the session's first certificate has
	// expired and was dropped from the record, so the session must hold
	// the renewed one.
	checkFor(t, defaultTestTimeout, func() error {
		if got := ih.metric("tether_coordinator_enrollments_total", "result", "renewed"); got < 3 {
			return fmt.Errorf("renewed %v times", got)
		}
		return nil
	})
	if got := ih.metric("tether_coordinator_enrollments_total", "result", "renew_refused"); got != 0 {
		t.Errorf("renew_refused = %v", got)
	}
	if got := session(); got != first {
		t.Errorf("session %s after renewal, want %s kept", got, first)
	}
	idDir := filepath.Join(dataDir, agent.DefaultIdentityDirName)
	for _, f := range []string{tunnel.IdentityFile, tunnel.PinnedCAFile} {
		fi, err := os.Stat(filepath.Join(idDir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v, want 0600", f, err, fi.Mode().Perm())
		}
	}
	checkFor(t, defaultTestTimeout, func() error {
		id, err := tunnel.LoadIdentity(idDir)
		if err != nil {
			return err
		}
		return ih.store.CheckCert("real-1", tunnel.SerialHex(id.Cert))
	})
	if ns := ih.c.Nodes(protocol.Selector{}); len(ns) != 1 || ns[0].Labels["pool"] != "gpu" {
		t.Errorf("nodes %+v, want the token's label pool=gpu", ns)
	}
	stop()
	checkFor(t, defaultTestTimeout, func() error {
		if n := len(ih.c.Nodes(protocol.Selector{})); n != 0 {
			return fmt.Errorf("%d nodes", n)
		}
		return nil
	})
	// Restarted without a token (it was one-use anyway): the stored
	// certificate is its identity.
	stop = run("")
	if got := session(); got == first {
		t.Errorf("restarted agent has the old session %s", got)
	}
	if got := ih.metric("tether_coordinator_enrollments_total", "result", "ok"); got != 1 {
		t.Errorf("enrollments{ok} = %v, want 1 (the restart used the certificate)", got)
	}

	// Revoked, it is cut off and stays out; restarted with a token
	// created after the revocation, it enrolls again.
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if _, err := ih.store.Revoke(ctx, "real-1"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if ih.metric("tether_coordinator_auth_failures_total", "reason", "revoked") < 1 {
			return errors.New("the revoked agent has not been refused yet")
		}
		if n := len(ih.c.Nodes(protocol.Selector{})); n != 0 {
			return fmt.Errorf("%d nodes", n)
		}
		return nil
	})
	stop()
	ih.clock.advance(time.Second)
	stop = run(ih.token(t, 1, time.Hour, nil))
	defer stop()
	session()
	if got := ih.metric("tether_coordinator_enrollments_total", "result", "ok"); got != 2 {
		t.Errorf("enrollments{ok} = %v, want 2 (re-admitted)", got)
	}
}
