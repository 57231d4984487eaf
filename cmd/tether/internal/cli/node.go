package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/protocol"
)

func newNodeCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Manage node identities (tether node revoke)",
		Args:  cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			cmd.Help()
			return usage(errors.New("a subcommand is required"))
		}),
	}
	var nats natsOptions
	var asJSON bool
	revoke := &cobra.Command{
		Use:   "revoke NODE",
		Short: "Revoke a node's certificates and cut its session",
		Long: `Revoke every certificate issued to NODE: its session is closed at once (on
whichever coordinator holds it), and the certificates are refused for
reconnecting and for renewal from then on. The revocation is kept in the
coordinators' JetStream KV. To re-admit the node, create a new join token
(tokens created before the revocation cannot enroll it) and restart its
agent with it. Needs the admin right in the coordinator's policy.`,
		Args: cobra.ExactArgs(1),
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			if err := protocol.ValidNodeID(args[0]); err != nil {
				return usage(err)
			}
			c, closeNC, err := nats.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			resp, err := c.RevokeNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, resp)
			}
			session := "it had no session on this coordinator"
			if resp.SessionClosed {
				session = "its session was closed"
			}
			_, err = fmt.Fprintf(e.stdout, "node %s revoked: %d certificate(s) refused from now on; %s\n", resp.Node, len(resp.Serials), session)
			return err
		}),
	}
	revoke.Flags().BoolVar(&asJSON, "json", false, "print the API's JSON response")
	nats.addFlags(revoke)
	cmd.AddCommand(clientCommand(revoke))
	return cmd
}
