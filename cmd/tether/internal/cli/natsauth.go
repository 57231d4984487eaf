//go:build !tetherclient

package cli

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/protocol"
)

// natsAuthDir is where a coordinator keeps its NATS layout (natsauth.Load):
// the operator and account seeds, 0700, every file 0600.
func natsAuthDir(dataDir string) string { return filepath.Join(dataDir, "nats-auth") }

// natsUserName turns s into a name natsauth accepts for a user (letters,
// digits and "._@+-", starting with a letter or digit, at most 128
// bytes): every other byte becomes '-', and a name that does not start
// with a letter or digit gets "u" in front. "" becomes "user".
func natsUserName(s string) string {
	b := []byte(s)
	for i, c := range b {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && !strings.ContainsRune("._@+-", rune(c)) {
			b[i] = '-'
		}
	}
	out := string(b)
	if out == "" {
		return "user"
	}
	if c := out[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
		out = "u" + out
	}
	if len(out) > 128 {
		out = out[:128]
	}
	return out
}

// externalVerifier reads the operator JWT and CLIENTS account JWT of a
// layout built with nsc (files holding the raw JWT, as `nsc describe
// ... --raw` prints them).
func externalVerifier(operatorFile, clientsFile string) (*natsauth.Verifier, error) {
	op, err := os.ReadFile(operatorFile)
	if err != nil {
		return nil, fmt.Errorf("--nats-operator-jwt: %w", err)
	}
	acc, err := os.ReadFile(clientsFile)
	if err != nil {
		return nil, fmt.Errorf("--nats-clients-jwt: %w", err)
	}
	v, err := natsauth.NewVerifier(strings.TrimSpace(string(op)), strings.TrimSpace(string(acc)))
	if err != nil {
		return nil, fmt.Errorf("--nats-operator-jwt/--nats-clients-jwt: %w", err)
	}
	return v, nil
}

// errAnonymousNATS: the server lets a connection without credentials
// publish to the Tether API.
var errAnonymousNATS = errors.New("the NATS server lets anonymous clients publish to tether.v1.>")

// checkNoAnonymous connects to url without credentials and publishes one
// empty message to tether.v1.nodes. The server is safe when it refuses the
// connection (authorization violation) or the publish (permissions
// violation: the server reports it before it answers the flush's PING, so
// it is the connection's last error once the flush returns). Anything else
// is errAnonymousNATS, or the error that kept the check from finishing.
func checkNoAnonymous(url string) error {
	nc, err := nats.Connect(url, nats.Name("tether-coordinator anonymity check"), nats.NoReconnect(), nats.Timeout(5*time.Second))
	if err != nil {
		if errors.Is(err, nats.ErrAuthorization) || strings.Contains(strings.ToLower(err.Error()), "authorization") {
			return nil
		}
		return fmt.Errorf("check whether %s admits anonymous clients: %w", url, err)
	}
	defer nc.Close()
	if err := nc.Publish(protocol.SubjectNodes, nil); err != nil {
		return fmt.Errorf("check whether %s admits anonymous clients: %w", url, err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		return fmt.Errorf("check whether %s admits anonymous clients: %w", url, err)
	}
	if errors.Is(nc.LastError(), nats.ErrPermissionViolation) {
		return nil
	}
	return fmt.Errorf("%w (%s: a connection without credentials published to %s)", errAnonymousNATS, nc.ConnectedUrlRedacted(), protocol.SubjectNodes)
}

// devCreds is the client user `tether dev` runs its user's commands as.
type devCreds struct {
	path  string
	creds *natsauth.Creds
}

// devUserName is the name of the dev client user: the invoking OS user's
// name as natsauth accepts it (natsUserName).
func devUserName(getenv func(string) string) string {
	name := ""
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if name == "" {
		name = getenv("USER")
	}
	if name == "" {
		name = "dev"
	}
	return natsUserName(name)
}

// devCredsFile is where `tether dev` writes its user's credentials:
// devCredsPath, where client commands look last; DATA-DIR/dev.creds when
// there is no home directory.
func devCredsFile(o *devOptions, getenv func(string) string) string {
	if p := devCredsPath(getenv); p != "" {
		return p
	}
	return filepath.Join(o.DataDir, "dev.creds")
}

// writeDevCreds gives the dev user credentials at path: the ones already
// there when they are this layout's, for this user, and still valid
// (restarts do not pile up users), else freshly minted ones, written 0600
// (the directory 0700).
func writeDevCreds(l *natsauth.Layout, path string, name string) (devCreds, error) {
	if c, err := natsauth.ReadCreds(path); err == nil && c.Name() == name && validClientCreds(l, c) {
		return devCreds{path: path, creds: c}, nil
	}
	c, err := l.MintClient(name, 0)
	if err != nil {
		return devCreds{}, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return devCreds{}, fmt.Errorf("dev credentials: %w", err)
	}
	if err := natsauth.WriteCreds(path, c); err != nil {
		return devCreds{}, fmt.Errorf("dev credentials: %w", err)
	}
	return devCreds{path: path, creds: c}, nil
}

// othersDevCreds reports whether path holds client credentials of
// another layout than l that have not expired: another dev instance's,
// which may still be in use.
func othersDevCreds(l *natsauth.Layout, path string) bool {
	c, err := natsauth.ReadCreds(path)
	if err != nil || validClientCreds(l, c) {
		return false
	}
	uc, err := jwt.DecodeUserClaims(c.JWT)
	return err == nil && (uc.Expires == 0 || time.Now().Unix() < uc.Expires)
}

// validClientCreds reports whether c is a client user of l that l would
// let in now: issued by a signing key of l's CLIENTS account (the JWT's
// signature is checked by decoding it), not expired, not revoked.
func validClientCreds(l *natsauth.Layout, c *natsauth.Creds) bool {
	uc, err := jwt.DecodeUserClaims(c.JWT)
	if err != nil || uc.IssuerAccount != l.AccountKey(natsauth.AccountClients) {
		return false
	}
	ac, err := jwt.DecodeAccountClaims(l.AccountJWT(natsauth.AccountClients))
	if err != nil || !ac.SigningKeys.Contains(uc.Issuer) || ac.IsClaimRevoked(uc) {
		return false
	}
	return uc.Expires == 0 || time.Now().Unix() < uc.Expires
}

// checkNATSVersion refuses an external NATS server older than
// minNATSServer (its version as it announces it, "2.9.10"): it would accept
// the coordinator but refuse every client user its replies. A version that
// does not parse is let through (a build of the server's main branch).
func checkNATSVersion(v string) error {
	have, ok := parseVersion(v)
	if !ok {
		return nil
	}
	want, _ := parseVersion(minNATSServer)
	for i := range want {
		if have[i] != want[i] {
			if have[i] < want[i] {
				return fmt.Errorf("nats-server %s is older than %s, the oldest Tether works with: "+
					"its client users' permissions come from the CLIENTS account's signing-key template, "+
					"which servers before %s do not apply to them, so it would refuse every client its replies; upgrade the server",
					v, minNATSServer, minNATSServer)
			}
			return nil
		}
	}
	return nil
}

// parseVersion reads MAJOR.MINOR.PATCH from the start of v (a suffix such
// as -RC.1 or +build is ignored).
func parseVersion(v string) ([3]int, bool) {
	var out [3]int
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(v, "-+ "); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}
