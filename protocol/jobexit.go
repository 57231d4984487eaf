package protocol

import (
	"errors"
	"fmt"
)

// Exit reports of detached jobs. A detached job's durable record
// (JobRecord) is written running once its node started it. Without
// reports it is settled only when someone asks (tether.v1.job.get asks
// the node) or when a restarted coordinator reconciles, so a listing
// (tether.v1.job.list) showed jobs long finished as running. With
// FeatureJobExit the agent reports each detached job of its node that
// exited or that it found lost (its shim gone without a status) on the
// control stream, FrameJobExit with the job's final JobStatus (the same
// shape op status answers), and the coordinator settles the record from
// it at once: listings are current within moments of a job's end.
//
// Delivery is at least once per agent session that could carry it, and
// not acknowledged: the agent records, in the job's directory, that it
// wrote a job's report, and reports the jobs that ended without one at
// the start of each session whose coordinator takes reports (so a job
// that ended while the agent was disconnected or restarting is reported
// at its next session). A report written just before a session died may
// be lost; job.get and reconciliation still settle such a record. A
// repeated report changes nothing: a settled record is terminal.
//
// The coordinator takes the node from the session (the node its
// certificate proved), never from the payload, and settles only a
// single-node detached job whose record names that node: an agent can
// settle its own node's jobs, no other's.

// FeatureJobExit, in Hello.Features: the agent may send FrameJobExit on
// the control stream. In Welcome.Features: the coordinator takes it. An
// agent sends it only to a coordinator whose Welcome listed it.
const FeatureJobExit = "job_exit"

// MaxJobExitSize bounds a FrameJobExit payload, in bytes: a JobStatus is
// a few hundred.
const MaxJobExitSize = 4 << 10

// ErrBadJobExit wraps every reason DecodeJobExit refuses a report for.
var ErrBadJobExit = errors.New("protocol: bad job exit report")

// DecodeJobExit decodes and checks a FrameJobExit payload: JSON within
// MaxJobExitSize (DecodeJSON's rules), a valid job id (ValidJobID), state
// JobExited (with an exit code) or JobLost, no negative byte count, and a
// signal name of at most 32 bytes. Failures wrap ErrBadJobExit (and
// ErrMalformedJSON or ErrTooLarge where they apply). Node is returned as
// sent: the receiver replaces it with the session's node.
func DecodeJobExit(payload []byte) (*JobStatus, error) {
	if len(payload) > MaxJobExitSize {
		return nil, fmt.Errorf("%w: %d bytes: %w (max %d)", ErrBadJobExit, len(payload), ErrTooLarge, MaxJobExitSize)
	}
	var st JobStatus
	if err := DecodeJSON(payload, &st); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadJobExit, err)
	}
	if err := ValidJobID(st.ID); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadJobExit, err)
	}
	switch st.State {
	case JobExited:
		if st.ExitCode == nil {
			return nil, fmt.Errorf("%w: job %s: state exited without an exit code", ErrBadJobExit, st.ID)
		}
	case JobLost:
	default:
		return nil, fmt.Errorf("%w: job %s: state %s: want %s or %s", ErrBadJobExit, st.ID, Clip(st.State), JobExited, JobLost)
	}
	if st.StdoutBytes < 0 || st.StderrBytes < 0 {
		return nil, fmt.Errorf("%w: job %s: negative byte count", ErrBadJobExit, st.ID)
	}
	if len(st.Signal) > 32 {
		return nil, fmt.Errorf("%w: job %s: signal name of %d bytes (max 32)", ErrBadJobExit, st.ID, len(st.Signal))
	}
	return &st, nil
}
