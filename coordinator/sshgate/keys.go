package sshgate

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/internal/filetype"
)

// Bounds of the key files, so that a wrong path (a log, /dev/zero) fails
// clearly instead of filling memory.
const (
	maxKeysFileSize = 4 << 20 // bytes
	maxKeysPerFile  = 100_000
)

// keyEntry is one trusted key of a key file: where it was written, for
// logs.
type keyEntry struct {
	key     ssh.PublicKey
	comment string
	where   string // FILE:LINE
}

// keySet is the keys the gate trusts, indexed by their wire form. It is
// immutable once built; Reload swaps in a new one.
type keySet struct {
	users map[string]keyEntry // authorized plain keys
	cas   map[string]keyEntry // user certificate authorities
}

// Authorized-keys options. The gate refuses every option of an
// authorized_keys line: it cannot honour from=, command=, restrict,
// no-port-forwarding and the like (it runs no commands and its only
// service is port forwarding to nodes), and silently ignoring one would
// give the key more than its line says. What a key may do is the policy's
// to say. In a CA file the one option allowed is cert-authority, so that
// the same line can be shared with an authorized_keys file.
const optCertAuthority = "cert-authority"

// parseKeyFile parses an authorized_keys-format file (one key a line, as
// ssh.ParseAuthorizedKey reads them; blank lines and # comments skipped).
// With ca set the lines are user CA keys: cert-authority is the one option
// allowed, and a certificate is refused (a CA is a plain key). Every
// problem is reported, each as "NAME:LINE: what", joined; then the keys
// returned are nil. A file with no key at all (empty, or comments only)
// is no error: it is how an operator revokes every key of the file at a
// reload (refusing it kept the old keys, and their live connections, in
// force); the gate warns when no key and no CA is left (warnIfLocked).
func parseKeyFile(name string, data []byte, ca bool) (map[string]keyEntry, error) {
	if len(data) > maxKeysFileSize {
		// data is cut at maxKeysFileSize+1 by readKeyFile: its length is
		// not the file's size.
		return nil, fmt.Errorf("%s: over %d bytes (%d MiB): not a key file", name, maxKeysFileSize, maxKeysFileSize>>20)
	}
	what := "authorized key"
	if ca {
		what = "user CA key"
	}
	keys := map[string]keyEntry{}
	var errs []error
	for n, line := 0, []byte(nil); len(data) > 0; {
		n++
		line, data, _ = bytes.Cut(data, []byte{'\n'})
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, n)
		if len(keys) >= maxKeysPerFile {
			errs = append(errs, fmt.Errorf("%s: over %d keys", where, maxKeysPerFile))
			break
		}
		key, comment, options, rest, err := ssh.ParseAuthorizedKey(line)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: not an %s line (%v)", where, what, err))
			continue
		}
		if len(bytes.TrimSpace(rest)) != 0 {
			errs = append(errs, fmt.Errorf("%s: text after the key line", where))
			continue
		}
		var bad []string
		for _, o := range options {
			if ca && o == optCertAuthority {
				continue
			}
			bad = append(bad, clipString(o, 40))
		}
		if len(bad) != 0 {
			hint := "the gate honours no authorized_keys option; the policy says what a key may do"
			if ca {
				hint = "a CA line may have the cert-authority option only"
			}
			errs = append(errs, fmt.Errorf("%s: option %s refused: %s", where, strings.Join(bad, ","), hint))
			continue
		}
		if _, isCert := key.(*ssh.Certificate); isCert {
			if ca {
				errs = append(errs, fmt.Errorf("%s: a certificate cannot be a user CA (certificates signed by certificates are refused); give the CA's plain public key", where))
			} else {
				errs = append(errs, fmt.Errorf("%s: a certificate in an authorized keys file; list the plain key, or trust its CA with a user CA file", where))
			}
			continue
		}
		wire := string(key.Marshal())
		if _, dup := keys[wire]; dup {
			continue // a repeated key is harmless; the first line names it
		}
		keys[wire] = keyEntry{key: key, comment: comment, where: where}
	}
	if len(errs) != 0 {
		return nil, errors.Join(errs...)
	}
	return keys, nil
}

// readKeyFile reads and parses a key file (see parseKeyFile).
func readKeyFile(path string, ca bool) (map[string]keyEntry, error) {
	// O_NONBLOCK: a FIFO in the file's place opens at once and is refused
	// below, instead of blocking the reload (and with it every later
	// SIGHUP and the shutdown) until a writer comes.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		what := "authorized keys file"
		if ca {
			what = "user CA file"
		}
		return nil, fmt.Errorf("ssh gate: %s %s does not exist (deleted or renamed?)", what, path)
	}
	if err != nil {
		return nil, fmt.Errorf("ssh gate: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("ssh gate: %w", err)
	}
	if err := checkKeyFileMode(path, fi, uint32(os.Geteuid())); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeysFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("ssh gate: reading %s: %w", path, err)
	}
	return parseKeyFile(path, data, ca)
}

// checkKeyFileMode refuses a key file that is not regular, owned by
// neither root nor euid, or writable by its group or others: whoever can
// write it can let themselves in (OpenSSH's StrictModes, and the policy
// file's rule).
func checkKeyFileMode(path string, fi os.FileInfo, euid uint32) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("ssh gate: %s is not a regular file (%s)", path, filetype.Of(fi.Mode()))
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("ssh gate: %s: cannot tell its owner", path)
	}
	if st.Uid != 0 && st.Uid != euid {
		return fmt.Errorf("ssh gate: %s is owned by uid %d: it must be owned by root or by the uid this runs as (%d), or its owner could let any key in; chown it", path, st.Uid, euid)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("ssh gate: %s is writable by its group or others (mode %04o): whoever can write it can let any key in; chmod go-w it", path, perm)
	}
	return nil
}

// loadKeySet reads the authorized keys file (may be empty: none) and the
// user CA files.
func loadKeySet(authorizedKeys string, userCAs []string) (*keySet, error) {
	ks := &keySet{users: map[string]keyEntry{}, cas: map[string]keyEntry{}}
	var errs []error
	if authorizedKeys != "" {
		keys, err := readKeyFile(authorizedKeys, false)
		if err != nil {
			errs = append(errs, err)
		}
		ks.users = keys
	}
	for _, path := range userCAs {
		keys, err := readKeyFile(path, true)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for w, e := range keys {
			if _, dup := ks.cas[w]; !dup {
				ks.cas[w] = e
			}
		}
	}
	if len(errs) != 0 {
		return nil, errors.Join(errs...)
	}
	if ks.users == nil {
		ks.users = map[string]keyEntry{}
	}
	return ks, nil
}

// clipString returns s, cut to n bytes with an ellipsis, quoted.
func clipString(s string, n int) string {
	if len(s) > n {
		s = s[:n] + "…"
	}
	return fmt.Sprintf("%q", s)
}
