//go:build !tetherclient

package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/tetherfleet/tether/internal/yamlerr"
)

func newConfigCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check and write the agent's and coordinator's config files",
		Long: `tether agent and tether coordinator read a YAML config file given with
--config FILE or $` + configEnv + `. Its keys are the command's flag names without
the dashes (log-level: debug); a group joins with a dash (log: {level: debug}
is log-level). Unknown keys and values of the wrong type are errors naming the
line. Flags on the command line override the file, the environment variables
that stand for secrets ($` + tokenEnv + `, ...) override it too; secrets are
never written in the file, only the paths of the files that hold them.
SIGHUP re-reads the file: limits and the policy apply at once, without
dropping sessions; a changed listener, directory or identity is logged and
waits for a restart.`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			cmd.Help()
			return usage(errors.New("a subcommand is required: validate or example"))
		}),
	}
	var role string
	validate := &cobra.Command{
		Use:   "validate [--role agent|coordinator] FILE",
		Short: "Check a config file as the daemon would load it: every error, with its line",
		Long: `Validate parses FILE as tether agent or tether coordinator would (the role
from --role, else the file's role: key), checks the settings as the daemon
does before it starts, and prints "FILE: ok (ROLE)", or every error
(FILE:LINE: key KEY: problem) and exits 1. Environment variables the daemon
would read ($` + tokenEnv + `, ...) count as they are set for this command.`,
		Args: cobra.ExactArgs(1),
		RunE: e.runE(func(_ *cobra.Command, args []string) error {
			r, err := configRoleFor(role, args[0])
			if err != nil {
				return err
			}
			if err := validateConfigFile(e, r, args[0]); err != nil {
				return err
			}
			_, err = fmt.Fprintf(e.stdout, "%s: ok (%s)\n", args[0], r.name)
			return err
		}),
	}
	validate.Flags().StringVar(&role, "role", "", "agent or coordinator (default: the file's role: key)")
	var exRole string
	example := &cobra.Command{
		Use:   "example --role agent|coordinator",
		Short: "Print a complete, commented config file for a role",
		Long: `Example prints a config file with every key of the role: the ones a
deployment sets, with example values, and every other one commented out with
its default and its help. It passes tether config validate as printed once
the files it names exist (validate loads the coordinator's policy).`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(_ *cobra.Command, _ []string) error {
			r := configRoles[exRole]
			if r == nil {
				return usage(fmt.Errorf("--role %q: want agent or coordinator", exRole))
			}
			_, err := fmt.Fprint(e.stdout, configExample(e, r))
			return err
		}),
	}
	example.Flags().StringVar(&exRole, "role", "", "agent or coordinator (required)")
	cmd.AddCommand(validate, example)
	return cmd
}

// configRoleFor is the role of --role, else of the file's role: key. No
// role is a usage error. A file that does not parse, or whose role: key is
// not one role, is the file's error (with its line): the problem is the
// file, not the command line.
func configRoleFor(flag, path string) (*configRole, error) {
	if flag != "" {
		r := configRoles[flag]
		if r == nil {
			return nil, usage(fmt.Errorf("--role %q: want agent or coordinator", flag))
		}
		return r, nil
	}
	data, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	// The role is looked up in the node tree, which holds duplicate keys
	// and everything else a full parse then reports with its line.
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlerr.Syntax(path, data, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(root.Content); i += 2 {
			k, v := root.Content[i], root.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Value != "role" {
				continue
			}
			if v.Kind != yaml.ScalarNode || v.Tag != "!!str" || configRoles[v.Value] == nil {
				return nil, fmt.Errorf("%s:%d: key role: want agent or coordinator", path, k.Line)
			}
			return configRoles[v.Value], nil
		}
	}
	return nil, usage(fmt.Errorf("%s names no role (role: agent or role: coordinator): give --role", path))
}

// validateConfigFile loads path as role r's daemon would, on a fresh
// command with no flags, and validates the options it yields.
func validateConfigFile(e *env, r *configRole, path string) error {
	cmd, opts := r.newCmd(e)
	s := &configSource{path: path, role: r, e: e, cmd: cmd, cli: map[string][]string{}, envSet: map[string]bool{}}
	for _, v := range r.envFirst {
		s.envSet[v] = e.getenv(v) != ""
	}
	cf, err := s.read(cmd.Flags())
	if cf == nil {
		return err
	}
	s.file = cf
	err = errors.Join(err, cf.annotate(r.validate(opts, func(v string) bool { return s.getenv(e, v) != "" })))
	if r.load != nil {
		err = errors.Join(err, r.load(opts, cf))
	}
	return err
}

// exampleValues are the keys each role's example sets, with their values;
// every other key is printed commented out with its default.
var exampleValues = map[string][][2]string{
	"agent": {
		{"coordinator", "[coordinator-1.example.internal:7443, coordinator-2.example.internal:7443]"},
		{"token-file", "/etc/tether/join-token"},
		{"ca-file", "/etc/tether/ca.crt"},
		{"node-id", "gpu-07"},
		{"labels", "zone=a,gpu=a100,pool=train"},
		{"data-dir", "/var/lib/tether/agent"},
		{"metrics-addr", "127.0.0.1:9469"},
		{"local-policy", "/etc/tether/agent-policy.yaml"},
		{"log-format", "json"},
	},
	"coordinator": {
		{"data-dir", "/var/lib/tether"},
		{"listen", ":7443"},
		{"http-addr", "127.0.0.1:7080"},
		{"policy", "/etc/tether/policy.yaml"},
		{"tls-host", "[coordinator-1.example.internal]"},
		{"max-handshakes-per-source", "8"},
		{"exec-timeout", "1h"},
		{"log-format", "json"},
	},
}

// reloadNote is what the example of each role says SIGHUP does with
// the keys not marked live.
var reloadNote = map[string]string{
	"agent": `SIGHUP re-reads the file; keys marked "live" apply at once, the others at
# the next restart.`,
	"coordinator": `SIGHUP re-reads the file; keys marked "live" apply at once. A change of
# any other key cannot apply at run time: the reload is refused, naming
# it, and nothing changes; restart the coordinator to apply it.`,
}

// configExample is the commented example config file of role r: every key
// of its command (flags in the order the command defines them), the ones
// of exampleValues set, the others commented out with their defaults.
func configExample(e *env, r *configRole) string {
	cmd, _ := r.newCmd(e)
	set := map[string]string{}
	for _, kv := range exampleValues[r.name] {
		set[kv[0]] = kv[1]
	}
	var b strings.Builder
	fmt.Fprintf(&b, `# tether %s config file (tether %s --config FILE, or $%s).
# Check it with: tether config validate FILE
#
# Keys are the flags of 'tether %s --help' without the dashes. Flags given
# on the command line override this file; so do the environment variables
# that carry secrets. Secrets never go in this file: give the path of the
# file that holds each one (the *-file keys), or the environment variable
# that does (token: {env: VARIABLE}).
# %s
role: %s
`, r.name, r.name, configEnv, r.name, reloadNote[r.name], r.name)
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == configFlag || f.Name == "help" {
			return
		}
		b.WriteString("\n")
		usage := f.Usage
		if f.Deprecated != "" {
			usage = "deprecated: " + f.Deprecated
		}
		if r.live[f.Name] {
			usage += " [live]"
		}
		for _, line := range wrapWords(usage, 76) {
			b.WriteString("# " + line + "\n")
		}
		if v, ok := set[f.Name]; ok {
			fmt.Fprintf(&b, "%s: %s\n", f.Name, v)
			return
		}
		fmt.Fprintf(&b, "# %s: %s\n", f.Name, yamlDefault(f))
	})
	return b.String()
}

// yamlDefault is f's default as a YAML value.
func yamlDefault(f *pflag.Flag) string {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		var items []string
		for _, s := range sv.GetSlice() {
			items = append(items, strconv.Quote(s))
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	switch f.Value.Type() {
	case "string":
		return strconv.Quote(f.Value.String())
	case "duration":
		// durationFlag shows zero as "" (no "(default 0s)" in help); a
		// config file needs a value ("" would be YAML's null).
		if v := f.Value.String(); v == "" || v == "0s" {
			return "0s"
		}
	}
	return f.Value.String()
}

// wrapWords wraps s at width columns.
func wrapWords(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
