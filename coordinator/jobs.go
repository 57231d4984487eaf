package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// stderrTailSize is how much of a node's stderr the coordinator keeps for
// the failure message of its result.
const stderrTailSize = protocol.FailureStderrTail

// Causes of a job's cancellation other than a cancel request.
var (
	// errClientGone: the client stopped listening (see job.startKeeper).
	errClientGone = errors.New("client disappeared")
	// errFanoutGone: the coordinator running the fan-out this job is one
	// node's run of is gone (holders.go): nobody reads the run's output.
	errFanoutGone = errors.New("the fan-out's coordinator is gone")
)

// shutdownError is the cause of jobs cancelled by the drain.
type shutdownError struct{ id string }

func (e *shutdownError) Error() string {
	return fmt.Sprintf("coordinator %s is shutting down; job cancelled", e.id)
}

// shutdownCause returns the cancel cause the drain gives running jobs.
func (c *Coordinator) shutdownCause() error { return &shutdownError{id: c.cfg.ID} }

// cancelReason replaces a cancelled node result's error with why the job
// was cancelled, when that was not a cancel request.
func (j *job) cancelReason(r *protocol.NodeResult) {
	cause := context.Cause(j.ctx)
	var se *shutdownError
	switch {
	case errors.As(cause, &se):
		r.Error = se.Error()
		r.ErrorCode = protocol.ResultCodeShutdown
	case errors.As(cause, new(*onceBoundError)):
		r.Error = cause.Error()
		r.ErrorCode = protocol.ResultCodeExecOnceBound
	case errors.As(cause, new(*revokedError)):
		r.Error = cause.Error() + "; job cancelled"
		r.ErrorCode = protocol.ResultCodeRevoked
	case errors.Is(cause, errClientGone):
		r.Error = "the client disappeared; job cancelled"
	case errors.As(cause, new(*panics.Error)):
		r.Error = fmt.Sprintf("coordinator %s: %v; job cancelled", j.c.cfg.ID, cause)
		r.ErrorCode = protocol.CodeInternal
	}
}

// failureOf is a failed node's NodeResult.Failure: protocol.
// FailureMessage with tail, the last bytes of stderr the coordinator saw.
// When the agent cut stderr at the output limit (r.StderrTruncated), what
// the coordinator saw ends at the cut, not where the command's stderr
// ended (the agent sends nothing past the limit): the message shows no
// tail then and says where stderr was cut, rather than pass the bytes
// before the cut (with a small limit, the very first ones) off as the
// command's last words.
func failureOf(node string, p *protocol.ExecParams, r *protocol.NodeResult, tail []byte) string {
	if !r.StderrTruncated {
		return protocol.FailureMessage(node, p, r, tail)
	}
	return protocol.FailureMessage(node, p, r, nil) + fmt.Sprintf(
		"(stderr was cut at the output limit after %d bytes; its tail was not sent, so none is shown: rerun with a higher --output-limit to see it)", r.StderrBytes)
}

// stderrTail keeps the last stderrTailSize bytes written to it.
type stderrTail struct{ b []byte }

func (t *stderrTail) write(p []byte) {
	if len(p) >= stderrTailSize {
		t.b = append(t.b[:0], p[len(p)-stderrTailSize:]...)
		return
	}
	t.b = append(t.b, p...)
	if len(t.b) > 2*stderrTailSize {
		t.b = append(t.b[:0], t.b[len(t.b)-stderrTailSize:]...)
	}
}

func (t *stderrTail) bytes() []byte {
	if len(t.b) > stderrTailSize {
		return t.b[len(t.b)-stderrTailSize:]
	}
	return t.b
}

// withoutNodePrefix strips the "node <id>: " an agent puts in front of its
// messages: a node result names its node in its own field.
func withoutNodePrefix(id, msg string) string {
	return strings.TrimPrefix(msg, "node "+id+": ")
}

// shortenFailure cuts n bytes from the start of a failure message's stderr
// part (keeping its first two lines, the command failed line and the
// command), marking the cut.
func shortenFailure(f string, n int) string {
	head := 0
	for k := 0; k < 2; k++ {
		i := strings.IndexByte(f[head:], '\n')
		if i < 0 {
			return f
		}
		head += i + 1
	}
	rest := f[head:]
	if n >= len(rest) {
		return f[:head] + "…"
	}
	return f[:head] + "…" + rest[n:]
}

// Liveness. While a job runs, its keeper goroutine wakes every
// Config.KeepAliveInterval. If nothing was published for half an interval
// it publishes a keepalive reply (sequenced, so clients can tell a silent
// job from a dead coordinator), else an unsequenced probe message. A
// client answers each with a heartbeat on SubjectExecAlive naming the job
// (handleExecAlive). Once a job got a heartbeat from its sender, the
// coordinator expects one per interval: clientGoneIntervals intervals in a
// row without one cancel the job (cause errClientGone). A job whose client
// never sent one (an older client, the nats CLI) is never cancelled so,
// unless its request promised heartbeats (protocol.HeaderHeartbeats): it
// is then watched from its start.
//
// Heartbeats replace probing the reply subject for a 503 "no responders"
// status, which never comes across the NATS import clients call through
// (natsauth: the server drops responses to a departed client silently).

// clientGoneIntervals is how many keepalive intervals in a row without a
// heartbeat from a job's client cancel the job: more than the two 503s that
// used to, since a missing heartbeat may only be late on a loaded machine.
const clientGoneIntervals = 3

// handleExecAlive takes a client's heartbeat for a running job: counted
// only when its sender (caller.Of, as the NATS server stamped it) is the
// sender of the job's exec request, so nobody can keep another's job
// alive or learn anything from this endpoint. It answers nothing.
func (c *Coordinator) handleExecAlive(req micro.Request) {
	id := req.Headers().Get(protocol.HeaderJob)
	if id == "" {
		return
	}
	sender, ok := caller.Of(req)
	// The job run whole here, else the node runs of another
	// coordinator's fan-out of that id (runKey).
	c.mu.Lock()
	js := c.jobs.parts(id, "")
	if j := c.jobs.whole(id); j != nil {
		js = []*job{j}
	}
	c.mu.Unlock()
	if len(js) == 0 && c.fl != nil && !isForwarded(req) {
		// To the coordinator running it, if another one does.
		h := nats.Header{}
		for k, v := range req.Headers() {
			h[k] = v
		}
		h.Set(HeaderForwardedBy, c.cfg.ID)
		if err := c.cfg.NATS.PublishMsg(&nats.Msg{Subject: runSubject(id, "alive"), Header: h, Data: req.Data()}); err != nil {
			c.log.Debug("forward heartbeat", "job_id", protocol.Clip(id), "err", err)
		}
		return
	}
	if !ok {
		return
	}
	for _, j := range js {
		if !j.ownerKnown || sender.Kind != j.owner.Kind || sender.Key != j.owner.Key || sender.Account != j.owner.Account {
			continue
		}
		j.heard.Store(true)
		j.alive.Store(true)
	}
}

// startKeeper starts the job's keeper goroutine and returns the function
// that stops it and waits for it.
func (j *job) startKeeper() (stop func()) {
	c := j.c
	iv := c.cfg.KeepAliveInterval
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Without its keeper the job's client would think the coordinator
		// gone: end the job, its nodes reporting the internal error.
		defer c.guard.Recover("exec job keeper", func(e *panics.Error) { j.cancel(e) })
		t := time.NewTicker(iv)
		defer t.Stop()
		missed := 0
		// A fan-out's run on this coordinator gets no client heartbeats
		// (the fan-out's coordinator reads it): it ends when that
		// coordinator is gone.
		var fanout string
		if j.header.Get(headerFanoutRun) != "" {
			fanout = j.header.Get(HeaderForwardedBy)
		}
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if fanout != "" && j.ctx.Err() == nil && c.holderGone(fanout) {
				c.log.Warn(fmt.Sprintf("coordinator %s, running the fan-out of job %s, is gone; cancelling its run here", fanout, j.id), "job_id", j.id)
				j.cancel(errFanoutGone)
				continue
			}
			if j.heard.Load() {
				if j.alive.Swap(false) {
					missed = 0
				} else {
					missed++
				}
			}
			if missed >= clientGoneIntervals {
				if j.ctx.Err() == nil {
					c.log.Warn(fmt.Sprintf("client of job %s disappeared (no heartbeat for %d keepalive intervals); cancelling", j.id, missed), "job_id", j.id)
					j.cancel(errClientGone)
				}
				continue
			}
			j.keepAlive(iv)
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// keepAlive publishes a keepalive reply if the job was silent for half an
// interval, else a probe; the client answers either with a heartbeat.
func (j *job) keepAlive(iv time.Duration) {
	j.pubMu.Lock()
	silent := time.Since(j.lastPub) >= iv/2
	j.pubMu.Unlock()
	if silent {
		h := nats.Header{}
		h.Set(protocol.HeaderType, protocol.ReplyKeepAlive)
		j.publishMsg(h, nil, protocol.ReplyKeepAlive)
		return
	}
	h := nats.Header{}
	h.Set(protocol.HeaderType, protocol.ReplyProbe)
	h.Set(protocol.HeaderJob, j.id)
	if err := j.c.cfg.NATS.PublishMsg(&nats.Msg{Subject: j.reply, Header: h}); err != nil {
		j.c.log.Debug("publish probe", "job_id", j.id, "err", err)
	}
}

// Detached job endpoints: each validates its request, then a goroutine the
// coordinator owns (counted in jobWG) opens a job stream to the node and
// relays the answer.

// jobAnswerTimeout bounds the wait for a job stream's answer; a cancel
// waits for the agent's kill grace.
const jobAnswerTimeout = 30 * time.Second

// jobOpHandler serves tether.v1.job.status or .cancel: both take a
// JobRequest and ask the node for one job operation.
func (c *Coordinator) jobOpHandler(op string) micro.HandlerFunc {
	return func(req micro.Request) {
		var r protocol.JobRequest
		if !c.decodeValid(req, &r) {
			return
		}
		c.goJobOp(req, r.Node, &protocol.JobParams{Op: op, ID: r.ID})
	}
}

func (c *Coordinator) handleJobOutput(req micro.Request) {
	var r protocol.JobOutputRequest
	if !c.decodeValid(req, &r) {
		return
	}
	c.goJobOp(req, r.Node, r.Params())
}

// goJobOp looks the node up, asks policy (the job's owner is who
// submitted it, as recorded when it started detached) and runs the job
// stream in a goroutine.
func (c *Coordinator) goJobOp(req micro.Request, nodeID string, p *protocol.JobParams) {
	if c.forwardForNode(req, nodeID, "job."+p.Op) {
		return
	}
	c.mu.Lock()
	n, ok := c.nodes[nodeID]
	c.mu.Unlock()
	if !ok {
		c.replyError(req, c.notConnected(nodeID))
		return
	}
	obj := policy.Object{Owner: c.jobOwner(nodeID, p.ID)}
	op, pn := jobOps[p.Op], n.policyNode()
	a := c.authorizer()
	if _, e := a.Authorize(req, op, []policy.Node{pn}, obj); e != nil {
		c.replyError(req, c.jobRefusal(a, req, op, pn, p.ID, e))
		return
	}
	c.goRequest(req, "job "+p.Op, func(life context.Context) { c.runJobOp(life, req, n, p) })
}

// jobRefusal is the answer to a job operation op on node of job id that
// Authorize refused with e, the same whether the job is another
// identity's or does not exist (or has no owner this coordinator knows),
// so that ids are no oracle: a caller granted op on its own jobs there
// gets 404 not_found, one granted op on none of them the refusal of its
// own job (the same 403 for every id). Other refusals (401, 400, 429) are
// e. The second decision is not counted: e was.
func (c *Coordinator) jobRefusal(a caller.Authorizer, req micro.Request, op policy.Operation, node policy.Node, id string, e *protocol.APIError) *protocol.APIError {
	who, ok := caller.Of(req)
	if e.Status != 403 || !ok || a.Policy == nil {
		return e
	}
	if _, err := a.Policy.Policy().Decide(who, op, node, policy.Object{Owner: who.String()}); err != nil {
		return caller.RefusalError(err)
	}
	return protocol.NewAPIError(404, protocol.ErrCodeNotFound, "node %s: no job %s that %s may %s (a job of another identity needs scope: any)",
		node.ID, protocol.Clip(id), who, op)
}

// runJobOp opens a job stream to n with p and replies with its answer.
func (c *Coordinator) runJobOp(ctx context.Context, req micro.Request, n *node, p *protocol.JobParams) {
	a, err := c.readJobStream(ctx, n, p, protocol.MaxJobOutputLimit)
	if err != nil {
		code, status := protocol.ErrCodeInternal, 500
		if _, ok := errors.AsType[*jobStreamUnavailable](err); ok {
			code, status = protocol.ErrCodeUnavailable, 503
		}
		c.replyError(req, protocol.NewAPIError(status, code, "node %s: %v", n.id, err))
		return
	}
	if ei := a.agentErr; ei != nil {
		msg := "node " + n.id + ": " + withoutNodePrefix(n.id, truncateAgentString(ei.Message))
		switch ei.Code {
		case "job_not_found":
			c.replyError(req, protocol.NewAPIError(404, protocol.ErrCodeNotFound, "%s", msg))
		case protocol.CodeBadRequest:
			c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "%s", msg))
		case protocol.CodeUnsupported:
			c.replyError(req, protocol.NewAPIError(501, protocol.ErrCodeUnsupported, "node %s: its agent does not support detached jobs", n.id))
		default:
			c.replyError(req, protocol.NewAPIError(500, protocol.ErrCodeInternal, "%s", msg))
		}
		return
	}
	if p.Op == protocol.JobOpOutput {
		var end protocol.JobOutputEnd
		if err := protocol.DecodeJSON(a.answer, &end); err != nil {
			c.replyError(req, protocol.NewAPIError(500, protocol.ErrCodeInternal, "node %s: job stream: %v", n.id, err))
			return
		}
		h := micro.Headers{}
		h[protocol.HeaderTotal] = []string{strconv.FormatInt(end.Total, 10)}
		h[protocol.HeaderEOF] = []string{strconv.FormatBool(end.EOF)}
		if err := req.Respond(a.data, micro.WithHeaders(h)); err != nil {
			c.log.Warn("send job output reply", "node_id", n.id, "job_id", p.ID, "err", err)
		}
		return
	}
	var js protocol.JobStatus
	if err := protocol.DecodeJSON(a.answer, &js); err != nil {
		c.replyError(req, protocol.NewAPIError(500, protocol.ErrCodeInternal, "node %s: job stream: %v", n.id, err))
		return
	}
	js.Node = n.id
	c.replyJSON(req, js, "a job status", "raise the server's max_payload")
}

// jobStreamUnavailable is a readJobStream error of the transport: the
// stream did not open or ended before its answer. runJobOp answers it as
// the node being unavailable (503), the others as a broken peer (500). Its
// text is err's.
type jobStreamUnavailable struct{ err error }

func (e *jobStreamUnavailable) Error() string { return e.err.Error() }
func (e *jobStreamUnavailable) Unwrap() error { return e.err }

// jobAnswer is what a job stream answered: the stdout bytes it sent first,
// then either answer (the FrameJob payload, undecoded: a JobStatus or a
// JobOutputEnd by p.Op) or agentErr (the agent's FrameError).
type jobAnswer struct {
	data     []byte
	answer   []byte
	agentErr *protocol.ErrorInfo
}

// readJobStream opens a job stream to n with p and reads its answer, with
// at most limit bytes of stdout before it. It is the one reader of job
// streams: the NATS job.* handlers (runJobOp) and the console's JobOutput
// map its result to their own errors. It blocks for at most
// jobAnswerTimeout or until ctx ends. Errors do not name the node (the
// caller does); those of the transport are *jobStreamUnavailable.
func (c *Coordinator) readJobStream(ctx context.Context, n *node, p *protocol.JobParams, limit int64) (jobAnswer, error) {
	var a jobAnswer
	ctx, cancel := context.WithTimeout(ctx, jobAnswerTimeout)
	defer cancel()
	octx, ocancel := context.WithTimeout(ctx, c.cfg.Tunnel.WriteTimeout)
	st, err := n.sess.Open(octx, protocol.KindJob, p)
	ocancel()
	if err != nil {
		return a, &jobStreamUnavailable{fmt.Errorf("open job stream: %w", err)}
	}
	c.m.streamsOpened.WithLabelValues(protocol.KindJob.String()).Inc()
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetReadDeadline(time.Now()) })
	defer stop()

	fr := protocol.NewFrameReader(st)
	for {
		f, err := fr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return a, &jobStreamUnavailable{fmt.Errorf("job stream ended without an answer: %w", err)}
		}
		switch f.Type {
		case protocol.FrameStdout:
			// The agent answers at most limit bytes; more is a broken peer.
			if int64(len(a.data)+len(f.Payload)) > limit {
				return a, fmt.Errorf("job output answer over the %d byte limit", limit)
			}
			a.data = append(a.data, f.Payload...)
		case protocol.FrameError:
			var ei protocol.ErrorInfo
			if err := protocol.DecodeJSON(f.Payload, &ei); err != nil {
				return a, fmt.Errorf("job stream: %w", err)
			}
			a.agentErr = &ei
			return a, nil
		case protocol.FrameJob:
			a.answer = f.Payload
			return a, nil
		default:
			return a, fmt.Errorf("job stream: unexpected %s frame", f.Type)
		}
	}
}

// jobOwner is who submitted job id on nodeID: as this coordinator
// remembered it when the job started, or else as the job's durable record
// says (a coordinator restarted, or the node moved here from another), if
// the record names nodeID. "" when neither knows: then only a grant of
// scope any reaches the job.
func (c *Coordinator) jobOwner(nodeID, id string) string {
	if o := c.owners.get(nodeID, id); o != "" || c.cfg.Jobs == nil {
		return o
	}
	ctx, cancel := context.WithTimeout(context.Background(), jobOwnerTimeout)
	defer cancel()
	j, err := c.cfg.Jobs.Get(ctx, id)
	if err != nil || !slices.Contains(j.Nodes, nodeID) {
		return ""
	}
	return j.Owner
}

// jobOwnerTimeout bounds jobOwner's read of a record; it runs in the
// request's handler, once per job a coordinator did not start itself.
const jobOwnerTimeout = 2 * time.Second
