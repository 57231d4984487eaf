package protocol

import (
	"fmt"
	"strings"
)

// FailureStderrTail is how much of a failed node's stderr, in bytes, its
// NodeResult.Failure carries: the last FailureStderrTail bytes.
const FailureStderrTail = 64 << 10

// ShownCommand is what a failure message shows ran for p: "bash -s" for a
// script or a batch run as one script (as NeMo Gym's SSH run shows its ssh
// argv), the argv joined by spaces, or "" in fail-fast mode (the failing
// command is shown instead, see FailureMessage).
func (p *ExecParams) ShownCommand() string {
	switch {
	case p.FailFast:
		return ""
	case p.ShellScript() != "":
		return "bash -s"
	}
	return strings.Join(p.Argv, " ")
}

// FailureMessage formats a failed node's result (NodeResult.Failure) the way
// NeMo Gym reports a failed command (reference/wire-facts.md §4.1):
// "Command failed (exec on <node>) with exit code N:\n  <command>\n<stderr
// stripped>". command is p.ShownCommand(), or in fail-fast mode the command
// at r.FailedCommand; stderr is the tail of the node's stderr (at most
// FailureStderrTail bytes are kept by the callers).
func FailureMessage(node string, p *ExecParams, r *NodeResult, stderr []byte) string {
	cmd := p.ShownCommand()
	if i := r.FailedCommand; p.FailFast && i != nil && *i >= 0 && *i < len(p.Commands) {
		cmd = p.Commands[*i]
	}
	return fmt.Sprintf("Command failed (exec on %s) with exit code %d:\n  %s\n%s",
		node, r.ExitCode, cmd, strings.TrimSpace(string(stderr)))
}
