package cli

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/protocol"
)

// nodesOptions are the flags of `tether nodes`.
type nodesOptions struct {
	// Selector filters nodes by label. Not given lists every node.
	Selector string
	// SelectorGiven is set when --selector was on the command line: an
	// empty one is then an error, not "every node".
	SelectorGiven bool
	// JSON prints the protocol.NodesResponse instead of a table.
	JSON bool
	// NATS says how to reach the API.
	NATS natsOptions
}

// Validate reports every invalid option.
func (o *nodesOptions) Validate() error {
	if o.SelectorGiven && o.Selector == "" {
		return fmt.Errorf("--selector is empty: leave it out to list every node")
	}
	if o.Selector != "" {
		if _, err := protocol.ParseSelector(o.Selector); err != nil {
			return fmt.Errorf("--selector: %w", err)
		}
	}
	return nil
}

func newNodesCmd(e *env) *cobra.Command {
	var o nodesOptions
	cmd := &cobra.Command{
		Use:   "nodes [--selector S] [--json]",
		Short: "List connected nodes",
		Args:  cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			o.SelectorGiven = cmd.Flags().Changed("selector")
			if err := o.Validate(); err != nil {
				return usage(err)
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			nodes, err := c.Nodes(cmd.Context(), o.Selector)
			if err != nil {
				return err
			}
			if o.JSON {
				if nodes == nil {
					nodes = []protocol.NodeInfo{}
				}
				return writeJSON(e.stdout, protocol.NodesResponse{Nodes: nodes, Total: len(nodes)})
			}
			return writeNodesTable(e.stdout, nodes, e.now())
		}),
	}
	cmd.Flags().StringVar(&o.Selector, "selector", "", "list only nodes matching this label selector")
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print the API's JSON response")
	o.NATS.addFlags(cmd)
	return cmd
}

// writeNodesTable prints nodes as an aligned table, every cell printable
// (what an agent reports: its id, labels, GPU model); ages are relative
// to now.
// STALLS is the session's window stalls and their total time, in both
// directions (a stream's writes waited for the other end to read: a slow
// link, a slow node or a slow client downstream), QUEUED the bytes of the
// frames the coordinator and the agent are writing to each other that the
// link has not taken yet; --json has each direction apart.
func writeNodesTable(w io.Writer, nodes []protocol.NodeInfo, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tLABELS\tCPUS\tMEMORY\tGPUS\tRTT\tSTALLS\tQUEUED\tCONNECTED\tLAST SEEN\tCOORDINATOR")
	for _, n := range nodes {
		writeRow(tw, n.ID, formatLabels(n.Labels), strconv.Itoa(n.Capacity.CPUs), formatBytes(n.Capacity.MemoryBytes),
			formatGPUs(n.Capacity), formatRTT(n.RTTMicros), formatStalls(n.WindowStalls+n.AgentWindowStalls, n.WindowStallSeconds+n.AgentWindowStallSeconds),
			formatQueued(n.SendQueuedBytes+n.AgentSendQueuedBytes), formatAge(now, n.ConnectedAt), formatAge(now, n.LastHeartbeat), n.Coordinator)
	}
	return tw.Flush()
}

// formatStalls renders a session's window stalls as count/total time
// ("3/1.25s"), "0" when none.
func formatStalls(n uint64, seconds float64) string {
	if n == 0 {
		return "0"
	}
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d < time.Millisecond:
		d = d.Round(time.Microsecond)
	case d < time.Second:
		d = d.Round(100 * time.Microsecond)
	default:
		d = d.Round(10 * time.Millisecond)
	}
	return fmt.Sprintf("%d/%s", n, d)
}

// formatQueued renders the bytes queued for a node, "0" when none.
func formatQueued(n int64) string {
	if n <= 0 {
		return "0"
	}
	return formatBytes(uint64(n))
}

// formatLabels renders labels as sorted k=v pairs, "-" when none.
func formatLabels(l map[string]string) string {
	if len(l) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + l[k]
	}
	return strings.Join(keys, ",")
}

// formatBytes renders a size in binary units ("15.6Gi"), "-" when unknown.
func formatBytes(n uint64) string {
	if n == 0 {
		return "-"
	}
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 5 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f%ci", v, "KMGTPE"[i])
}

func formatGPUs(c protocol.Capacity) string {
	if c.GPUs == 0 {
		return "0"
	}
	if c.GPUModel == "" {
		return fmt.Sprint(c.GPUs)
	}
	return fmt.Sprintf("%d×%s", c.GPUs, c.GPUModel)
}

// formatRTT renders the tunnel round trip, "-" when not measured yet.
func formatRTT(us int64) string {
	if us <= 0 {
		return "-"
	}
	d := time.Duration(us) * time.Microsecond
	switch {
	case d < time.Millisecond:
		return d.String()
	case d < time.Second:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// formatAge renders now-t coarsely: "45s", "12m", "3h", "2d"; "-" for a zero t.
func formatAge(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}
