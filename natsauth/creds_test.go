package natsauth

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

func TestCredsFiles(t *testing.T) {
	l := testLayout(t, Config{})
	alice, err := l.MintClient("alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "alice.creds")
	if err := WriteCreds(path, alice); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("creds file mode %04o, want 0600", perm)
	}
	got, err := ReadCreds(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.JWT != alice.JWT || !bytes.Equal(got.Seed, alice.Seed) || got.PublicKey() != alice.PublicKey() || got.Name() != "alice" {
		t.Errorf("read back %+v", got)
	}
	if got.InboxPrefix() != "_INBOX_"+alice.PublicKey() {
		t.Errorf("inbox prefix %s", got.InboxPrefix())
	}
	uc, _ := jwt.DecodeUserClaims(got.JWT)
	if uc.Expires == 0 {
		t.Error("the ttl set no expiry")
	}
	// Rewriting replaces the file atomically and leaves no temporary.
	if err := WriteCreds(path, alice); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("directory holds %d entries after a rewrite", len(entries))
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ReadCreds(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "mode 0644") {
		t.Errorf("group-readable creds: %v", err)
	}
	if _, err := ReadCreds(filepath.Join(t.TempDir(), "none.creds")); err == nil {
		t.Error("missing file accepted")
	}
}

func TestParseCredsRefusesMismatch(t *testing.T) {
	l := testLayout(t, Config{})
	alice, bob := mintClient(t, l, "alice"), mintClient(t, l, "bob")
	mixed, err := jwt.FormatUserConfig(alice.JWT, alice.Seed)
	if err != nil {
		t.Fatal(err)
	}
	// bob's seed under alice's JWT.
	mixed = bytes.Replace(mixed, alice.Seed, bob.Seed, 1)
	if _, err := ParseCreds(mixed); err == nil || !strings.Contains(err.Error(), "issued to") {
		t.Errorf("mismatched seed: %v", err)
	}
	for name, data := range map[string][]byte{
		"empty":   nil,
		"garbage": []byte("hello"),
		"jwt only": func() []byte {
			b, _ := jwt.DecorateJWT(alice.JWT)
			return b
		}(),
	} {
		if _, err := ParseCreds(data); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	good, err := alice.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := ParseCreds(good); err != nil || c.PublicKey() != alice.PublicKey() {
		t.Errorf("round trip: %v", err)
	}
}

// TestReadCredsFileError: ReadCreds's errors are *FileError naming the
// file once, with a reason free of Go's operation ("open PATH: ..."), and
// a missing file still matches fs.ErrNotExist.
func TestReadCredsFileError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.creds")
	_, err := ReadCreds(missing)
	var fe *FileError
	if !errors.As(err, &fe) || fe.Path != missing || fe.What != "creds file" || fe.Err.Error() != "no such file or directory" || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %#v", err)
	}
	if got, want := err.Error(), "natsauth: creds file "+missing+": no such file or directory"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	junk := filepath.Join(t.TempDir(), "junk.creds")
	if err := os.WriteFile(junk, []byte("junk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = ReadCreds(junk)
	if !errors.As(err, &fe) || !strings.HasPrefix(fe.Err.Error(), "not NATS user credentials: ") || strings.Count(err.Error(), "natsauth") != 1 {
		t.Errorf("junk file: %v", err)
	}
}

// TestParseCredsLeavesSignatureToServer: reading a .creds file checks the
// seed against the JWT's subject but not the JWT's signature (an ed25519
// verification, whose first use in a process costs about 0.5 ms; issue
// 12): a file whose signature was damaged still parses, and the NATS
// server, which verifies every JWT at connect, refuses it. A JWT that is
// not a user's is still refused when read.
func TestParseCredsLeavesSignatureToServer(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	alice := mintClient(t, l, "alice")
	parts := strings.Split(alice.JWT, ".")
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		t.Fatal(err)
	}
	sig[0] ^= 0xff
	parts[2] = base64.RawURLEncoding.EncodeToString(sig)
	damaged := strings.Join(parts, ".")
	if _, err := jwt.DecodeUserClaims(damaged); err == nil {
		t.Fatal("the damaged JWT still verifies: the test damages nothing")
	}
	// jwt.FormatUserConfig would verify the JWT: swap it into a good file.
	good, err := alice.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	file := bytes.Replace(good, []byte(alice.JWT), []byte(damaged), 1)
	c, err := ParseCreds(file)
	if err != nil {
		t.Fatalf("ParseCreds of a damaged signature: %v (the server's check, not the reader's)", err)
	}
	if c.PublicKey() != alice.PublicKey() || c.Name() != "alice" {
		t.Errorf("parsed user %s %q, want %s \"alice\"", c.PublicKey(), c.Name(), alice.PublicKey())
	}
	if nc, _, err := dial(s, c); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("connect with the damaged JWT: got %v, want %v", err, nats.ErrAuthorization)
	}
	if nc, _, err := dial(s, alice); err != nil {
		t.Errorf("connect with the intact JWT: %v", err)
	} else {
		nc.Close()
	}

	// An account JWT with a user's seed is no user's credentials.
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	tok, err := jwt.NewAccountClaims(apub).Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newCreds(tok, alice.Seed); err == nil {
		t.Error("an account JWT read as user credentials")
	}
}
