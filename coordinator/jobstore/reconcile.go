package jobstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// Errors a Querier returns.
var (
	// ErrNodeUnreachable: the node is not connected (here, or anywhere
	// the querier can reach), so the job's fate is unknown for now.
	ErrNodeUnreachable = errors.New("jobstore: node unreachable")
	// ErrNoSuchJob: the node answered that it has no such job.
	ErrNoSuchJob = errors.New("jobstore: node has no such job")
)

// Querier asks a node about a detached job.
type Querier interface {
	// JobStatus returns the job's status on node, ErrNodeUnreachable
	// (wrapped) when the node cannot be asked, ErrNoSuchJob when the node
	// does not know the job.
	JobStatus(ctx context.Context, node, id string) (*protocol.JobStatus, error)
}

// Outcome is what Reconcile did with the jobs it looked at.
type Outcome struct {
	// Claimed jobs this coordinator took over; Settled those it ended
	// (with the node's result or as lost); Pending the detached jobs left
	// running because their node could not be asked (a later pass ends
	// them lost once they have been pending loseAfter).
	Claimed, Settled, Pending int
	// Errs are the jobs that could not be reconciled (another coordinator
	// claimed them first: ErrFenced), joined.
	Errs error
}

// Reconcile takes over the non-terminal jobs left by a dead holder (dead
// reports whether a holder id is dead; this coordinator's own id is always
// dead to it when written by another process: those jobs are a
// predecessor's) and settles them:
//   - queued: it never ran; lost (at most once) with that reason;
//   - attached (dispatched or running): its exec stream ended with its
//     coordinator, so the agent killed it; lost;
//   - detached on several nodes: each node without a result is asked, as
//     SettleNodes does; a node that does not know the job is lost at once,
//     an unreachable one once the job has been pending loseAfter; the job
//     ends when every node has a result;
//   - detached on one node: its status is asked of the node; exited
//     becomes succeeded (exit 0), failed or cancelled; running stays
//     running under the new holder; a node that does not know it makes
//     it lost; an unreachable node leaves it pending, and lost once it
//     has been pending for loseAfter (0: at once).
//
// It reads the bucket (Active).
func (s *Store) Reconcile(ctx context.Context, q Querier, dead func(holder string) bool, loseAfter time.Duration) (Outcome, error) {
	var out Outcome
	keep := func(r *Record) bool {
		if r.Coordinator == s.cfg.Coordinator {
			return r.Boot != s.boot || s.isPending(r.ID)
		}
		return dead != nil && dead(r.Coordinator)
	}
	jobs, err := s.Active(ctx, keep)
	if err != nil && jobs == nil {
		return out, fmt.Errorf("jobstore: reconcile: %w", err)
	}
	errs := []error{err} // records that could not be read, if any
	for _, j := range jobs {
		claimed, settled, err := s.TakeOver(ctx, q, j, loseAfter)
		if claimed {
			out.Claimed++
		}
		switch {
		case err != nil:
			errs = append(errs, err)
		case settled:
			out.Settled++
		default:
			out.Pending++
		}
	}
	out.Errs = errors.Join(errs...)
	return out, nil
}

// TakeOver claims one orphaned job read by Get or Active (unless this
// coordinator holds it already: pending from an earlier pass) and settles
// it as Reconcile does. claimed reports whether this call raised the
// epoch; settled whether the job ended (else it stays running, pending,
// under this coordinator, and is lost once pending for loseAfter). A job
// claimed first by another coordinator is ErrFenced.
func (s *Store) TakeOver(ctx context.Context, q Querier, j *Job, loseAfter time.Duration) (claimed, settled bool, err error) {
	if j.Coordinator != s.cfg.Coordinator || j.Boot != s.boot {
		if err := s.Claim(ctx, j); err != nil {
			return false, false, err
		}
		claimed = true
	}
	since := s.pendingSince(j.ID)
	settled, err = s.settleOrphan(ctx, q, j, since != (time.Time{}) && s.cfg.Now().Sub(since) >= loseAfter || loseAfter <= 0)
	if err != nil {
		return claimed, false, err
	}
	s.setPending(j.ID, !settled)
	return claimed, settled, nil
}

func (s *Store) settleOrphan(ctx context.Context, q Querier, j *Job, lose bool) (bool, error) {
	switch {
	case j.State == Queued:
		return true, s.Lose(ctx, j, "its coordinator stopped before dispatching it; it never ran")
	case !j.Detached || len(j.Nodes) == 0:
		return true, s.Lose(ctx, j, "its coordinator stopped while it ran; an attached job dies with its exec stream")
	case len(j.Nodes) > 1:
		return s.SettleNodes(ctx, q, j, true, lose)
	}
	st, err := q.JobStatus(ctx, j.Nodes[0], j.ID)
	switch {
	case errors.Is(err, ErrNoSuchJob):
		return true, s.Lose(ctx, j, fmt.Sprintf("node %s does not know the job", j.Nodes[0]))
	case errors.Is(err, ErrNodeUnreachable) || err != nil:
		if lose {
			return true, s.Lose(ctx, j, fmt.Sprintf("node %s unreachable after its coordinator stopped: %v", j.Nodes[0], err))
		}
		return false, nil
	}
	done, err := s.Observe(ctx, j, st)
	return done, err
}

// Observe applies a detached job's status, as its node reported it, to
// the record by protocol.ObserveJob's rule (the CLI's too, for a record
// that lags its nodes): running moves a dispatched job to running; exited
// or lost ends it (a zero exit code succeeded, a cancel cancelled, else
// failed; lost lost), finished no earlier than it started. It reports
// whether the job is now terminal. The write is
// compare-and-set on the handle's revision but not fenced by holder: the
// node's own report is authoritative, so any coordinator that read the
// record may settle it.
//
// A job on several nodes records st as st.Node's result instead (see
// nodes.go), ending once every node has one; a status of a node the job
// does not name is ErrNotInJob.
func (s *Store) Observe(ctx context.Context, j *Job, st *protocol.JobStatus) (bool, error) {
	if j.State.Terminal() {
		return true, nil
	}
	if len(j.Nodes) > 1 {
		return s.observeNode(ctx, j, st)
	}
	if st.Node != "" && !slices.Contains(j.Nodes, st.Node) {
		return false, fmt.Errorf("jobstore: observe job %s: node %s: %w (%s)", j.ID, protocol.Clip(st.Node), ErrNotInJob, strings.Join(j.Nodes, ","))
	}
	rec := j.Record
	changed, err := protocol.ObserveJob(&rec, st, s.now())
	if err != nil {
		return false, fmt.Errorf("jobstore: observe job %s: %w", j.ID, err)
	}
	if !changed {
		return rec.State.Terminal(), nil
	}
	if err := s.write(ctx, j, rec); err != nil {
		return false, err
	}
	if !rec.State.Terminal() {
		return false, nil // its queue message stays until it ends
	}
	return true, s.ack(ctx, j.ID)
}

func (s *Store) isPending(id string) bool {
	return s.pendingSince(id) != (time.Time{})
}

// pendingSince is when a pass first left job id pending; zero if none did.
func (s *Store) pendingSince(id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending[id]
}

func (s *Store) setPending(id string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch _, ok := s.pending[id]; {
	case !on:
		delete(s.pending, id)
	case !ok:
		s.pending[id] = s.cfg.Now()
	}
}
