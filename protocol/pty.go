package protocol

import "errors"

// PTY streams (KindPTY) run a process on a pseudo-terminal on the node. The
// client sends FrameStdin (keystrokes), FrameResize and FrameSignal; the agent
// sends FrameStdout (the terminal's output: stdout and stderr are one stream
// on a terminal) and, when the process exits, FrameExit, then closes.
// FrameStdinClose sends the terminal's EOF character. Closing the stream or
// FrameCancel hangs up: the process group gets SIGHUP, then SIGKILL.

// PTYParams are the params of a pty stream's header.
type PTYParams struct {
	// Argv is the command; empty runs the user's login shell.
	Argv []string          `json:"argv,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	// Term is the TERM value for the process; default "xterm-256color".
	Term string `json:"term,omitempty"`
	// Rows and Cols are the initial window size; 0 means 24×80.
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// User is the local account on the node the operation runs as: a user
	// name or a decimal uid, with that user's uid, primary and
	// supplementary groups, home and shell. The coordinator sets it from
	// the policy rule that allowed the operation (run_as) and overwrites
	// whatever a client wrote; the agent's local policy decides whether it
	// may run as that user. Empty means the agent's own user.
	User string `json:"user,omitempty"`
}

// Validate reports every problem with p, joined: the agent checks every
// pty header with it before it starts anything. Argv (when set) has a
// non-empty argv[0]; nothing that becomes a C string of the process (an
// argument, an environment key or value, the cwd, the term) contains NUL
// or a byte that is not UTF-8 (CheckUTF8); argv and env are bounded by
// MaxArgs and MaxEnv.
func (p *PTYParams) Validate() error {
	var errs []error
	if len(p.Argv) > 0 && p.Argv[0] == "" {
		errs = append(errs, errors.New("argv[0] is empty"))
	}
	errs = append(errs, checkArgs("argv", p.Argv, true)...)
	errs = append(errs, checkEnv(p.Env)...)
	errs = append(errs, checkNoNUL("cwd", p.Cwd)...)
	errs = append(errs, checkUser(p.User)...)
	errs = append(errs, checkNoNUL("term", p.Term)...)
	if err := p.CheckUTF8(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// WindowSize is the payload of FrameResize.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Signal is the payload of FrameSignal: a signal name without "SIG" ("INT",
// "TERM", "QUIT", "HUP", "USR1", "USR2", "WINCH", "KILL").
type Signal struct {
	Name string `json:"name"`
}
