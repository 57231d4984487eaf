package protocol

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// How a node's word changes a detached job's durable record. The job
// store (coordinator/jobstore) applies it when a node reports (an exit
// report, an answer to job.get or reconciliation) and writes the result;
// the CLI applies the same rule, writing nothing, to a record it read that
// lags what the nodes answered it (tether job status --json, job cancel
// --json), so that both show one record. The rule is pure: no I/O, no
// clock but the now its callers pass.
//
// A record's times come from two clocks: started_at from the
// coordinator's when it recorded the nodes' start (or a node's, when the
// node's word reached the record first, or, for a job on several nodes,
// the earliest node's start), finished_at from a node's (the end it
// reported) or the caller's now. A job that ends before its start was
// recorded would read as finishing before it started, so finished_at is
// never earlier than started_at: an earlier end is recorded as the start.

// MaxJobResultsBytes bounds the JSON encoding of a record's Results; past
// it only the counts are kept (JobRecord.ResultsOmitted), so the record
// of a wide fan-out stays well under NATS's payload limit.
const MaxJobResultsBytes = 256 << 10

// ObserveJob brings r, a detached job's record, up to date with st, the
// status one of its nodes (st.Node; empty means r's one node) reported of
// the job (op status or FrameJobExit). now is the caller's clock (UTC):
// the end of a run whose node gave no end time (lost) is stamped with it.
//
// A job on one node: running moves a queued or dispatched job to running;
// exited ends it with the node's result (JobExitResult): cancelled when
// the node cancelled it, succeeded when the result is OK, else failed,
// finished when the node says (now if it does not); lost ends it lost
// (JobLostError), finished at now. A start the record has is kept, else
// it is the node's.
//
// A job on several nodes: running moves a queued or dispatched job to
// running; exited or lost adds the node's result (AddJobResult, which ends
// the job once every node has one), the job's start lowered to the
// node's when that is earlier, its end the end of the node that ended it
// (now if that node gave none).
//
// Either way the times are stored UTC and the end is never before the
// start (an earlier end, from the node's clock, is recorded as the start);
// a record with no state yet (one a reader made of a job the store does
// not hold) counts as dispatched.
//
// It reports whether r changed: a terminal r, a status that does not move
// r forward and a repeat of a node's result change nothing. A status of a
// node r does not name or in a state it does not know is an error naming
// it, and r is left as it is.
func ObserveJob(r *JobRecord, st *JobStatus, now time.Time) (bool, error) {
	if r.State.Terminal() {
		return false, nil
	}
	node := st.Node
	if node == "" && len(r.Nodes) == 1 {
		node = r.Nodes[0]
	}
	if !slices.Contains(r.Nodes, node) {
		return false, fmt.Errorf("node %s is not one of the job's nodes (%s)", Clip(node), strings.Join(r.Nodes, ","))
	}
	var res NodeResult
	switch st.State {
	case JobRunning:
	case JobExited:
		res = JobExitResult(st)
		res.Node = node
	case JobLost:
		why := JobLostError(node)
		if st.Error != "" {
			why += "; the node says: " + st.Error
		}
		res = JobLostResult(node, why)
	default:
		return false, fmt.Errorf("unknown node state %s", Clip(st.State))
	}
	rec := *r
	rec.Results = slices.Clone(r.Results)
	if st.State == JobRunning {
		if rec.State != JobQueued && rec.State != JobDispatched && rec.State != "" {
			return false, nil
		}
		rec.State = JobStateRunning
		if rec.StartedAt.IsZero() {
			rec.StartedAt = st.StartedAt.UTC()
		}
		*r = rec
		return true, nil
	}
	if len(rec.Nodes) > 1 {
		if !addJobResult(&rec, res) {
			return false, nil
		}
		if rec.StartedAt.IsZero() || !st.StartedAt.IsZero() && st.StartedAt.Before(rec.StartedAt) {
			rec.StartedAt = st.StartedAt.UTC()
		}
	} else {
		switch {
		case st.State == JobLost:
			rec.State, rec.Error = JobStateLost, res.Error
		case st.Cancelled:
			rec.State, rec.Results, rec.Succeeded, rec.Failed = JobCancelled, []NodeResult{res}, 0, 1
		case res.OK():
			rec.State, rec.Results, rec.Succeeded, rec.Failed = JobSucceeded, []NodeResult{res}, 1, 0
		default:
			rec.State, rec.Results, rec.Succeeded, rec.Failed = JobFailed, []NodeResult{res}, 0, 1
		}
		if rec.StartedAt.IsZero() {
			rec.StartedAt = st.StartedAt.UTC()
		}
	}
	if rec.State.Terminal() {
		end := now
		if st.State == JobExited && st.FinishedAt != nil {
			end = *st.FinishedAt
		}
		finishJob(&rec, end)
	}
	*r = rec
	return true, nil
}

// AddJobResult adds res, the result of node res.Node of r, a detached job
// on several nodes, to r.Results (kept sorted by node), and ends r once
// every node of r.Nodes has a result: succeeded when all are OK; lost
// when every node was lost; else cancelled when one was cancelled; else
// failed, with the counts set and the results dropped past
// MaxJobResultsBytes. now (UTC) is the end it records, never earlier than
// r's start. It reports whether r changed: a terminal r, a node r does not
// name, or one with a result already change nothing.
func AddJobResult(r *JobRecord, res NodeResult, now time.Time) bool {
	if r.State.Terminal() || !slices.Contains(r.Nodes, res.Node) {
		return false
	}
	if !addJobResult(r, res) {
		return false
	}
	if r.State.Terminal() {
		finishJob(r, now)
	}
	return true
}

// addJobResult is AddJobResult without its checks and its end time.
func addJobResult(r *JobRecord, res NodeResult) bool {
	i, found := slices.BinarySearchFunc(r.Results, res.Node, func(x NodeResult, n string) int { return strings.Compare(x.Node, n) })
	if found {
		return false
	}
	r.Results = slices.Insert(slices.Clip(r.Results), i, res)
	if r.State == JobQueued || r.State == JobDispatched || r.State == "" {
		r.State = JobStateRunning // a node ended its run, so it ran
	}
	if len(r.Results) < len(r.Nodes) {
		return true
	}
	ok, bad, lost, cancelled := 0, 0, 0, 0
	for i := range r.Results {
		x := &r.Results[i]
		switch {
		case x.OK():
			ok++
			continue
		case x.ErrorCode == ResultCodeLost:
			lost++
		case x.Cancelled:
			cancelled++
		}
		bad++
	}
	r.Succeeded, r.Failed = ok, bad
	switch {
	case lost == len(r.Results):
		r.State, r.Error = JobStateLost, "every node lost the job"
	case cancelled > 0:
		r.State = JobCancelled
	case bad > 0:
		r.State = JobFailed
	default:
		r.State = JobSucceeded
	}
	if b, _ := json.Marshal(r.Results); len(b) > MaxJobResultsBytes {
		r.Results, r.ResultsOmitted = nil, true
	}
	return true
}

// finishJob records end (UTC) as r's end, or r's start if end is earlier
// (the two come from different clocks).
func finishJob(r *JobRecord, end time.Time) {
	r.FinishedAt = end.UTC()
	if r.FinishedAt.Before(r.StartedAt) {
		r.FinishedAt = r.StartedAt
	}
}

// JobExitResult is the result of node st.Node's run of a detached job
// that exited (st.State JobExited): its exit code (-1 without one; 124
// for a run its timeout ended that exited 0), signal, timeout, cancel and
// output counts as the node reported them, and its duration in
// milliseconds (the node's clock: st.FinishedAt - st.StartedAt; 0 without
// an end).
func JobExitResult(st *JobStatus) NodeResult {
	res := NodeResult{Node: st.Node, Detached: true, ExitCode: -1, Signal: st.Signal, TimedOut: st.TimedOut, Cancelled: st.Cancelled,
		StdoutBytes: st.StdoutBytes, StderrBytes: st.StderrBytes, StdoutTruncated: st.StdoutTruncated, StderrTruncated: st.StderrTruncated,
		Truncated: st.StdoutTruncated || st.StderrTruncated}
	if st.ExitCode != nil {
		res.ExitCode = *st.ExitCode
	}
	if st.FinishedAt != nil {
		res.DurationMS = float64(st.FinishedAt.Sub(st.StartedAt).Milliseconds())
	}
	if st.TimedOut && res.ExitCode == 0 {
		res.ExitCode = 124 // as a timeout's kill reads (coreutils timeout)
	}
	if st.Error != "" {
		res.Error = fmt.Sprintf("node %s: %s", Clip(st.Node), st.Error)
	}
	return res
}

// JobLostResult is the result of node's run of a detached job whose end
// is unknown, with why (JobLostError for a node that reported it lost):
// exit -1, ErrorCode ResultCodeLost.
func JobLostResult(node, why string) NodeResult {
	return NodeResult{Node: node, Detached: true, ExitCode: -1, Error: why, ErrorCode: ResultCodeLost}
}
