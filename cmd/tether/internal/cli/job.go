package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// jobOptions are the flags of `tether job ...`.
type jobOptions struct {
	// Node is the node the detached job runs on; empty means look it up
	// in the coordinators' job store by the job id.
	Node string
	// JSON prints the job record as JSON (status, cancel, wait).
	JSON bool
	// Follow keeps polling the output until the job exited (logs).
	Follow bool
	// Poll is the --follow polling interval.
	Poll time.Duration
	NATS natsOptions
}

// Validate reports every invalid option; args are the positional
// arguments. What the API would refuse (a bad job id) is refused here, by
// the protocol's own rules (protocol.ValidJobID, the requests' Validate), so
// that nothing is sent.
func (o *jobOptions) Validate(args []string) error {
	var errs []error
	if o.Node != "" {
		if err := protocol.ValidNodeID(o.Node); err != nil {
			errs = append(errs, fmt.Errorf("--node: %w", err))
		}
	}
	if len(args) == 0 {
		errs = append(errs, errors.New("give the job id"))
	} else if len(args) > 1 {
		errs = append(errs, fmt.Errorf("give one job id, not %d arguments (%q …)", len(args), args[1]))
	} else if err := protocol.ValidJobID(args[0]); err != nil {
		errs = append(errs, err)
	}
	if o.Poll <= 0 || o.Poll > maxPoll {
		errs = append(errs, fmt.Errorf("--poll %s is out of range: want more than 0 and at most %s", humanDuration(o.Poll), humanDuration(maxPoll)))
	}
	if len(errs) == 0 && o.Node != "" {
		// Anything else the API checks (none today).
		for _, r := range []interface{ Validate() *protocol.APIError }{
			&protocol.JobRequest{Node: o.Node, ID: args[0]},
			&protocol.JobOutputRequest{Node: o.Node, ID: args[0], Stream: protocol.ReplyStdout},
		} {
			if e := r.Validate(); e != nil {
				return errors.New(e.Message)
			}
		}
	}
	return errors.Join(errs...)
}

func newJobCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "job",
		Short: "List, query, wait for, read and cancel jobs",
		Long: `A job started with 'tether exec --detach' runs in its own session on its node
and keeps its output in files there (up to the output limit), surviving the
tunnel. These commands reach it by job id; without --node they look its node
up in the coordinators' job store, which records every job the exec API
accepted (when the coordinator keeps one): 'list' lists those records,
'wait' waits for a job (attached or detached) to end and exits with its exit
code, 'status' shows its record, a node: line each with its exit code and
output sizes (a detached job's nodes asked for what the record lacks). Finished jobs' files are kept for the agent's job
retention (24 h by default). With --json, status, wait and cancel print the
job's record, in the words of 'list' (succeeded, failed, cancelled, lost…):
one JSON object with its nodes and, once they ended, their results.

A job on several nodes (exec --all or --selector) is reached by its id
alone: 'status' shows a node: line each, 'logs' prints every node's
output with each line prefixed "NODE | " (as exec prints a fan-out's),
'cancel' cancels every node's run (a node: line each); --node narrows any
of them to one node. 'wait' and 'logs --follow' of a fan-out end as exec
of it does: 0 when every node succeeded, 1 when any failed.

'logs --follow' keeps following while the node or the coordinator is
unreachable (the job outlives its agent: a restart or upgrade of the agent
loses no output), and ends with the job's exit code (124 when its timeout killed
it, 128+N when signal N did), 254 when it exited 0 but its output was
truncated at the output limit, and 255 when its outcome is unknown (lost).
Every job command exits 255 when Tether failed (no coordinator, node not
connected, no such job) and 2 for a usage error, a job id the API would
refuse included (1-64 characters of [A-Za-z0-9-_.], starting and ending with
a letter or digit): nothing is sent then.`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			cmd.Help()
			return usage(errors.New("a subcommand is required: list, status, wait, logs or cancel"))
		}),
	}
	cmd.AddCommand(
		newJobListCmd(e),
		newJobSubCmd(e, "wait", "Wait for a job to end; exit with its exit code", runJobWait),
		newJobSubCmd(e, "status", "Show a job's state, exit code and output sizes", runJobStatus),
		newJobSubCmd(e, "logs", "Print a detached job's stdout, then its stderr", runJobLogs),
		newJobSubCmd(e, "cancel", "Kill a detached job's process group", runJobCancel),
	)
	return cmd
}

func newJobSubCmd(e *env, name, short string, run func(ctx context.Context, c *client.Client, o *jobOptions, id string, e *env) error) *cobra.Command {
	o := jobOptions{Poll: time.Second}
	cmd := &cobra.Command{
		Use:   name + " [--node NODE] JOB-ID",
		Short: short,
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(args); err != nil {
				return usage(err)
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			err = run(cmd.Context(), c, &o, args[0], e)
			if err != nil && cmd.Context().Err() != nil {
				return interruptedError(cmd.Context())
			}
			return err
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.Node, "node", "", "the node the job runs on (default: looked up by the job id)")
	switch name {
	case "wait":
		f.BoolVar(&o.JSON, "json", false, "print the job's final record as JSON")
		boundedDurationVar(f, &o.Poll, "poll", o.Poll, 0, maxPoll, "how often to poll the job's record (at most "+humanDuration(maxPoll)+")")
	case "status", "cancel":
		f.BoolVar(&o.JSON, "json", false, "print the job's record as JSON (as job wait and job list do)")
	case "logs":
		f.BoolVar(&o.Follow, "follow", false, "keep printing new output until the job exited")
		boundedDurationVar(f, &o.Poll, "poll", o.Poll, 0, maxPoll, "how often --follow polls (at most "+humanDuration(maxPoll)+")")
	}
	o.NATS.addFlags(cmd)
	return cmd
}

// maxPoll bounds --poll: a longer interval would leave a wait or a follow
// unaware of the job's end for that long.
const maxPoll = time.Minute

// resolveNode fills o.Node from the job's record when --node was not
// given. It returns the record it read (nil with --node).
func resolveNode(ctx context.Context, c *client.Client, o *jobOptions, id string) (*protocol.JobRecord, error) {
	if o.Node != "" {
		return nil, nil
	}
	rec, err := c.JobGet(ctx, id)
	var ae *protocol.APIError
	if errors.As(err, &ae) && ae.Status == 404 {
		return nil, err // "no job ID" says it all
	}
	if err != nil {
		return nil, fmt.Errorf("look up job %s (give --node to ask its node directly): %w", id, err)
	}
	if len(rec.Nodes) != 1 {
		return rec, usage(fmt.Errorf("job %s ran on %d nodes; give --node", id, len(rec.Nodes)))
	}
	o.Node = rec.Nodes[0]
	return rec, nil
}

// runJobStatus prints job id's status in one layout whatever the job
// (printJobView): its record's lines, then a node: line for each node.
// A detached job's nodes that have no result in the record yet are asked
// (tether.v1.job.status, a few at a time), and the record is brought up to
// date with their answers (statusRecord), as --json prints it; with
// --node only that node is asked and shown. A node that cannot be asked
// is named on stderr and the command exits 255 after printing the rest;
// with --node (or a job on one node) its error is the command's.
func runJobStatus(ctx context.Context, c *client.Client, o *jobOptions, id string, e *env) error {
	var rec *protocol.JobRecord
	nodes := []string{o.Node}
	if o.Node == "" {
		var err error
		nodes, rec, err = jobNodes(ctx, c, o, id)
		if rec == nil {
			return err
		}
		if !rec.Detached || len(rec.Nodes) == 0 {
			// An attached job: its record is all there is (the agent
			// keeps no detached record of it).
			return printJobRecord(e.stdout, rec, o.JSON)
		}
		if len(rec.Nodes) > 1 {
			// A fan-out's nodes with a result have nothing to add.
			nodes = slices.DeleteFunc(slices.Clone(nodes), func(n string) bool {
				return slices.ContainsFunc(rec.Results, func(r protocol.NodeResult) bool { return r.Node == n })
			})
		}
	}
	sts, errs := jobStatuses(ctx, c, id, nodes)
	if one := rec == nil || len(rec.Nodes) == 1; one && errs[0] != nil {
		return errs[0] // as a --node job's status always said it
	}
	failed := 0
	for i, err := range errs {
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			failed++
			fmt.Fprintf(e.stderr, "tether: job %s on node %s: %v\n", id, printable(nodes[i]), err)
		}
	}
	sts = slices.DeleteFunc(sts, func(st *protocol.JobStatus) bool { return st == nil })
	view := statusRecord(ctx, c, id, rec, sts...)
	var err error
	if o.JSON {
		err = printJobRecord(e.stdout, view, true)
	} else {
		err = printJobView(e.stdout, view, sts, o.Node)
	}
	if err == nil && failed > 0 {
		err = fmt.Errorf("job %s: the status of %d of %d nodes could not be read", id, failed, len(nodes))
	}
	return err
}

// jobStatuses asks each of nodes for job id's status, at most 16 at a
// time: sts[i] (nil on an error) and errs[i] are node i's.
func jobStatuses(ctx context.Context, c *client.Client, id string, nodes []string) (sts []*protocol.JobStatus, errs []error) {
	sts, errs = make([]*protocol.JobStatus, len(nodes)), make([]error, len(nodes))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sts[i], errs[i] = c.JobStatus(ctx, n, id)
		}()
	}
	wg.Wait()
	return sts, errs
}

// jobNodes returns the nodes of job id: --node's, else every node its
// record names (rec is nil with --node).
func jobNodes(ctx context.Context, c *client.Client, o *jobOptions, id string) ([]string, *protocol.JobRecord, error) {
	if o.Node != "" {
		return []string{o.Node}, nil, nil
	}
	rec, err := c.JobGet(ctx, id)
	var ae *protocol.APIError
	if errors.As(err, &ae) && ae.Status == 404 {
		return nil, nil, err // "no job ID" says it all
	}
	if err != nil {
		return nil, nil, fmt.Errorf("look up job %s (give --node to ask its node directly): %w", id, err)
	}
	if len(rec.Nodes) == 0 {
		return nil, rec, fmt.Errorf("job %s has no nodes (it is %s)", id, rec.State)
	}
	return rec.Nodes, rec, nil
}

// runJobCancel cancels the job on its node, or on every node of a
// fan-out (one node: line each; --node narrows to one). An attached job
// (one a tether exec runs) is cancelled through its coordinator instead
// (tether.v1.cancel): the agent keeps no detached record of it.
func runJobCancel(ctx context.Context, c *client.Client, o *jobOptions, id string, e *env) error {
	nodes, rec, err := jobNodes(ctx, c, o, id)
	if err != nil {
		return err
	}
	if rec == nil {
		// --node: the record still tells an attached job from a detached
		// one. Without one (none, or not ours to read) the node is asked,
		// as it knows its detached jobs.
		rec, _ = c.JobGet(ctx, id)
	}
	if rec != nil && !rec.Detached {
		return cancelAttached(ctx, c, o, rec, e)
	}
	if len(nodes) == 1 {
		st, note, err := cancelOnNode(ctx, c, nodes[0], id)
		if err != nil {
			return err
		}
		if note != "" {
			fmt.Fprintf(e.stderr, "tether: job %s %s\n", id, note)
		}
		view := statusRecord(ctx, c, id, rec, st)
		if o.JSON {
			return printJobRecord(e.stdout, view, true)
		}
		return printJobView(e.stdout, view, []*protocol.JobStatus{st}, o.Node)
	}
	if !o.JSON {
		fmt.Fprintf(e.stdout, "job:       %s\n", id)
	}
	failed := 0
	var sts []*protocol.JobStatus
	for _, n := range nodes {
		st, note, err := cancelOnNode(ctx, c, n, id)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			failed++
			fmt.Fprintf(e.stderr, "tether: job %s on node %s: %v\n", id, printable(n), err)
			if !o.JSON {
				fmt.Fprintf(e.stdout, "node:      %s error\n", printable(n))
			}
			continue
		}
		if o.JSON {
			sts = append(sts, st)
			continue
		}
		what := "cancelled"
		switch {
		case note != "":
			what = note
		case !st.Cancelled && st.State == protocol.JobRunning:
			what = "cancel sent (running)"
		}
		fmt.Fprintf(e.stdout, "node:      %s %s\n", printable(n), printable(what))
	}
	if o.JSON {
		// The record, with what the nodes answered, also when some
		// failed (those keep the record's word).
		if err := printJobRecord(e.stdout, statusRecord(ctx, c, id, rec, sts...), true); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("job %s: the cancel failed on %d of %d nodes", id, failed, len(nodes))
	}
	return nil
}

// cancelAttached cancels the attached job rec: as a whole, since its
// coordinator runs it as one (--node may name only its one node). One
// that has ended says so and how, as a detached job's cancel does.
func cancelAttached(ctx context.Context, c *client.Client, o *jobOptions, rec *protocol.JobRecord, e *env) error {
	id := rec.ID
	if o.Node != "" && (len(rec.Nodes) != 1 || rec.Nodes[0] != o.Node) {
		return usage(fmt.Errorf("job %s is attached and ran on %s: it is cancelled as a whole; drop --node %s", id, strings.Join(rec.Nodes, ", "), o.Node))
	}
	ended := func(rec *protocol.JobRecord) error {
		fmt.Fprintf(e.stderr, "tether: job %s had already ended (%s): nothing to cancel\n", id, rec.State)
		return printJobRecord(e.stdout, rec, o.JSON)
	}
	if rec.State.Terminal() {
		return ended(rec)
	}
	_, err := c.Cancel(ctx, id)
	var ae *protocol.APIError
	if errors.As(err, &ae) && ae.Status == 404 {
		// It may have ended between the two requests.
		if now, gerr := c.JobGet(ctx, id); gerr == nil && now.State.Terminal() {
			return ended(now)
		}
	}
	if err != nil {
		return fmt.Errorf("cancel attached job %s: %w", id, err)
	}
	if o.JSON {
		// The record, as every job command prints it: still running
		// (the tether exec running it ends it, cancelled).
		if now, gerr := c.JobGet(ctx, id); gerr == nil {
			rec = now
		}
		return printJobRecord(e.stdout, rec, true)
	}
	fmt.Fprintf(e.stdout, "job:       %s\nstate:     cancel sent (attached: the tether exec running it ends, exit %d)\n", id, exitInterrupted)
	return nil
}

// cancelOnNode cancels job id's run on node. note says, when nothing was
// cancelled, why (it had ended, or ended before the cancel reached it).
func cancelOnNode(ctx context.Context, c *client.Client, node, id string) (*protocol.JobStatus, string, error) {
	// A job that ended is said to have, with how (exit 0: there is
	// nothing left to cancel).
	if st, err := c.JobStatus(ctx, node, id); err == nil && st.State != protocol.JobRunning {
		return st, fmt.Sprintf("had already ended (%s): nothing to cancel", jobStatusState(st)), nil
	}
	st, err := c.JobCancel(ctx, node, id)
	if err != nil {
		return nil, "", err
	}
	if !st.Cancelled && st.State != protocol.JobRunning {
		return st, fmt.Sprintf("ended (%s) before the cancel reached it: nothing was cancelled", jobStatusState(st)), nil
	}
	return st, "", nil
}

// jobStatusState is a node's job status in the words of the job store
// (tether job list, --state): a job that exited is succeeded, failed or
// cancelled, as the coordinator records it (jobstore.Observe).
func jobStatusState(st *protocol.JobStatus) string {
	if st.State != protocol.JobExited {
		return st.State
	}
	switch {
	case st.Cancelled:
		return string(protocol.JobCancelled)
	case st.ExitCode != nil && *st.ExitCode == 0 && !st.TimedOut:
		return string(protocol.JobSucceeded)
	}
	return string(protocol.JobFailed)
}

// statusRecord is the record of detached job id as `job status --json`
// and `job cancel --json` print it: rec (the job store's, read when nil)
// brought up to date with what its nodes answered (sts) by
// refreshRecord, at the client's clock.
func statusRecord(ctx context.Context, c *client.Client, id string, rec *protocol.JobRecord, sts ...*protocol.JobStatus) *protocol.JobRecord {
	if rec == nil {
		if got, err := c.JobGet(ctx, id); err == nil {
			rec = got
		}
	}
	return refreshRecord(id, rec, time.Now().UTC(), sts...)
}

// refreshRecord is a copy of rec, the record of detached job id (one of
// just id, detached, dispatched, and the nodes of sts when there is none:
// no job store, or not ours to read), brought up to date with what its
// nodes answered (sts) by the rule the job store records those answers
// with (protocol.ObserveJob): the record may lag its nodes by the agent's
// report. now stamps the end of a run its node gave no end time (lost).
// A record that ended is not changed: it already holds the nodes' word.
func refreshRecord(id string, rec *protocol.JobRecord, now time.Time, sts ...*protocol.JobStatus) *protocol.JobRecord {
	var r protocol.JobRecord
	if rec != nil {
		r = *rec
		r.Results = slices.Clone(rec.Results)
		r.Nodes = slices.Clone(rec.Nodes)
	} else {
		// Its nodes answered, so it was dispatched to them.
		r = protocol.JobRecord{ID: id, Detached: true, State: protocol.JobDispatched}
		for _, st := range sts {
			r.Nodes = append(r.Nodes, st.Node)
		}
		slices.Sort(r.Nodes)
	}
	for _, st := range sts {
		// A status the rule refuses (a node the record does not name, a
		// state this client does not know) leaves the record as it is.
		_, _ = protocol.ObserveJob(&r, st, now)
	}
	return &r
}

// runJobLogs prints the job's stdout then its stderr; with --follow it
// polls both, printing new bytes as they come, until the job exited and
// both were read to the end, then exits with the job's exit code. A job
// on several nodes (without --node) prints every node's output, each line
// prefixed "NODE | " as tether exec prints a fan-out's, node by node
// (with --follow: as it comes), and --follow of a fan-out (by its target,
// also one that matched a single node) ends as exec of it does (0, 1
// when any node failed, 254 when all succeeded but an output was
// truncated).
func runJobLogs(ctx context.Context, c *client.Client, o *jobOptions, id string, e *env) error {
	nodes, rec, err := jobNodes(ctx, c, o, id)
	if err != nil {
		return err
	}
	if rec != nil && !rec.Detached {
		// Its output went to the client that ran it; nothing kept it.
		return fmt.Errorf("job %s was attached (%s): its output went to the tether exec that ran it and was not kept; only detached jobs (tether exec --detach) keep logs", id, rec.State)
	}
	multi := len(nodes) > 1
	// A fan-out's follow ends as exec of it does, by its target (also one
	// that matched a single node); --node asks one node's code.
	// Its lines are prefixed "NODE | " as exec printed them: every
	// fan-out's, also one that matched a single node.
	fanout := multi || (rec != nil && rec.Target != "")
	type nodeLogs struct {
		node           string
		offsets        map[string]int64
		stdout, stderr io.Writer
		prefixers      []*linePrefixer
		done, outage   bool
	}
	logs := make([]*nodeLogs, len(nodes))
	// One node's output is shown as it is: whether it ended mid-line is
	// tracked for the notes that may follow it (jobOutcome).
	var outTrack, errTrack *lineTracker
	for i, n := range nodes {
		l := &nodeLogs{node: n, offsets: map[string]int64{}, stdout: e.stdout, stderr: e.stderr}
		if !fanout {
			outTrack, errTrack = &lineTracker{w: e.stdout}, &lineTracker{w: e.stderr}
			l.stdout, l.stderr = outTrack, errTrack
		}
		if fanout {
			po, pe := newLinePrefixer(e.stdout, n+" | "), newLinePrefixer(e.stderr, n+" | ")
			l.stdout, l.stderr, l.prefixers = po, pe, []*linePrefixer{po, pe}
		}
		logs[i] = l
	}
	flush := func(l *nodeLogs) error {
		for _, p := range l.prefixers {
			if err := p.Flush(); err != nil {
				return err
			}
		}
		return nil
	}
	read := func(l *nodeLogs, stream string, w io.Writer) (eof bool, err error) {
		for {
			out, err := c.JobOutput(ctx, l.node, id, stream, l.offsets[stream], 0)
			if err != nil {
				return false, err
			}
			if len(out.Data) > 0 {
				if _, err := w.Write(out.Data); err != nil {
					return false, err
				}
				l.offsets[stream] += int64(len(out.Data))
			}
			if l.offsets[stream] >= out.Total || len(out.Data) == 0 {
				return out.EOF, nil
			}
		}
	}
	if !o.Follow {
		failed := 0
		for _, l := range logs {
			_, err := read(l, protocol.ReplyStdout, l.stdout)
			if err == nil {
				_, err = read(l, protocol.ReplyStderr, l.stderr)
			}
			if ferr := flush(l); err == nil {
				err = ferr
			}
			if err != nil && (!multi || ctx.Err() != nil) {
				return err
			}
			if err != nil {
				failed++
				fmt.Fprintf(e.stderr, "tether: job %s on node %s: %v\n", id, l.node, err)
			}
		}
		if failed > 0 {
			return fmt.Errorf("job %s: could not read the output of %d of %d nodes", id, failed, len(logs))
		}
		return nil
	}
	t := time.NewTicker(o.Poll)
	defer t.Stop()
	for {
		pending := 0
		for _, l := range logs {
			if l.done {
				continue
			}
			outEOF, err := read(l, protocol.ReplyStdout, l.stdout)
			var errEOF bool
			if err == nil {
				errEOF, err = read(l, protocol.ReplyStderr, l.stderr)
			}
			switch {
			case err != nil && followRetryable(ctx, err):
				// The job outlives its agent (and the coordinator): keep
				// following from the same offsets once the node is back.
				if !l.outage {
					l.outage = true
					fmt.Fprintf(e.stderr, "tether: job %s: %v; still following, from the same offsets\n", id, err)
				}
			case err != nil:
				return err
			case l.outage:
				l.outage = false
				fmt.Fprintf(e.stderr, "tether: job %s: node %s answers again; resuming\n", id, l.node)
			}
			if err == nil && outEOF && errEOF {
				if err := flush(l); err != nil {
					return err
				}
				l.done = true
				continue
			}
			pending++
		}
		if pending == 0 {
			// Like `tail --pid` plus wait: the follower ends with the
			// job's own exit code, so scripts can branch on it.
			if !fanout {
				st, err := c.JobStatus(ctx, nodes[0], id)
				if err != nil {
					return err
				}
				return jobOutcome(e, st, errTrack.midLine() || (outTrack.midLine() && sameStream(e.stdout, e.stderr)))
			}
			code := exitOK
			for _, n := range nodes {
				st, err := c.JobStatus(ctx, n, id)
				if err != nil {
					return err
				}
				var ee *exitError
				switch err := jobOutcome(e, st, false); {
				case err == nil:
				case errors.As(err, &ee) && ee.code == exitTruncated:
					if code == exitOK {
						code = exitTruncated
					}
				default:
					if ee != nil && ee.err != nil {
						fmt.Fprintf(e.stderr, "tether: %v\n", ee.err)
					}
					code = exitFailure
				}
			}
			if code == exitOK {
				return nil
			}
			return &exitError{code: code}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// followRetryable reports whether err, from a read of a job's output
// while following it, is an outage that passes: the node not connected or
// not answering (its agent restarting), no coordinator (it restarting), a
// request that timed out. Anything else (no such job, refused) ends the
// follow.
func followRetryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var ae *protocol.APIError
	if errors.As(err, &ae) {
		return ae.Code == protocol.ErrCodeUnknownNode || ae.Code == protocol.ErrCodeUnavailable
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
}

// jobOutcome is how `job logs --follow` ends once a job's output was read
// to the end: with the job's exit code (124 when its timeout killed it,
// 128+N when signal N did), exitTruncated when it exited 0 but output past
// the output limit was dropped, and exitTether when its outcome is unknown
// (the job is lost).
//
// midLine is set when the job's output shown last stopped mid-line where
// a note on stderr would follow it: the notes then start on a new line.
func jobOutcome(e *env, st *protocol.JobStatus, midLine bool) error {
	var notes []string
	for _, s := range []struct {
		name      string
		truncated bool
		n         int64
	}{{"stdout", st.StdoutTruncated, st.StdoutBytes}, {"stderr", st.StderrTruncated, st.StderrBytes}} {
		if s.truncated {
			notes = append(notes, fmt.Sprintf("job %s: %s was truncated at the output limit (%d bytes produced); start the job with a larger --output-limit to keep it all", st.ID, s.name, s.n))
		}
	}
	if len(notes) > 0 && midLine {
		fmt.Fprintln(e.stderr)
	}
	for _, n := range notes {
		fmt.Fprintf(e.stderr, "tether: %s\n", n)
	}
	if st.ExitCode == nil {
		return &exitError{code: exitTether, err: fmt.Errorf("job %s on node %s is %s: its exit status is unknown", st.ID, st.Node, st.State)}
	}
	// nodeOutcome, as job wait and job list's EXIT: 130 for a cancelled
	// job (not its SIGTERM's 143), 124 for a timeout, 255 for the node's
	// own error.
	r := protocol.JobExitResult(st)
	code, msg := nodeOutcome(&r, 0)
	switch {
	case code != exitOK && r.Error != "":
		return &exitError{code: code, err: fmt.Errorf("job %s on node %s: %s", st.ID, st.Node, printable(msg))}
	case code != exitOK:
		return &exitError{code: code}
	case len(notes) > 0:
		return &exitError{code: exitTruncated}
	}
	return nil
}

// runJobWait polls the job's record until it ended, then exits with its
// exit code (jobRecordOutcome).
func runJobWait(ctx context.Context, c *client.Client, o *jobOptions, id string, e *env) error {
	wait := func(ctx context.Context, id string) (*protocol.JobRecord, error) { return c.JobWait(ctx, id, o.Poll) }
	rec, err := wait(ctx, id)
	if err != nil {
		return err
	}
	rec, err = followReruns(ctx, rec, c.JobGet, wait, o.Poll, e.stderr)
	if err != nil {
		return err
	}
	if o.JSON {
		if err := writeJSON(e.stdout, rec); err != nil {
			return err
		}
	}
	return jobRecordOutcome(rec)
}

// rerunClaimWait is how long `job wait` waits, for a lost idempotent
// job whose record names no re-run yet, for a coordinator to claim one.
const rerunClaimWait = 10 * time.Second

// followReruns follows lost job rec to the final state of its re-runs
// (Record.RerunAs, attempt after attempt), saying so on stderr, and
// returns the last record. A lost idempotent detached job whose record
// names neither a re-run nor why there is none (NoRerun) is read again
// (get) every poll for up to rerunClaimWait: its coordinator claims the
// re-run just after it wrote the record lost. A fan-out's re-runs (one
// per lost node) are named, not followed: its record stays its outcome.
func followReruns(ctx context.Context, rec *protocol.JobRecord, get, wait func(context.Context, string) (*protocol.JobRecord, error), poll time.Duration, stderr io.Writer) (*protocol.JobRecord, error) {
	for range protocol.MaxJobAttempts {
		if !rec.Detached || !rec.Idempotent || rec.NoRerun != "" {
			return rec, nil
		}
		if len(rec.Nodes) > 1 {
			if rec.RerunAs != "" {
				fmt.Fprintf(stderr, "tether: job %s: its lost nodes run again as %s (tether job wait ID)\n", rec.ID, rec.RerunAs)
			}
			return rec, nil
		}
		if rec.State != protocol.JobStateLost {
			return rec, nil
		}
		for deadline := time.Now().Add(rerunClaimWait); rec.RerunAs == "" && rec.NoRerun == "" && time.Now().Before(deadline); {
			select {
			case <-ctx.Done():
				return rec, nil
			case <-time.After(poll):
			}
			if r, err := get(ctx, rec.ID); err == nil {
				rec = r
			}
		}
		if rec.RerunAs == "" {
			return rec, nil
		}
		fmt.Fprintf(stderr, "tether: job %s was lost (attempt %d of %d); following its re-run %s\n", rec.ID, max(rec.Attempt, 1), protocol.MaxJobAttempts, rec.RerunAs)
		next, err := wait(ctx, rec.RerunAs)
		if err != nil {
			return nil, err
		}
		rec = next
	}
	return rec, nil
}

// jobRecordOutcome is how `job wait` ends: with recordOutcome's code, an
// error saying why unless the code is 0 or a --node job's plain exit
// code, which speaks for itself.
func jobRecordOutcome(rec *protocol.JobRecord) error {
	code, why, _ := recordOutcome(rec)
	switch {
	case code == exitOK:
		return nil
	case why == "":
		return &exitError{code: code}
	}
	return &exitError{code: code, err: errors.New(why)}
}

// recordOutcome is the exit code of the job rec records, as the `tether
// exec` that submitted it ends (without --detach, not interrupted): by the
// job's target, not by how many nodes it matched. It is the one mapping
// behind `job wait`'s exit code and the EXIT that `job list` and `job
// status` show. A --node job (rec.Target empty) has its node's code
// (nodeOutcome: the command's own, 124 for its timeout, 130 when
// cancelled, 126/127 for a command the node could not execute or find,
// exitTether when Tether failed). A fan-out (--selector, --all), also one
// that matched a single node, has 0 when every node succeeded and
// exitFailure when any node did not.
//
// why says what went wrong, naming the job and node ("" for success and
// for a --node job's plain exit code). known is false, with exitTether,
// when the record holds no exit status: the job is lost, has not ended,
// or ended without a result.
func recordOutcome(rec *protocol.JobRecord) (code int, why string, known bool) {
	unknown := func() (int, string, bool) {
		why := rec.Error
		if why == "" {
			why = "no exit status recorded"
		}
		return exitTether, fmt.Sprintf("job %s is %s: %s", rec.ID, rec.State, why), false
	}
	if rec.State == protocol.JobStateLost || !rec.State.Terminal() {
		return unknown()
	}
	if rec.Target != "" || len(rec.Nodes) > 1 {
		switch {
		case rec.State == protocol.JobSucceeded && slices.ContainsFunc(rec.Results, func(r protocol.NodeResult) bool { return r.OutputTruncated() }):
			return exitTruncated, fmt.Sprintf("job %s: output was truncated at the output limit", rec.ID), true
		case rec.State == protocol.JobSucceeded:
			return exitOK, "", true
		case rec.Failed > 0 || slices.ContainsFunc(rec.Results, func(r protocol.NodeResult) bool {
			c, _ := nodeOutcome(&r, 0)
			return c != exitOK
		}):
			return exitFailure, "", true
		}
		return unknown()
	}
	if len(rec.Results) != 1 {
		return unknown()
	}
	r := &rec.Results[0]
	code, msg := nodeOutcome(r, 0)
	if code == exitOK && r.OutputTruncated() {
		// As tether exec exits for it.
		return exitTruncated, fmt.Sprintf("job %s on node %s: output was truncated at the output limit", rec.ID, r.Node), true
	}
	if code == exitOK || r.Error == "" && !r.TimedOut && !r.Cancelled && r.Signal == "" {
		return code, "", true
	}
	return code, fmt.Sprintf("job %s on node %s: %s", rec.ID, r.Node, msg), true
}

// printJobRecord prints rec as JSON or, as printJobView does, as
// "key: value" lines.
func printJobRecord(w io.Writer, rec *protocol.JobRecord, asJSON bool) error {
	if asJSON {
		return writeJSON(w, rec)
	}
	return printJobView(w, rec, nil, "")
}

// printJobView prints the job rec as `tether job status` shows every job,
// attached or detached, on one node or several, as "key: value" lines:
// the record's (job, nodes, state, exit, owner, held by, submitted,
// started, finished, error), then a node: line for each of its nodes
// (only node's, when not ""). The exit: line is the code `tether job
// wait` exits with (recordOutcome, as job list's EXIT), followed, for a
// job on one node, by what the process really got when that differs (a
// cancelled job's SIGTERM, exit code 143: 130 for a --node job, 1 for a
// fan-out's); "-" with why, for a lost job. Each node: line says the
// node's exit code (nodeOutcome's, as the EXIT of `tether exec`'s summary
// table) with the same detail and its error, or "running", and the
// sizes of its stdout and stderr when known: from its result, else from
// its status in sts (a detached job's node, asked). What the record's
// fields hold (ids, owner, errors) is shown printable.
func printJobView(w io.Writer, rec *protocol.JobRecord, sts []*protocol.JobStatus, node string) error {
	fmt.Fprintf(w, "job:       %s\nnodes:     %s\nstate:     %s\n", printable(rec.ID), printable(strings.Join(rec.Nodes, ",")), printable(string(rec.State)))
	switch code, _, known := recordOutcome(rec); {
	case known:
		detail := ""
		if len(rec.Nodes) == 1 && len(rec.Results) == 1 {
			detail = printable(resultDetail(code, &rec.Results[0])) // the signal is the agent's
		}
		fmt.Fprintf(w, "exit:      %d%s\n", code, detail)
	case rec.State == protocol.JobStateLost:
		why := rec.Error
		if why == "" {
			why = "its outcome is unknown"
		}
		fmt.Fprintf(w, "exit:      - (lost: %s)\n", printable(why))
	}
	if rec.Attempt > 1 || rec.RerunAs != "" || rec.NoRerun != "" {
		line := fmt.Sprintf("%d of %d", max(rec.Attempt, 1), protocol.MaxJobAttempts)
		if rec.RerunOf != "" {
			line += ", re-runs " + rec.RerunOf
		}
		if rec.RerunAs != "" {
			line += ", re-run as " + rec.RerunAs
		}
		fmt.Fprintf(w, "attempt:   %s\n", line)
	}
	if rec.Owner != "" {
		fmt.Fprintf(w, "owner:     %s\n", printable(rec.Owner))
	}
	fmt.Fprintf(w, "held by:   %s\nsubmitted: %s\n", printable(rec.Coordinator), rec.SubmittedAt.Format(time.RFC3339))
	if !rec.StartedAt.IsZero() {
		fmt.Fprintf(w, "started:   %s\n", rec.StartedAt.Format(time.RFC3339))
	}
	if !rec.FinishedAt.IsZero() {
		fmt.Fprintf(w, "finished:  %s", rec.FinishedAt.Format(time.RFC3339))
		if !rec.StartedAt.IsZero() {
			fmt.Fprintf(w, " (%v)", rec.FinishedAt.Sub(rec.StartedAt).Round(time.Millisecond))
		}
		fmt.Fprintln(w)
	}
	if rec.Error != "" && rec.State != protocol.JobStateLost {
		fmt.Fprintf(w, "error:     %s\n", printable(rec.Error))
	}
	if rec.ResultsOmitted {
		_, err := fmt.Fprintf(w, "nodes ok:  %d of %d (results too large to keep)\n", rec.Succeeded, rec.Succeeded+rec.Failed)
		return err
	}
	trunc := func(b bool) string {
		if b {
			return " (truncated)"
		}
		return ""
	}
	sizes := func(out, errb int64, outT, errT bool) string {
		return fmt.Sprintf(", stdout %d bytes%s, stderr %d bytes%s", out, trunc(outT), errb, trunc(errT))
	}
	for _, n := range rec.Nodes {
		if node != "" && n != node {
			continue
		}
		shown := printable(n)
		i := slices.IndexFunc(rec.Results, func(r protocol.NodeResult) bool { return r.Node == n })
		j := slices.IndexFunc(sts, func(st *protocol.JobStatus) bool { return st.Node == n })
		var err error
		switch {
		case i >= 0:
			r := &rec.Results[i]
			code, _ := nodeOutcome(r, 0)
			line := fmt.Sprintf("exit %d%s", code, printable(resultDetail(code, r)))
			if r.Error != "" {
				line += ": " + printable(r.Error)
			}
			_, err = fmt.Fprintf(w, "node:      %s %s%s\n", shown, line, sizes(r.StdoutBytes, r.StderrBytes, r.StdoutTruncated, r.StderrTruncated))
		case j >= 0 && sts[j].State == protocol.JobRunning:
			st := sts[j]
			_, err = fmt.Fprintf(w, "node:      %s running%s\n", shown, sizes(st.StdoutBytes, st.StderrBytes, st.StdoutTruncated, st.StderrTruncated))
		case j >= 0:
			_, err = fmt.Fprintf(w, "node:      %s %s\n", shown, printable(jobStatusState(sts[j])))
		case rec.State == protocol.JobStateRunning:
			_, err = fmt.Fprintf(w, "node:      %s running\n", shown)
		default:
			_, err = fmt.Fprintf(w, "node:      %s %s\n", shown, printable(string(rec.State)))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// resultDetail is what a node's result r says beside code, the exit code
// shown for it, when they differ or it was ended: " (timed out: signal
// TERM, exit code 143)", " (cancelled: …)", " (signal KILL, exit code
// 137)", " (exit code 3)" (a fan-out's 1); "" when code says it all.
func resultDetail(code int, r *protocol.NodeResult) string {
	var raw string
	if code != r.ExitCode && r.ExitCode >= 0 {
		raw = fmt.Sprintf("exit code %d", r.ExitCode)
	}
	if r.Signal != "" {
		raw = fmt.Sprintf("signal %s, exit code %d", r.Signal, r.ExitCode)
	}
	what := ""
	switch {
	case r.TimedOut:
		what = "timed out"
	case r.Cancelled:
		what = "cancelled"
	}
	switch {
	case what != "" && raw != "":
		return " (" + what + ": " + raw + ")"
	case what != "":
		return " (" + what + ")"
	case raw != "":
		return " (" + raw + ")"
	}
	return ""
}

// jobListOptions are the flags of `tether job list`.
type jobListOptions struct {
	Req  protocol.JobListRequest
	JSON bool
	NATS natsOptions
}

// request fills o.Req from the flags --state and --owner (o.Req holds
// the others) and checks it, as the API would and by the rules `tether
// audit` reads the same filters with (identityFilter, nodeFilter,
// limitFlag), so that nothing is sent when it would be refused.
func (o *jobListOptions) request(state, owner string) error {
	var errs []error
	o.Req.State = protocol.JobState(state)
	var err error
	if o.Req.Owner, err = identityFilter("--owner", owner); err != nil {
		errs = append(errs, err)
	}
	if err := nodeFilter(o.Req.Node); err != nil {
		errs = append(errs, err)
	}
	if err := limitFlag(o.Req.Limit, protocol.MaxJobList); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if e := o.Req.Validate(); e != nil {
		return errors.New(e.Message)
	}
	return nil
}

func newJobListCmd(e *env) *cobra.Command {
	var o jobListOptions
	var state, owner string
	cmd := &cobra.Command{
		Use:   "list [--state STATE] [--node NODE] [--owner IDENTITY]",
		Short: "List the jobs recorded in the job store that you may see, newest first",
		Args:  cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			if err := o.request(state, owner); err != nil {
				return usage(err)
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			resp, err := c.JobList(cmd.Context(), o.Req)
			if err != nil {
				return err
			}
			if o.JSON {
				return writeJSON(e.stdout, resp)
			}
			if err := writeJobsTable(e.stdout, resp.Jobs); err != nil {
				return err
			}
			if resp.More {
				fmt.Fprintf(e.stderr, "tether: more jobs match; raise --limit (at most %d)\n", protocol.MaxJobList)
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&state, "state", "", "only jobs in this state (queued, dispatched, running, succeeded, failed, cancelled, lost)")
	f.StringVar(&o.Req.Node, "node", "", "only jobs on this node")
	f.StringVar(&owner, "owner", "", "only jobs submitted by this identity (KIND:NAME; a bare name is nats:NAME)")
	f.IntVar(&o.Req.Limit, "limit", 100, fmt.Sprintf("at most this many jobs (1 to %d)", protocol.MaxJobList))
	f.BoolVar(&o.JSON, "json", false, "print the list as JSON")
	o.NATS.addFlags(cmd)
	return cmd
}

// writeJobsTable prints job list's table of jobs, every cell printable
// (COMMAND is what its owner ran).
func writeJobsTable(w io.Writer, jobs []protocol.JobRecord) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tEXIT\tNODES\tOWNER\tSUBMITTED\tCOMMAND")
	for i := range jobs {
		r := &jobs[i]
		exit := "-" // no exit status recorded (lost, not ended)
		if code, _, known := recordOutcome(r); known {
			exit = fmt.Sprint(code)
		}
		writeRow(tw, r.ID, string(r.State), exit, strings.Join(r.Nodes, ","), r.Owner, r.SubmittedAt.Format(time.RFC3339), r.Command)
	}
	return tw.Flush()
}
