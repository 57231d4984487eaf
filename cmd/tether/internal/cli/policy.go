//go:build !tetherclient

package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/policy"
)

func newPolicyCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Check the coordinator's authorization policy file",
		Long: `The policy file maps identities (NATS users and accounts, facade client
certificates and tokens) to what they may do on which nodes, as which local
user, and to their limits. Everything it does not grant is refused. The
README's "Policy" section and deploy/policy.example.yaml show the format.`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			cmd.Help()
			return usage(errors.New("a subcommand is required: check"))
		}),
	}
	var local bool
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a policy file: report every error, with its line and column",
		Long: `Check parses FILE as the coordinator would load it and prints a summary, or
every error found (FILE:LINE:COLUMN: field: problem) and exits 1. Warnings
(an unused role, an identity that grants nothing) go to stderr and do not
change the exit code. With --local, FILE is a node's local policy, checked
as tether agent --local-policy loads it (README "Local policy").`,
		Args: cobra.ExactArgs(1),
		RunE: e.runE(func(_ *cobra.Command, args []string) error {
			if local {
				lp, err := localpolicy.Load(args[0])
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(e.stdout, "%s: ok: a local policy, %d user %s, %d copy %s\n", args[0],
					len(lp.Users), plural(len(lp.Users), "entry", "entries"), len(lp.CopyRoots), plural(len(lp.CopyRoots), "root", "roots"))
				return err
			}
			p, err := policy.Load(args[0])
			if err != nil {
				if _, lerr := localpolicy.Load(args[0]); lerr == nil {
					// Every key "unknown" would say nothing useful.
					return fmt.Errorf("%s is a node's local policy, not the coordinator's; check it with tether policy check --local %s", args[0], args[0])
				}
				return err
			}
			for _, w := range p.Warnings() {
				fmt.Fprintf(e.stderr, "tether: warning: %s\n", w)
			}
			ids, roles, rules := p.Counts()
			_, err = fmt.Fprintf(e.stdout, "%s: ok: %d %s, %d %s, %d %s\n", args[0],
				ids, plural(ids, "identity", "identities"), roles, plural(roles, "role", "roles"), rules, plural(rules, "rule", "rules"))
			return err
		}),
	}
	check.Flags().BoolVar(&local, "local", false, "check FILE as a node's local policy (tether agent --local-policy)")
	cmd.AddCommand(check)
	return cmd
}
