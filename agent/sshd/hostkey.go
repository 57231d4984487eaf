package sshd

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

// LoadOrCreateHostKey returns the ed25519 host key stored at path (an
// OpenSSH private key file, unencrypted, as ssh-keygen -t ed25519 writes
// it), creating it on the first call: a new random key written 0600 to a
// temporary file in path's directory and renamed into place, so that a
// crash never leaves half a key. The directory must exist.
//
// A file that exists but cannot be read, does not parse, holds no ed25519
// key, or is readable by group or others is an error naming path: the host
// key is the node's SSH identity, and silently replacing it would make
// every client see a changed host key.
func LoadOrCreateHostKey(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		return parseHostKey(path, b)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("ssh host key %s: %w", path, err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ssh host key %s: generate: %w", path, err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, "tether agent host key")
	if err != nil {
		return nil, fmt.Errorf("ssh host key %s: encode: %w", path, err)
	}
	data := pem.EncodeToMemory(blk)
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("ssh host key %s: create: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after the rename: a no-op
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("ssh host key %s: chmod: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("ssh host key %s: write: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("ssh host key %s: sync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("ssh host key %s: write: %w", path, err)
	}
	// Link, not rename: two agents starting at once on one data dir keep
	// the first key written, and the second reads it.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			b, err := os.ReadFile(path)
			if err != nil {
				return nil, fmt.Errorf("ssh host key %s: %w", path, err)
			}
			return parseHostKey(path, b)
		}
		return nil, fmt.Errorf("ssh host key %s: install: %w", path, err)
	}
	return ssh.NewSignerFromKey(priv)
}

// parseHostKey parses the host key file path holding b.
func parseHostKey(path string, b []byte) (ssh.Signer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("ssh host key %s: %w", path, err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("ssh host key %s: mode %04o: readable or writable by group or others; want 0600 (chmod 600 %s)",
			path, fi.Mode().Perm(), path)
	}
	raw, err := ssh.ParseRawPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("ssh host key %s: corrupt: %w (move it away to have a new key created, which every client will see as a changed host key)", path, err)
	}
	priv, ok := raw.(*ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("ssh host key %s: holds a %T, want an ed25519 key", path, raw)
	}
	return ssh.NewSignerFromKey(*priv)
}
