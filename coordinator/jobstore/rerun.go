package jobstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/protocol"
)

// Re-runs of lost idempotent jobs (issue 11 item 2: at least once for a
// job that says it is idempotent). A detached idempotent job's spec (the
// exec request as accepted, with its submitter) is kept under spec.<id>
// (PutSpec), so that whichever coordinator sees the job end lost can run
// it again (Spec). The re-run is claimed on the lost record, compare-and-
// set (ClaimRerun: of several coordinators that saw the loss, one wins,
// the others get ErrFenced), as a new job whose record links back
// (Record.RerunOf, Attempt+1); the lost record names it (RerunAs). After
// MaxAttempts the record stays lost, saying its attempts were exhausted
// (NoRerun, Error); so does one whose re-run was refused (RefuseRerun).

// MaxAttempts bounds the runs of one idempotent job: the first and its
// re-runs.
const MaxAttempts = protocol.MaxJobAttempts

// Errors of ClaimRerun.
var (
	// ErrNotRerunnable: the record is not a lost detached idempotent job.
	ErrNotRerunnable = errors.New("jobstore: job is not a lost idempotent detached job")
	// ErrRerunClaimed: the record's re-run was claimed already, or
	// refused (Record.RerunAs, Record.NoRerun).
	ErrRerunClaimed = errors.New("jobstore: job's re-run is claimed or refused already")
	// ErrAttemptsExhausted: the job ran MaxAttempts times; it stays lost.
	ErrAttemptsExhausted = errors.New("jobstore: job's attempts are exhausted")
)

func specKey(id string) string { return "spec." + id }

// PutSpec stores spec, the job's exec request as accepted (opaque to the
// store), for a re-run by any coordinator. It expires with the records.
func (s *Store) PutSpec(ctx context.Context, id string, spec []byte) error {
	if _, err := s.kv.Put(ctx, specKey(id), spec); err != nil {
		return fmt.Errorf("jobstore: store spec of job %s: %w", protocol.Clip(id), err)
	}
	return nil
}

// Spec is the spec PutSpec stored for job id; ErrNotFound if none.
func (s *Store) Spec(ctx context.Context, id string) ([]byte, error) {
	e, err := s.kv.Get(ctx, specKey(id))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return nil, fmt.Errorf("jobstore: spec of job %s: %w", protocol.Clip(id), ErrNotFound)
		}
		return nil, fmt.Errorf("jobstore: spec of job %s: %w", protocol.Clip(id), err)
	}
	return e.Value(), nil
}

// Rerunnable reports whether r is a lost detached idempotent job whose
// re-run nobody claimed or refused yet: on one node, ended lost; on
// several, ended with some node lost (LostNodes: those re-run, each on
// its own).
func Rerunnable(r *Record) bool {
	return lostRun(r) && r.RerunAs == "" && r.NoRerun == ""
}

// lostRun reports whether r is a detached idempotent job that ended with
// a run lost.
func lostRun(r *Record) bool {
	if !r.Detached || !r.Idempotent || !r.State.Terminal() {
		return false
	}
	if len(r.Nodes) > 1 {
		return len(LostNodes(r)) > 0
	}
	return r.State == Lost
}

// LostNodes are the nodes of a job on several nodes whose result says
// lost.
func LostNodes(r *Record) []string {
	var out []string
	for i := range r.Results {
		if r.Results[i].ErrorCode == protocol.ResultCodeLost {
			out = append(out, r.Results[i].Node)
		}
	}
	return out
}

// attempt is r's attempt, 1-based.
func attempt(r *Record) int { return max(r.Attempt, 1) }

// ClaimRerun claims the re-run of lost job j (read by Get, or as written)
// as job next (for a job on several nodes, the re-runs of its lost nodes,
// comma-separated): compare-and-set on j's revision, so that of several
// claimers exactly one wins; the others get ErrFenced (or, read again,
// ErrRerunClaimed). A job that ran MaxAttempts times is not claimed: its
// record says its attempts were exhausted, and ClaimRerun returns
// ErrAttemptsExhausted. The claim is not fenced by holder: the job ended,
// and any coordinator that saw it end may run it again.
func (s *Store) ClaimRerun(ctx context.Context, j *Job, next string) error {
	switch {
	case !lostRun(&j.Record):
		return fmt.Errorf("jobstore: re-run job %s (%s): %w", j.ID, j.State, ErrNotRerunnable)
	case j.RerunAs != "" || j.NoRerun != "":
		return fmt.Errorf("jobstore: re-run job %s: %w (%s%s)", j.ID, ErrRerunClaimed, j.RerunAs, j.NoRerun)
	}
	rec := j.Record
	if n := attempt(&rec); n >= MaxAttempts {
		why := fmt.Sprintf("attempts exhausted (%d of %d)", n, MaxAttempts)
		if err := s.markRerun(ctx, j, rec, "", why); err != nil {
			return err
		}
		return fmt.Errorf("jobstore: re-run job %s: %w (%d of %d)", j.ID, ErrAttemptsExhausted, n, MaxAttempts)
	}
	return s.markRerun(ctx, j, rec, next, "")
}

// RefuseRerun records on lost job j, whose re-run this coordinator
// claimed (ClaimRerun), that it was not run again (or, of a job on
// several nodes, not on every lost node: started are the re-runs that
// did start, comma-separated), and why; the record is never claimed
// again. With started and why empty it releases the claim instead: the
// job may be claimed again (a re-run put off).
func (s *Store) RefuseRerun(ctx context.Context, j *Job, started, why string) error {
	if !lostRun(&j.Record) || j.NoRerun != "" {
		return fmt.Errorf("jobstore: refuse re-run of job %s (%s): %w", j.ID, j.State, ErrNotRerunnable)
	}
	return s.markRerun(ctx, j, j.Record, started, why)
}

// markRerun writes rec with RerunAs next, or NoRerun why (added to its
// Error too), compare-and-set on j's revision.
func (s *Store) markRerun(ctx context.Context, j *Job, rec Record, next, why string) error {
	rec.RerunAs, rec.NoRerun = next, why
	if why != "" {
		if rec.Error != "" {
			rec.Error += "; "
		}
		rec.Error += "not re-run: " + why
	}
	b, _ := json.Marshal(&rec)
	rev, err := s.kv.Update(ctx, jobKey(j.ID), b, j.rev)
	if err != nil {
		if isConflict(err) {
			return fmt.Errorf("jobstore: re-run job %s: %w (changed since read)", j.ID, ErrFenced)
		}
		return fmt.Errorf("jobstore: re-run job %s: %w", j.ID, err)
	}
	j.Record, j.rev = rec, rev
	return nil
}

// OnEnd sets f to be called (on the writer's goroutine, after the write)
// with each record this store's writes end: the coordinator re-runs the
// lost idempotent ones (Rerunnable). f must not block.
func (s *Store) OnEnd(f func(*Record)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onEnd = f
}

// ended calls the OnEnd hook with rec, if rec is terminal.
func (s *Store) ended(rec *Record) {
	if !rec.State.Terminal() {
		return
	}
	s.mu.Lock()
	f := s.onEnd
	s.mu.Unlock()
	if f != nil {
		r := *rec
		f(&r)
	}
}
