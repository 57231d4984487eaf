package natsauth

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tetherfleet/tether/internal/filetype"

	"github.com/nats-io/nkeys"
)

// maxSecretFile bounds what ReadCreds and the seed loader read, in bytes: a
// .creds file is about 1 KiB, a seed 58 bytes.
const maxSecretFile = 64 << 10

// FileError is a file of secrets (a .creds or seed file) that could not be
// read or used. Error is "natsauth: WHAT PATH: ERR"; a caller that knows
// where the path came from (a flag, a variable) can say so and print What,
// Path and Err in its own words. Unwrap is Err, so errors.Is(err,
// fs.ErrNotExist) holds for a missing file.
type FileError struct {
	// What the file is: "creds file" or "seed file".
	What string
	// Path is the file as given.
	Path string
	// Err is what is wrong with it, in words that name neither the file
	// nor Go's operation: "no such file or directory", "not a regular
	// file (a directory)", "mode 0644 lets the group or others access
	// it; ...", "not a NATS credentials file: no nkey seed found".
	Err error
}

func (e *FileError) Error() string {
	return "natsauth: " + e.What + " " + e.Path + ": " + e.Err.Error()
}
func (e *FileError) Unwrap() error { return e.Err }

// readSecret reads a file that holds a secret (a seed or .creds). It
// refuses anything but a regular file and any mode that gives the group or
// others access, the way ssh treats private keys: a secret others can read
// is already leaked, and one they can write may have been replaced. Errors
// are *FileError.
func readSecret(path, what string) ([]byte, error) {
	fail := func(err error) error { return &FileError{What: what, Path: path, Err: err} }
	f, err := os.Open(path)
	if err != nil {
		return nil, fail(pathErrReason(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fail(pathErrReason(err))
	}
	if !fi.Mode().IsRegular() {
		return nil, fail(fmt.Errorf("not a regular file (%s)", filetype.Of(fi.Mode())))
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fail(fmt.Errorf("mode %04o lets the group or others access it; it must be readable by its owner only (chmod 600 %s)", perm, path))
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fail(pathErrReason(err))
	}
	if len(b) > maxSecretFile {
		return nil, fail(fmt.Errorf("over %d bytes: not a %s", maxSecretFile, what))
	}
	return b, nil
}

// pathErrReason is the reason of a *fs.PathError (the errno, without the
// operation and path Go puts before it), else err.
func pathErrReason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// writeFileAtomic writes data to path with mode 0600: a temporary file in
// the same directory, synced, then renamed over path, so a reader never sees
// a partial file and a crash leaves the old one.
func writeFileAtomic(path string, data []byte) error {
	return writeFile(path, data, false)
}

// writeFile is writeFileAtomic; with exclusive it fails with an error
// matching fs.ErrExist when path exists (the complete file is linked into
// place, which fails on an existing name, so two writers cannot both
// believe they wrote it).
func writeFile(path string, data []byte, exclusive bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("natsauth: write %s: %w", path, err)
	}
	name := tmp.Name()
	fail := func(err error) error {
		tmp.Close()
		os.Remove(name)
		return fmt.Errorf("natsauth: write %s: %w", path, err)
	}
	// CreateTemp already uses 0600; Chmod states it whatever the umask.
	if err := tmp.Chmod(0o600); err != nil {
		return fail(err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(name)
		return fmt.Errorf("natsauth: write %s: %w", path, err)
	}
	if exclusive {
		err := os.Link(name, path)
		os.Remove(name)
		if err != nil {
			return fmt.Errorf("natsauth: write %s: %w", path, err)
		}
		return nil
	}
	if err := os.Rename(name, path); err != nil {
		os.Remove(name)
		return fmt.Errorf("natsauth: write %s: %w", path, err)
	}
	return nil
}

// createExclusive writes data to a new file at path (mode 0600), complete
// or not at all, and fails with an error wrapping fs.ErrExist if path
// exists: two processes generating keys in one directory at once must not
// end up with a mix of both.
func createExclusive(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("natsauth: create %s: %w", path, err)
	}
	name := tmp.Name()
	defer os.Remove(name)
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// A hard link, unlike rename, refuses to replace an existing file.
		err = os.Link(name, path)
	}
	if err != nil {
		return fmt.Errorf("natsauth: create %s: %w", path, err)
	}
	return nil
}

// loadSeed reads the seed file at path and checks that it holds a key of
// the given type.
func loadSeed(path string, want nkeys.PrefixByte) (nkeys.KeyPair, error) {
	b, err := readSecret(path, "seed file")
	if err != nil {
		return nil, err
	}
	// The file is one seed line, as nsc writes .nk files.
	seed := bytes.TrimSpace(b)
	prefix, _, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, &FileError{What: "seed file", Path: path, Err: fmt.Errorf("does not hold one NKey seed: %w", err)}
	}
	if prefix != want {
		return nil, &FileError{What: "seed file", Path: path, Err: fmt.Errorf("holds %s key, want %s key", prefixName(prefix), prefixName(want))}
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, &FileError{What: "seed file", Path: path, Err: err}
	}
	return kp, nil
}

func prefixName(p nkeys.PrefixByte) string {
	switch p {
	case nkeys.PrefixByteOperator:
		return "an operator"
	case nkeys.PrefixByteAccount:
		return "an account"
	case nkeys.PrefixByteUser:
		return "a user"
	}
	return "a " + p.String()
}

// exists reports whether path exists (as anything, even a dangling link).
func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return false, fmt.Errorf("natsauth: %w", err)
}
