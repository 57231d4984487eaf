package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// topCommands names each constructor's command, in the order of the
// help listing, and no top-level command has an alias that the lazy lookup
// in newRootCmdFor would miss.
func TestTopCommandsTable(t *testing.T) {
	e := &env{getenv: testGetenv(nil)}
	for _, c := range topCommands {
		cmd := c.build(e)
		if cmd.Name() != c.name {
			t.Errorf("topCommands entry %q builds a command named %q", c.name, cmd.Name())
		}
		if len(cmd.Aliases) != 0 {
			t.Errorf("command %q has aliases %q: newRootCmdFor would not find it by them", c.name, cmd.Aliases)
		}
	}
}

// A run of one subcommand builds only that subcommand; a run that could
// need any of them (no arguments, help, an unknown name) builds all.
func TestLazyTreeBuildsOnlyTheCommand(t *testing.T) {
	e := &env{getenv: testGetenv(nil)}
	for _, args := range [][]string{{"version"}, {"exec", "--node", "n", "--", "true"}, {"nats", "user", "list"}} {
		root := newRootCmdFor(e, args)
		var names []string
		for _, c := range root.Commands() {
			names = append(names, c.Name())
		}
		if len(names) != 1 || names[0] != args[0] {
			t.Errorf("tree for %q holds %q, want only %q", args, names, args[0])
		}
		// cobra's completion command (four subcommands with their help
		// text, built on every run that wants it) is reachable only
		// through the whole tree: `tether completion` is no top-level
		// name of ours.
		root.SetArgs(args)
		e.initCompletionCmd(root, args)
		root.InitDefaultCompletionCmd(args...) // what Execute does
		for _, c := range root.Commands() {
			if c.Name() == "completion" {
				t.Errorf("tree for %q builds cobra's completion command", args)
			}
		}
	}
	for _, args := range [][]string{nil, {"--help"}, {"help", "exec"}, {"exce"}, {"__complete", "ex"}} {
		if got, want := len(newRootCmdFor(e, args).Commands()), len(topCommands); got != want {
			t.Errorf("tree for %q holds %d commands, want all %d", args, got, want)
		}
	}
}

// Help, usage errors and flag errors of every command are the same from the
// one-command tree as from the whole tree: nothing a command prints looks at
// its siblings.
func TestLazyTreeSameOutput(t *testing.T) {
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		for _, sub := range c.Commands() {
			p := append(append([]string(nil), path...), sub.Name())
			paths = append(paths, p)
			walk(sub, p)
		}
	}
	walk(newRootCmd(&env{getenv: testGetenv(nil)}), nil)
	if len(paths) < len(topCommands) {
		t.Fatalf("walked %d commands, fewer than the %d top-level ones", len(paths), len(topCommands))
	}
	for _, path := range paths {
		if path[0] == "help" {
			continue // cobra's own, reached only through the whole tree
		}
		for _, extra := range [][]string{{"--help"}, {"--no-such-flag"}} {
			args := append(append([]string(nil), path...), extra...)
			lazy := runTree(t, newRootCmdFor, args)
			whole := runTree(t, func(e *env, _ []string) *cobra.Command { return newRootCmd(e) }, args)
			if lazy != whole {
				t.Errorf("tether %s: one-command tree says\n%s\nwhole tree says\n%s", strings.Join(args, " "), lazy, whole)
			}
		}
	}
}

// runTree parses and runs args on the tree that build makes, and returns
// its error and everything it printed.
func runTree(t *testing.T, build func(*env, []string) *cobra.Command, args []string) string {
	t.Helper()
	var out bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &out, getenv: testGetenv(nil)}
	root := build(e, args)
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&out)
	_, err := root.ExecuteContextC(context.Background())
	return out.String() + "\nerror: " + errString(err)
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
