package sshkey

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "key")
	s1, err := LoadOrCreate(path, "c")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", st, err)
	}
	s2, err := LoadOrCreate(path, "c")
	if err != nil || !bytes.Equal(s1.PublicKey().Marshal(), s2.PublicKey().Marshal()) {
		t.Fatalf("reloaded a different key (%v)", err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
	// Corrupt, too open, or of another type: an error naming the file,
	// and the file left as it was.
	corrupt := filepath.Join(dir, "corrupt")
	os.WriteFile(corrupt, []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"), 0o600)
	if _, err := LoadOrCreate(corrupt, "c"); err == nil || !strings.Contains(err.Error(), corrupt) || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("corrupt key: %v", err)
	}
	if data, _ := os.ReadFile(corrupt); !bytes.Contains(data, []byte("AAAA")) {
		t.Error("the corrupt file was overwritten")
	}
	open := filepath.Join(dir, "open")
	data, _ := os.ReadFile(path)
	os.WriteFile(open, data, 0o644)
	os.Chmod(open, 0o644)
	if _, err := LoadOrCreate(open, "c"); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("group-readable key: %v", err)
	}
}

// Two processes (here goroutines) creating one key file at once end with
// one key: the file appears whole by a link, and the loser reads it.
func TestLoadOrCreateRacers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ssh_host_ed25519_key")
	keys := make([]ssh.Signer, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := LoadOrCreate(path, "racer")
			if err != nil {
				t.Error(err)
				return
			}
			keys[i] = k
		}()
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if k != nil && keys[0] != nil && !bytes.Equal(k.PublicKey().Marshal(), keys[0].PublicKey().Marshal()) {
			t.Fatal("racing creators got different keys")
		}
	}
	if k := keys[0]; k != nil && k.PublicKey().Type() != ssh.KeyAlgoED25519 {
		t.Errorf("key type %s, want ed25519", k.PublicKey().Type())
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want the key only", len(entries))
	}
}
