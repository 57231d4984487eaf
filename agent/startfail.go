package agent

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// startError is a failed start explained: Error is the explanation, Unwrap
// the error Start returned (which startFailCode classifies).
type startError struct {
	msg string
	err error
}

func (e *startError) Error() string { return e.msg }
func (e *startError) Unwrap() error { return e.err }

// explainStart returns err, from starting a program in dir, explained
// where the errno alone misleads: execve's ENOENT for a file that exists
// means that the interpreter it names is missing, so it becomes what a
// shell says ("/usr/bin/python9: bad interpreter: no such file or
// directory"), naming the interpreter from the file's #! line or, for an ELF
// binary, its program interpreter (the dynamic loader). Any other err is
// returned as it is.
func explainStart(err error, dir string) error {
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Op != "fork/exec" || !errors.Is(pe.Err, syscall.ENOENT) {
		return err
	}
	path := pe.Path
	if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	if interp, ok := shebangInterpreter(path); ok {
		if interp == "" {
			return &startError{fmt.Sprintf("%s: its #! line names no interpreter", protocol.QuoteName(path)), err}
		}
		return &startError{fmt.Sprintf("%s: bad interpreter: no such file or directory (named by the #! line of %s)", protocol.QuoteName(interp), protocol.QuoteName(path)), err}
	}
	if interp := elfInterpreter(path); interp != "" {
		return &startError{fmt.Sprintf("%s: bad ELF interpreter: no such file or directory (the dynamic loader %s needs)", protocol.QuoteName(interp), protocol.QuoteName(path)), err}
	}
	return err
}

// startFailure is the message for program name failing to start in dir
// with err (from Start), in a shell's words rather than Go's ("exec: "x":
// executable file not found in $PATH", "fork/exec /x: ..."):
//
//	command "x" not found in PATH
//	start /no/such/tool: no such file or directory
//	start /etc/passwd: permission denied
//	start ./script: /usr/bin/python9: bad interpreter: no such file or directory (named by the #! line of ...)
//
// It names the program once, quoted when a terminal would not show it as it
// is (quoteName); the caller adds the node.
func startFailure(name string, err error, dir string) string {
	name = protocol.QuoteName(name)
	var ee *exec.Error
	if errors.As(err, &ee) {
		if errors.Is(ee.Err, exec.ErrNotFound) {
			return fmt.Sprintf("command %q not found in PATH", ee.Name)
		}
		return fmt.Sprintf("start %s: %v", name, pathErrReason(ee.Err))
	}
	if x := explainStart(err, dir); x != err {
		return fmt.Sprintf("start %s: %v", name, x)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Op == "fork/exec" {
		return fmt.Sprintf("start %s: %v", name, pe.Err)
	}
	return fmt.Sprintf("start %s: %v", name, err)
}

// pathErrReason is the reason of a *fs.PathError (its errno, without the
// operation and path Go puts before it), else err.
func pathErrReason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// shebangInterpreter reads the #! line of the file at path: ok is set when
// the file starts with "#!", and interp is the interpreter it names (the
// first word after "#!"; "" for none). The kernel reads at most 256 bytes of
// it, and so does this.
func shebangInterpreter(path string) (interp string, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	buf := make([]byte, 256)
	n, _ := io.ReadFull(f, buf)
	line, found := bytes.CutPrefix(buf[:n], []byte("#!"))
	if !found {
		return "", false
	}
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	fields := strings.Fields(string(line))
	if len(fields) == 0 {
		return "", true
	}
	return fields[0], true
}

// elfInterpreter returns the program interpreter (PT_INTERP) of the ELF
// file at path, or "" when it is not one or has none.
func elfInterpreter(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(p.Open(), 4096))
		if err != nil {
			return ""
		}
		return strings.TrimRight(string(b), "\x00")
	}
	return ""
}
