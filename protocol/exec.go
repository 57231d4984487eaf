package protocol

import (
	"errors"
	"fmt"
	"strings"
)

// ExecParams are the params of an exec stream's header.
//
// Exactly one of Script, Argv and Commands is set. A Script runs as `bash -s`
// with the script on stdin, the way NeMo Gym's SSH executor runs
// `run(commands)` (reference/wire-facts.md §4.1): the commands are joined by
// newlines and only the script's last status counts. An Argv runs directly,
// without a shell, found through PATH. Commands without FailFast are the
// same as a Script of the commands joined by "\n"; with FailFast each
// command runs through `bash -c`, one after the other in the same cwd and
// environment, and the batch stops at the first that exits non-zero
// (NeMo Gym's local run); ExitStatus.FailedCommand then names it.
type ExecParams struct {
	Script   string   `json:"script,omitempty"`
	Argv     []string `json:"argv,omitempty"`
	Commands []string `json:"commands,omitempty"`
	// FailFast runs Commands one by one, stopping at the first failure.
	FailFast bool              `json:"fail_fast,omitempty"`
	Env      map[string]string `json:"env,omitempty"` // added to the agent's environment
	Cwd      string            `json:"cwd,omitempty"` // working directory; empty = agent's data dir default
	// TimeoutMS kills the process group after this many milliseconds; 0 = no
	// timeout.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin says frames of stdin follow; without it stdin is /dev/null.
	// Script mode never has stdin: bash reads the script from it.
	Stdin bool `json:"stdin,omitempty"`
	// OutputLimit caps each of stdout and stderr, in bytes; past it the output
	// is discarded (the process keeps running) and ExitStatus says so. 0 means
	// the agent's default; OutputUnlimited means no cap.
	OutputLimit int64 `json:"output_limit,omitempty"`
	// Detach starts the job in its own session, writing its output to files
	// on the node, and answers with an ExitStatus whose Detached is set as
	// soon as it started. The job survives the stream and the tunnel; it is
	// queried and cancelled through job streams (KindJob) by JobID.
	Detach bool `json:"detach,omitempty"`
	// JobID names a detached job on the node (required with Detach; the
	// coordinator sends the exec job's id). Same syntax as ExecRequest.ID.
	JobID string `json:"job_id,omitempty"`
	// User is the local account on the node the operation runs as: a user
	// name or a decimal uid, with that user's uid, primary and
	// supplementary groups, home and shell. The coordinator sets it from
	// the policy rule that allowed the operation (run_as) and overwrites
	// whatever a client wrote; the agent's local policy decides whether it
	// may run as that user. Empty means the agent's own user.
	User string `json:"user,omitempty"`
}

// ShellScript returns the script p runs through `bash -s`, or "" when p runs
// an argv or fail-fast commands.
func (p *ExecParams) ShellScript() string {
	switch {
	case p.Script != "":
		return p.Script
	case len(p.Commands) > 0 && !p.FailFast:
		return strings.Join(p.Commands, "\n")
	}
	return ""
}

// MaxScriptSize bounds a script's length, in bytes. It is below
// MaxHeaderSize because the script travels in the header's params.
const MaxScriptSize = 48 << 10

// Validate reports every problem with p, joined. It is the one rule set
// for exec params: the agent checks every exec header with it before it
// runs anything, and ExecRequest.Validate checks a NATS request through it.
// What it accepts the agent can start (or reports as start_failed: a
// missing program or cwd); in particular every command of a batch is
// non-empty ("commands[2] is empty"), since an empty one runs nothing and
// leaves nothing to start. A whitespace-only command is a valid no-op, as
// in bash. Nothing that reaches a process as a C string or through bash
// (an argument, a command, the script, an environment key or value, the
// cwd) may contain NUL: bash would drop it and run something else; nor a
// byte that is not UTF-8 (CheckUTF8): JSON would carry U+FFFD instead.
// Problems of size match ErrTooLarge.
func (p *ExecParams) Validate() error {
	var errs []error
	n := 0
	for _, set := range []bool{p.Script != "", len(p.Argv) > 0, len(p.Commands) > 0} {
		if set {
			n++
		}
	}
	switch {
	case n == 0:
		errs = append(errs, errors.New("nothing to run: one of script, argv or commands is required"))
	case n > 1:
		errs = append(errs, errors.New("script, argv and commands are mutually exclusive"))
	}
	if len(p.Argv) > 0 && p.Argv[0] == "" {
		errs = append(errs, errors.New("argv[0] is empty"))
	}
	errs = append(errs, checkArgs("argv", p.Argv, true)...)
	errs = append(errs, checkArgs("commands", p.Commands, false)...)
	errs = append(errs, checkNoNUL("script", p.Script)...)
	if size := len(p.Script); size > MaxScriptSize {
		errs = append(errs, tooLarge("script is %d bytes, over the %d byte limit", size, MaxScriptSize))
	}
	if size := joinedLen(p.Commands); size > MaxScriptSize {
		errs = append(errs, tooLarge("commands are %d bytes, over the %d byte limit", size, MaxScriptSize))
	}
	if p.FailFast && len(p.Commands) == 0 {
		errs = append(errs, errors.New("fail_fast needs commands"))
	}
	if p.Script != "" && p.Stdin {
		errs = append(errs, errors.New("stdin cannot be combined with script: bash -s reads the script from stdin; use argv"))
	}
	if len(p.Commands) > 0 && p.Stdin {
		errs = append(errs, errors.New("stdin cannot be combined with commands; use argv"))
	}
	errs = append(errs, checkEnv(p.Env)...)
	errs = append(errs, checkNoNUL("cwd", p.Cwd)...)
	errs = append(errs, checkUser(p.User)...)
	if p.TimeoutMS < 0 {
		errs = append(errs, errors.New("timeout must not be negative"))
	}
	if p.TimeoutMS > MaxTimeoutMS {
		errs = append(errs, fmt.Errorf("timeout_ms %d is over the limit of %d (about 146 years)", p.TimeoutMS, MaxTimeoutMS))
	}
	if p.Detach {
		if p.Stdin {
			errs = append(errs, errors.New("stdin cannot be combined with detach"))
		}
		if p.FailFast {
			errs = append(errs, errors.New("fail_fast cannot be combined with detach: use a script with set -e"))
		}
		if !validSegment(p.JobID, MaxJobIDLen) {
			errs = append(errs, fmt.Errorf("job_id %s: a detached job needs an id of 1-%d characters of [A-Za-z0-9-_.]", Clip(p.JobID), MaxJobIDLen))
		}
	}
	if p.OutputLimit < 0 {
		errs = append(errs, fmt.Errorf("output_limit %d is negative", p.OutputLimit))
	}
	if err := p.CheckUTF8(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// joinedLen is len(strings.Join(cmds, "\n")), without building it.
func joinedLen(cmds []string) int {
	n := max(len(cmds)-1, 0)
	for _, c := range cmds {
		n += len(c)
	}
	return n
}

// ExitStatus is the payload of FrameExit: how the process ended.
type ExitStatus struct {
	// ExitCode is the process's exit status: 0–255 for a normal exit, 128+N
	// when killed by signal N, and 124 when the timeout killed it (as
	// coreutils timeout(1) and OpenShell do).
	ExitCode int `json:"exit_code"`
	// Signal names the signal that ended the process, if any ("KILL").
	Signal string `json:"signal,omitempty"`
	// TimedOut is set when the timeout killed the process group.
	TimedOut bool `json:"timed_out,omitempty"`
	// Cancelled is set when a FrameCancel killed the process group.
	Cancelled bool `json:"cancelled,omitempty"`
	// DurationMS is the wall time from start to exit, in milliseconds.
	DurationMS float64 `json:"duration_ms"`
	// StdoutBytes and StderrBytes count everything the process wrote,
	// including bytes dropped past the output limit.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// StdoutTruncated and StderrTruncated are set when output past the
	// output limit was dropped.
	StdoutTruncated bool `json:"stdout_truncated,omitempty"`
	StderrTruncated bool `json:"stderr_truncated,omitempty"`
	// FailedCommand is the index in ExecParams.Commands of the command that
	// stopped a fail-fast batch (exited non-zero, timed out or was
	// cancelled); nil when none did.
	FailedCommand *int `json:"failed_command,omitempty"`
	// OutputCut is set when the main process exited but something kept its
	// output pipes open past the agent's pipe wait, and the agent killed
	// the process group to end the job (output after that was lost).
	OutputCut bool `json:"output_cut,omitempty"`
	// Detached is set when the job was started detached (ExecParams.Detach):
	// it is running, and ExitCode means nothing yet.
	Detached bool `json:"detached,omitempty"`
}
