//go:build !tetherclient

package natsauth

// The methods that configure a nats-server, in their own file: the
// client-only build of tether (-tags tetherclient) leaves them, and with
// them nats-server's code and package initialisation, out (issue 12).

import (
	"fmt"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// ConfigureServer sets the authentication of an embedded nats-server's
// options to this layout: the trusted operator, a memory account resolver
// preloaded with the three account JWTs, and the system account. Every
// connection must then present a user JWT of one of the accounts (and sign
// the server's nonce with its seed): anonymous clients are refused. The
// caller keeps the listen address, JetStream (which TETHER may use) and TLS.
// Options that conflict with operator mode (Users, Nkeys, Accounts,
// NoAuthUser, a username, password or token, TrustedKeys or other
// operators) are refused with an error naming them.
func (l *Layout) ConfigureServer(o *server.Options) error {
	var bad []string
	if len(o.Users) > 0 {
		bad = append(bad, "Users")
	}
	if len(o.Nkeys) > 0 {
		bad = append(bad, "Nkeys")
	}
	if len(o.Accounts) > 0 {
		bad = append(bad, "Accounts")
	}
	if o.NoAuthUser != "" {
		bad = append(bad, "NoAuthUser")
	}
	if o.Username != "" || o.Password != "" || o.Authorization != "" {
		bad = append(bad, "Username/Password/Authorization")
	}
	if len(o.TrustedKeys) > 0 || len(o.TrustedOperators) > 0 {
		bad = append(bad, "TrustedKeys/TrustedOperators")
	}
	if o.AccountResolver != nil {
		bad = append(bad, "AccountResolver")
	}
	if o.SystemAccount != "" && o.SystemAccount != l.keys[AccountSYS] {
		bad = append(bad, "SystemAccount")
	}
	if len(bad) > 0 {
		return fmt.Errorf("natsauth: server options already set %s; operator mode configures authentication alone", strings.Join(bad, ", "))
	}
	r := &server.MemAccResolver{}
	l.mu.Lock()
	for _, name := range accountNames {
		if err := r.Store(l.keys[name], l.accountJWTs[name]); err != nil {
			l.mu.Unlock()
			return fmt.Errorf("natsauth: preload account %s: %w", name, err)
		}
	}
	l.mu.Unlock()
	o.TrustedOperators = []*jwt.OperatorClaims{l.opClaims}
	o.AccountResolver = r
	o.SystemAccount = l.keys[AccountSYS]
	return nil
}

// UpdateServer pushes the current CLIENTS account JWT (after Revoke) to a
// running server configured by ConfigureServer: the server disconnects the
// users it revokes and refuses their new connections.
func (l *Layout) UpdateServer(s *server.Server) error {
	key := l.keys[AccountClients]
	ajwt := l.AccountJWT(AccountClients)
	r := s.AccountResolver()
	if r == nil {
		return fmt.Errorf("natsauth: update server: it has no account resolver (not configured by ConfigureServer)")
	}
	if err := r.Store(key, ajwt); err != nil {
		return fmt.Errorf("natsauth: update server: store account %s: %w", AccountClients, err)
	}
	acc, err := s.LookupAccount(key)
	if err != nil {
		return fmt.Errorf("natsauth: update server: account %s: %w", AccountClients, err)
	}
	ac, err := jwt.DecodeAccountClaims(ajwt)
	if err != nil {
		return fmt.Errorf("natsauth: update server: %w", err)
	}
	s.UpdateAccountClaims(acc, ac)
	return nil
}
