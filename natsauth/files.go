package natsauth

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/tetherfleet/tether/internal/filetype"

	"github.com/nats-io/nkeys"
)

// maxSecretFile bounds what ReadCreds and the seed loader read, in bytes: a
// .creds file is about 1 KiB, a seed 58 bytes.
const maxSecretFile = 64 << 10

// FileError is a file of secrets (a .creds or seed file), or a file or the
// directory of a layout, that could not be read or used. Error is "natsauth: WHAT PATH: ERR"; a caller that knows
// where the path came from (a flag, a variable) can say so and print What,
// Path and Err in its own words. Unwrap is Err, so errors.Is(err,
// fs.ErrNotExist) holds for a missing file.
type FileError struct {
	// What the file is: "creds file", "seed file", "layout file" (a
	// JWT of the layout) or "layout directory".
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

// readSecret reads a file that holds a secret (a seed or .creds), following
// symlinks: the file checked is the target. It refuses anything but a
// regular file, a file owned by neither root nor the uid this runs as
// (euid), and any mode that gives the group or others access, the way ssh
// treats private keys: a secret others can read is already leaked, and one
// they can write, or own, may have been replaced. Errors are *FileError.
func readSecret(path, what string) ([]byte, error) {
	return readChecked(path, what, true)
}

// readChecked reads a file (a secret, or another file of the layout) after
// checkFile's checks of the open file: the target of a symlink. Errors
// are *FileError.
func readChecked(path, what string, secret bool) ([]byte, error) {
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
	if err := checkFile(path, fi, secret); err != nil {
		return nil, fail(err)
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

// checkPath stats path, following symlinks, and applies checkFile; dir says
// whether it must be a directory, else a regular file. Errors are
// *FileError; a missing path is not checked (nil).
func checkPath(path, what string, dir bool) error {
	fail := func(err error) error { return &FileError{What: what, Path: path, Err: err} }
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fail(pathErrReason(err))
	}
	if dir && !fi.IsDir() {
		return fail(fmt.Errorf("not a directory (%s)", filetype.Of(fi.Mode())))
	}
	if !dir && !fi.Mode().IsRegular() {
		return fail(fmt.Errorf("not a regular file (%s)", filetype.Of(fi.Mode())))
	}
	if err := checkFile(path, fi, false); err != nil {
		return fail(err)
	}
	return nil
}

// checkFile reports what is wrong with fi, the file (or directory) at path
// after following symlinks: an owner other than root and the uid this runs
// as (euid), who could replace it; a mode that lets the group or others
// write it; for a secret, a mode that lets them read it (or anything).
// The error (nil if none) names the mode, the owner, a symlink's target,
// and the chown or chmod line that fixes each problem; not path, which
// the caller's *FileError names.
func checkFile(path string, fi fs.FileInfo, secret bool) error {
	target, link := path, ""
	if lfi, err := os.Lstat(path); err == nil && lfi.Mode()&fs.ModeSymlink != 0 {
		if t, err := filepath.EvalSymlinks(path); err == nil {
			target = t
		}
		link = "; it is a symlink to " + target
	}
	perm := fi.Mode().Perm()
	euid := os.Geteuid()
	var problems []string
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if uid := int(st.Uid); uid != 0 && uid != euid {
			fix := fmt.Sprintf("chown %d %s", euid, target)
			if euid == 0 {
				fix += fmt.Sprintf(", or run this as uid %d, its owner", uid)
			}
			problems = append(problems, fmt.Sprintf("it is owned by uid %d (mode %04o): it must be owned by root or by the uid this runs as (%d), or its owner could replace it (%s)", uid, perm, euid, fix))
		}
	} else {
		problems = append(problems, "cannot tell its owner")
	}
	switch {
	case secret && perm&0o077 != 0:
		problems = append(problems, fmt.Sprintf("mode %04o lets the group or others access it; it must be readable by its owner only (chmod 600 %s)", perm, target))
	case perm&0o022 != 0:
		problems = append(problems, fmt.Sprintf("mode %04o lets the group or others write it, so they could replace it; it must be writable by its owner only (chmod go-w %s)", perm, target))
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; ") + link)
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
