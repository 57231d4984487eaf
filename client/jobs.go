package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/protocol"
)

// JobStatus returns the status of detached job id on node (see
// protocol.ExecRequest.Detach). An unknown job is a *protocol.APIError with
// code protocol.ErrCodeNotFound. A ctx without deadline is bounded by
// RequestTimeout.
func (c *Client) JobStatus(ctx context.Context, node, id string) (*protocol.JobStatus, error) {
	var st protocol.JobStatus
	if err := c.request(ctx, protocol.SubjectJobStatus, protocol.JobRequest{Node: node, ID: id}, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// JobCancel kills detached job id on node (SIGTERM to its process group,
// SIGKILL after the agent's kill grace) and returns its status afterwards.
func (c *Client) JobCancel(ctx context.Context, node, id string) (*protocol.JobStatus, error) {
	var st protocol.JobStatus
	if err := c.request(ctx, protocol.SubjectJobCancel, protocol.JobRequest{Node: node, ID: id}, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// JobOutput is one read of a detached job's output file.
type JobOutput struct {
	Data []byte
	// Total is the file's size when it was read.
	Total int64
	// EOF is set when Data reaches Total and the job exited.
	EOF bool
}

// JobOutput reads at most limit bytes (0: protocol.MaxJobOutputLimit) of
// detached job id's stream ("stdout" or "stderr") on node from offset.
func (c *Client) JobOutput(ctx context.Context, node, id, stream string, offset, limit int64) (*JobOutput, error) {
	if c.NC == nil {
		return nil, errors.New("client: job output: nil NATS connection")
	}
	req := protocol.JobOutputRequest{Node: node, ID: id, Stream: stream, Offset: offset, Limit: limit}
	if e := req.Validate(); e != nil {
		return nil, e
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%s: encode request: %w", protocol.SubjectJobOutput, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.requestTimeout())
		defer cancel()
	}
	msg, err := c.NC.RequestWithContext(ctx, protocol.SubjectJobOutput, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, c.noCoordinator(protocol.SubjectJobOutput)
	}
	if err != nil {
		return nil, fmt.Errorf("%s request to %s: %w", protocol.SubjectJobOutput, c.serverName(), err)
	}
	if e := apiError(msg); e != nil {
		return nil, e
	}
	out := &JobOutput{Data: msg.Data}
	if out.Total, err = strconv.ParseInt(msg.Header.Get(protocol.HeaderTotal), 10, 64); err != nil {
		return nil, fmt.Errorf("%s: reply has a bad %s header: %w", protocol.SubjectJobOutput, protocol.HeaderTotal, err)
	}
	out.EOF = msg.Header.Get(protocol.HeaderEOF) == "true"
	return out, nil
}

// JobGet returns job id's durable record from the coordinators' job store
// (any coordinator answers; the job may have run through another). An
// unknown job, or one the caller may not see, is a *protocol.APIError with
// status 404; a coordinator without a job store answers 501.
func (c *Client) JobGet(ctx context.Context, id string) (*protocol.JobRecord, error) {
	var r protocol.JobRecord
	if err := c.request(ctx, protocol.SubjectJobGet, protocol.JobGetRequest{ID: id}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// JobList returns the job records matching req that the caller may see,
// newest first.
func (c *Client) JobList(ctx context.Context, req protocol.JobListRequest) (*protocol.JobListResponse, error) {
	var r protocol.JobListResponse
	if err := c.request(ctx, protocol.SubjectJobList, req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// JobWait polls job id's record every poll until its state is terminal
// and returns it, or ctx's error. Each poll is one JobGet, bounded by
// jobPollTimeout (and RequestTimeout). A poll that is lost (its
// coordinator died with it: a timeout), finds no coordinator for a moment
// or gets 503 (one draining) is tried again at the next tick: the record
// lives in JetStream, not in the coordinator that answers. Any other
// failed poll is returned (no coordinator at all, too: a wait would not
// end).
func (c *Client) JobWait(ctx context.Context, id string, poll time.Duration) (*protocol.JobRecord, error) {
	if poll <= 0 {
		return nil, fmt.Errorf("client: job wait %s: poll interval %v must be positive", id, poll)
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	state := protocol.JobState("unknown")
	for {
		pctx, cancel := context.WithTimeout(ctx, min(c.requestTimeout(), jobPollTimeout))
		r, err := c.JobGet(pctx, id)
		cancel()
		switch {
		case err == nil && r.State.Terminal():
			return r, nil
		case err == nil:
			state = r.State
		case ctx.Err() != nil:
			return nil, fmt.Errorf("job %s still %s: %w", id, state, ctx.Err())
		case !passingPollError(err):
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("job %s still %s: %w", id, state, ctx.Err())
		case <-t.C:
		}
	}
}

// jobPollTimeout bounds one poll of JobWait: a poll lost with a dying
// coordinator costs this long, not RequestTimeout.
const jobPollTimeout = 3 * time.Second

// passingPollError reports whether err, from one JobGet, passes with the
// moment: the request was lost or timed out, or a coordinator answered
// 503 (draining, or its store unreachable for a moment).
func passingPollError(err error) bool {
	var ae *protocol.APIError
	if errors.As(err, &ae) {
		return ae.Status == 503
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}
