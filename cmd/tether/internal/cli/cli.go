package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// version is the release version, set at build time with
// -ldflags "-X github.com/tetherfleet/tether/cmd/tether/internal/cli.version=v1.2.3".
var version = "dev"

// Exit codes shared by several commands (see the package doc and the
// README's table).
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	// exitTimedOut: the timeout killed the remote command (coreutils
	// timeout(1)'s code).
	exitTimedOut = 124
	// exitNotExecutable and exitNotFound: the command exists but cannot
	// be executed, or does not exist (a shell's codes).
	exitNotExecutable = 126
	exitNotFound      = 127
	exitInterrupted   = 130
	// exitTruncated: the command succeeded but output past the output
	// limit was dropped.
	exitTruncated = 254
	// exitTether: Tether itself failed (ssh's 255): no coordinator, the
	// node is not connected, the tunnel was lost, the coordinator shut
	// down, an internal error. Client commands end with it for any error
	// that is not a usage error or a code they chose.
	exitTether = 255
)

// tetherFailures is the annotation that marks a client command (and its
// subcommands): an error ends it with exitTether instead of exitFailure.
const tetherFailures = "tether/failure-exit"

// clientCommand marks cmd as a client command (see tetherFailures) and
// returns it.
func clientCommand(cmd *cobra.Command) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[tetherFailures] = "255"
	return cmd
}

// failureCode is the exit code of an error of cmd that carries none:
// exitTether for client commands, exitFailure for the others.
func failureCode(cmd *cobra.Command) int {
	for c := cmd; c != nil; c = c.Parent() {
		if c.Annotations[tetherFailures] != "" {
			return exitTether
		}
	}
	return exitFailure
}

// Run runs the tether command line with args (without the program name) and
// returns the process exit code. Errors are printed to stderr as
// "tether: <error>". ctx ending (SIGINT, SIGTERM) stops daemons cleanly and
// cancels client operations.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(ctx, args, &env{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv, now: time.Now})
}

// env is what commands may use of the process: its streams, its environment
// and its clock. Tests substitute all of them.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time
	// reached is set once a command's RunE starts: an error before it is a
	// usage error (unknown command, bad flag, wrong arguments).
	reached bool
	// registry, when set, makes the registry `tether dev` registers its
	// metrics on and serves (tests record what registers); nil is
	// newRegistry.
	registry func() metricsRegistry
	// natsDefaultDataDir, when set, is the nats commands' default
	// --data-dir (tests; "" is the coordinator's, natsDataDir).
	natsDefaultDataDir string
	// natsRefused ends the command's context (run) when its NATS server
	// refused it a subscription or publish (natsOptions.connect): every
	// wait ends then, and run reports the refusal instead of what the
	// command saw. Nil outside run.
	natsRefused context.CancelCauseFunc
}

// exitError ends Run with code. A nil err prints nothing (the command has
// already reported, e.g. a remote exit code).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageError marks a problem with the command line: exit code 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usage wraps err (which may be a joined list) as a usage error; nil stays nil.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{err}
}

func run(ctx context.Context, args []string, e *env) int {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	e.natsRefused = cancel
	root := newRootCmdFor(e, args)
	root.SetArgs(args)
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	e.initCompletionCmd(root, args)
	cmd, err := root.ExecuteContextC(ctx)
	var refused *natsRefusedError
	if errors.As(context.Cause(ctx), &refused) {
		// What the command then saw (a request that ended, "interrupted")
		// follows from this.
		printError(e.stderr, refused)
		return exitTether
	}
	if err == nil {
		return exitOK
	}
	if brokenStdout(ctx, err) {
		return exitBrokenPipe
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			printError(e.stderr, ee.err)
		}
		return ee.code
	}
	var ue *usageError
	if errors.As(err, &ue) || !e.reached {
		printError(e.stderr, err)
		path := "tether"
		if cmd != nil {
			path = cmd.CommandPath()
		}
		fmt.Fprintf(e.stderr, "Run '%s --help' for usage.\n", path)
		return exitUsage
	}
	printError(e.stderr, err)
	return failureCode(cmd)
}

// printError prints err as "tether: ..." with each line of a joined error on
// its own line.
func printError(w io.Writer, err error) {
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(w, "tether: %s\n", strings.TrimPrefix(line, "tether: "))
	}
}

// runE adapts a command body: it records that the command line was parsed.
func (e *env) runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		e.reached = true
		return fn(cmd, args)
	}
}

// topCommands are the top-level subcommands, in the order help lists them,
// each with its constructor. A run builds only the one it was asked for (see
// newRootCmdFor): building every subcommand's flags, defaults and help text
// costs a start-up that a one-shot command such as `tether exec` pays every
// time (issue 12). name must equal the Name() of what build returns, and
// no top-level command has aliases (TestTopCommandsTable checks both).
var topCommands = []struct {
	name  string
	build func(*env) *cobra.Command
}{
	{"version", newVersionCmd},
	{"coordinator", newCoordinatorCmd},
	{"agent", newAgentCmd},
	{"dev", newDevCmd},
	{"exec", func(e *env) *cobra.Command { return clientCommand(newExecCmd(e)) }},
	{"nodes", func(e *env) *cobra.Command { return clientCommand(newNodesCmd(e)) }},
	{"shell", func(e *env) *cobra.Command { return clientCommand(newShellCmd(e)) }},
	{"job", func(e *env) *cobra.Command { return clientCommand(newJobCmd(e)) }},
	{"cp", func(e *env) *cobra.Command { return clientCommand(newCpCmd(e)) }},
	{"forward", func(e *env) *cobra.Command { return clientCommand(newForwardCmd(e)) }},
	{"ssh-config", func(e *env) *cobra.Command { return clientCommand(newSSHConfigCmd(e)) }},
	{"ssh-proxy", func(e *env) *cobra.Command { return clientCommand(newSSHProxyCmd(e)) }},
	{"sandboxes", func(e *env) *cobra.Command { return clientCommand(newSandboxesCmd(e)) }},
	{"run-lease", func(e *env) *cobra.Command { return clientCommand(newRunLeaseCmd(e)) }},
	{"audit", func(e *env) *cobra.Command { return clientCommand(newAuditCmd(e)) }},
	{"policy", newPolicyCmd},
	{"config", newConfigCmd},
	{"token", newTokenCmd},
	{"node", newNodeCmd},
	{"nats", newNATSCmd},
}

// newRootCmd is the whole command tree (every subcommand built).
func newRootCmd(e *env) *cobra.Command { return newRootCmdFor(e, nil) }

// newRootCmdFor is the command tree that runs args: when args[0] names a
// top-level subcommand, the root holds only that one; otherwise (no
// arguments, a flag, help, cobra's hidden __complete, a misspelt command
// that wants suggestions) it holds all of them. Parsing, help and errors of
// the named command are the same either way: none of them looks at its
// siblings (TestLazyTreeSameHelp).
func newRootCmdFor(e *env, args []string) *cobra.Command {
	root := &cobra.Command{
		Use:   "tether",
		Short: "Run jobs on a fleet of nodes reached through their outbound tunnels",
		Long: `Tether runs jobs on nodes that are reachable only through the tunnels
their agents dial out to a coordinator. Jobs are submitted through NATS, with
this CLI or any NATS client.

Start everything locally with 'tether dev', then try 'tether exec --all -- uname -a'.` + rootBuildNote,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			cmd.Help()
			return usage(errors.New("a command is required"))
		}),
	}
	// A flag error on a command with subcommands (`tether exce --node n1`)
	// most likely comes from a mistyped subcommand whose flags its parent
	// lacks: name the unknown command, with suggestions, rather than the
	// flag. pflag keeps the positional words it parsed before the bad flag.
	// Otherwise an unknown flag gets the command's own flags' suggestion.
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		if cmd.HasSubCommands() {
			if uerr := suggestArgs(cmd, cmd.Flags().Args()); uerr != nil {
				return usage(uerr)
			}
		}
		return usage(suggestFlag(cmd, flagValueError(err)))
	})
	// `tether completion bash|zsh|fish|powershell` is cobra's own; the
	// live candidates come from registerCompletions. --version prints
	// what `tether version` does.
	root.CompletionOptions.HiddenDefaultCmd = false
	root.Version = version
	root.SetVersionTemplate(versionString() + "\n")
	defer e.registerCompletions(root)
	if len(args) > 0 {
		for _, c := range topCommands {
			if c.name == args[0] {
				root.AddCommand(c.build(e))
				// Nor cobra's completion command, which only the whole
				// tree reaches (`completion` is not in topCommands):
				// Execute would build it, its four shells' subcommands
				// and their help text on every run.
				root.CompletionOptions.DisableDefaultCmd = true
				return root
			}
		}
	}
	for _, c := range topCommands {
		root.AddCommand(c.build(e))
	}
	return root
}

// versionString is the version line of `tether version`.
func versionString() string {
	return fmt.Sprintf("tether %s (%s %s/%s)", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func newVersionCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: e.runE(func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(e.stdout, versionString())
			return err
		}),
	}
}

// logOptions are the logging flags of the daemon commands.
type logOptions struct {
	// Format is "text" (default; logfmt-like) or "json".
	Format string
	// Level is "debug", "info" (default), "warn" or "error".
	Level string
	// level is the level of the logger built by logger; setLevel changes
	// it while running (a config file's SIGHUP).
	level *slog.LevelVar
}

func defaultLogOptions() logOptions { return logOptions{Format: "text", Level: "info"} }

func (o *logOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.Format, "log-format", o.Format, "log format: text or json")
	cmd.Flags().StringVar(&o.Level, "log-level", o.Level, "log level: debug, info, warn or error")
}

// Validate reports every invalid logging option.
func (o *logOptions) Validate() error {
	var errs []error
	if o.Format != "text" && o.Format != "json" {
		errs = append(errs, fmt.Errorf("--log-format %q: want text or json", o.Format))
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(o.Level)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level %q: want debug, info, warn or error", o.Level))
	}
	return errors.Join(errs...)
}

// logger builds the slog logger writing to w. o must be valid.
func (o *logOptions) logger(w io.Writer) *slog.Logger {
	var l slog.Level
	l.UnmarshalText([]byte(o.Level))
	o.level = new(slog.LevelVar)
	o.level.Set(l)
	ho := &slog.HandlerOptions{Level: o.level}
	if o.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}
