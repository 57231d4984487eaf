package natsauth

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
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
