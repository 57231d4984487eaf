package protocol

import (
	"errors"
	"fmt"
	"time"
)

// Durable job records (DESIGN §4 durable path): every job the exec API
// accepts has a JobRecord in the coordinators' job store, readable by id
// from any coordinator through SubjectJobGet and listed through
// SubjectJobList.

// Subjects of the job store API.
const (
	// SubjectJobGet takes a JobGetRequest and replies with the JobRecord
	// (404 not_found when there is none or the caller may not see it). A
	// detached job recorded running is asked of its node first, when the
	// coordinator answering holds the node's tunnel, so the record shows
	// its exit once it exited.
	SubjectJobGet = "tether.v1.job.get"
	// SubjectJobList takes a JobListRequest (an empty body is allowed) and
	// replies with a JobListResponse of the records the caller may see.
	SubjectJobList = "tether.v1.job.list"
)

// JobState is a job's durable state. It moves only forward: queued →
// dispatched → running → succeeded, failed, cancelled or lost.
type JobState string

// Job states of a record.
const (
	JobQueued     JobState = "queued"
	JobDispatched JobState = "dispatched"
	// JobStateRunning is JobRunning as a record's state.
	JobStateRunning JobState = "running"
	JobSucceeded    JobState = "succeeded"
	JobFailed       JobState = "failed"
	JobCancelled    JobState = "cancelled"
	// JobStateLost: the job's outcome is unknown (its coordinator or its
	// node's agent died while it ran, or it was never dispatched).
	JobStateLost JobState = "lost"
)

// Rank orders states: 0 queued, 1 dispatched, 2 running, 3 any terminal
// state; -1 for an unknown one.
func (s JobState) Rank() int {
	switch s {
	case JobQueued:
		return 0
	case JobDispatched:
		return 1
	case JobStateRunning:
		return 2
	case JobSucceeded, JobFailed, JobCancelled, JobStateLost:
		return 3
	}
	return -1
}

// Valid reports whether s is a known state.
func (s JobState) Valid() bool { return s.Rank() >= 0 }

// Terminal reports whether s is final.
func (s JobState) Terminal() bool { return s.Rank() == 3 }

// JobRecord is a job's durable record. Times are UTC; zero (omitted)
// means not reached.
type JobRecord struct {
	ID    string   `json:"id"`
	State JobState `json:"state"`
	// Owner is the submitting identity (its policy string, e.g.
	// "nats:alice"); empty when unknown.
	Owner string `json:"owner,omitempty"`
	// Coordinator is the id of the coordinator holding the job; Epoch
	// counts how often the job changed holders; Boot identifies the
	// holder's process (a restarted coordinator has a new one).
	Coordinator string `json:"coordinator"`
	Epoch       uint64 `json:"epoch"`
	Boot        string `json:"boot,omitempty"`
	// Nodes are the target node ids, sorted.
	Nodes []string `json:"nodes"`
	// Target is the request's selector ("" for one node).
	Target     string `json:"target,omitempty"`
	Detached   bool   `json:"detached,omitempty"`
	Idempotent bool   `json:"idempotent,omitempty"`
	// Command is the first line of the job's script (or argv, or its
	// batch's commands, a line each), at most 120 bytes, marking what it
	// leaves out: "…" where the line was cut, and " … (N lines)" when the
	// N lines of the whole go on past it.
	Command      string    `json:"command,omitempty"`
	SubmittedAt  time.Time `json:"submitted_at"`
	DispatchedAt time.Time `json:"dispatched_at,omitzero"`
	StartedAt    time.Time `json:"started_at,omitzero"`
	FinishedAt   time.Time `json:"finished_at,omitzero"`
	// Results are the nodes' results once the job ended, unless
	// ResultsOmitted (too large to keep: only the counts are).
	Results        []NodeResult `json:"results,omitempty"`
	ResultsOmitted bool         `json:"results_omitted,omitempty"`
	Succeeded      int          `json:"succeeded,omitempty"`
	Failed         int          `json:"failed,omitempty"`
	// Error says why the job was lost, or failed without a node result
	// (and, for an idempotent job lost, why it was not run again).
	Error string `json:"error,omitempty"`
	// Attempt is which run of an idempotent job this record is (1-based;
	// 0 in records written before attempts were counted, read as 1).
	// RerunOf is the lost record this attempt runs again; RerunAs the
	// record of the attempt that runs this lost one again, set when a
	// coordinator claimed the re-run (at most one does).
	Attempt int    `json:"attempt,omitempty"`
	RerunOf string `json:"rerun_of,omitempty"`
	RerunAs string `json:"rerun_as,omitempty"`
	// NoRerun says why a lost idempotent job was not run again
	// (attempts exhausted, its owner no longer authorized...); set, it
	// is never claimed for a re-run.
	NoRerun string `json:"no_rerun,omitempty"`
}

// MaxJobAttempts bounds the runs of one idempotent detached job: its
// first and the re-runs coordinators make when a run is lost
// (JobRecord.Attempt).
const MaxJobAttempts = 3

// ExitCode is the job's raw exit status as recorded: the exit code of
// its one node's result (-1 if it has none, as for a command the node
// could not start), 0 when every node of a fan-out succeeded, else 1;
// lost or cancelled jobs without a result are -1. It is not what `tether
// job wait` exits with: the CLI maps a result's error code, timeout and
// cancel to its exit codes (127, 126, 124, 130, 255) and a fan-out of one
// node by its target.
func (r *JobRecord) ExitCode() int {
	if len(r.Results) == 1 {
		return r.Results[0].ExitCode
	}
	switch {
	case r.State == JobSucceeded:
		return 0
	case r.Failed > 0:
		return 1
	}
	return -1
}

// JobGetRequest is the body of a SubjectJobGet request.
type JobGetRequest struct {
	ID string `json:"id"`
	// Mine asks as the job's submitter (a client checking on a job it
	// sent, which heard nothing): when no record of that id names the
	// caller as its owner (none at all, or another's), the answer is 404
	// ErrCodeNotRecorded, which tells the submitter that no coordinator
	// accepted its request (a job runs only once its record is stored)
	// and tells nothing of other callers' jobs. Without Mine, both are
	// 404 ErrCodeNotFound.
	Mine bool `json:"mine,omitempty"`
}

// Validate checks the id: 400 invalid_request if bad.
func (r *JobGetRequest) Validate() *APIError {
	if err := ValidJobID(r.ID); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "%v", err)
	}
	return nil
}

// MaxJobList bounds a JobListRequest's Limit.
const MaxJobList = 1000

// JobListRequest is the body of a SubjectJobList request; empty fields
// match every record.
type JobListRequest struct {
	State JobState `json:"state,omitempty"`
	Node  string   `json:"node,omitempty"`
	Owner string   `json:"owner,omitempty"`
	// Limit bounds the records answered (newest first), 1 to MaxJobList;
	// zero means 100.
	Limit int `json:"limit,omitempty"`
}

// Validate reports every problem with r (400 invalid_request).
func (r *JobListRequest) Validate() *APIError {
	var errs []error
	if r.State != "" && !r.State.Valid() {
		errs = append(errs, fmt.Errorf("state %s: want queued, dispatched, running, succeeded, failed, cancelled or lost", Clip(string(r.State))))
	}
	if r.Node != "" {
		if err := ValidNodeID(r.Node); err != nil {
			errs = append(errs, err)
		}
	}
	if len(r.Owner) > 1024 {
		errs = append(errs, errors.New("owner longer than 1024 bytes"))
	}
	if r.Limit < 0 || r.Limit > MaxJobList {
		errs = append(errs, fmt.Errorf("limit %d: want 0 (default 100) to %d", r.Limit, MaxJobList))
	}
	if err := errors.Join(errs...); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "%v", err)
	}
	return nil
}

// JobListResponse answers SubjectJobList.
type JobListResponse struct {
	Jobs []JobRecord `json:"jobs"`
	// More is set when Limit cut the list.
	More bool `json:"more,omitempty"`
}
