package natsauth

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// stamp builds the header the server stamps on a request crossing the
// import (inside TETHER, only the server writes it).
func stamp(acc, user, token, issuer string) nats.Header {
	b, _ := json.Marshal(server.ClientInfo{Account: acc, User: user, Jwt: token, IssuerKey: issuer, Name: "client-chosen connection name"})
	return nats.Header{server.ClientInfoHdr: {string(b)}}
}

// rawUser signs a user JWT with signer, letting edit adjust the claims.
func rawUser(tb testing.TB, signer nkeys.KeyPair, issuerAccount string, edit func(*jwt.UserClaims)) (token, pub string) {
	tb.Helper()
	ukp, _ := nkeys.CreateUser()
	pub, _ = ukp.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.IssuerAccount = issuerAccount
	uc.SetScoped(true)
	uc.Name = "someone"
	if edit != nil {
		edit(uc)
	}
	token, err := uc.Encode(signer)
	if err != nil {
		tb.Fatal(err)
	}
	return token, pub
}

func TestIdentify(t *testing.T) {
	l := testLayout(t, Config{})
	clients := l.AccountKey(AccountClients)
	signerKey := mustPublic(l.clientSigner)
	v, err := NewVerifier(l.OperatorJWT(), l.AccountJWT(AccountClients))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	v.now = func() time.Time { return now }

	scoped := func(edit func(*jwt.UserClaims)) nats.Header {
		tok, pub := rawUser(t, l.clientSigner, clients, edit)
		return stamp(clients, pub, tok, signerKey)
	}
	okTok, okPub := rawUser(t, l.clientSigner, clients, func(uc *jwt.UserClaims) { uc.Name = "alice" })

	t.Run("valid", func(t *testing.T) {
		id, err := v.Identify(stamp(clients, okPub, okTok, signerKey))
		if err != nil {
			t.Fatal(err)
		}
		if id != (Identity{Kind: KindNATS, Name: "alice", Key: okPub, Account: AccountClients}) {
			t.Fatalf("identity %+v", id)
		}
		// The second time comes from the cache, with the same answer.
		if id2, err := v.Identify(stamp(clients, okPub, okTok, signerKey)); err != nil || id2 != id {
			t.Fatalf("cached: %+v, %v", id2, err)
		}
	})
	t.Run("named by its key", func(t *testing.T) {
		h := scoped(func(uc *jwt.UserClaims) { uc.Name = uc.Subject })
		id, err := v.Identify(h)
		if err != nil || id.Name != "" || id.String() != "nats:"+id.Key {
			t.Fatalf("%+v (%s), %v", id, id.String(), err)
		}
	})

	identityKey := l.accounts[AccountClients]
	wrongScopeKP, _ := nkeys.CreateAccount()
	expired := func(uc *jwt.UserClaims) { uc.Expires = now.Add(-time.Second).Unix() }
	tampered := func() nats.Header {
		parts := strings.Split(okTok, ".")
		payload := parts[1]
		// Flip one character of the payload: the signature no longer fits.
		c := byte('A')
		if payload[10] == 'A' {
			c = 'B'
		}
		parts[1] = payload[:10] + string(c) + payload[11:]
		return stamp(clients, okPub, strings.Join(parts, "."), signerKey)
	}

	cases := []struct {
		name string
		h    nats.Header
		want error
		msg  string
	}{
		{"no header", nats.Header{}, ErrNoRequestInfo, "did not cross the import"},
		{"other spelling only", nats.Header{"nats-request-info": stamp(clients, okPub, okTok, signerKey)[server.ClientInfoHdr]}, ErrNoRequestInfo, ""},
		{"two headers", nats.Header{server.ClientInfoHdr: {stamp(clients, okPub, okTok, signerKey)[server.ClientInfoHdr][0], "{}"}}, ErrUntrusted, "2 Nats-Request-Info"},
		{"not JSON", nats.Header{server.ClientInfoHdr: {"alice"}}, ErrUntrusted, "Nats-Request-Info header"},
		{"no user (share false)", nats.Header{server.ClientInfoHdr: {`{"acc":"` + clients + `","rtt":1}`}}, ErrUntrusted, "share: true"},
		{"coordinator account", stamp(l.AccountKey(AccountTether), okPub, okTok, signerKey), ErrUntrusted, "not a client account"},
		{"no JWT", stamp(clients, okPub, "", signerKey), ErrUntrusted, "carries no user JWT"},
		{"tampered JWT", tampered(), ErrUntrusted, "its JWT"},
		{"JWT of another user", stamp(clients, mustPublicUser(t), okTok, signerKey), ErrUntrusted, "the server authenticated"},
		{"issuer key mismatch", stamp(clients, okPub, okTok, clients), ErrUntrusted, "not by a client signing key"},
		{"signed by the account key", func() nats.Header {
			tok, pub := rawUser(t, identityKey, "", func(uc *jwt.UserClaims) { uc.SetScoped(false) })
			return stamp(clients, pub, tok, clients)
		}(), ErrUntrusted, "not issued by a client signing key"},
		{"signed by an unknown signing key", func() nats.Header {
			tok, pub := rawUser(t, wrongScopeKP, clients, nil)
			return stamp(clients, pub, tok, mustPublic(wrongScopeKP))
		}(), ErrUntrusted, "not by a client signing key"},
		{"own permissions", scoped(func(uc *jwt.UserClaims) { uc.Sub.Allow.Add(">") }), ErrUntrusted, "permissions of its own"},
		{"bearer", scoped(func(uc *jwt.UserClaims) { uc.BearerToken = true }), ErrUntrusted, ""},
		{"expired", scoped(expired), ErrExpired, "expired at"},
		{"not yet valid", scoped(func(uc *jwt.UserClaims) { uc.NotBefore = now.Add(time.Hour).Unix() }), ErrExpired, "not valid before"},
		{"name shaped like a key", scoped(func(uc *jwt.UserClaims) { uc.Name = okPub }), ErrUntrusted, "shape of a user public key"},
		{"name with a newline", scoped(func(uc *jwt.UserClaims) { uc.Name = "alice\nadmin" }), ErrUntrusted, "letters, digits"},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			id, err := v.Identify(tt.h)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Identify = %+v, %v; want %v", id, err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not say %q", err, tt.msg)
			}
		})
	}

	t.Run("expires while its verdict is kept", func(t *testing.T) {
		// The verdict on a header value is reused; the validity period is
		// still checked on every request.
		h := scoped(func(uc *jwt.UserClaims) { uc.Name = "carol"; uc.Expires = now.Add(time.Minute).Unix() })
		if _, err := v.Identify(h); err != nil {
			t.Fatal(err)
		}
		later := now.Add(2 * time.Minute)
		v.now = func() time.Time { return later }
		defer func() { v.now = func() time.Time { return now } }()
		if _, err := v.Identify(h); !errors.Is(err, ErrExpired) {
			t.Fatalf("after its expiry: %v, want %v", err, ErrExpired)
		}
	})
	t.Run("refusal kept", func(t *testing.T) {
		h := scoped(func(uc *jwt.UserClaims) { uc.BearerToken = true })
		for i := range 2 {
			if _, err := v.Identify(h); !errors.Is(err, ErrUntrusted) {
				t.Fatalf("request %d: %v, want %v", i, err, ErrUntrusted)
			}
		}
	})
	t.Run("revoked", func(t *testing.T) {
		h := stamp(clients, okPub, okTok, signerKey)
		if err := l.Revoke(okPub); err != nil {
			t.Fatal(err)
		}
		// v is a separate verifier: it still trusts the old account JWT.
		if _, err := v.Identify(h); err != nil {
			t.Fatalf("old account JWT: %v", err)
		}
		if err := v.SetAccounts(l.AccountJWT(AccountClients)); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Identify(h); !errors.Is(err, ErrRevoked) || !strings.Contains(err.Error(), okPub) {
			t.Fatalf("after SetAccounts: %v, want %v naming the user", err, ErrRevoked)
		}
	})
}

func mustPublicUser(tb testing.TB) string {
	kp, _ := nkeys.CreateUser()
	return mustPublic(kp)
}

func TestNewVerifierRefusesUntrustedAccounts(t *testing.T) {
	l := testLayout(t, Config{})
	other := testLayout(t, Config{})
	if _, err := NewVerifier(l.OperatorJWT(), other.AccountJWT(AccountClients)); err == nil || !strings.Contains(err.Error(), "not by operator") {
		t.Errorf("another operator's account: %v", err)
	}
	if _, err := NewVerifier(l.OperatorJWT(), l.AccountJWT(AccountTether)); err == nil || !strings.Contains(err.Error(), "no scoped signing key with client permissions") {
		t.Errorf("an account without a client signing key: %v", err)
	}
	if _, err := NewVerifier(l.OperatorJWT()); err == nil {
		t.Error("no accounts: accepted")
	}
	if _, err := NewVerifier("junk", l.AccountJWT(AccountClients)); err == nil {
		t.Error("junk operator JWT: accepted")
	}

	// A client account whose scoped key grants more than a client's.
	broad := func(edit func(*jwt.UserScope)) string {
		sk, _ := nkeys.CreateAccount()
		ac := jwt.NewAccountClaims(l.AccountKey(AccountClients))
		sc := clientScope(mustPublic(sk))
		edit(sc)
		ac.SigningKeys.AddScopedSigner(sc)
		s, err := ac.Encode(l.operator)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for name, edit := range map[string]func(*jwt.UserScope){
		"publish anywhere":      func(s *jwt.UserScope) { s.Template.Pub.Allow = nil },
		"publish to _INBOX.>":   func(s *jwt.UserScope) { s.Template.Pub.Allow.Add("_INBOX.>") },
		"publish to tether.v1.": func(s *jwt.UserScope) { s.Template.Pub.Allow = jwt.StringList{"tether.v1."} },
		"subscribe anywhere":    func(s *jwt.UserScope) { s.Template.Sub.Allow = nil },
		"subscribe to >":        func(s *jwt.UserScope) { s.Template.Sub.Allow.Add(">") },
		"subscribe by name":     func(s *jwt.UserScope) { s.Template.Sub.Allow = jwt.StringList{"_INBOX_{{name()}}.>"} },
		"responses":             func(s *jwt.UserScope) { s.Template.Resp = &jwt.ResponsePermission{MaxMsgs: 1} },
		"bearer":                func(s *jwt.UserScope) { s.Template.BearerToken = true },
	} {
		if _, err := NewVerifier(l.OperatorJWT(), broad(edit)); err == nil || !strings.Contains(err.Error(), "its template") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Narrower templates pass.
	narrow := broad(func(s *jwt.UserScope) {
		s.Template.Pub.Allow = jwt.StringList{"tether.v1.exec", "tether.v1.job.*"}
		s.Template.Sub.Deny.Add(">")
	})
	if _, err := NewVerifier(l.OperatorJWT(), narrow); err != nil {
		t.Errorf("a narrower template: %v", err)
	}
}

func TestRequestUser(t *testing.T) {
	acc, user, err := RequestUser(stamp("ACC", "UUSER", "", ""))
	if err != nil || acc != "ACC" || user != "UUSER" {
		t.Fatalf("%s %s %v", acc, user, err)
	}
	if _, _, err := RequestUser(nats.Header{}); !errors.Is(err, ErrNoRequestInfo) {
		t.Fatalf("no header: %v", err)
	}
}
