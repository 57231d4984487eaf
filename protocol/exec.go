package protocol

import (
	"errors"
	"fmt"
	"strings"
)

// ExecParams are the params of an exec stream's header.
//
// Exactly one of Script and Argv is set. A Script runs as `bash -s` with the
// script on stdin, the way NeMo Gym's SSH executor runs `run(commands)`
// (reference/wire-facts.md §4.1): the commands are joined by newlines and only
// the script's last status counts. An Argv runs directly, without a shell,
// found through PATH.
type ExecParams struct {
	Script string            `json:"script,omitempty"`
	Argv   []string          `json:"argv,omitempty"`
	Env    map[string]string `json:"env,omitempty"` // added to the agent's environment
	Cwd    string            `json:"cwd,omitempty"` // working directory; empty = agent's data dir default
	// TimeoutMS kills the process group after this many milliseconds; 0 = no
	// timeout.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin says frames of stdin follow; without it stdin is /dev/null.
	// Script mode never has stdin: bash reads the script from it.
	Stdin bool `json:"stdin,omitempty"`
	// OutputLimit caps each of stdout and stderr, in bytes; past it the output
	// is discarded (the process keeps running) and ExitStatus says so. 0 means
	// the agent's default.
	OutputLimit int64 `json:"output_limit,omitempty"`
}

// MaxScriptSize bounds a script's length, in bytes. It is below
// MaxHeaderSize because the script travels in the header's params.
const MaxScriptSize = 48 << 10

// Validate reports every problem with p, joined.
func (p *ExecParams) Validate() error {
	var errs []error
	switch {
	case p.Script == "" && len(p.Argv) == 0:
		errs = append(errs, errors.New("one of script or argv is required"))
	case p.Script != "" && len(p.Argv) > 0:
		errs = append(errs, errors.New("script and argv are mutually exclusive"))
	}
	if len(p.Argv) > 0 && p.Argv[0] == "" {
		errs = append(errs, errors.New("argv[0] is empty"))
	}
	if len(p.Script) > MaxScriptSize {
		errs = append(errs, fmt.Errorf("script is %d bytes, over the %d byte limit", len(p.Script), MaxScriptSize))
	}
	if p.Script != "" && p.Stdin {
		errs = append(errs, errors.New("stdin cannot be combined with script: bash -s reads the script from stdin; use argv"))
	}
	for k := range p.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			errs = append(errs, fmt.Errorf("env key %q is invalid (empty, or contains '=' or NUL)", k))
		}
	}
	if p.TimeoutMS < 0 {
		errs = append(errs, fmt.Errorf("timeout_ms %d is negative", p.TimeoutMS))
	}
	if p.OutputLimit < 0 {
		errs = append(errs, fmt.Errorf("output_limit %d is negative", p.OutputLimit))
	}
	return errors.Join(errs...)
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
}
