package jobstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// Detached jobs on several nodes. Each node's run ends on its own, reported
// by its agent (an exit report) or found by asking the node (job.get,
// reconciliation), through whichever coordinator holds that node. So the
// record gathers one protocol.NodeResult per node in Record.Results while
// the job runs, and ends once every node of Record.Nodes has one:
// succeeded when all are OK; lost when every node was lost; cancelled when
// one was cancelled; else failed. A node's result is written once: a
// repeat of it, or a status of a node the job does not name, changes
// nothing. The rule is protocol.ObserveJob's and protocol.AddJobResult's
// (the CLI applies it too, to a record that lags its nodes); this file
// writes what it makes.
//
// The writers are many and independent (one per reporting node, on any
// coordinator), so a write that loses a compare-and-set race reads the
// record again and applies its node's result to what it finds, keeping
// every other node's result and the holder's fields (holder, boot, epoch)
// as they are: a result is the node's word, valid whoever holds the job.

// ErrNotInJob: the status is of a node the job does not run on.
var ErrNotInJob = errors.New("jobstore: node is not one of the job's nodes")

// maxMergeAttempts bounds the compare-and-set retries of one node result
// write. Each conflict is another writer's success, so a job on N nodes
// reporting at once needs at most N attempts.
const maxMergeAttempts = 64

// observeNode applies st, node st.Node's status of detached job j on
// several nodes (Observe's contract; protocol.ObserveJob's rule): running
// moves a dispatched job to running; exited or lost records the node's
// result, and ends the job if it was the last node without one.
func (s *Store) observeNode(ctx context.Context, j *Job, st *protocol.JobStatus) (bool, error) {
	if !slices.Contains(j.Nodes, st.Node) {
		return j.State.Terminal(), fmt.Errorf("jobstore: observe job %s: node %s: %w (%s)", j.ID, protocol.Clip(st.Node), ErrNotInJob, strings.Join(j.Nodes, ","))
	}
	var err error
	done, merr := s.mergeNodes(ctx, j, func(rec *Record) bool {
		var changed bool
		changed, err = protocol.ObserveJob(rec, st, s.now())
		return changed
	})
	if err != nil {
		return false, fmt.Errorf("jobstore: observe job %s: %w", j.ID, err)
	}
	return done, merr
}

// LoseNodes records each of nodes (of detached job j on several nodes)
// that has no result yet as lost with why, ending the job if no node is
// left without a result. It reports whether the job is now terminal;
// nodes the job does not name are ignored. The write is Observe's:
// compare-and-set, retried on a fresh read, not fenced by holder.
func (s *Store) LoseNodes(ctx context.Context, j *Job, nodes []string, why string) (bool, error) {
	return s.mergeNodes(ctx, j, func(rec *Record) bool {
		changed := false
		for _, n := range nodes {
			if protocol.AddJobResult(rec, protocol.JobLostResult(n, why), s.now()) {
				changed = true
			}
		}
		return changed
	})
}

// RecordResults adds results (of nodes of detached job j on several nodes
// that ended their run, or never started it) to the record, as Observe
// adds a node's: a node with a result already, or not of the job, is
// skipped; the job ends once every node has one. It reports whether the
// job is now terminal.
func (s *Store) RecordResults(ctx context.Context, j *Job, results []protocol.NodeResult) (bool, error) {
	return s.mergeNodes(ctx, j, func(rec *Record) bool {
		changed := false
		for _, res := range results {
			if protocol.AddJobResult(rec, res, s.now()) {
				changed = true
			}
		}
		return changed
	})
}

// Unsettled are the nodes of j with no result recorded: for a detached
// job on several nodes that runs, those still running (or not heard of).
func Unsettled(r *Record) []string {
	var out []string
	for _, n := range r.Nodes {
		if !slices.ContainsFunc(r.Results, func(res protocol.NodeResult) bool { return res.Node == n }) {
			out = append(out, n)
		}
	}
	return out
}

// mergeNodes applies change to j's record and writes it, compare-and-set
// on j's revision; on a conflict it reads the record again and applies
// change to that. change reports whether it changed the record (false:
// nothing to write). It reports whether the job is now terminal, and acks
// its queue message when this write ended it.
func (s *Store) mergeNodes(ctx context.Context, j *Job, change func(*Record) bool) (bool, error) {
	for attempt := 0; ; attempt++ {
		if j.State.Terminal() {
			return true, nil
		}
		rec := j.Record
		rec.Results = slices.Clone(j.Results)
		if !change(&rec) {
			return false, nil
		}
		b, _ := json.Marshal(&rec)
		rev, err := s.kv.Update(ctx, jobKey(j.ID), b, j.rev)
		if err == nil {
			j.Record, j.rev = rec, rev
			if !rec.State.Terminal() {
				return false, nil // its queue message stays until it ends
			}
			s.ended(&rec)
			return true, s.ack(ctx, j.ID)
		}
		if !isConflict(err) || attempt+1 >= maxMergeAttempts {
			return false, fmt.Errorf("jobstore: record node results of job %s (attempt %d): %w", j.ID, attempt+1, err)
		}
		if attempt > 1 {
			// Many writers at once: spread their next tries.
			select {
			case <-time.After(time.Duration(rand.Int64N(int64(attempt) * int64(time.Millisecond)))):
			case <-ctx.Done():
				return false, fmt.Errorf("jobstore: record node results of job %s: %w", j.ID, ctx.Err())
			}
		}
		cur, err := s.Get(ctx, j.ID)
		if err != nil {
			return false, fmt.Errorf("jobstore: record node results of job %s: %w", j.ID, err)
		}
		j.Record, j.rev = cur.Record, cur.rev
	}
}

// settleQueryConcurrency bounds the node queries of one SettleNodes call.
const settleQueryConcurrency = 16

// SettleNodes asks each node of detached job j on several nodes that has
// no result yet for the job's status (q, at most settleQueryConcurrency at
// once) and records the answers (Observe). A node that does not know the
// job is recorded lost when unknownLost (a holder's successor asking: the
// node lost it), else left as it is (it may not have started it yet); an
// unreachable node is recorded lost when unreachableLost (reconciliation
// past its bound), else left as it is. It reports whether the job is now
// terminal. Errors are the store's; a node's own error only decides how
// the node is recorded.
func (s *Store) SettleNodes(ctx context.Context, q Querier, j *Job, unknownLost, unreachableLost bool) (bool, error) {
	if j.State.Terminal() {
		return true, nil
	}
	nodes := Unsettled(&j.Record)
	type answer struct {
		st  *protocol.JobStatus
		err error
	}
	answers := make([]answer, len(nodes))
	sem := make(chan struct{}, settleQueryConcurrency)
	done := make(chan struct{})
	for i, n := range nodes {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; done <- struct{}{} }()
			st, err := q.JobStatus(ctx, n, j.ID)
			if err == nil && st == nil {
				err = fmt.Errorf("node %s: no status: %w", n, ErrNodeUnreachable)
			}
			if err == nil {
				st.Node = n // the node asked, whatever the answer says
			}
			answers[i] = answer{st, err}
		}()
	}
	for range nodes {
		<-done
	}
	lost := map[string]string{}
	var errs []error
	for i, a := range answers {
		n := nodes[i]
		switch {
		case a.err == nil:
			if _, err := s.Observe(ctx, j, a.st); err != nil {
				errs = append(errs, err)
			}
		case errors.Is(a.err, ErrNoSuchJob):
			if unknownLost {
				lost[n] = fmt.Sprintf("node %s does not know the job", n)
			}
		case unreachableLost:
			lost[n] = fmt.Sprintf("node %s unreachable after its coordinator stopped: %v", n, a.err)
		}
	}
	if len(lost) > 0 {
		if _, err := s.mergeNodes(ctx, j, func(rec *Record) bool {
			changed := false
			for n, why := range lost {
				if protocol.AddJobResult(rec, protocol.JobLostResult(n, why), s.now()) {
					changed = true
				}
			}
			return changed
		}); err != nil {
			errs = append(errs, err)
		}
	}
	return j.State.Terminal(), errors.Join(errs...)
}
