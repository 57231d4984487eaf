package protocol

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Detached jobs: an exec with ExecParams.Detach keeps running on its node
// after its stream (and the tunnel) is gone, writing its output to files
// there. A job stream (KindJob) queries or cancels one by id:
//
//   - op "status": the agent answers one FrameJob with a JobStatus;
//   - op "output": the agent answers FrameStdout frames with the bytes of the
//     requested stream's file from Offset (at most Limit bytes in total),
//     then one FrameJob with a JobOutputEnd;
//   - op "cancel": the agent kills the job's process group (SIGTERM, then
//     SIGKILL after its kill grace) and answers one FrameJob with the
//     JobStatus after the kill was sent.
//
// Any failure (unknown job, bad params) is one FrameError instead. The agent
// closes the stream after its answer.

// Ops of a job stream.
const (
	JobOpStatus = "status"
	JobOpOutput = "output"
	JobOpCancel = "cancel"
)

// Job states.
const (
	JobRunning = "running"
	JobExited  = "exited"
	// JobLost: how the job ended is unknown: its supervisor on the node
	// (the agent's job shim) ended without recording it (it was killed or
	// failed; its parent-death signal then killed the job's main
	// process), or the job was started by an agent too old to have one
	// and that agent restarted.
	JobLost = "lost"
)

// JobLostError is the error recorded for node's run of a detached job
// that node reported JobLost (a JobRecord's Error, or its NodeResult's):
// what the node saw, which is that the job's shim ended without recording
// the job's end; the shim's parent-death signal kills the job's main
// process with it. It does not say "the agent restarted": a detached job
// outlives its agent. The job store records it and the CLI, bringing a
// record that lags its nodes up to date, says the same.
func JobLostError(node string) string {
	return fmt.Sprintf("node %s lost the job: its supervisor on the node (the job shim) ended while the job ran, without recording how the job ended (killed? the node rebooted?); the job's main process was killed with it", node)
}

// JobParams are the params of a job stream's header.
type JobParams struct {
	Op string `json:"op"`
	ID string `json:"id"`
	// Stream is "stdout" or "stderr" (op output).
	Stream string `json:"stream,omitempty"`
	// Offset is where to start reading, in bytes (op output).
	Offset int64 `json:"offset,omitempty"`
	// Limit bounds the bytes answered, at most MaxJobOutputLimit; zero
	// means MaxJobOutputLimit (op output).
	Limit int64 `json:"limit,omitempty"`
}

// Validate reports every problem with p, joined.
func (p *JobParams) Validate() error {
	var errs []error
	switch p.Op {
	case JobOpStatus, JobOpCancel:
	case JobOpOutput:
		if p.Stream != ReplyStdout && p.Stream != ReplyStderr {
			errs = append(errs, fmt.Errorf("stream %s: want stdout or stderr", Clip(p.Stream)))
		}
		if p.Offset < 0 {
			errs = append(errs, errors.New("offset must not be negative"))
		}
		if p.Limit < 0 || p.Limit > MaxJobOutputLimit {
			errs = append(errs, fmt.Errorf("limit %d: must be 0 (default %d) to %d", p.Limit, MaxJobOutputLimit, MaxJobOutputLimit))
		}
	default:
		errs = append(errs, fmt.Errorf("op %s: want status, output or cancel", Clip(p.Op)))
	}
	if err := ValidJobID(p.ID); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ValidJobID checks a job id (ExecRequest.ID, JobParams.ID, a detached
// job's JobID): 1 to MaxJobIDLen characters of [A-Za-z0-9-_.], starting and
// ending with a letter or digit. It is the one rule for job ids: the API,
// the agent and the CLI check them with it.
func ValidJobID(id string) error {
	if !validSegment(id, MaxJobIDLen) {
		return fmt.Errorf("job id %s: must be 1-%d characters of [A-Za-z0-9-_.], starting and ending with a letter or digit", Clip(id), MaxJobIDLen)
	}
	// The id is a token of the job store's keys (job.<id>) and of
	// subjects, where an empty token is no key at all.
	if i := strings.Index(id, ".."); i >= 0 {
		return fmt.Errorf("job id %s: two dots in a row at byte %d (the job store's keys have no empty part)", Clip(id), i+1)
	}
	return nil
}

// JobStatus describes a detached job.
type JobStatus struct {
	ID    string `json:"id"`
	Node  string `json:"node"`
	State string `json:"state"` // JobRunning, JobExited or JobLost
	// ExitCode is set once the job exited (128+N when killed by signal N,
	// 124 when its timeout killed it).
	ExitCode        *int       `json:"exit_code,omitempty"`
	Signal          string     `json:"signal,omitempty"`
	TimedOut        bool       `json:"timed_out,omitempty"`
	Cancelled       bool       `json:"cancelled,omitempty"`
	StartedAt       time.Time  `json:"started_at"`
	FinishedAt      *time.Time `json:"finished_at,omitempty"`
	StdoutBytes     int64      `json:"stdout_bytes"`
	StderrBytes     int64      `json:"stderr_bytes"`
	StdoutTruncated bool       `json:"stdout_truncated,omitempty"`
	StderrTruncated bool       `json:"stderr_truncated,omitempty"`
	// Error, set by the node, says what went wrong on the node beside the
	// job's own exit: an output file it could not write (naming the file
	// and the errno: the output kept is then incomplete), a status it
	// could not write where it belongs. An exited job with an Error is a
	// failed result (JobExitResult).
	Error string `json:"error,omitempty"`
}

// JobOutputEnd ends an op output answer.
type JobOutputEnd struct {
	// Total is the size of the output file so far (what was kept, at most
	// the output limit).
	Total int64 `json:"total"`
	// EOF is set when the answer reached Total and the job exited: there
	// will never be more.
	EOF bool `json:"eof"`
}

// JobRequest is the body of SubjectJobStatus and SubjectJobCancel requests.
type JobRequest struct {
	Node string `json:"node"`
	ID   string `json:"id"`
}

// JobOutputRequest is the body of a SubjectJobOutput request.
type JobOutputRequest struct {
	Node   string `json:"node"`
	ID     string `json:"id"`
	Stream string `json:"stream"` // "stdout" or "stderr"
	Offset int64  `json:"offset,omitempty"`
	// Limit bounds the reply, 1 to MaxJobOutputLimit bytes; 0 means
	// MaxJobOutputLimit.
	Limit int64 `json:"limit,omitempty"`
}

// Validate checks a job request.
func (r *JobRequest) Validate() *APIError {
	if err := ValidNodeID(r.Node); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "node: %v", err)
	}
	p := JobParams{Op: JobOpStatus, ID: r.ID}
	if err := p.Validate(); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "%v", err)
	}
	return nil
}

// Validate checks a job output request.
func (r *JobOutputRequest) Validate() *APIError {
	if err := ValidNodeID(r.Node); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "node: %v", err)
	}
	if err := r.Params().Validate(); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "%s", joinLines(err))
	}
	return nil
}

// Params returns the job stream params of r.
func (r *JobOutputRequest) Params() *JobParams {
	return &JobParams{Op: JobOpOutput, ID: r.ID, Stream: r.Stream, Offset: r.Offset, Limit: r.Limit}
}

func joinLines(err error) string {
	s := err.Error()
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, "; "...)
			continue
		}
		out = append(out, s[i])
	}
	return string(out)
}
