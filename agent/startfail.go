package agent

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/tetherfleet/tether/protocol"
)

// startFailCode classifies an error of exec.Cmd.Start (or of creack/pty's
// Start, which returns it) as a shell would report the command: the
// program does not exist (protocol.CodeCommandNotFound, a shell's 127), it
// exists but cannot be executed (protocol.CodeNotExecutable, 126), or
// anything else (protocol.CodeStartFailed). dir is the command's working
// directory, against which a relative program path is checked.
//
// Only the errors Start produces for the program itself are classified: a
// failed PATH search (*exec.Error) and a failed execve (*fs.PathError with
// Op "fork/exec"); everything else, such as a missing cwd (Op "chdir"),
// is CodeStartFailed.
func startFailCode(err error, dir string) string {
	var ee *exec.Error
	if errors.As(err, &ee) {
		// The PATH search (or, for a name with a slash, the check of that
		// file) failed.
		if errors.Is(ee.Err, exec.ErrNotFound) || errors.Is(ee.Err, fs.ErrNotExist) || errors.Is(ee.Err, syscall.ENOTDIR) {
			return protocol.CodeCommandNotFound
		}
		return protocol.CodeNotExecutable
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Op != "fork/exec" {
		return protocol.CodeStartFailed
	}
	// The child's chdir fails with the same "fork/exec" error when os/exec
	// did not check the directory first (it does not with a SysProcAttr).
	if dir != "" {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return protocol.CodeStartFailed
		}
	}
	switch {
	case errors.Is(pe.Err, syscall.ENOENT):
		// execve says ENOENT both for a missing file and for a script
		// whose interpreter (#!) is missing; bash reports the latter as
		// 126 ("bad interpreter").
		path := pe.Path
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, path)
		}
		if _, err := os.Stat(path); err == nil {
			return protocol.CodeNotExecutable
		}
		return protocol.CodeCommandNotFound
	case errors.Is(pe.Err, syscall.EACCES), errors.Is(pe.Err, syscall.EPERM), errors.Is(pe.Err, syscall.EISDIR),
		errors.Is(pe.Err, syscall.ENOEXEC), errors.Is(pe.Err, syscall.ENOTDIR), errors.Is(pe.Err, syscall.ETXTBSY),
		errors.Is(pe.Err, syscall.ELOOP), errors.Is(pe.Err, syscall.ELIBBAD):
		return protocol.CodeNotExecutable
	}
	return protocol.CodeStartFailed
}
