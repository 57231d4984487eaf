package cli

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/protocol"
)

// Shell completion (issue 13). `tether completion bash|zsh|fish|powershell`
// is cobra's own generator; the scripts it writes call the hidden
// `tether __complete ARGS...`, which answers from the functions registered
// here: node ids (--node, the NODE argument of shell, forward, ssh-proxy,
// node revoke and cp's NODE:PATH), label terms (--selector), job ids (the
// JOB-ID of job status|logs|wait|cancel), a node's targets (forward's
// TARGET) and job states (job list --state).
//
// The live values come from the fleet the command itself would use (its
// --nats-url, --nats-creds and --nats-context, else the environment and
// the dev credentials). A shell waits for completion on every Tab, so the
// lookup is bounded by completionTimeout in all and says nothing when no
// fleet answers: the user gets no candidates (and files where a path fits),
// never an error on the terminal.

// completionTimeout bounds one completion's connect and request together.
const completionTimeout = 1500 * time.Millisecond

// completionNATS is the connection options of cmd's own flags, as parsed
// by cobra for __complete.
func completionNATS(cmd *cobra.Command) natsOptions {
	var o natsOptions
	if f := cmd.Flag("nats-url"); f != nil {
		o.URL = f.Value.String()
	}
	if f := cmd.Flag("nats-creds"); f != nil {
		o.Creds = f.Value.String()
	}
	if f := cmd.Flag("nats-context"); f != nil {
		o.Context = f.Value.String()
	}
	return o
}

// completionClient connects as cmd would, within ctx: a short connect
// timeout and no reconnects, so that a missing fleet costs one refused
// dial. The caller calls the returned close.
func completionClient(ctx context.Context, cmd *cobra.Command, getenv func(string) string) (*client.Client, func(), error) {
	o := completionNATS(cmd)
	t, err := o.resolve(getenv)
	if err != nil {
		return nil, nil, err
	}
	timeout := completionTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	opts := []nats.Option{nats.Name("tether-cli-completion " + version), nats.Timeout(timeout), nats.NoReconnect()}
	if t.creds != "" {
		c, err := natsauth.ReadCreds(t.creds)
		if err != nil {
			return nil, nil, credsFileError(err, t.credsFrom)
		}
		opts = append(opts, c.Options()...)
	}
	nc, err := nats.Connect(t.url, opts...)
	if err != nil {
		return nil, nil, err
	}
	c := client.New(nc)
	c.RequestTimeout = timeout
	return c, func() { c.Close(); nc.Close() }, nil
}

// completer runs fetch against the live fleet within completionTimeout;
// any failure is no candidates.
func (e *env) completer(fetch func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
		defer cancel()
		c, closeNC, err := completionClient(ctx, cmd, e.getenv)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer closeNC()
		return fetch(ctx, c, cmd, args, toComplete)
	}
}

// nodeCandidates are the connected nodes' ids starting with prefix, each
// described by its labels.
func nodeCandidates(ctx context.Context, c *client.Client, prefix, suffix string) []string {
	ns, err := c.Nodes(ctx, "")
	if err != nil {
		return nil
	}
	var out []string
	for _, n := range ns {
		if !strings.HasPrefix(n.ID, prefix) {
			continue
		}
		out = append(out, n.ID+suffix+"\t"+labelText(n.Labels))
	}
	slices.Sort(out)
	return out
}

// labelText is labels as k=v,k=v, sorted, for a candidate's description.
func labelText(labels map[string]string) string {
	keys := slices.Sorted(maps.Keys(labels))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}

// completeNode completes a node id.
func completeNode(ctx context.Context, c *client.Client, _ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	return nodeCandidates(ctx, c, toComplete, ""), cobra.ShellCompDirectiveNoFileComp
}

// completeSelector completes the last term of a selector with the fleet's
// label terms (k=v) and keys (k, !k); the terms before the last comma are
// kept.
func completeSelector(ctx context.Context, c *client.Client, _ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	ns, err := c.Nodes(ctx, "")
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	head, last := "", toComplete
	if i := strings.LastIndexByte(toComplete, ','); i >= 0 {
		head, last = toComplete[:i+1], toComplete[i+1:]
	}
	seen := map[string]bool{}
	for _, n := range ns {
		for k, v := range n.Labels {
			for _, term := range []string{k + "=" + v, k + "!=" + v, k, "!" + k} {
				if strings.HasPrefix(term, last) {
					seen[head+term] = true
				}
			}
		}
	}
	// NoSpace: the user may go on with ",next".
	return slices.Sorted(maps.Keys(seen)), cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
}

// completeJobID completes a job id from the job records the caller may
// see (newest first, at most the list's default), each described by its
// state, nodes and command.
func completeJobID(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	req := protocol.JobListRequest{}
	if f := cmd.Flag("node"); f != nil {
		req.Node = f.Value.String()
	}
	resp, err := c.JobList(ctx, req)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, j := range resp.Jobs {
		if !strings.HasPrefix(j.ID, toComplete) {
			continue
		}
		desc := fmt.Sprintf("%s on %s", j.State, strings.Join(j.Nodes, ","))
		if j.Command != "" {
			desc += ": " + clipText(j.Command, 60)
		}
		out = append(out, j.ID+"\t"+desc)
	}
	// Keep the newest first, as the list answers: cobra's shells sort
	// anyway unless told to keep the order.
	return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveKeepOrder
}

// clipText is s on one line, at most n bytes (cut at a rune), for a
// candidate's description: shells show descriptions unquoted.
func clipText(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// completeForward completes forward's NODE, then that node's targets.
func completeForward(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	switch len(args) {
	case 0:
		return completeNode(ctx, c, cmd, args, toComplete)
	case 1:
		ns, err := c.Nodes(ctx, "")
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, n := range ns {
			if n.ID != args[0] {
				continue
			}
			for _, t := range n.Targets {
				if strings.HasPrefix(t, toComplete) {
					out = append(out, t)
				}
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
	return nil, cobra.ShellCompDirectiveNoFileComp
}

// completeFirstNode completes the first argument with a node id and
// leaves the rest (a remote command) alone.
func completeFirstNode(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return completeNode(ctx, c, cmd, args, toComplete)
}

// completeCpPath completes cp's SRC and DST: "NODE:" for a word that
// names no local path yet, local files otherwise.
func (e *env) completeCpPath(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) >= 2 || strings.ContainsAny(toComplete, ":/.~") {
		// A remote path needs the node's file system; a local one, the
		// shell's own file completion.
		return nil, cobra.ShellCompDirectiveDefault
	}
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	c, closeNC, err := completionClient(ctx, cmd, e.getenv)
	if err != nil {
		return nil, cobra.ShellCompDirectiveDefault
	}
	defer closeNC()
	out := nodeCandidates(ctx, c, toComplete, ":")
	if len(out) == 0 {
		return nil, cobra.ShellCompDirectiveDefault
	}
	return out, cobra.ShellCompDirectiveNoSpace
}

// registerCompletions attaches the completion functions to the commands
// of root that exist in this run (the tree may be partial, see
// newRootCmdFor), by their paths and flag names, so that the commands'
// own files need no completion code. Commands with subcommands get
// suggestArgs, so that a mistyped subcommand gets "did you mean".
func (e *env) registerCompletions(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.HasSubCommands() {
			c.Args = suggestArgs
			c.SuggestionsMinimumDistance = 2
		}
		for name, fn := range map[string]cobra.CompletionFunc{
			"node":     e.completer(completeNode),
			"selector": e.completer(completeSelector),
		} {
			if c.Flags().Lookup(name) != nil {
				// An error only says the flag has one already.
				_ = c.RegisterFlagCompletionFunc(name, fn)
			}
		}
		switch strings.TrimPrefix(c.CommandPath(), root.Name()+" ") {
		case "job status", "job logs", "job wait", "job cancel":
			c.ValidArgsFunction = e.completer(completeJobID)
		case "job list":
			_ = c.RegisterFlagCompletionFunc("state", completeJobState)
		case "forward":
			c.ValidArgsFunction = e.completer(completeForward)
		case "shell", "ssh-proxy", "node revoke":
			c.ValidArgsFunction = e.completer(completeFirstNode)
		case "cp":
			c.ValidArgsFunction = e.completeCpPath
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// initCompletionCmd adds cobra's completion command to root now, as
// cobra would on Execute (so call it once root has its output streams:
// the command keeps them), and gives it an Args check and a body of ours:
// a shell it writes no script for, or none, is a usage error naming the
// shells (cobra alone prints the command's help and exits 0).
func (e *env) initCompletionCmd(root *cobra.Command, args []string) {
	root.InitDefaultCompletionCmd(args...)
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		c.Args = completionShellArgs
		c.RunE = e.runE(func(cmd *cobra.Command, _ []string) error {
			return usage(fmt.Errorf("a shell is required: %s", completionShells(cmd)))
		})
	}
}

// completionShellArgs is the Args check of `tether completion`: its one
// argument, when given, must be a shell cobra writes a script for (one of
// its subcommands, which run instead when named). cobra alone prints the
// command's help and exits 0 for any other word.
func completionShellArgs(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) == 1:
		return usage(fmt.Errorf("unsupported shell %q: want %s", args[0], completionShells(cmd)))
	case len(args) > 1:
		return usage(fmt.Errorf("want one shell, got %d arguments: %s", len(args), completionShells(cmd)))
	}
	return nil
}

// completionShells lists the shells of the completion command cmd (its
// subcommands), sorted: "bash, fish, powershell or zsh".
func completionShells(cmd *cobra.Command) string {
	var shells []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			shells = append(shells, c.Name())
		}
	}
	slices.Sort(shells)
	if len(shells) < 2 {
		return strings.Join(shells, "")
	}
	return strings.Join(shells[:len(shells)-1], ", ") + " or " + shells[len(shells)-1]
}

// completeJobState completes the states `job list --state` takes.
func completeJobState(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	var out []string
	for _, s := range []protocol.JobState{protocol.JobQueued, protocol.JobDispatched, protocol.JobStateRunning, protocol.JobSucceeded, protocol.JobFailed, protocol.JobCancelled, protocol.JobStateLost} {
		if strings.HasPrefix(string(s), toComplete) {
			out = append(out, string(s))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// suggestArgs is the Args check of a command that takes no arguments but
// has subcommands: an unknown word is an "unknown command" with cobra's
// "Did you mean" suggestions (cobra.NoArgs gives none).
func suggestArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(quoteAll(s), " or ") + "?"
	}
	return errors.New(msg)
}

// flagValueError words pflag's refusal of a whole number, number or
// boolean flag's value in a user's terms (`--max-parallel "abc": want a
// whole number`), not with strconv's ("invalid argument "abc" for
// "--max-parallel" flag: strconv.ParseInt: parsing "abc": invalid
// syntax"). Other errors, among them the duration and size flags' own
// messages, are returned as they are.
func flagValueError(err error) error {
	var ive *pflag.InvalidValueError
	var ne *strconv.NumError
	if !errors.As(err, &ive) || !errors.As(err, &ne) {
		return err
	}
	f := ive.GetFlag()
	typ := f.Value.Type()
	if errors.Is(ne.Err, strconv.ErrRange) {
		if bits := strings.TrimLeft(typ, "uint"); intTypes().MatchString(typ) {
			n := 64
			if bits != "" {
				n, _ = strconv.Atoi(bits)
			}
			if strings.HasPrefix(typ, "u") {
				return fmt.Errorf("--%s %q: want a whole number from 0 to %d", f.Name, ive.GetValue(), uint64(1)<<n-1)
			}
			return fmt.Errorf("--%s %q: want a whole number from %d to %d", f.Name, ive.GetValue(), -(int64(1) << (n - 1)), int64(1)<<(n-1)-1)
		}
	}
	return fmt.Errorf("--%s %q: want %s", f.Name, ive.GetValue(), typeName(typ))
}

// suggestFlag adds "did you mean --timeout?" to err when it is pflag's
// unknown long flag (--tiemout) and cmd has flags (its own and inherited,
// hidden ones left out) within edit distance 2 of it, or that it is a
// prefix of; cobra suggests subcommands only. Any other err is returned
// as it is.
func suggestFlag(cmd *cobra.Command, err error) error {
	var ne *pflag.NotExistError
	if !errors.As(err, &ne) || ne.GetSpecifiedShortnames() != "" {
		return err
	}
	typed := ne.GetSpecifiedName()
	if typed == "" || !strings.HasPrefix(err.Error(), "unknown flag: --") {
		return err
	}
	best, bestD := []string(nil), 3
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(strings.ToLower(typed), f.Name)
		if d > 2 && len(typed) >= 3 && strings.HasPrefix(f.Name, typed) {
			d = 2 // "--time" for --timeout
		}
		switch {
		case d > 2:
		case d < bestD:
			best, bestD = []string{"--" + f.Name}, d
		case d == bestD && len(best) < 3:
			best = append(best, "--"+f.Name)
		}
	})
	if len(best) == 0 {
		return err
	}
	slices.Sort(best)
	return fmt.Errorf("%w; did you mean %s?", err, strings.Join(best, " or "))
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}
