package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/protocol"
)

// Defaults used when the corresponding Client field is zero.
const (
	DefaultRequestTimeout = 10 * time.Second
	DefaultCancelGrace    = 5 * time.Second
	// DefaultKeepAliveTimeout is how long Exec waits without any reply
	// before it decides the coordinator is gone: three times 15 s, well
	// above the coordinator's keepalive interval (5 s by default).
	DefaultKeepAliveTimeout = 3 * 15 * time.Second
	// DefaultFateCheckAfter is how long Exec waits with no reply before it
	// asks the job store (any coordinator) what became of the job: a
	// little more than the coordinator's keepalive interval
	// (protocol.DefaultKeepAliveInterval), so that a job whose coordinator
	// lives is never asked about (each check is an audited job.get).
	DefaultFateCheckAfter = protocol.DefaultKeepAliveInterval + time.Second
)

// ErrCoordinatorSilent is matched (errors.Is) by the error Exec returns when
// nothing at all arrived for a job for KeepAliveTimeout.
var ErrCoordinatorSilent = errors.New("client: coordinator stopped answering")

// ErrNotRecorded is matched (errors.Is) by the error ExecWith returns when
// no reply came and the job store holds no record of the job submitted by
// this caller, twice, NotRecordedConfirm apart: the coordinator that took
// the request stopped before recording it, so the job did not run (a job
// runs only once its record is stored) and may be submitted again.
var ErrNotRecorded = errors.New("client: job was never recorded, so it did not run")

// NotRecordedConfirm is how long after a fate check that found no record
// of the job ExecWith checks again before it concludes ErrNotRecorded.
const NotRecordedConfirm = time.Second

// notRecordedError is the error of a job no coordinator recorded.
type notRecordedError struct {
	id     string
	silent time.Duration
}

func (e *notRecordedError) Error() string {
	return fmt.Sprintf("exec job %s: no reply for %v and no coordinator recorded the job: the coordinator that took the request stopped before recording it, so it did not run; it may be submitted again", e.id, e.silent.Round(time.Second))
}

func (e *notRecordedError) Is(target error) bool { return target == ErrNotRecorded }

// silentError is the error of a job whose coordinator fell silent.
type silentError struct{ id string }

func (e *silentError) Error() string {
	return fmt.Sprintf("coordinator stopped answering for job %s; it may have restarted — the job was cancelled or is lost", e.id)
}

func (e *silentError) Is(target error) bool { return target == ErrCoordinatorSilent }

// connClosedError is Exec's error when its NATS connection was closed
// while it waited for the job's replies: it matches
// nats.ErrConnectionClosed.
type connClosedError struct{ id string }

func (e *connClosedError) Error() string {
	return fmt.Sprintf("exec job %s: %v while waiting for its result (the NATS server disconnects a user whose credentials were revoked or expired); "+
		"its outcome is unknown here: tether job status %s", e.id, nats.ErrConnectionClosed, e.id)
}

func (e *connClosedError) Unwrap() error { return nats.ErrConnectionClosed }

// Reply subscription limits of Exec. Output is drained as fast as the
// OutputHandler accepts it; the limits only matter when the handler blocks
// (a paused terminal, a full pipe), and they are generous so that a burst of
// fan-out output is buffered rather than dropped. Past them nats.go drops
// replies and Exec reports the sequence gap.
const (
	execPendingMsgs  = -1        // no limit on the number of replies
	execPendingBytes = 256 << 20 // 256 MiB of buffered replies (per request)
)

// OutputHandler receives one chunk of a node's output. stream is
// protocol.ReplyStdout or protocol.ReplyStderr. Calls come from the goroutine
// that called Exec, one at a time, in the order the coordinator sent them;
// the handler may keep data.
type OutputHandler func(node, stream string, data []byte)

// NodeResultHandler receives one node's result as soon as the node finished,
// from the goroutine that called ExecWith, in arrival order, interleaved with
// output calls (a node's output comes before its result).
type NodeResultHandler func(r *protocol.NodeResult)

// ExecOptions are the optional callbacks of ExecWith. Nil fields are
// skipped.
type ExecOptions struct {
	// Output receives output chunks.
	Output OutputHandler
	// NodeResult receives each node's result as the node finishes.
	NodeResult NodeResultHandler
	// Rerun, if set, is told when an idempotent job that was lost with
	// its coordinator (or never recorded: ErrNotRecorded) is submitted
	// again (as job next; why is the record's reason, or "never
	// recorded: …"). Output and results of the new attempt follow.
	Rerun func(lost, next, why string)

	reruns int // attempts submitted again so far (rerun)
}

// MaxIdempotentReruns bounds how many times ExecWith submits an
// idempotent job again after an attempt was lost.
const MaxIdempotentReruns = 3

// Client calls Tether's NATS API over a connection it does not own: closing
// NC is the caller's job. The zero values of the tuning fields select the
// defaults. A Client is safe for concurrent use.
type Client struct {
	// NC is the NATS connection requests go through. Required.
	NC *nats.Conn
	// RequestTimeout bounds Nodes and Cancel when their ctx has no deadline,
	// and Exec's check that a coordinator received the request. Zero means
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// CancelGrace is how long Exec keeps waiting for a job's final result
	// after its ctx ended and it asked the coordinator to cancel the job.
	// Zero means DefaultCancelGrace.
	CancelGrace time.Duration
	// KeepAliveTimeout is how long Exec waits with no reply at all (output,
	// node result, keepalive) before it gives up on the job: the
	// coordinator sends keepalives while a job is silent, so silence means
	// it is gone. Zero means DefaultKeepAliveTimeout.
	KeepAliveTimeout time.Duration
	// FateCheckAfter is how long Exec waits with no reply before it reads
	// the job's durable record (JobGet, answered by any coordinator), and
	// again after each further FateCheckAfter of silence: a job whose
	// coordinator died is settled by another one (lost, for an attached
	// job), and Exec returns that outcome within seconds instead of after
	// KeepAliveTimeout. Zero means DefaultFateCheckAfter; negative turns
	// the checks off.
	FateCheckAfter time.Duration
	// Direct selects how OpenStream carries streams (direct.go): the zero
	// value, DirectAuto, uses the coordinator's tunnel listener when it
	// can and relays over NATS otherwise.
	Direct DirectMode
	// DirectDialTimeout bounds the dial and TLS handshake with a
	// coordinator's tunnel listener. Zero means DefaultDirectDialTimeout.
	DirectDialTimeout time.Duration

	// direct is the cached direct sessions; Close releases them.
	direct directClient

	// replies is the one reply subscription of all exec requests on NC
	// (see replyMux), made on first use under repliesMu; a copy of the
	// Client shares it. perRequest makes each request subscribe on its
	// own instead, as before it (for the benchmark that compares them).
	replies    *replyMux
	perRequest bool
}

// replySub is an exec request's replies: its queue on the shared reply
// subscription, or with perRequest a subscription of its own.
func (c *Client) replySub() (replySource, error) {
	if c.perRequest {
		inbox := c.NC.NewInbox()
		sub, err := c.NC.SubscribeSync(inbox)
		if err != nil {
			return nil, fmt.Errorf("subscribe to replies: %w", err)
		}
		if err := sub.SetPendingLimits(execPendingMsgs, execPendingBytes); err != nil {
			sub.Unsubscribe()
			return nil, fmt.Errorf("set reply limits: %w", err)
		}
		return ownReplies{sub}, nil
	}
	repliesMu.Lock()
	if c.replies == nil || c.replies.nc != c.NC {
		c.replies = &replyMux{nc: c.NC}
	}
	m := c.replies
	repliesMu.Unlock()
	return m.open(execPendingBytes)
}

// repliesMu guards every Client's replies field: a Client is a struct
// callers copy (and fill in as a literal), so it cannot hold a lock.
var repliesMu sync.Mutex

// New returns a Client using nc with default timeouts.
func New(nc *nats.Conn) *Client { return &Client{NC: nc} }

func (c *Client) requestTimeout() time.Duration {
	if c.RequestTimeout > 0 {
		return c.RequestTimeout
	}
	return DefaultRequestTimeout
}

func (c *Client) keepAliveTimeout() time.Duration {
	if c.KeepAliveTimeout > 0 {
		return c.KeepAliveTimeout
	}
	return DefaultKeepAliveTimeout
}

func (c *Client) fateCheckAfter() time.Duration {
	if c.FateCheckAfter != 0 {
		return c.FateCheckAfter
	}
	return DefaultFateCheckAfter
}

func (c *Client) cancelGrace() time.Duration {
	if c.CancelGrace > 0 {
		return c.CancelGrace
	}
	return DefaultCancelGrace
}

// noCoordinator is the error for a request nobody answered with a 503.
func (c *Client) noCoordinator(subject string) error {
	return fmt.Errorf("no Tether coordinator is serving %s at %s (%w)", subject, c.serverName(), nats.ErrNoResponders)
}

// NewJobID returns a random job id suitable for ExecRequest.ID.
func NewJobID() string {
	var b [12]byte
	rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return hex.EncodeToString(b[:])
}

// Exec runs req and blocks until its final result arrives, calling out (which
// may be nil) for every output chunk as it streams in. It is ExecWith with
// only an output handler.
func (c *Client) Exec(ctx context.Context, req *protocol.ExecRequest, out OutputHandler) (*protocol.ExecResult, error) {
	return c.ExecWith(ctx, req, ExecOptions{Output: out})
}

// ExecWith runs req and blocks until its final result arrives, calling
// opts.Output for every output chunk and opts.NodeResult for every node's
// result as they stream in.
//
// If req.ID is empty Exec sets it to a fresh NewJobID, so the caller can read
// the job id from req. req is validated locally first (an invalid request
// returns the *protocol.APIError the coordinator would send). A request the
// coordinator rejects returns its *protocol.APIError and nothing ran. No
// coordinator at all returns an error wrapping nats.ErrNoResponders.
//
// Exec waits for the result as long as ctx allows (see the package doc for
// why there is no reply timeout). When ctx ends first, Exec publishes a
// protocol.CancelRequest for the job and keeps reading for up to
// CancelGrace: it then returns the (cancelled) result, if it arrived, together
// with an error wrapping ctx.Err(). A ctx whose cause wraps
// nats.ErrPermissionViolation (the server refused the connection its
// replies) returns that cause at once, after the cancel: no result can
// come. A gap in the replies' sequence numbers is an error; the job is
// then cancelled too.
//
// After FateCheckAfter without a reply, ExecWith reads the job's record (as
// its submitter: protocol.JobGetRequest.Mine): a job lost with its
// coordinator returns its nodes with the reason as their error, or, when
// req.Idempotent, is submitted again (a new id, the same idempotency key;
// req.ID is then the new attempt's), at most MaxIdempotentReruns times. A
// job of which no reply ever came and that has no record of this caller's,
// twice NotRecordedConfirm apart (its coordinator died before recording
// it, so it did not run), returns an error matching ErrNotRecorded, or,
// when req.Idempotent, is submitted again likewise. A record the caller
// may not see keeps it waiting.
//
// When no reply at all arrives for KeepAliveTimeout (the coordinator sends
// keepalives to silent jobs), ExecWith asks for a cancel and returns an error
// matching ErrCoordinatorSilent.
//
// The result reports each node's outcome, sorted by node; a node that failed
// or exited non-zero is not an error of Exec. Truncated is set on each node
// result whose output was cut at the output limit, and on the result when
// any was, also when the coordinator predates those fields. When the coordinator's result
// omits the per-node list (too large for one NATS message), ExecWith rebuilds
// it from the node-result replies.
func (c *Client) ExecWith(ctx context.Context, req *protocol.ExecRequest, opts ExecOptions) (*protocol.ExecResult, error) {
	if c.NC == nil {
		return nil, errors.New("client: exec: nil NATS connection")
	}
	if req.ID == "" {
		req.ID = NewJobID()
	}
	if e := req.Validate(); e != nil {
		return nil, e
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("exec job %s: %w", req.ID, err)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("exec job %s: encode request: %w", req.ID, err)
	}
	out := opts.Output
	if out == nil {
		out = func(string, string, []byte) {}
	}
	onResult := opts.NodeResult
	if onResult == nil {
		onResult = func(*protocol.NodeResult) {}
	}

	sub, err := c.replySub()
	if err != nil {
		return nil, fmt.Errorf("exec job %s: %w", req.ID, err)
	}
	defer sub.Close()
	// Heartbeats promised: the coordinator expects them from the start,
	// so that a client killed before the first keepalive is noticed.
	hdr := nats.Header{protocol.HeaderHeartbeats: {"1"}}
	if err := c.NC.PublishMsg(&nats.Msg{Subject: protocol.SubjectExec, Reply: sub.subject(), Data: body, Header: hdr}); err != nil {
		return nil, fmt.Errorf("exec job %s: publish request: %w", req.ID, err)
	}
	// The flush round trip orders a possible 503 "no responders" status
	// ahead of its PONG, so after it the status (if any) is already queued
	// on sub and the loop below sees it first.
	fctx, fcancel := context.WithTimeout(ctx, c.requestTimeout())
	err = c.NC.FlushWithContext(fctx)
	fcancel()
	if err != nil && ctx.Err() == nil {
		c.cancelJob(req.ID)
		return nil, fmt.Errorf("exec job %s: flush request to %s: %w", req.ID, c.serverName(), err)
	}

	r := execReader{id: req.ID, out: out, onResult: onResult, alive: c.heartbeat(req.ID)}
	wait := ctx
	var cause error                // ctx's error once the job was cancelled because of it
	sent := time.Now()             // when the request was sent
	last := sent                   // when the last reply arrived
	var ended *protocol.ExecResult // the record's outcome, once it ended without a result reply
	unrecorded := false            // the last fate check found no record of the job
	replied := false               // a reply (of any kind) arrived
	for {
		// Wait for the next reply, or until the next fate check is due.
		step := time.Until(last.Add(c.keepAliveTimeout()))
		check := c.fateCheckAfter() > 0 && cause == nil
		if check {
			next := c.fateCheckAfter()
			if unrecorded {
				next = min(next, NotRecordedConfirm)
			}
			step = min(step, next)
		}
		mctx, mcancel := context.WithTimeout(wait, max(step, 0))
		msg, err := sub.NextMsgWithContext(mctx)
		silent := mctx.Err() != nil && wait.Err() == nil && time.Since(last) >= c.keepAliveTimeout()
		timedOut := mctx.Err() != nil && wait.Err() == nil
		mcancel()
		if err != nil && timedOut && !silent {
			if !check {
				continue
			}
			if ended != nil {
				return ended, nil // no result reply came after the record ended
			}
			var lost, none bool
			if ended, lost, none = c.jobFate(ctx, req.ID); lost {
				if req.Idempotent && opts.reruns < MaxIdempotentReruns {
					return c.rerun(ctx, req, opts, ended)
				}
				return ended, nil
			}
			if none && unrecorded && !replied {
				// Twice no record, and no reply ever: its coordinator
				// died before recording it (ErrNotRecorded).
				c.cancelJob(req.ID) // in case a coordinator is only very slow
				nr := &notRecordedError{id: req.ID, silent: time.Since(sent)}
				if req.Idempotent && opts.reruns < MaxIdempotentReruns {
					return c.rerun(ctx, req, opts, &protocol.ExecResult{ID: req.ID, Results: []protocol.NodeResult{{Error: "never recorded: its coordinator stopped before recording it, so it did not run"}}})
				}
				return nil, nr
			}
			unrecorded = none
			continue
		}
		if err == nil {
			last = time.Now()
			unrecorded, replied = false, true
		}
		if err != nil {
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				return nil, c.noCoordinator(protocol.SubjectExec)
			case errors.Is(err, nats.ErrConnectionClosed):
				// No reply can come, nor a cancel go: the server closed
				// the connection (a revoked or expired user is
				// disconnected and refused) or its owner did.
				return nil, &connClosedError{id: req.ID}
			case silent && cause == nil:
				c.cancelJob(req.ID)
				return nil, &silentError{id: req.ID}
			case silent:
				return nil, fmt.Errorf("exec job %s: %w (cancel requested; no result within %v)", req.ID, cause, c.cancelGrace())
			case cause == nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), nats.ErrPermissionViolation):
				// The caller gave up because the server refused this
				// connection its replies: no report can come.
				c.cancelJob(req.ID)
				return nil, fmt.Errorf("exec job %s: %w", req.ID, context.Cause(ctx))
			case cause == nil && ctx.Err() != nil:
				// The caller gave up: cancel the job and give the
				// coordinator a moment to report what it stopped.
				cause = ctx.Err()
				c.cancelJob(req.ID)
				gctx, gcancel := context.WithTimeout(context.WithoutCancel(ctx), c.cancelGrace())
				defer gcancel()
				wait = gctx
				continue
			case cause != nil:
				return nil, fmt.Errorf("exec job %s: %w (cancel requested; no result within %v)", req.ID, cause, c.cancelGrace())
			}
			c.cancelJob(req.ID)
			return nil, fmt.Errorf("exec job %s: read reply: %w", req.ID, err)
		}
		res, err := r.handle(msg)
		if err != nil {
			var apiErr *protocol.APIError
			if !errors.As(err, &apiErr) {
				c.cancelJob(req.ID)
			}
			return nil, err
		}
		if res != nil {
			if cause != nil {
				return res, fmt.Errorf("exec job %s: %w", req.ID, cause)
			}
			return res, nil
		}
	}
}

// rerun submits the idempotent job req, whose attempt was lost (ended),
// again under a new id with the same idempotency key (the job store lets
// a repeat of a lost job run: at least once), and returns its outcome.
func (c *Client) rerun(ctx context.Context, req *protocol.ExecRequest, opts ExecOptions, ended *protocol.ExecResult) (*protocol.ExecResult, error) {
	next := *req
	next.ID = NewJobID()
	if next.IdempotencyKey == "" {
		next.IdempotencyKey = req.ID // the key the first attempt had
	}
	why := ""
	if len(ended.Results) > 0 {
		why = ended.Results[0].Error
	}
	if opts.Rerun != nil {
		opts.Rerun(req.ID, next.ID, why)
	}
	opts.reruns++
	for tries := 1; ; tries++ {
		res, err := c.ExecWith(ctx, &next, opts)
		// 503 is the API's "retry": the node is between coordinators
		// (its own just died), and the attempt was not run.
		var ae *protocol.APIError
		if errors.As(err, &ae) && ae.Status == 503 && tries < rerunTries && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(rerunRetryWait):
			}
			continue
		}
		*req = next // the caller reads the job id from req
		return res, err
	}
}

// rerunTries and rerunRetryWait bound how long a rerun waits for the
// node of its job to be reachable again (about 10 s).
const (
	rerunTries     = 20
	rerunRetryWait = 500 * time.Millisecond
)

// jobFate reads job id's durable record (fate check, see FateCheckAfter)
// and returns the outcome it records once the job ended, else nil (still
// running, no record, no job store, or the read failed: keep waiting).
// The record of a job that ended normally is written after its result
// reply, so ExecWith waits one more FateCheckAfter for that reply before
// it returns this outcome. A job lost (its coordinator died, per the
// coordinator that took it over; lost is true) reports each node with
// the record's reason as its error, and ExecWith returns it at once.
func (c *Client) jobFate(ctx context.Context, id string) (res *protocol.ExecResult, lost, none bool) {
	// Bounded by the check interval too: replies (and the heartbeats
	// they ask for) wait while it reads.
	rctx, cancel := context.WithTimeout(ctx, min(c.requestTimeout(), c.fateCheckAfter()))
	defer cancel()
	// Asked as its submitter: "no record of yours" (not_recorded) is
	// told apart from a record this caller may not see (not_found).
	var rec protocol.JobRecord
	err := c.request(rctx, protocol.SubjectJobGet, protocol.JobGetRequest{ID: id, Mine: true}, &rec)
	var ae *protocol.APIError
	if errors.As(err, &ae) && ae.Code == protocol.ErrCodeNotRecorded {
		return nil, false, true
	}
	if err != nil || !rec.State.Terminal() {
		return nil, false, false
	}
	res = &protocol.ExecResult{ID: id, Nodes: len(rec.Nodes), Succeeded: rec.Succeeded, Failed: rec.Failed}
	if len(rec.Results) > 0 && rec.State != protocol.JobStateLost {
		res.Results = slices.Clone(rec.Results)
		for i := range res.Results {
			res.Results[i].Truncated = res.Results[i].OutputTruncated()
			res.Truncated = res.Truncated || res.Results[i].Truncated
		}
		return res, false, false
	}
	why := rec.Error
	if why == "" {
		why = string(rec.State)
	}
	res.Succeeded, res.Failed = 0, len(rec.Nodes)
	for _, n := range rec.Nodes {
		res.Results = append(res.Results, protocol.NodeResult{Node: n, ExitCode: -1, Cancelled: rec.State == protocol.JobCancelled,
			Error: fmt.Sprintf("job %s %s: %s", id, rec.State, why)})
	}
	return res, rec.State == protocol.JobStateLost, false
}

// cancelJob asks the coordinator to cancel job id, best effort: the caller
// is already failing or giving up, and the publish is flushed by nats.go's
// background flusher. It is published without a reply subject, which the
// API documents (protocol.SubjectCancel): the coordinator cancels and
// answers nothing; the job's result, which the caller may still be
// reading, reports the cancel.
func (c *Client) cancelJob(id string) {
	body, _ := json.Marshal(protocol.CancelRequest{ID: id})
	_ = c.NC.Publish(protocol.SubjectCancel, body)
}

// heartbeat returns the function that tells the coordinator this client
// still waits for job id (protocol.SubjectExecAlive), best effort: a lost
// heartbeat is made up for by the next one.
func (c *Client) heartbeat(id string) func() {
	h := nats.Header{protocol.HeaderJob: {id}}
	return func() { _ = c.NC.PublishMsg(&nats.Msg{Subject: protocol.SubjectExecAlive, Header: h}) }
}

// execReader checks and dispatches the replies of one exec request.
type execReader struct {
	id       string
	out      OutputHandler
	onResult NodeResultHandler
	nextSeq  uint64
	results  []protocol.NodeResult // from node-result replies
	alive    func()                // sends the job's heartbeat
}

// handle processes one reply. It returns the result when msg is the final
// reply, or an error that ends the request.
func (r *execReader) handle(msg *nats.Msg) (*protocol.ExecResult, error) {
	if e := apiError(msg); e != nil {
		return nil, e
	}
	typ := msg.Header.Get(protocol.HeaderType)
	if typ == protocol.ReplyProbe {
		r.alive() // a liveness probe: the heartbeat answers it
		return nil, nil
	}
	if s := msg.Header.Get(protocol.HeaderSeq); s != "" {
		seq, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("exec job %s: %s reply has a bad %s header %q", r.id, typ, protocol.HeaderSeq, s)
		}
		if seq != r.nextSeq {
			return nil, fmt.Errorf("exec job %s: reply %d is missing (next reply has sequence %d): output was lost, e.g. because this client fell behind", r.id, r.nextSeq, seq)
		}
		r.nextSeq++
	} else if typ == protocol.ReplyStdout || typ == protocol.ReplyStderr {
		return nil, fmt.Errorf("exec job %s: %s reply has no %s header", r.id, typ, protocol.HeaderSeq)
	}
	switch typ {
	case protocol.ReplyStdout, protocol.ReplyStderr:
		r.out(msg.Header.Get(protocol.HeaderNode), typ, msg.Data)
	case protocol.ReplyNodeResult:
		var nr protocol.NodeResult
		if err := json.Unmarshal(msg.Data, &nr); err != nil {
			return nil, fmt.Errorf("exec job %s: decode node result: %w", r.id, err)
		}
		nr.Truncated = nr.OutputTruncated() // also from a coordinator that predates the field
		r.results = append(r.results, nr)
		r.onResult(&nr)
	case protocol.ReplyKeepAlive:
		// Its arrival (and sequence number) is all it says; the
		// heartbeat tells the coordinator this client still listens.
		r.alive()
	case protocol.ReplyResult:
		var res protocol.ExecResult
		if err := json.Unmarshal(msg.Data, &res); err != nil {
			return nil, fmt.Errorf("exec job %s: decode result: %w", r.id, err)
		}
		if res.ResultsOmitted {
			if len(r.results) != res.Nodes {
				return nil, fmt.Errorf("exec job %s: the result lists no nodes and %d node results arrived for %d nodes", r.id, len(r.results), res.Nodes)
			}
			res.Results = slices.Clone(r.results)
			slices.SortFunc(res.Results, func(a, b protocol.NodeResult) int { return strings.Compare(a.Node, b.Node) })
			res.ResultsOmitted = false
		}
		for i := range res.Results {
			res.Results[i].Truncated = res.Results[i].OutputTruncated()
			res.Truncated = res.Truncated || res.Results[i].Truncated
		}
		return &res, nil
	}
	// Other reply types are newer than this client; their sequence number
	// has been accounted for above.
	return nil, nil
}

// The headers of a NATS micro service's error reply (micro.ErrorCodeHeader
// and micro.ErrorHeader), spelt here: package micro compiles three regular
// expressions when it is initialised, at the start of every client process
// that links it, and a client needs only these names (issue 12;
// TestMicroErrorHeaders checks they agree).
const (
	microErrorCodeHeader = "Nats-Service-Error-Code"
	microErrorHeader     = "Nats-Service-Error"
)

// apiError returns the micro error carried by msg, or nil if msg is not an
// error reply.
func apiError(msg *nats.Msg) *protocol.APIError {
	code := msg.Header.Get(microErrorCodeHeader)
	if code == "" {
		return nil
	}
	var e protocol.APIError
	if err := json.Unmarshal(msg.Data, &e); err == nil && e.Code != "" {
		if e.Message == "" {
			e.Message = msg.Header.Get(microErrorHeader)
		}
		return &e
	}
	// Not one of ours (e.g. a plain micro error): keep what the headers say.
	status, _ := strconv.Atoi(code)
	return &protocol.APIError{Status: status, Code: "unknown", Message: msg.Header.Get(microErrorHeader)}
}

// Nodes lists the connected nodes matching selector (empty: all), sorted by
// id. It asks for pages of protocol.DefaultNodesLimit nodes until it has
// them all (halving the page size if a page is too large for the NATS
// server's max payload); nodes that come or go meanwhile may be missed or
// listed, but never twice. Each request is bounded by RequestTimeout when
// ctx has no deadline.
func (c *Client) Nodes(ctx context.Context, selector string) ([]protocol.NodeInfo, error) {
	var all []protocol.NodeInfo
	seen := map[string]bool{}
	limit := protocol.DefaultNodesLimit
	for offset := 0; ; {
		var resp protocol.NodesResponse
		err := c.request(ctx, protocol.SubjectNodes, protocol.NodesRequest{Selector: selector, Limit: limit, Offset: offset}, &resp)
		if errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeTooLarge}) && limit > 1 {
			limit /= 2
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, n := range resp.Nodes {
			if !seen[n.ID] {
				seen[n.ID] = true
				all = append(all, n)
			}
		}
		offset += len(resp.Nodes)
		// A coordinator that predates paging reports no total: its one
		// reply was the whole list.
		if len(resp.Nodes) == 0 || offset >= resp.Total {
			break
		}
	}
	slices.SortFunc(all, func(a, b protocol.NodeInfo) int { return strings.Compare(a.ID, b.ID) })
	return all, nil
}

// Cancel asks the coordinator to cancel the running job id and returns its
// answer. A job that is unknown or already finished is reported by the
// coordinator as a *protocol.APIError with code protocol.ErrCodeNotFound. A
// ctx without deadline is bounded by RequestTimeout.
func (c *Client) Cancel(ctx context.Context, id string) (*protocol.CancelResponse, error) {
	var resp protocol.CancelResponse
	if err := c.request(ctx, protocol.SubjectCancel, protocol.CancelRequest{ID: id}, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// serverName names the NATS server for errors: the connected URL, or the
// configured servers while disconnected.
func (c *Client) serverName() string {
	if u := c.NC.ConnectedUrlRedacted(); u != "" {
		return u
	}
	return "NATS (disconnected, reconnecting)"
}

// request does one JSON request/reply round trip on subject.
func (c *Client) request(ctx context.Context, subject string, req, resp any) error {
	if c.NC == nil {
		return fmt.Errorf("client: %s: nil NATS connection", subject)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("%s: encode request: %w", subject, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.requestTimeout())
		defer cancel()
	}
	msg, err := c.NC.RequestWithContext(ctx, subject, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return c.noCoordinator(subject)
	}
	if err != nil {
		return fmt.Errorf("%s request to %s: %w", subject, c.serverName(), err)
	}
	if e := apiError(msg); e != nil {
		return e
	}
	if err := json.Unmarshal(msg.Data, resp); err != nil {
		return fmt.Errorf("%s: decode reply: %w", subject, err)
	}
	return nil
}
