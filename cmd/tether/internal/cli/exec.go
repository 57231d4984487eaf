package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// execOptions are the flags of `tether exec`.
type execOptions struct {
	// Node, Selector and All name the target; exactly one is set.
	Node     string
	Selector string
	All      bool
	// nodes are the --node values as given, in order (more than one is
	// a usage error).
	nodes []string
	// SelectorGiven is set when --selector was on the command line, so
	// that an empty one is refused rather than taken as no target.
	SelectorGiven bool
	// Timeout bounds each node's run. Zero means the coordinator's default.
	// The flag takes a duration or a plain number of seconds.
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
	// Stdin forwards local standard input to the command even when it is a
	// terminal, and to every node of a fan-out (read fully first, at most
	// protocol.MaxStdinSize bytes, the same bytes to each node); argv mode
	// only. Without it a standard input that is not a terminal is
	// forwarded to a --node command anyway (stdinMode).
	Stdin bool
	// NoStdin never forwards standard input (ssh -n): the command reads
	// /dev/null.
	NoStdin bool
	// Script is a file whose content runs through `bash -s` ("-" reads it
	// from standard input). Exclusive with a command after "--".
	Script string
	// Commands are shell commands (-c, repeatable): joined by newlines into
	// one `bash -s` script, or with FailFast run one by one until the
	// first failure. Exclusive with Script and a command after "--".
	Commands []string
	// FailFast runs Commands one by one, stopping at the first failure.
	FailFast bool
	// Summary prints every node in the final table of a multi-node job,
	// not only the failed ones.
	Summary bool
	// Detach starts the job detached on each node and returns at once.
	Detach bool
	// Idempotent and IdempotencyKey mark a job that may run more than
	// once (ExecRequest.Idempotent).
	Idempotent     bool
	IdempotencyKey string
	// IdempotencyKeyGiven is whether --idempotency-key was on the command
	// line: given empty, it would silently make the job non-idempotent.
	IdempotencyKeyGiven bool
	// OutputLimit caps each of stdout and stderr per node, in bytes: 0
	// means the agent's default (64 MiB), protocol.OutputUnlimited no cap.
	OutputLimit int64
	// NATS says how to reach the API.
	NATS natsOptions
}

// Validate reports every invalid option; argv is the command after "--".
func (o *execOptions) Validate(argv []string) error {
	var errs []error
	targets := 0
	if len(o.nodes) > 1 {
		errs = append(errs, fmt.Errorf("--node given %d times (%s): one node a command; --selector or --all run on several", len(o.nodes), quotedList(o.nodes)))
	}
	if o.Node != "" {
		targets++
		if err := protocol.ValidNodeID(o.Node); err != nil {
			errs = append(errs, fmt.Errorf("--node: %w", err))
		}
	}
	switch {
	case o.Selector != "":
		targets++
		if _, err := protocol.ParseSelector(o.Selector); err != nil {
			errs = append(errs, fmt.Errorf("--selector: %w", err))
		}
	case o.SelectorGiven:
		targets++
		errs = append(errs, errors.New("--selector is empty: give at least one requirement, or --all for every node"))
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
	sources := 0
	for _, set := range []bool{o.Script != "", len(argv) > 0, len(o.Commands) > 0} {
		if set {
			sources++
		}
	}
	switch {
	case sources == 0:
		errs = append(errs, errors.New("nothing to run: give a command after --, -c CMD or --script FILE"))
	case sources > 1:
		errs = append(errs, errors.New("give only one of a command after --, -c and --script"))
	}
	if len(argv) > 0 && argv[0] == "" {
		errs = append(errs, errors.New("the command after -- is empty"))
	}
	if o.IdempotencyKeyGiven && o.IdempotencyKey == "" {
		errs = append(errs, errors.New(`--idempotency-key is empty: give a key, or leave the flag out (--idempotent alone keys the job by its id)`))
	}
	errs = append(errs, idempotencyKeyErr(o.IdempotencyKey)...)
	if o.FailFast && len(o.Commands) == 0 {
		errs = append(errs, errors.New("--fail-fast needs -c commands"))
	}
	if o.Stdin && (o.Script != "" || len(o.Commands) > 0) {
		errs = append(errs, errors.New("--stdin works with a command after -- only: a script is itself bash's standard input"))
	}
	if o.Detach && o.Stdin {
		errs = append(errs, errors.New("--stdin cannot be combined with --detach: a detached job has no standard input"))
	}
	if o.Stdin && o.NoStdin {
		errs = append(errs, errors.New("give only one of --stdin and -n/--no-stdin"))
	}
	if o.Detach && o.FailFast {
		errs = append(errs, errors.New("--fail-fast cannot be combined with --detach: use a script with set -e"))
	}
	if o.Timeout < 0 {
		errs = append(errs, fmt.Errorf("--timeout %s is negative", humanDuration(o.Timeout)))
	}
	if o.Timeout > maxTimeout {
		errs = append(errs, fmt.Errorf("--timeout %s is over the limit of %s", humanDuration(o.Timeout), humanDuration(maxTimeout)))
	}
	if o.MaxParallel < 0 {
		errs = append(errs, fmt.Errorf("--max-parallel %d is negative", o.MaxParallel))
	}
	seen := make(map[string]string, len(o.Env))
	for _, kv := range o.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			errs = append(errs, fmt.Errorf("--env %q: want KEY=VALUE", kv))
			continue
		}
		if err := protocol.CheckEnvName(k); err != nil {
			errs = append(errs, fmt.Errorf("--env: %w", err))
			continue
		}
		// The request's env is a map: a second value would replace the
		// first without a word. The same value twice loses nothing.
		if first, dup := seen[k]; dup && first != v {
			errs = append(errs, fmt.Errorf("--env %s is given twice, with different values (not shown: an env value may be a secret): give it once", protocol.QuoteName(k)))
		} else if !dup {
			seen[k] = v
		}
	}
	errs = append(errs, utf8Errs(argv, o.Env, o.Cwd)...)
	for i, c := range o.Commands {
		if n := protocol.InvalidUTF8At(c); n > 0 {
			errs = append(errs, fmt.Errorf("-c command %d: not valid UTF-8 at byte %d", i+1, n))
		}
	}
	return errors.Join(errs...)
}

// idempotencyKeyErr checks --idempotency-key by the API's rule
// (protocol.ExecRequest.Validate: at most MaxIdempotencyKeyLen bytes, no
// control character) and as UTF-8, which JSON would turn into U+FFFD, a
// different key; in the flag's words, with 1-based byte positions as the
// CLI's other errors give them.
func idempotencyKeyErr(key string) []error {
	if len(key) > protocol.MaxIdempotencyKeyLen {
		return []error{fmt.Errorf("--idempotency-key: %d bytes, at most %d", len(key), protocol.MaxIdempotencyKeyLen)}
	}
	if n := protocol.InvalidUTF8At(key); n > 0 {
		return []error{fmt.Errorf("--idempotency-key: not valid UTF-8 at byte %d", n)}
	}
	for i, c := range key {
		if c < 0x20 || c == 0x7f {
			return []error{fmt.Errorf("--idempotency-key: a control character %q at byte %d", c, i+1)}
		}
	}
	return nil
}

// utf8Errs reports each of argv (the command after --), env (--env K=V
// flags) and cwd (--cwd) that is not valid UTF-8 (protocol.InvalidUTF8At),
// in the CLI's words (package client refuses them too, in the API's).
// Strings that exec sends go as JSON strings, where such a byte would
// become U+FFFD: the node would run something else.
func utf8Errs(argv, env []string, cwd string) []error {
	var errs []error
	for i, a := range argv {
		if n := protocol.InvalidUTF8At(a); n > 0 {
			errs = append(errs, fmt.Errorf("argument %d: not valid UTF-8 at byte %d", i+1, n))
		}
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if n := protocol.InvalidUTF8At(k); n > 0 {
			errs = append(errs, fmt.Errorf("--env %s: name not valid UTF-8 at byte %d", protocol.QuoteName(k), n))
		} else if n := protocol.InvalidUTF8At(v); n > 0 {
			errs = append(errs, fmt.Errorf("--env %s: value not valid UTF-8 at byte %d", protocol.QuoteName(k), n))
		}
	}
	if n := protocol.InvalidUTF8At(cwd); n > 0 {
		errs = append(errs, fmt.Errorf("--cwd: not valid UTF-8 at byte %d", n))
	}
	return errs
}

// multi reports whether the target may be several nodes.
func (o *execOptions) multi() bool { return o.Node == "" }

// request builds the ExecRequest, reading the script from stdin (--script -)
// and, with o.Stdin on several nodes, the stdin bytes to send (buffered).
// o must be valid.
//
// The script is read while ctx lasts: a script that never comes (a FIFO
// nobody writes, `--script <(sleep 1h)`, a terminal on `--script -`) ends
// with ctx, so Ctrl-C and SIGTERM stop it (interruptedError: 130, 143);
// before, the read held the command past every signal but SIGKILL. A
// file is opened without blocking, so a FIFO without a writer reads as
// empty instead of waiting in open for one.
func (o *execOptions) request(ctx context.Context, argv []string, stdin io.Reader) (*protocol.ExecRequest, error) {
	req := &protocol.ExecRequest{
		Target:      protocol.Target{Node: o.Node, Selector: o.Selector, All: o.All},
		Argv:        argv,
		Commands:    o.Commands,
		FailFast:    o.FailFast,
		Cwd:         o.Cwd,
		Timeout:     protocol.Duration(o.Timeout),
		MaxParallel: o.MaxParallel,
		OutputLimit: o.OutputLimit,
		Detach:      o.Detach,

		Idempotent:     o.Idempotent || o.IdempotencyKey != "",
		IdempotencyKey: o.IdempotencyKey,
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
		name := "-"
		// One form for every failure to read the file: "--script FILE:
		// is a directory", "--script FILE: no such file or directory"
		// (the path is the user's own; the operation adds nothing).
		scriptErr := func(err error) error {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return usage(fmt.Errorf("--script %s: %w", protocol.QuoteName(o.Script), err))
		}
		if o.Script != "-" {
			f, err := os.OpenFile(o.Script, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				return nil, scriptErr(err)
			}
			defer f.Close()
			r, name = f, protocol.QuoteName(o.Script)
		}
		b, err := readAllCtx(ctx, io.LimitReader(r, protocol.MaxScriptSize+1))
		if ctx.Err() != nil {
			return nil, interruptedError(ctx)
		}
		if err != nil {
			if o.Script == "-" {
				return nil, usage(fmt.Errorf("--script -: read standard input: %w", err))
			}
			return nil, scriptErr(err)
		}
		if len(b) > protocol.MaxScriptSize {
			return nil, usage(fmt.Errorf("--script %s: the script is over the %d byte limit", name, protocol.MaxScriptSize))
		}
		if len(b) == 0 {
			// Say it in the user's words: the API's would name its
			// fields ("one of script, argv or commands").
			if o.Script == "-" {
				return nil, usage(errors.New("--script -: the script on standard input is empty: nothing to run (pipe the script in, or give its file)"))
			}
			return nil, usage(fmt.Errorf("--script %s: the script file is empty: nothing to run", name))
		}
		if n := protocol.InvalidUTF8At(string(b)); n > 0 {
			return nil, usage(fmt.Errorf("--script %s: not valid UTF-8 at byte %d (Tether sends commands as UTF-8 text; convert the file, e.g. with iconv)", name, n))
		}
		if i := bytes.IndexByte(b, 0); i >= 0 {
			return nil, usage(fmt.Errorf("--script %s: a NUL byte at byte %d (a script is text; bash would drop it)", name, i+1))
		}
		req.Script = string(b)
	}
	if o.Stdin && o.multi() {
		b, err := io.ReadAll(io.LimitReader(stdin, protocol.MaxStdinSize+1))
		if err != nil {
			return nil, fmt.Errorf("read standard input: %w", err)
		}
		if len(b) > protocol.MaxStdinSize {
			// Nothing was sent: a usage error, like any other request
			// the API would refuse.
			return nil, usage(fmt.Errorf("standard input is over the %d byte (%d KiB) limit of --stdin with several nodes (the same bytes go to each node, buffered): "+
				"run it per node with --node, which streams standard input with no limit, or copy the data to the nodes with 'tether cp' first", protocol.MaxStdinSize, protocol.MaxStdinSize>>10))
		}
		req.Stdin = b
	}
	return req, nil
}

// stdinMode is what `tether exec` does with its standard input.
type stdinMode int

const (
	stdinUnused   stdinMode = iota // the command reads /dev/null
	stdinScript                    // --script -: standard input is the script
	stdinStream                    // streamed to a --node command (ExecStream)
	stdinBuffered                  // --stdin on several nodes: read fully, sent to each
)

// stdinMode decides, as ssh does, what standard input means for o: with
// --node and a command after --, a standard input that is not a terminal
// (a pipe, a file) is streamed to the command, as is any with --stdin; -n
// never forwards it. Where it cannot be forwarded (a -c batch or a script
// file, which bash -s reads from its own standard input; several nodes,
// unless --stdin sends the same bytes to each; a detached job) it is left
// unread, and warn says so when it was piped. kind is the local standard
// input's kind (classifyStdin).
func (o *execOptions) stdinMode(kind stdinKind) (mode stdinMode, warn string) {
	switch {
	case o.Script == "-":
		return stdinScript, ""
	case o.NoStdin:
		return stdinUnused, ""
	case o.Stdin && o.multi():
		return stdinBuffered, ""
	case o.Stdin:
		return stdinStream, ""
	case kind != stdinPiped:
		return stdinUnused, ""
	case o.Script != "" || len(o.Commands) > 0:
		return stdinUnused, "standard input is not forwarded: -c and --script run through 'bash -s', which reads the script from its standard input; put the command after -- to give it standard input, or pass -n (or </dev/null) to say it has none"
	case o.Detach:
		return stdinUnused, "standard input is not forwarded: a detached job has no standard input; pass -n (or </dev/null) to say it has none"
	case o.multi():
		return stdinUnused, fmt.Sprintf("standard input is not forwarded to several nodes; pass --stdin to send the same bytes to each (buffered, at most %d KiB), or -n (or </dev/null) to say it has none", protocol.MaxStdinSize>>10)
	}
	return stdinStream, ""
}

// stdinKind is what a process's standard input is.
type stdinKind int

const (
	stdinNone     stdinKind = iota // none: not open, /dev/null, or nil
	stdinTerminal                  // a terminal
	stdinPiped                     // anything else: a pipe, a file, a socket, an io.Reader
)

// classifyStdin tells what r, a command's standard input, is. A file
// descriptor that is not open (fstat fails, as for a CI runner's closed
// fd 0) and /dev/null are stdinNone; an io.Reader that is not an *os.File
// is stdinPiped.
func classifyStdin(r io.Reader) stdinKind {
	if r == nil {
		return stdinNone
	}
	f, ok := r.(*os.File)
	if !ok {
		return stdinPiped
	}
	fi, err := f.Stat()
	if err != nil {
		return stdinNone
	}
	if term.IsTerminal(int(f.Fd())) {
		return stdinTerminal
	}
	if isNullDevice(fi) {
		return stdinNone
	}
	return stdinPiped
}

// linuxNullRdev is the device number of Linux's null device (major 1,
// minor 3), whichever mount or inode a /dev/null is on.
var linuxNullRdev = unix.Mkdev(1, 3)

// isNullDevice tells whether fi is a null device: a character device with
// /dev/null's device number (1:3 on Linux), not only the inode this
// process's /dev/null is. A docker exec's fd 0 is the host's /dev/null, a
// char device 1:3 on another mount than the container's /dev/null.
func isNullDevice(fi os.FileInfo) bool {
	if fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	if err == nil && os.SameFile(fi, null) {
		return true
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	if st.Rdev == linuxNullRdev {
		return true
	}
	if err == nil {
		if nst, ok := null.Sys().(*syscall.Stat_t); ok && nst.Rdev == st.Rdev {
			return true
		}
	}
	return false
}

func newExecCmd(e *env) *cobra.Command {
	var o execOptions
	cmd := &cobra.Command{
		Use:   "exec (--node ID | --selector k=v,... | --all) [flags] (-- CMD [ARGS...] | -c CMD... | --script FILE)",
		Short: "Run a command, a batch or a script on nodes and stream its output",
		Long: `Run a command (without a shell), a batch of shell commands (-c, repeatable) or
a script (through 'bash -s') on one node, on the nodes matching a label
selector, or on all nodes, and stream their output.

A batch of -c commands runs like NeMo Gym's SSH executor: joined by newlines
into one 'bash -s' script, where only the last command's status counts. With
--fail-fast the commands run one by one (each through 'bash -c', in the same
cwd and environment) and the batch stops at the first that fails. A failed
node is reported as "Command failed (exec on NODE) with exit code N:", the
command and the node's stderr.

With several target nodes every line is prefixed with "node-id | ", a live
progress line is shown on a terminal, and a table of the failed nodes (every
node with --summary) and the totals end the run. Ctrl-C cancels the job on
every node. With --json, stdout carries one JSON object per line: output
chunks {"node","stream","data"} (or "data_b64" with the raw bytes in base64
when a chunk is not valid UTF-8), each node's result as {"node_result":
{...}} when it finishes, then the result object.

Each of stdout and stderr is capped per node at --output-limit (default: the
agent's, 64 MiB; "unlimited" for none); past it the output is dropped, the
command runs on, and the result says "truncated": true. So does a result
with "output_cut": true (an agent run with --pipe-wait killed the process
group because a process left behind held the output open after the command
exited; what it wrote later was lost).

With --detach the job is started on each node under a supervisor of its own
(in a transient systemd scope where the node has systemd), its output kept
in files there; it survives the tunnel and a restart of the agent, and is
queried with 'tether job'. With --json a node that started it reports
{"node_result": {"node", "state": "running", "detached": true}} (no exit
code: it has not exited), and the result counts "started" nodes in place
of "succeeded" ones ("failed": those that could not start it).

Standard input, as with ssh: with --node and a command after --, a standard
input that is not a terminal (a pipe, a redirected file) is streamed to the
command with no size limit; -n (or </dev/null) gives it none, and --stdin
forwards a terminal's too. -c and --script run through 'bash -s', which reads
the script from its standard input, so stdin cannot reach them (--script -
reads the script from it). Several nodes get it only with --stdin (the same
bytes to each, buffered, at most 512 KiB), a detached job never; where piped
stdin is not forwarded a warning says so.

Exit codes, with --node:
  0        the command exited 0
  N        the command's own exit code (128+N when signal N killed it)
  2        usage error: nothing was sent
  124      the timeout killed the command
  126      the command exists on the node but cannot be executed
  127      the command was not found on the node
  130/143  interrupted by SIGINT/SIGTERM (129 SIGHUP, 141 stdout's
           reader gone): the job was cancelled
  254      the command exited 0 but its output is incomplete: output past
           --output-limit was dropped, or the agent's --pipe-wait cut it
           (a process left behind held it open; "output_cut")
  255      Tether failed: no coordinator, node not connected, cwd missing,
           tunnel lost, coordinator shut down, internal error
With --selector or --all: 0 when every node succeeded, 1 when any node failed
(for any of the reasons above), 254 when every node succeeded but an output
was truncated or cut, 255 when Tether failed for the whole job (no node matched, no
coordinator); 2, 130 and 143 as above.`,
		Example: `  tether exec --all -- uname -a
  tether exec --selector gpu=true --timeout 1m -- nvidia-smi
  tether exec --node web-1 --script deploy.sh
  tether exec --node web-1 -c 'cd /srv' -c 'make' --fail-fast
  tar c ./data | tether exec --node web-1 -- tar x -C /srv
  tether exec --all --stdin -- tee /etc/motd < motd.txt
  tether exec --node web-1 --detach -- ./train.sh`,
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			o.SelectorGiven = cmd.Flags().Changed("selector")
			o.IdempotencyKeyGiven = cmd.Flags().Changed("idempotency-key")
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
	f.Var(&repeatedString{p: &o.Node, all: &o.nodes}, "node", "run on this node")
	f.StringVar(&o.Selector, "selector", "", "run on the nodes matching this label selector (k=v,k2!=v2,k3 in (a,b))")
	f.BoolVar(&o.All, "all", false, "run on every connected node")
	f.Var(durationFlag{d: &o.Timeout, max: maxTimeout}, "timeout", "kill the command on a node after this long: 30s, 5m or a number of seconds (default: the coordinator's)")
	f.IntVar(&o.MaxParallel, "max-parallel", 0, "run on at most this many nodes at once (default: the coordinator's)")
	f.BoolVar(&o.JSON, "json", false, "print output chunks, node results and the result as JSON lines")
	f.StringArrayVar(&o.Env, "env", nil, "set an environment variable KEY=VALUE (repeatable)")
	f.StringVar(&o.Cwd, "cwd", "", "remote working directory")
	f.BoolVar(&o.Stdin, "stdin", false, "forward standard input even from a terminal, or to several nodes (buffered, at most 512 KiB)")
	f.BoolVarP(&o.NoStdin, "no-stdin", "n", false, "do not forward standard input (as ssh -n): the command reads /dev/null")
	f.StringVar(&o.Script, "script", "", "run this script file through bash -s ('-': standard input)")
	f.StringArrayVarP(&o.Commands, "command", "c", nil, "a shell command of the batch (repeatable)")
	f.BoolVar(&o.FailFast, "fail-fast", false, "run the -c commands one by one and stop at the first failure")
	f.BoolVar(&o.Summary, "summary", false, "list every node in the final table, not only the failed ones")
	f.BoolVar(&o.Detach, "detach", false, "start the job detached on each node and return (see 'tether job')")
	f.BoolVar(&o.Idempotent, "idempotent", false, "the job may run more than once: a repeat is deduplicated, and it runs again if its coordinator died while it ran")
	f.StringVar(&o.IdempotencyKey, "idempotency-key", "", "the key that makes repeats of an idempotent job one job (default: the job id; implies --idempotent)")
	f.Var(outputLimitFlag{&o.OutputLimit}, "output-limit", "cap each of stdout and stderr per node: 64MiB, 1GiB, 1GB or unlimited (default: the agent's, 64 MiB)")
	o.NATS.addFlags(cmd)
	return cmd
}

// readAllCtx is io.ReadAll of r, given up when ctx ends (its error then
// ctx's): the read goes on in a goroutine that the command's exit ends.
func readAllCtx(ctx context.Context, r io.Reader) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(r)
		done <- result{b, err}
	}()
	select {
	case res := <-done:
		return res.b, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// maxTimeout is the longest --timeout: what the API accepts
// (protocol.MaxTimeoutMS).
const maxTimeout = time.Duration(protocol.MaxTimeoutMS) * time.Millisecond

// runExec submits the job and maps its outcome to an exit code. o must be
// valid.
func runExec(ctx context.Context, o *execOptions, argv []string, e *env) error {
	kind := classifyStdin(e.stdin)
	mode, warn := o.stdinMode(kind)
	if warn != "" {
		fmt.Fprintf(e.stderr, "tether: warning: %s\n", warn)
	}
	req, err := o.request(ctx, argv, e.stdin)
	if err != nil {
		return err
	}
	// What the API would refuse is a usage error, found before anything is
	// sent.
	if apiErr := req.Validate(); apiErr != nil {
		return usage(errors.New(apiErr.Message))
	}
	c, closeNC, err := o.NATS.connect(e)
	if err != nil {
		return err
	}
	defer closeNC()

	stdout, stderr := e.stdout, e.stderr
	var prog *progress
	if o.multi() && !o.JSON && isTerminal(e.stderr) {
		// The node count is for display only: nodes may come and go
		// before the job resolves its target.
		total := 0
		if ns, err := c.Nodes(ctx, o.Selector); err == nil {
			total = len(ns)
		}
		maxPar := o.MaxParallel
		if maxPar == 0 {
			maxPar = protocol.DefaultMaxParallel
		}
		prog = newProgress(e.stderr, total, maxPar)
		stdout, stderr = prog.writer(e.stdout), prog.writer(e.stderr)
		prog.start()
	}
	out := newExecOutput(stdout, stderr, o.multi(), o.JSON)
	// Whether a notice on stderr would land right after stdout's bytes.
	same := sameStream(e.stdout, e.stderr)
	start := e.now()
	opts := client.ExecOptions{
		Output: out.handle,
		Rerun: func(lost, next, why string) {
			what := "was lost (" + why + ")"
			if strings.HasPrefix(why, "never recorded") {
				what = "was " + why
			}
			fmt.Fprintf(stderr, "tether: job %s %s; it is idempotent: running it again as job %s\n", lost, what, next)
		},
		NodeResult: func(r *protocol.NodeResult) {
			if prog != nil {
				prog.nodeDone(r.OK())
			}
			if o.JSON {
				out.nodeResult(r)
				return
			}
			if r.Failure != "" && !brokenStdout(ctx, nil) {
				// Complete this node's partial lines first.
				out.FlushNode(r.Node)
				// On a line of its own, after output cut mid-line.
				out.EndLines(same)
				fmt.Fprintf(stderr, "%s\n", shownFailure(req, r))
			}
		},
	}
	var res *protocol.ExecResult
	if mode == stdinStream {
		res, err = execStream(ctx, c, req, e.stdin, kind, opts)
	} else {
		res, err = c.ExecWith(ctx, req, opts)
	}
	out.Flush()
	if prog != nil {
		prog.stop()
	}
	interrupted := ctx.Err() != nil && errors.Is(err, ctx.Err())
	if res == nil {
		if interrupted {
			return interruptedError(ctx)
		}
		return err
	}
	if o.JSON {
		if err := out.json.Encode(jsonExecResult(res, o.Detach)); err != nil {
			return fmt.Errorf("write result: %w", err)
		}
	}
	code, lines := execOutcome(!o.multi(), o.Timeout, o.OutputLimit, res)
	if len(lines) > 0 && !o.JSON {
		out.EndLines(same)
	}
	if interrupted && brokenStdout(ctx, nil) {
		// The reader of stdout left (SIGPIPE): a filter has nothing
		// more to say, as one the signal killed would not.
		return &exitError{code: exitBrokenPipe}
	}
	for _, l := range lines {
		fmt.Fprintf(e.stderr, "tether: %s\n", l)
	}
	if o.multi() && !o.JSON {
		// A node the client's interrupt cancelled shows the code the
		// process exits with (130, 143 after SIGTERM), as --node would.
		cancelCode := exitInterrupted
		if interrupted {
			cancelCode = interruptCode(ctx)
		}
		if err := writeSummary(e.stderr, res, o.Timeout, o.Summary, e.now().Sub(start), cancelCode); err != nil {
			return err
		}
	}
	if o.Detach && !o.JSON {
		// The job id alone on stdout, for scripts (id=$(tether exec
		// --detach ...)); the rest goes to stderr.
		started := false
		for _, r := range res.Results {
			if r.Detached {
				started = true
				fmt.Fprintf(e.stderr, "tether: job %s started detached on node %s; see: tether job status %s\n", res.ID, r.Node, res.ID)
			}
		}
		if started {
			fmt.Fprintln(e.stdout, res.ID)
		}
	}
	if interrupted {
		code = interruptCode(ctx)
	}
	if code == exitOK {
		return nil
	}
	return &exitError{code: code}
}

// shownFailure is r.Failure as the terminal shows it: NeMo Gym's
// "Command failed (exec on NODE) with exit code N:" and the command,
// without the stderr tail the message ends with when that stderr was just
// streamed to the terminal in full (a failed command's stderr is printed
// once, issue 13). A stderr cut at the output limit has no tail in the
// message (the agent sends nothing past the limit): the coordinator says
// so there instead, and that note is shown. --json keeps the whole
// message.
func shownFailure(req *protocol.ExecRequest, r *protocol.NodeResult) string {
	if stderrStreamed(r) {
		p := req.Params(0)
		head := protocol.FailureMessage(r.Node, &p, r, nil)
		if strings.HasPrefix(r.Failure, head) {
			return strings.TrimRight(head, "\n")
		}
	}
	return strings.TrimRight(r.Failure, "\n")
}

// stderrStreamed reports whether the node's whole stderr reached the
// terminal as it was produced.
func stderrStreamed(r *protocol.NodeResult) bool { return r.StderrBytes > 0 && !r.StderrTruncated }

// execOutcome maps a result to the exit code and the messages for stderr.
// single is true for a --node job; timeout is the requested per-node
// timeout, if any. A multi-node job's failed nodes are listed by its
// summary table instead, so only truncation notes are returned for them.
//
// Single node: the node's code (nodeOutcome), or exitTruncated when it is 0
// and an output was truncated. Several nodes: exitFailure when any node
// failed, else exitTruncated when any output was truncated, else exitOK.
//
// limit is --output-limit (0: the agent's default), named by the notes
// of truncated outputs.
func execOutcome(single bool, timeout time.Duration, limit int64, res *protocol.ExecResult) (int, []string) {
	inForce := "the agent's"
	if limit > 0 {
		inForce = formatSize(limit)
	}
	if single && len(res.Results) != 1 {
		return exitTether, []string{fmt.Sprintf("job %s: expected one node's result, got %d", res.ID, len(res.Results))}
	}
	code := exitOK
	truncated := false
	var lines []string
	for i := range res.Results {
		r := &res.Results[i]
		for _, s := range []struct {
			name      string
			truncated bool
			n         int64
		}{{"stdout", r.StdoutTruncated, r.StdoutBytes}, {"stderr", r.StderrTruncated, r.StderrBytes}} {
			if s.truncated {
				lines = append(lines, fmt.Sprintf("node %s: %s was truncated at the output limit in force, %s (%d bytes produced); raise --output-limit (1GiB, unlimited) to get it all", r.Node, s.name, inForce, s.n))
			}
		}
		truncated = truncated || r.OutputTruncated()
		if r.OutputCut {
			lines = append(lines, fmt.Sprintf("node %s: output cut: the command exited but a process it left behind kept its output open past the agent's --pipe-wait, so its process group was killed and output after that was lost", r.Node))
		}
		nodeCode, msg := nodeOutcome(r, timeout)
		// A single node's plain exit code speaks for itself (its failure
		// text was printed), as with ssh.
		plainExit := r.Error == "" && !r.TimedOut && !r.Cancelled && r.Signal == ""
		if single && msg != "" && !plainExit {
			// printable: the message may repeat the client's bytes (a
			// cwd, a program name) unquoted, from an older agent.
			lines = append(lines, fmt.Sprintf("node %s: %s", r.Node, printable(msg)))
		}
		switch {
		case single:
			code = nodeCode
		case nodeCode != exitOK:
			code = exitFailure
		}
	}
	if code == exitOK && truncated {
		code = exitTruncated
	}
	return code, lines
}

// nodeOutcome is one node's exit code as a single-node job would report it,
// and a description when it did not succeed (without the node's name): the
// command's own code, 124 for a timeout, 130 for a cancel, 126 and 127 for
// a command the node could not execute or find, and exitTether when Tether
// failed or refused (the coordinator shut down, the caller's access was
// revoked while it ran, the tunnel was lost, a bad cwd, an internal
// error).
func nodeOutcome(r *protocol.NodeResult, timeout time.Duration) (int, string) {
	switch {
	case r.ErrorCode == protocol.ResultCodeShutdown, r.ErrorCode == protocol.ResultCodeRevoked:
		// Tether stopped it (a shutdown; the caller's access revoked
		// while it ran), not the user.
		return exitTether, r.Error
	case r.TimedOut:
		d := timeout
		if d <= 0 {
			d = time.Duration(r.DurationMS * float64(time.Millisecond)).Round(time.Millisecond)
		}
		return exitTimedOut, fmt.Sprintf("timed out after %v", d)
	case r.Cancelled && r.Error == "":
		return exitInterrupted, "cancelled"
	case r.Error != "":
		msg := r.Error
		if r.ErrorCode != "" {
			msg += " (" + r.ErrorCode + ")"
		}
		switch {
		case r.Cancelled:
			return exitInterrupted, msg
		case r.ErrorCode == protocol.CodeCommandNotFound:
			return exitNotFound, msg
		case r.ErrorCode == protocol.CodeNotExecutable:
			return exitNotExecutable, msg
		}
		return exitTether, msg
	case r.Signal != "":
		return r.ExitCode, fmt.Sprintf("killed by signal %s (exit code %d)", r.Signal, r.ExitCode)
	case r.ExitCode != 0:
		return r.ExitCode, fmt.Sprintf("exit code %d", r.ExitCode)
	}
	return exitOK, ""
}

// errorInfoCode is the exit code of an operation the agent refused with an
// error frame of code (protocol.ErrorInfo.Code): 127 and 126 for a command
// it could not find or execute, as a shell reports them, else exitTether.
func errorInfoCode(code string) int {
	switch code {
	case protocol.CodeCommandNotFound:
		return exitNotFound
	case protocol.CodeNotExecutable:
		return exitNotExecutable
	}
	return exitTether
}

// execStream runs req on its node with stdin streamed to the command
// (client.ExecStream). An *os.File is read through a stdinReader, whose
// read ExecStream can interrupt once the command exited; a standard input
// that is not open reads as empty.
func execStream(ctx context.Context, c *client.Client, req *protocol.ExecRequest, stdin io.Reader, kind stdinKind, opts client.ExecOptions) (*protocol.ExecResult, error) {
	if kind == stdinNone {
		return c.ExecStream(ctx, req, strings.NewReader(""), opts)
	}
	if _, ok := stdin.(*os.File); !ok {
		return c.ExecStream(ctx, req, stdin, opts)
	}
	in, stop, err := newStdinReader(stdin)
	if err != nil {
		return nil, err
	}
	defer in.close()
	defer stop()
	return c.ExecStream(ctx, req, in, opts)
}

// repeatedString is a string flag that keeps every value it is given
// (all), for a command to refuse a second one; p holds the last.
type repeatedString struct {
	p   *string
	all *[]string
}

func (r *repeatedString) String() string {
	if r.p == nil {
		return ""
	}
	return *r.p
}

func (r *repeatedString) Set(s string) error {
	*r.p = s
	*r.all = append(*r.all, s)
	return nil
}

func (r *repeatedString) Type() string { return "string" }

// quotedList is vs quoted and joined by ", ".
func quotedList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ", ")
}
