// Package sshkey keeps the SSH private keys Tether's SSH servers sign
// with (the agent's host key, the jump host's host key, the host CA): one
// ed25519 key per file, created once, never silently replaced.
package sshkey

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"
)

// maxKeyFileSize bounds a private key file read, in bytes (an OpenSSH
// ed25519 key is about 400).
const maxKeyFileSize = 64 << 10

// LoadOrCreate returns the ed25519 private key in path (OpenSSH
// "OPENSSH PRIVATE KEY" PEM, unencrypted, as ssh-keygen -t ed25519 -N ”
// writes it), creating it with mode 0600 when the file does not exist. The
// directory is created 0700 when missing. A file that exists but is not an
// unencrypted ed25519 key, or that group or others may read or write
// (sshd's "UNPROTECTED PRIVATE KEY FILE"), is an error naming it; it is
// never overwritten: a server's key is its identity, and a new one would
// make every client see a changed key (move the file away to have one
// made). Two processes creating the same file at once end up
// with one key: the file appears whole, by a hard link from a temporary
// file, or not at all.
func LoadOrCreate(path, comment string) (ssh.Signer, error) {
	signer, err := loadKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return signer, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ssh key %s: creating its directory: %w", path, err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ssh key %s: generating an ed25519 key: %w", path, err)
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, fmt.Errorf("ssh key %s: encoding the new key: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("ssh key %s: creating a temporary file: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("ssh key %s: %w", path, err)
	}
	if _, err := tmp.Write(pem.EncodeToMemory(block)); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("ssh key %s: writing %s: %w", path, tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("ssh key %s: syncing %s: %w", path, tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("ssh key %s: closing %s: %w", path, tmp.Name(), err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("ssh key %s: %w", path, err)
	}
	// Whoever linked first won: load what is there now.
	return loadKey(path)
}

// loadKey reads an unencrypted ed25519 OpenSSH private key from path. The
// error wraps fs.ErrNotExist when the file does not exist.
func loadKey(path string) (ssh.Signer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ssh key %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("ssh key %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("ssh key %s: not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("ssh key %s: mode %04o lets group or others at the private key: chmod 600 it", path, perm)
	}
	if st.Size() > maxKeyFileSize {
		return nil, fmt.Errorf("ssh key %s: %d bytes, over %d: not an ed25519 private key", path, st.Size(), maxKeyFileSize)
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, fmt.Errorf("ssh key %s: reading: %w", path, err)
	}
	raw, err := ssh.ParseRawPrivateKey(data)
	if err != nil {
		var pp *ssh.PassphraseMissingError
		if errors.As(err, &pp) {
			return nil, fmt.Errorf("ssh key %s: encrypted with a passphrase; Tether needs an unencrypted key", path)
		}
		return nil, fmt.Errorf("ssh key %s: corrupt or not an OpenSSH private key: %w (move it away to have a new key created, which every client will see as a changed key)", path, err)
	}
	var priv ed25519.PrivateKey
	switch k := raw.(type) {
	case *ed25519.PrivateKey:
		priv = *k
	case ed25519.PrivateKey:
		priv = k
	default:
		return nil, fmt.Errorf("ssh key %s: a %T, want an ed25519 key", path, raw)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("ssh key %s: %w", path, err)
	}
	return signer, nil
}
