package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/protocol"
)

// execOptions are the flags of `tether exec`.
type execOptions struct {
	// Node, Selector and All name the target; exactly one is set.
	Node     string
	Selector string
	All      bool
	// Timeout bounds each node's run. Zero means the coordinator's default.
	Timeout time.Duration
	// MaxParallel bounds how many nodes run at once. Zero means the
	// coordinator's default.
	MaxParallel int
	// JSON prints output chunks and the result as JSON lines.
	JSON bool
	// Env are extra environment variables, "K=V" each.
	Env []string
	// Cwd is the remote working directory. Empty means the agent's data
	// directory.
	Cwd string
	// Stdin forwards local standard input (read fully first, at most
	// protocol.MaxStdinSize bytes) to the command; argv mode only.
	Stdin bool
	// Script is a file whose content runs through `bash -s` ("-" reads it
	// from standard input). Exclusive with a command after "--".
	Script string
	// NATS says how to reach the API.
	NATS natsOptions
}

// Validate reports every invalid option; argv is the command after "--".
func (o *execOptions) Validate(argv []string) error {
	var errs []error
	targets := 0
	if o.Node != "" {
		targets++
		if err := protocol.ValidNodeID(o.Node); err != nil {
			errs = append(errs, fmt.Errorf("--node: %w", err))
		}
	}
	if o.Selector != "" {
		targets++
		if _, err := protocol.ParseSelector(o.Selector); err != nil {
			errs = append(errs, fmt.Errorf("--selector: %w", err))
		}
	}
	if o.All {
		targets++
	}
	switch {
	case targets == 0:
		errs = append(errs, errors.New("no target: give --node, --selector or --all"))
	case targets > 1:
		errs = append(errs, errors.New("give only one of --node, --selector and --all"))
	}
	switch {
	case o.Script == "" && len(argv) == 0:
		errs = append(errs, errors.New("nothing to run: give a command after -- or --script FILE"))
	case o.Script != "" && len(argv) > 0:
		errs = append(errs, errors.New("give either a command after -- or --script, not both"))
	}
	if o.Stdin && o.Script != "" {
		errs = append(errs, errors.New("--stdin works with a command only: a script is itself bash's standard input"))
	}
	if o.Timeout < 0 {
		errs = append(errs, fmt.Errorf("--timeout %v is negative", o.Timeout))
	}
	if o.MaxParallel < 0 {
		errs = append(errs, fmt.Errorf("--max-parallel %d is negative", o.MaxParallel))
	}
	for _, kv := range o.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("--env %q: want KEY=VALUE", kv))
		}
	}
	return errors.Join(errs...)
}

// multi reports whether the target may be several nodes.
func (o *execOptions) multi() bool { return o.Node == "" }

// request builds the ExecRequest, reading the script or stdin from stdin as
// asked. o must be valid.
func (o *execOptions) request(argv []string, stdin io.Reader) (*protocol.ExecRequest, error) {
	req := &protocol.ExecRequest{
		Target:      protocol.Target{Node: o.Node, Selector: o.Selector, All: o.All},
		Argv:        argv,
		Cwd:         o.Cwd,
		Timeout:     protocol.Duration(o.Timeout),
		MaxParallel: o.MaxParallel,
	}
	if len(o.Env) > 0 {
		req.Env = map[string]string{}
		for _, kv := range o.Env {
			k, v, _ := strings.Cut(kv, "=")
			req.Env[k] = v
		}
	}
	if o.Script != "" {
		var r io.Reader = stdin
		name := "standard input"
		if o.Script != "-" {
			f, err := os.Open(o.Script)
			if err != nil {
				return nil, fmt.Errorf("read script: %w", err)
			}
			defer f.Close()
			r, name = f, o.Script
		}
		b, err := readLimited(r, protocol.MaxScriptSize, "script "+name)
		if err != nil {
			return nil, err
		}
		req.Script = string(b)
	}
	if o.Stdin {
		b, err := readLimited(stdin, protocol.MaxStdinSize, "standard input")
		if err != nil {
			return nil, err
		}
		req.Stdin = b
	}
	return req, nil
}

// readLimited reads r fully, failing if it holds more than limit bytes.
func readLimited(r io.Reader, limit int, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%s is over the %d byte limit", what, limit)
	}
	return b, nil
}

func newExecCmd(e *env) *cobra.Command {
	var o execOptions
	cmd := &cobra.Command{
		Use:   "exec (--node ID | --selector k=v,... | --all) [flags] (-- CMD [ARGS...] | --script FILE)",
		Short: "Run a command or script on nodes and stream its output",
		Long: `Run a command (without a shell) or a script (through 'bash -s') on one node, on
the nodes matching a label selector, or on all nodes, and stream their output.

With several target nodes every line is prefixed with "node-id | ". The exit
code is the remote exit code for --node (124 on timeout), and 0 or 1 (any
node failed) otherwise. Ctrl-C cancels the job on every node and exits 130.
With --json, stdout carries one JSON object per output chunk, then the
result object. A chunk is {"node","stream","data"} with data as a string
when the chunk is valid UTF-8, and {"node","stream","data_b64"} with the raw
bytes in base64 otherwise (binary output), so no byte is ever mangled.`,
		Example: `  tether exec --all -- uname -a
  tether exec --selector gpu=true --timeout 1m -- nvidia-smi
  tether exec --node web-1 --script deploy.sh
  echo data | tether exec --node web-1 --stdin -- wc -c`,
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(args); err != nil {
				return usage(err)
			}
			return runExec(cmd.Context(), &o, args, e)
		}),
	}
	// Flags stop at the command, so "tether exec --all uname -a" works
	// without "--" too.
	cmd.Flags().SetInterspersed(false)
	f := cmd.Flags()
	f.StringVar(&o.Node, "node", "", "run on this node")
	f.StringVar(&o.Selector, "selector", "", "run on the nodes matching this label selector (k=v,k2!=v2,k3 in (a,b))")
	f.BoolVar(&o.All, "all", false, "run on every connected node")
	f.DurationVar(&o.Timeout, "timeout", 0, "kill the command on a node after this long (default: the coordinator's)")
	f.IntVar(&o.MaxParallel, "max-parallel", 0, "run on at most this many nodes at once (default: the coordinator's)")
	f.BoolVar(&o.JSON, "json", false, "print output chunks and the result as JSON lines")
	f.StringArrayVar(&o.Env, "env", nil, "set an environment variable KEY=VALUE (repeatable)")
	f.StringVar(&o.Cwd, "cwd", "", "remote working directory")
	f.BoolVar(&o.Stdin, "stdin", false, "forward standard input to the command (read fully first)")
	f.StringVar(&o.Script, "script", "", "run this script file through bash -s ('-': standard input)")
	o.NATS.addFlags(cmd)
	return cmd
}

// runExec submits the job and maps its outcome to an exit code. o must be
// valid.
func runExec(ctx context.Context, o *execOptions, argv []string, e *env) error {
	req, err := o.request(argv, e.stdin)
	if err != nil {
		return err
	}
	c, closeNC, err := o.NATS.connect(e.getenv)
	if err != nil {
		return err
	}
	defer closeNC()

	out := newExecOutput(e.stdout, e.stderr, o.multi(), o.JSON)
	res, err := c.Exec(ctx, req, out.handle)
	out.Flush()
	interrupted := ctx.Err() != nil && errors.Is(err, ctx.Err())
	if res == nil {
		if interrupted {
			return &exitError{code: exitInterrupted, err: fmt.Errorf("interrupted: %w", err)}
		}
		return err
	}
	if o.JSON {
		if err := json.NewEncoder(e.stdout).Encode(res); err != nil {
			return fmt.Errorf("write result: %w", err)
		}
	}
	code, lines := execOutcome(!o.multi(), o.Timeout, res)
	for _, l := range lines {
		fmt.Fprintf(e.stderr, "tether: %s\n", l)
	}
	if interrupted {
		code = exitInterrupted
	}
	if code == exitOK {
		return nil
	}
	return &exitError{code: code}
}

// execOutcome maps a result to the exit code and the messages for stderr.
// single is true for a --node job; timeout is the requested per-node
// timeout, if any.
func execOutcome(single bool, timeout time.Duration, res *protocol.ExecResult) (int, []string) {
	if single && len(res.Results) != 1 {
		return exitFailure, []string{fmt.Sprintf("job %s: expected one node's result, got %d", res.ID, len(res.Results))}
	}
	code := exitOK
	var lines []string
	for i := range res.Results {
		r := &res.Results[i]
		for _, s := range []struct {
			name      string
			truncated bool
			n         int64
		}{{"stdout", r.StdoutTruncated, r.StdoutBytes}, {"stderr", r.StderrTruncated, r.StderrBytes}} {
			if s.truncated {
				lines = append(lines, fmt.Sprintf("node %s: %s was truncated (%d bytes produced)", r.Node, s.name, s.n))
			}
		}
		nodeCode, msg := nodeOutcome(r, timeout)
		// A single node's plain exit code speaks for itself, as with ssh.
		plainExit := r.Error == "" && !r.TimedOut && !r.Cancelled && r.Signal == ""
		if msg != "" && !(single && plainExit) {
			lines = append(lines, fmt.Sprintf("node %s: %s", r.Node, msg))
		}
		switch {
		case single:
			code = nodeCode
		case nodeCode != exitOK:
			code = exitFailure
		}
	}
	return code, lines
}

// nodeOutcome is one node's exit code as a single-node job would report it,
// and a description when it did not succeed.
func nodeOutcome(r *protocol.NodeResult, timeout time.Duration) (int, string) {
	switch {
	case r.TimedOut:
		d := timeout
		if d <= 0 {
			d = time.Duration(r.DurationMS * float64(time.Millisecond)).Round(time.Millisecond)
		}
		return exitTimedOut, fmt.Sprintf("timed out after %v", d)
	case r.Cancelled:
		return exitInterrupted, "cancelled"
	case r.Error != "":
		msg := r.Error
		if r.ErrorCode != "" {
			msg += " (" + r.ErrorCode + ")"
		}
		return exitFailure, msg
	case r.Signal != "":
		return r.ExitCode, fmt.Sprintf("killed by signal %s (exit code %d)", r.Signal, r.ExitCode)
	case r.ExitCode != 0:
		return r.ExitCode, fmt.Sprintf("exit code %d", r.ExitCode)
	}
	return exitOK, ""
}
