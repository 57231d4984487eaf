package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/protocol"
)

// sandboxesOptions are the flags of `tether sandboxes`.
type sandboxesOptions struct {
	Run, Node, State, Provider string
	// JSON prints the records as a JSON array instead of a table.
	JSON bool
	// Sync has every node list its gateways first, so the ledger is
	// current (it is refreshed every 30 s anyway).
	Sync bool
	NATS natsOptions
}

// Validate reports every invalid option.
func (o *sandboxesOptions) Validate() error {
	var errs []error
	if o.Run != "" {
		if err := protocol.ValidRunID(o.Run); err != nil {
			errs = append(errs, fmt.Errorf("--run: %w", err))
		}
	}
	if o.Node != "" {
		if err := protocol.ValidNodeID(o.Node); err != nil {
			errs = append(errs, fmt.Errorf("--node: %w", err))
		}
	}
	if o.State != "" && !protocol.ValidSandboxState(o.State) {
		errs = append(errs, fmt.Errorf("--state %q: want live, deleting, deleted, lost or leaked", o.State))
	}
	if o.Provider != "" && !protocol.ValidProvider(o.Provider) {
		errs = append(errs, fmt.Errorf("--provider %q: want %s or %s", o.Provider, protocol.ProviderOpenShell, protocol.ProviderOpenSandbox))
	}
	return errors.Join(errs...)
}

func newSandboxesCmd(e *env) *cobra.Command {
	var o sandboxesOptions
	cmd := &cobra.Command{
		Use:   "sandboxes [--run R] [--node N] [--state S] [--provider P] [--sync] [--json]",
		Short: "List the sandbox ledger: which run owns which sandbox on which node",
		Long: `List the coordinator's sandbox ledger. Records come from the OpenShell and
OpenSandbox facades, from the agents' inventories of their gateways and from
explicit registrations. States: live, deleting, deleted (kept a while),
lost (node unreachable too long), leaked (the reaper gave up; look at it).`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return usage(err)
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			if o.Sync {
				resp, err := c.SyncSandboxes(cmd.Context())
				if err != nil {
					return fmt.Errorf("sync: %w", err)
				}
				for _, p := range resp.Incomplete {
					where := "node " + p.Node
					if p.Target != "" {
						where += " gateway " + p.Target
					}
					fmt.Fprintf(e.stderr, "tether: warning: sync: %s not listed: %s\n", printable(where), printable(p.Error)) // a gateway's words
				}
			}
			sbs, err := c.Sandboxes(cmd.Context(), protocol.SandboxesListRequest{Run: o.Run, Node: o.Node, State: o.State, Provider: o.Provider})
			if err != nil {
				return err
			}
			if o.JSON {
				if sbs == nil {
					sbs = []protocol.SandboxInfo{}
				}
				// Named, as every list is ({"sandboxes": […]}, the
				// API's shape); a whole list, so no next cursor.
				return writeJSON(e.stdout, protocol.SandboxesListResponse{Sandboxes: sbs})
			}
			return writeSandboxesTable(e.stdout, sbs, e.now())
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.Run, "run", "", "only sandboxes of this run")
	f.StringVar(&o.Node, "node", "", "only sandboxes on this node")
	f.StringVar(&o.State, "state", "", "only sandboxes in this state (live, deleting, deleted, lost, leaked)")
	f.StringVar(&o.Provider, "provider", "", "only sandboxes of this provider (openshell, opensandbox)")
	f.BoolVar(&o.JSON, "json", false, "print the records as JSON: {\"sandboxes\": [...]}")
	f.BoolVar(&o.Sync, "sync", false, "have every node list its gateways first (the ledger is refreshed every 30s anyway)")
	o.NATS.addFlags(cmd)
	cmd.AddCommand(newSandboxesReapCmd(e))
	return cmd
}

// sandboxName is how a table shows a sandbox: workspace/name for OpenShell
// (what its API addresses), the id for OpenSandbox.
func sandboxName(s protocol.SandboxInfo) string {
	if s.Name != "" {
		ws := s.Workspace
		if ws == "" {
			ws = "default"
		}
		return ws + "/" + s.Name
	}
	return s.ID
}

func writeSandboxesTable(w io.Writer, sbs []protocol.SandboxInfo, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPROVIDER\tSANDBOX\tRUN\tSTATE\tAGE\tEXPIRES\tLAST SEEN")
	for _, s := range sbs {
		writeRow(tw, s.Node, s.Provider, sandboxName(s), dash(runOf(s)), s.State,
			formatAge(now, s.CreatedAt), formatExpiry(now, s), formatAge(now, s.LastSeen))
	}
	return tw.Flush()
}

// runOf is the run that owns s: its explicit owner, else its run label.
func runOf(s protocol.SandboxInfo) string {
	if s.Owner != "" {
		return s.Owner
	}
	return s.Run
}

// formatExpiry shows when s expires: the earlier of its gateway expiry and
// Tether's TTL, as "in 5m" or "5m ago"; "-" when neither is set.
func formatExpiry(now time.Time, s protocol.SandboxInfo) string {
	if s.State == protocol.SandboxDeleted {
		return "-"
	}
	exp := s.ExpiresAt
	if s.TTLMS > 0 && !s.CreatedAt.IsZero() {
		if t := s.CreatedAt.Add(time.Duration(s.TTLMS) * time.Millisecond); exp.IsZero() || t.Before(exp) {
			exp = t
		}
	}
	if exp.IsZero() {
		return "-"
	}
	if exp.After(now) {
		return "in " + formatAge(now, now.Add(-exp.Sub(now)))
	}
	return formatAge(now, exp) + " ago"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// reapOptions are the flags of `tether sandboxes reap`.
type reapOptions struct {
	Run    string
	DryRun bool
	JSON   bool
	NATS   natsOptions
}

func newSandboxesReapCmd(e *env) *cobra.Command {
	var o reapOptions
	cmd := &cobra.Command{
		Use:   "reap (--run R [--dry-run] | --dry-run) [--json]",
		Short: "Reap a run's sandboxes now, or show what the reaper would delete",
		Long: `With --run, close the run's lease and have the reaper delete every sandbox the
run owns now; with --dry-run, only show what would go and why. --dry-run
without --run shows every sandbox the reaper would delete (lease expired, TTL
passed, run closed, or unowned past the grace period), and what it waits for
when it cannot yet (node unreachable, inventory incomplete).`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			req := protocol.ReapRequest{Run: o.Run, DryRun: o.DryRun}
			if e := req.Validate(); e != nil {
				return usage(errors.New(strings.Replace(e.Message, "run is required unless dry_run is set", "--run is required unless --dry-run is given", 1)))
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			resp, err := c.Reap(cmd.Context(), req)
			if err != nil {
				return err
			}
			if o.JSON {
				return writeJSON(e.stdout, resp)
			}
			return writeReapTable(e.stdout, resp)
		}),
	}
	cmd.Flags().StringVar(&o.Run, "run", "", "the run whose sandboxes to reap")
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "only show what would be reaped")
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print the API's JSON response")
	o.NATS.addFlags(cmd)
	return cmd
}

func writeReapTable(w io.Writer, resp *protocol.ReapResponse) error {
	verb := "reaping"
	if resp.DryRun {
		verb = "would reap"
	}
	if len(resp.Candidates) == 0 {
		if resp.DryRun {
			_, err := fmt.Fprintln(w, "nothing would be reaped")
			return err
		}
		_, err := fmt.Fprintln(w, "nothing to reap")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tNODE\tPROVIDER\tSANDBOX\tRUN\tREASON\tWAITING FOR")
	for _, c := range resp.Candidates {
		writeRow(tw, verb, c.Sandbox.Node, c.Sandbox.Provider,
			sandboxName(c.Sandbox), dash(runOf(c.Sandbox)), c.Reason, dash(c.Blocked))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if resp.Omitted > 0 {
		_, err := fmt.Fprintf(w, "… and %d more (see tether sandboxes --run)\n", resp.Omitted)
		return err
	}
	return nil
}
