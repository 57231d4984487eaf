package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// auditOptions are the flags of `tether audit`.
type auditOptions struct {
	// Since and Until bound the events' time: a duration back from now
	// ("1h", "30m") or an RFC 3339 time. Empty is unbounded.
	Since, Until string
	// Identity, Node, Operation, Result, Job and Source filter the events
	// (see protocol.AuditQueryRequest). An identity without "KIND:" is a
	// NATS user: alice is nats:alice. Source is an IP (every port) or
	// IP:PORT.
	Identity, Node, Operation, Result, Job, Source string
	// Limit is how many of the newest matching events to print. Default
	// 50.
	Limit int
	// JSON prints one protocol.AuditEvent per line instead of a table.
	JSON bool
	// Follow keeps printing new events as they come, until interrupted.
	Follow bool
	// Poll is how often Follow asks for new events.
	Poll time.Duration
	// NATS says how to reach the API.
	NATS natsOptions
}

// maxAuditPrint bounds --limit.
const maxAuditPrint = 100000

// query turns the options into the API's filters, relative to now.
func (o *auditOptions) query(now time.Time) (protocol.AuditQueryRequest, error) {
	var q protocol.AuditQueryRequest
	var errs []error
	var err error
	if q.Since, err = parseWhen(o.Since, now); err != nil {
		errs = append(errs, fmt.Errorf("--since: %w", err))
	}
	if q.Until, err = parseWhen(o.Until, now); err != nil {
		errs = append(errs, fmt.Errorf("--until: %w", err))
	}
	if q.Identity, err = identityFilter("--identity", o.Identity); err != nil {
		errs = append(errs, err)
	}
	if err := nodeFilter(o.Node); err != nil {
		errs = append(errs, err)
	}
	q.Node, q.Operation, q.Result, q.JobID, q.Source = o.Node, o.Operation, o.Result, o.Job, o.Source
	// A filter no event can match is a mistake, not "no matching events".
	// The names are the coordinator's: policy operations, and the audit
	// operations of requests no policy operation covers.
	if o.Operation != "" {
		if !slices.Contains(protocol.PolicyOperations(), o.Operation) && !slices.Contains(protocol.AuditOtherOperations(), o.Operation) {
			errs = append(errs, fmt.Errorf("--operation %q: want one of %s, or %s", o.Operation,
				strings.Join(protocol.PolicyOperations(), ", "), strings.Join(protocol.AuditOtherOperations(), ", ")))
		}
	}
	if o.Result != "" && !slices.Contains(protocol.AuditResults(), o.Result) {
		errs = append(errs, fmt.Errorf("--result %q: want one of %s", o.Result, strings.Join(protocol.AuditResults(), ", ")))
	}
	if o.Job != "" {
		if err := protocol.ValidJobID(o.Job); err != nil {
			errs = append(errs, fmt.Errorf("--job: %w", err))
		}
	}
	if o.Source != "" {
		_, err := netip.ParseAddr(o.Source)
		if _, perr := netip.ParseAddrPort(o.Source); err != nil && perr != nil {
			errs = append(errs, fmt.Errorf("--source %q: want an IP address, or IP:PORT ([IPv6]:PORT)", o.Source))
		}
	}
	if err := limitFlag(o.Limit, maxAuditPrint); err != nil {
		errs = append(errs, err)
	}
	if o.Follow && o.Until != "" {
		errs = append(errs, errors.New("--follow and --until do not go together"))
	}
	if o.Poll <= 0 {
		errs = append(errs, fmt.Errorf("--poll %s: want a positive duration", humanDuration(o.Poll)))
	}
	if len(errs) == 0 {
		if e := q.Validate(); e != nil {
			errs = append(errs, errors.New(e.Message))
		}
	}
	return q, errors.Join(errs...)
}

// parseWhen reads a duration back from now ("90m", "1h", or seconds as
// every duration flag takes them: "90") or an RFC 3339 time; "" is the
// zero time.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	d, durErr := parseDuration(s, 0, 0)
	if durErr == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q is negative: give how long ago, e.g. 1h", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		if _, numErr := strconv.ParseFloat(strings.TrimSpace(s), 64); numErr == nil || errors.Is(numErr, strconv.ErrRange) || looksNumeric(strings.TrimSpace(s)) {
			// A number or a duration that does not fit (1e10, NaN,
			// 1000000000h): say that, not "neither".
			return time.Time{}, durErr
		}
		return time.Time{}, fmt.Errorf("%q is neither a duration (1h, 30m, or seconds: 90) nor an RFC 3339 time (2026-12-01T15:04:05Z)", s)
	}
	return t, nil
}

func newAuditCmd(e *env) *cobra.Command {
	o := auditOptions{Limit: 50, Poll: time.Second}
	cmd := &cobra.Command{
		Use:   "audit [--since D|T] [--identity ID] [--node N] [--operation OP] [--source IP] [--json] [-f]",
		Short: "Show the audit log: who did what, where, and how it ended",
		Long: `Show the newest events of the coordinators' audit log, oldest first: every
operation (exec, cp, shell, forward, job, sandbox and node requests) and every
refusal, with the caller's identity, the nodes, the command's SHA-256 digest
(never its text or environment values), the result, exit code, duration and
bytes. Reading it needs the policy's admin operation.

--since and --until take a duration back from now (1h, 30m) or an RFC 3339
time. An identity without KIND: is a NATS user (alice means nats:alice).
Results are ok, failed, refused and error. SOURCE is where the call came
from as the coordinator saw it: the TCP peer IP:PORT of a facade, console
or jump host call, the client's IP the NATS server vouched for on a NATS
request; never an address a client wrote in a header.`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			q, err := o.query(e.now())
			if err != nil {
				return usage(err)
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			return runAudit(cmd.Context(), c, q, &o, e.stdout, e.stderr)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.Since, "since", "", "only events since this long ago (1h) or this RFC 3339 time")
	f.StringVar(&o.Until, "until", "", "only events until this long ago or this RFC 3339 time")
	f.StringVar(&o.Identity, "identity", "", "only events of this caller (KIND:NAME; a bare name is nats:NAME)")
	f.StringVar(&o.Node, "node", "", "only events on this node")
	f.StringVar(&o.Operation, "operation", "", "only this operation: a policy operation (exec, cp.read, cp.write, shell, forward, job.status, admin, ...), or stream or exec-alive")
	f.StringVar(&o.Result, "result", "", "only this result: ok, failed, refused or error")
	f.StringVar(&o.Job, "job", "", "only events of this job id")
	f.StringVar(&o.Source, "source", "", "only events from this address: an IP (any port) or IP:PORT")
	f.IntVar(&o.Limit, "limit", o.Limit, "print at most this many of the newest matching events")
	f.BoolVar(&o.JSON, "json", false, "print one JSON event per line")
	f.BoolVarP(&o.Follow, "follow", "f", false, "keep printing new events until interrupted")
	durationVar(f, &o.Poll, "poll", o.Poll, "with --follow, how often to ask for new events")
	o.NATS.addFlags(cmd)
	return cmd
}

// runAudit prints the newest o.Limit events matching q, oldest first, then
// with o.Follow the new ones as they come until ctx ends.
func runAudit(ctx context.Context, c *client.Client, q protocol.AuditQueryRequest, o *auditOptions, w, notices io.Writer) error {
	var evs []protocol.AuditEvent
	var last uint64 // the newest event in the log when we began
	q.Order = protocol.AuditNewestFirst
	for len(evs) < o.Limit {
		q.Limit = min(protocol.MaxAuditLimit, o.Limit-len(evs))
		resp, err := c.Audit(ctx, q)
		if err != nil {
			return err
		}
		if q.Cursor == 0 {
			last = resp.Last
		}
		evs = append(evs, resp.Events...)
		if resp.Next == 0 {
			break
		}
		q.Cursor = resp.Next
	}
	slices.Reverse(evs)
	p := &auditPrinter{w: w, json: o.JSON}
	if err := p.print(evs); err != nil {
		return err
	}
	if !o.Follow {
		if len(evs) == 0 && !o.JSON {
			// A notice, not data: on stderr, so that a script reading
			// the events reads none.
			fmt.Fprintln(notices, "tether: no matching audit events")
		}
		return nil
	}
	// Follow: oldest first from after the newest event of the log when
	// the first page was read (that page had all events up to it).
	q.Order, q.Cursor, q.Limit = protocol.AuditOldestFirst, last+1, protocol.MaxAuditLimit
	t := time.NewTicker(o.Poll)
	defer t.Stop()
	for {
		resp, err := c.Audit(ctx, q)
		if ctx.Err() != nil {
			return nil // interrupted: the normal end of --follow
		}
		if err != nil {
			return err
		}
		if err := p.print(resp.Events); err != nil {
			return err
		}
		if resp.Next > 0 {
			q.Cursor = resp.Next
		}
		if len(resp.Events) == q.Limit {
			continue // more are waiting
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// auditPrinter prints events as a table (its header once), every cell
// printable, or JSON lines.
type auditPrinter struct {
	w      io.Writer
	json   bool
	header bool
}

func (p *auditPrinter) print(evs []protocol.AuditEvent) error {
	if p.json {
		enc := json.NewEncoder(p.w)
		for i := range evs {
			if err := enc.Encode(&evs[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if len(evs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
	if !p.header {
		fmt.Fprintln(tw, "TIME\tIDENTITY\tSOURCE\tOPERATION\tNODES\tRESULT\tEXIT\tDURATION\tDETAIL")
		p.header = true
	}
	for i := range evs {
		ev := &evs[i]
		exit := "-"
		if ev.ExitCode != nil {
			exit = strconv.Itoa(*ev.ExitCode)
		}
		writeRow(tw, ev.Time.Local().Format("2006-01-02 15:04:05"), dash(ev.Identity), dash(ev.Source), ev.Operation, auditNodes(ev),
			ev.Result, exit, formatMS(ev.DurationMS), auditDetail(ev))
	}
	return tw.Flush()
}

// auditNodes renders an event's nodes: the list, up to three, else a count.
func auditNodes(ev *protocol.AuditEvent) string {
	switch {
	case len(ev.Nodes) == 0:
		return dash(ev.Target)
	case len(ev.Nodes) <= 3 && ev.NodesTotal == 0:
		return strings.Join(ev.Nodes, ",")
	}
	return fmt.Sprintf("%s,… (%d nodes)", strings.Join(ev.Nodes[:2], ","), max(len(ev.Nodes), ev.NodesTotal))
}

// auditDetail is what the event is about, in a few words: the command
// (program and digest prefix), paths, target, job, bytes, and why it was
// refused or failed.
func auditDetail(ev *protocol.AuditEvent) string {
	var parts []string
	if c := ev.Command; c != nil {
		s := c.Mode
		if c.Program != "" {
			s = c.Program
		}
		if len(c.SHA256) >= 12 {
			s += " sha256:" + c.SHA256[:12]
		}
		parts = append(parts, s)
	}
	if len(ev.Paths) > 0 {
		parts = append(parts, strings.Join(ev.Paths, ","))
	}
	if ev.Target != "" && len(ev.Nodes) > 0 {
		parts = append(parts, "target "+ev.Target)
	}
	if ev.JobID != "" {
		parts = append(parts, "job "+ev.JobID)
	}
	if ev.Run != "" {
		parts = append(parts, "run "+ev.Run)
	}
	if ev.RunAs != "" {
		parts = append(parts, "as "+ev.RunAs)
	}
	if ev.BytesIn > 0 {
		parts = append(parts, "in "+formatCount(ev.BytesIn))
	}
	if ev.BytesOut > 0 {
		parts = append(parts, "out "+formatCount(ev.BytesOut))
	}
	switch {
	case ev.Reason != "":
		parts = append(parts, ev.Reason+": "+ev.Error)
	case ev.ErrorCode != "":
		parts = append(parts, ev.ErrorCode)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

// formatMS renders a duration in milliseconds coarsely: "850µs", "12ms",
// "3.2s", "5m10s".
func formatMS(ms float64) string {
	d := time.Duration(ms * float64(time.Millisecond))
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// formatCount renders a byte count: "512B", "1.5Ki".
func formatCount(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10) + "B"
	}
	return formatBytes(uint64(n))
}
