package sshgate

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func authorizedLine(t testing.TB) string {
	return string(ssh.MarshalAuthorizedKey(newSigner(t).PublicKey()))
}

func TestParseKeyFile(t *testing.T) {
	k1, k2 := authorizedLine(t), authorizedLine(t)
	ca := newSigner(t)
	cert := certTemplate(newSigner(t).PublicKey(), "x")
	if err := cert.SignCert(randReader, ca); err != nil {
		t.Fatal(err)
	}
	certLine := string(ssh.MarshalAuthorizedKey(cert))

	keys, err := parseKeyFile("ak", []byte("# comment\n\n  "+k1+"\r\n"+k2+k1), false)
	if err != nil || len(keys) != 2 {
		t.Fatalf("two keys, one repeated: %d keys, %v", len(keys), err)
	}
	for _, tc := range []struct {
		name, data string
		ca         bool
		want       []string // substrings of the error; nil: no error
	}{
		{"option refused", k1 + `from="10.0.0.0/8" ` + k2, false, []string{"ak:2: option \"from=\\\"10.0.0.0/8\\\"\" refused"}},
		{"restrict refused", "restrict,no-pty " + k1, false, []string{"ak:1: option \"restrict\",\"no-pty\" refused"}},
		{"cert-authority in authorized keys", "cert-authority " + k1, false, []string{"ak:1: option \"cert-authority\" refused"}},
		{"cert-authority in a CA file", "cert-authority " + k1 + k2, true, nil},
		{"certificate as a key", certLine, false, []string{"ak:1: a certificate in an authorized keys file"}},
		{"certificate as a CA", certLine, true, []string{"ak:1: a certificate cannot be a user CA"}},
		{"garbage, every line reported", "ssh-ed25519 AAAA\n" + k1 + "nonsense\n", false, []string{"ak:1: not an authorized key line", "ak:3: not an authorized key line"}},
		{"empty: no keys, no error (a reload that revokes them all)", "# nothing\n", false, nil},
		{"empty CA file", "", true, nil},
		// The size named is the limit, never the length read (cut at the
		// limit): a 10 MB file was said to be 4194305 bytes.
		{"over the size limit", strings.Repeat("#", 10<<20), false, []string{"ak: over 4194304 bytes (4 MiB): not a key file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseKeyFile("ak", []byte(tc.data), tc.ca)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	if _, err := parseKeyFile("big", bytes.Repeat([]byte("#"), maxKeysFileSize+1), false); err == nil {
		t.Error("an oversized file was read")
	}
}

// TestReload: a key added to the file authenticates after Reload; a bad
// file leaves the keys in force; a removed key's connection, authenticated
// before, is closed (TestReloadClosesUntrustedConnections has the rest).
func TestReload(t *testing.T) {
	e := newEnv(t)
	akPath := filepath.Join(e.dir, "authorized_keys")
	if c, err := e.dial(e.mallory.signer); err == nil {
		c.Close()
		t.Fatal("mallory authenticated before being added")
	}
	alice, err := e.dial(e.alice.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	if err := os.WriteFile(akPath, []byte("bad line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.gate.Reload(); err == nil || !strings.Contains(err.Error(), akPath+":1:") {
		t.Fatalf("Reload of a bad file: %v", err)
	}
	if c, err := e.dial(e.alice.signer); err != nil {
		t.Fatalf("alice refused after a failed reload: %v", err)
	} else {
		c.Close()
	}
	if err := os.WriteFile(akPath, ssh.MarshalAuthorizedKey(e.mallory.signer.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.gate.Reload(); err != nil {
		t.Fatal(err)
	}
	if c, err := e.dial(e.mallory.signer); err != nil {
		t.Errorf("mallory refused after being added: %v", err)
	} else {
		c.Close()
	}
	waitClosed(t, "alice's connection", alice)
	if _, err := openDirect(alice, "node-a", 22); err == nil {
		t.Error("alice's connection opened a channel after her key was removed")
	}
}

func TestHostCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadHostCA(filepath.Join(dir, "ca"), 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	ca.now = func() time.Time { return now }
	hk := newSigner(t).PublicKey()
	w1, err := ca.Certify("node-a", hk.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.ParsePublicKey(w1)
	if err != nil {
		t.Fatal(err)
	}
	cert := k.(*ssh.Certificate)
	if cert.CertType != ssh.HostCert || !slices.Equal(cert.ValidPrincipals, []string{"node-a", "node-a.tether"}) || cert.KeyId != "tether-node:node-a" ||
		cert.ValidAfter != uint64(now.Add(-5*time.Minute).Unix()) || cert.ValidBefore != uint64(now.Add(7*24*time.Hour).Unix()) ||
		!bytes.Equal(cert.Key.Marshal(), hk.Marshal()) {
		t.Errorf("certificate %+v", cert)
	}
	checker := ssh.CertChecker{
		IsHostAuthority: func(auth ssh.PublicKey, _ string) bool { return bytes.Equal(auth.Marshal(), ca.PublicKey().Marshal()) },
		Clock:           func() time.Time { return now },
	}
	if err := checker.CheckCert("node-a.tether", cert); err != nil {
		t.Errorf("the certificate does not check: %v", err)
	}
	// OpenSSH checks the principals against the host name it lowercased:
	// a node id with capitals is named in lowercase too.
	wc, err := ca.Certify("GPU-07", newSigner(t).PublicKey().Marshal())
	if err != nil {
		t.Fatal(err)
	}
	kc, _ := ssh.ParsePublicKey(wc)
	if got := kc.(*ssh.Certificate).ValidPrincipals; !slices.Equal(got, []string{"GPU-07", "GPU-07.tether", "gpu-07", "gpu-07.tether"}) {
		t.Errorf("principals for GPU-07: %q", got)
	}
	// Reused until half its life, renewed after; a new key gets a new one.
	now = now.Add(3 * 24 * time.Hour)
	if w2, _ := ca.Certify("node-a", hk.Marshal()); !bytes.Equal(w1, w2) {
		t.Error("certificate not reused before its half-life")
	}
	now = now.Add(24 * time.Hour)
	if w3, _ := ca.Certify("node-a", hk.Marshal()); bytes.Equal(w1, w3) {
		t.Error("certificate not renewed past its half-life")
	}
	if w4, _ := ca.Certify("node-a", newSigner(t).PublicKey().Marshal()); bytes.Equal(w1, w4) {
		t.Error("a new host key got the old certificate")
	}
	// Bad input.
	if _, err := ca.Certify("../x", hk.Marshal()); err == nil {
		t.Error("invalid node id certified")
	}
	if _, err := ca.Certify("node-b", []byte("junk")); err == nil || !strings.Contains(err.Error(), "node-b") {
		t.Errorf("junk host key: %v", err)
	}
	if _, err := ca.Certify("node-b", w1); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a certificate as a host key: %v", err)
	}
	// The same file gives the same CA; the line has the documented shape.
	ca2, err := LoadHostCA(filepath.Join(dir, "ca"), time.Hour)
	if err != nil || !bytes.Equal(ca2.PublicKey().Marshal(), ca.PublicKey().Marshal()) {
		t.Fatalf("reloaded CA differs (%v)", err)
	}
	want := "@cert-authority *.tether " + authorizedKey(ca.PublicKey()) + " tether-host-ca"
	if got := ca.KnownHostsLine(); got != want {
		t.Errorf("KnownHostsLine = %q, want %q", got, want)
	}
	if got := ca.KnownHostsLineFor("node-a", "node-b"); !strings.HasPrefix(got, "@cert-authority node-a,node-b ssh-ed25519 ") {
		t.Errorf("KnownHostsLineFor = %q", got)
	}
	if _, err := LoadHostCA(filepath.Join(dir, "ca3"), time.Minute); err == nil {
		t.Error("a lifetime under the backdate was accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	err := (&Config{MaxConnections: -1}).Validate()
	for _, w := range []string{"StateDir", "AuthorizedKeysFile nor UserCAFiles", "Nodes", "Policy", "Auditor", "MaxConnections -1"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate: %v, want it to name %s", err, w)
		}
	}
}

// A key file that is a FIFO is refused at once (opening it blocked the
// reload, every later SIGHUP and the shutdown until a writer came), and so
// is one its group or others may write (they could let any key in).
func TestReadKeyFileRefusesFIFOsAndWritableFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "authorized_keys")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := readKeyFile(fifo, false); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file (a named pipe)") {
			t.Errorf("FIFO: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("reading a FIFO key file blocks")
	}
	open := filepath.Join(dir, "open_keys")
	if err := os.WriteFile(open, []byte(authorizedLine(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o666)
	if _, err := readKeyFile(open, false); err == nil || !strings.Contains(err.Error(), "writable by its group or others (mode 0666)") {
		t.Errorf("world-writable key file: %v", err)
	}
	os.Chmod(open, 0o644)
	if _, err := readKeyFile(open, false); err != nil {
		t.Errorf("0644 key file: %v", err)
	}
}

// TestReadKeysThenSet: ReadKeys changes nothing; SetKeys puts in force
// the keys ReadKeys read; a key file that is gone is named as such.
func TestReadKeysThenSet(t *testing.T) {
	e := newEnv(t)
	akPath := filepath.Join(e.dir, "authorized_keys")
	if err := os.WriteFile(akPath, ssh.MarshalAuthorizedKey(e.mallory.signer.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := e.gate.ReadKeys()
	if err != nil {
		t.Fatal(err)
	}
	if users, _ := k.Counts(); users != 1 {
		t.Fatalf("%d authorized keys read, want 1", users)
	}
	if c, err := e.dial(e.mallory.signer); err == nil {
		c.Close()
		t.Fatal("ReadKeys put the keys in force")
	}
	os.Remove(akPath)
	if _, err := e.gate.ReadKeys(); err == nil || !strings.Contains(err.Error(), "authorized keys file "+akPath+" does not exist") {
		t.Fatalf("ReadKeys without the file: %v", err)
	}
	e.gate.SetKeys(k)
	if c, err := e.dial(e.mallory.signer); err != nil {
		t.Fatalf("mallory refused after SetKeys: %v", err)
	} else {
		c.Close()
	}
}
