package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// execSlack is how long past a request's timeout the coordinator waits
// before it cancels a node's run itself. The agent enforces the timeout; this
// only guards against an agent that never answers while its heartbeats keep
// the session alive.
const execSlack = 30 * time.Second

// cancelWriteTimeout bounds the cancel frame written to an exec stream the
// coordinator gives up on, just before closing it.
const cancelWriteTimeout = time.Second

// replyHeaderRoom is what a reply's NATS headers (Tether-Job, -Type, -Node,
// -Seq, or a micro error's) may take of the server's max payload, in bytes.
const replyHeaderRoom = 1 << 10

// job is one exec request in flight. Its goroutine (run) starts one goroutine
// per node, at most maxParallel at a time, and waits for them.
type job struct {
	c *Coordinator
	// request and header are the exec request as it came (body, headers
	// with the caller the server stamped): a fan-out forwards them, one
	// node at a time, to the coordinators holding its remote targets
	// (runRemote).
	request []byte
	header  nats.Header
	// fanoutPart: this job is one node's run of a detached fan-out that
	// another coordinator runs and records under the same id
	// (fanoutPartOf); it writes no record of its own.
	fanoutPart bool
	// key is the job's key among the coordinator's running jobs
	// (runkey.go): its id, and its node when it is one node's run of
	// another coordinator's fan-out.
	key runKey
	// sub is the job's run subscription (fleet.go), nil without a fleet.
	sub     *nats.Subscription
	id      string
	reply   string   // the request's reply subject
	targets []string // node ids, sorted; each is looked up when its run starts
	params  protocol.ExecParams
	// users are the local users each node runs the job as (policy's
	// run_as), by node id; they replace params.User.
	users       map[string]string
	stdin       []byte
	maxParallel int
	ctx         context.Context // cancelled by SubjectCancel, the drain or a vanished client
	// cancel cancels ctx with a cause: nil (a cancel request), errShutdown
	// or errClientGone.
	cancel context.CancelCauseFunc
	// owner is the sender of the exec request (caller.Of), when the guard
	// identified it (ownerKnown): only its heartbeats count (jobs.go).
	owner      policy.Identity
	ownerKnown bool
	// heard is set by the first heartbeat of the job's client, alive by
	// each one; the keeper clears alive every interval.
	heard, alive atomic.Bool

	// audit is the exec request's audit wrapper (nil when the coordinator
	// audits nothing), target the request's selector or "all nodes"
	// (empty for one node), res and results what the job ended with (res
	// nil until then); recordAudit reads them after run.
	audit   *auditReq
	target  string
	res     *protocol.ExecResult
	results []protocol.NodeResult

	// durable is the job's record in Config.Jobs (durable.go), nil
	// without a store; idempotent and idempotencyKey are the request's.
	durable *jobstore.Job
	// release frees the caller's job slot (policy max_concurrent_jobs);
	// more calls do nothing. run calls it before the final reply, so that
	// the caller may submit its next job as soon as it has this one's
	// result (the final record is written after the reply).
	release func()
	// accept waits for the job's record to be accepted (startAccept,
	// durable.go) and reports whether the job may run.
	accept         func() bool
	idempotent     bool
	idempotencyKey string
	// attempt and rerunOf: a re-run's (rerun.go) attempt and the lost
	// job it runs again; zero for a client's job.
	attempt int
	rerunOf string
	// moved: the node's tunnel here was closing when the job was to be
	// sent there (a drain handing the agent to another coordinator): the
	// job did not run there (runNode), and a single-node job is refused
	// with 503, to be retried where the node went (refuseMoved).
	moved atomic.Bool

	// pubMu serialises publishes so that replies leave in Tether-Seq order.
	pubMu   sync.Mutex
	seq     uint64
	lastPub time.Time // when the last sequenced reply was published
}

// run executes the job on every target and publishes the final result.
// A panic unwinding it (contained by its caller, which then publishes an
// internal error as the last reply) still stops the keeper and forgets the
// job.
func (j *job) run() {
	defer j.cancel(nil)
	log := j.c.log.With("job_id", j.id, "caller", j.ownerString())
	log.Debug("job started", "nodes", len(j.targets), "max_parallel", j.maxParallel)
	j.pubMu.Lock()
	j.lastPub = time.Now()
	j.pubMu.Unlock()
	stopKeeper := sync.OnceFunc(j.startKeeper())
	defer stopKeeper()
	defer j.forget()
	// A reload (or revocation) applied after the request's decision and
	// rechecked (RecheckCallers) before the job was among the running
	// did not see it: decide it again now that it is.
	if why := j.c.jobRevoked(j); why != "" {
		j.cancel(&revokedError{why})
	}
	// The job's record is being written (startAccept, in handleExec) while
	// its exec stream opens; the agent starts nothing before the record is
	// stored (durable.go). Whatever failed before a refused accept
	// (nothing started: the stream went without its header) is dropped,
	// the accept's error reply being the job's last.
	results := make([]protocol.NodeResult, len(j.targets))
	if len(j.targets) == 1 {
		// The common case: no fan-out, so no extra goroutine.
		results[0] = j.runNodeGuarded(j.targets[0])
		if !j.accept() {
			return
		}
		if j.moved.Load() {
			j.refuseMoved(results[0].Error)
			return
		}
		j.publishNodeResult(&results[0])
	} else {
		// A fan-out starts its nodes one after another, some perhaps
		// elsewhere (runRemote): it waits for the accept first.
		if !j.accept() {
			return
		}
		j.fanOut(results)
	}
	stopKeeper()

	// Forget the job and free its slot before the final reply, so a client
	// may reuse its id (its own: another caller's reuse is refused, see
	// errIDInUse), or submit its next job, as soon as it sees the result.
	j.forget()
	if j.release != nil {
		j.release()
	}

	slices.SortFunc(results, func(a, b protocol.NodeResult) int { return strings.Compare(a.Node, b.Node) })
	res := protocol.ExecResult{ID: j.id, Results: results, Nodes: len(results)}
	for i := range results {
		if results[i].OK() {
			res.Succeeded++
		} else {
			res.Failed++
		}
		res.Truncated = res.Truncated || results[i].Truncated
	}
	j.res, j.results = &res, results
	// After the final reply (durable.go): the client waits for no store
	// write once its job ended; a reuse of its id waits for it instead.
	j.ending()
	defer j.recordEnd(results)
	body, err := json.Marshal(res)
	if err != nil { // cannot happen: plain data
		log.Error("encode exec result", "err", err)
		return
	}
	if max := j.maxData(); max > 0 && len(body) > max {
		// Every node's result went out as a node-result reply already:
		// the client rebuilds the list from those.
		log.Debug("exec result too large for one reply; sending counts only", "nodes", len(results), "bytes", len(body), "max_payload", max+replyHeaderRoom)
		res.Results = nil
		res.ResultsOmitted = true
		body, _ = json.Marshal(res)
	}
	j.publish("", protocol.ReplyResult, body)
	log.Debug("job finished", "succeeded", res.Succeeded, "failed", res.Failed)
}

// refuseMoved ends a single-node job that was not sent to its node
// because the node's tunnel here was closing (j.moved): its only reply is
// a 503, the API's "retry" (the node is on its way to another
// coordinator; the same job id may be submitted again), and its record
// ends lost, saying it never ran.
func (j *job) refuseMoved(why string) {
	node := j.targets[0]
	j.publishError(protocol.NewAPIError(503, protocol.ErrCodeUnavailable,
		"node %s is moving to another coordinator (its tunnel to coordinator %s closed: %s); job %s was not run; retry", node, j.c.cfg.ID, why, j.id))
	if j.durable == nil {
		return
	}
	ctx, cancel := j.storeCtx()
	defer cancel()
	if err := j.c.cfg.Jobs.Lose(ctx, j.durable, fmt.Sprintf("not run: node %s's tunnel to coordinator %s closed before the job was sent (the client was told to retry)", node, j.c.cfg.ID)); err != nil {
		j.c.log.Warn("record a job refused as its node moved", "job_id", j.id, "err", err)
	}
}

// fanOut runs the job on every target, at most maxParallel at once, one
// goroutine per running node, and fills results in target order.
func (j *job) fanOut(results []protocol.NodeResult) {
	sem := make(chan struct{}, j.maxParallel)
	var wg sync.WaitGroup
	defer wg.Wait() // also if this loop panics: the node runs are the job's
	for i, id := range j.targets {
		acquired := false
		select {
		case sem <- struct{}{}:
			acquired = true
		case <-j.ctx.Done():
		}
		if j.ctx.Err() != nil {
			if acquired {
				<-sem
			}
			results[i] = j.notStarted(id)
			j.publishNodeResult(&results[i])
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer j.c.guard.Recover("exec job node result", nil) // the result is kept; the client misses its node-result reply
			results[i] = j.runNodeGuarded(id)
			j.publishNodeResult(&results[i])
		}()
	}
}

// forget removes the job from the coordinator's running jobs, if it is
// still there.
func (j *job) forget() {
	j.c.mu.Lock()
	var sub *nats.Subscription
	if j.c.jobs.remove(j.key, j) {
		sub, j.sub = j.sub, nil
	}
	j.c.mu.Unlock()
	if sub != nil {
		sub.Unsubscribe()
	}
}

// runNodeGuarded is runNode with a panic in it contained: the node's result
// is then an internal error (ExitCode -1, ErrorCode protocol.CodeInternal)
// and the job's other nodes go on.
// It records the node run's metrics.
func (j *job) runNodeGuarded(id string) (res protocol.NodeResult) {
	start := time.Now()
	defer func() {
		if errors.Is(context.Cause(j.ctx), errNotAccepted) {
			return // refused, not run (durable.go)
		}
		j.c.m.execDuration.Observe(time.Since(start).Seconds())
		j.c.m.execResults.WithLabelValues(outcome(&res)).Inc()
	}()
	defer j.c.guard.Recover("exec job node", func(e *panics.Error) {
		res = protocol.NodeResult{Node: id, ExitCode: -1, Error: fmt.Sprintf("coordinator %s: %v", j.c.cfg.ID, e), ErrorCode: protocol.CodeInternal}
	})
	j.c.hook("exec node " + id)
	return j.runNode(id)
}

// notStarted is the result of a node the job was cancelled before reaching.
func (j *job) notStarted(id string) protocol.NodeResult {
	r := protocol.NodeResult{
		Node:      id,
		ExitCode:  -1,
		Cancelled: true,
		Error:     fmt.Sprintf("job %s was cancelled before it started there", j.id),
	}
	j.cancelReason(&r)
	j.c.m.execResults.WithLabelValues(outcomeCancelled).Inc()
	return r
}

// runNode runs the job on node id through a new exec stream and returns the
// node's result. The node's session is looked up now, when its run starts
// (in a fan-out that may be long after the request arrived). It never fails:
// problems become the result's Error. Whenever it gives up on the stream
// without having read a final frame, it writes a cancel frame before closing
// the stream, so that the agent kills the process group.
func (j *job) runNode(id string) (res protocol.NodeResult) {
	c := j.c
	res.Node = id
	start := time.Now()
	var tail stderrTail
	defer func() {
		d := time.Since(start)
		if res.DurationMS == 0 {
			res.DurationMS = float64(d) / float64(time.Millisecond)
		}
		if res.Cancelled {
			j.cancelReason(&res)
		}
		if res.Error == "" && res.ExitCode != 0 && !res.Detached && !res.Cancelled {
			res.Failure = failureOf(id, &j.params, &res, tail.bytes())
		}
	}()
	fail := func(format string, args ...any) protocol.NodeResult {
		res.ExitCode = -1
		res.Error = fmt.Sprintf(format, args...)
		return res
	}

	c.mu.Lock()
	n := c.nodes[id]
	c.mu.Unlock()
	if n == nil {
		if owner := c.remoteOwner(id); owner != "" {
			if !j.accept() { // another coordinator would run it
				return fail("job %s: %v", j.id, errNotAccepted)
			}
			return j.runRemote(id, owner, &tail)
		}
		return fail("disconnected before the job's run started there")
	}

	ctx := j.ctx
	if j.params.TimeoutMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(j.params.TimeoutMS)*time.Millisecond+execSlack)
		defer cancel()
	}

	// The stream opens while the job's record is written; its header
	// (the agent's go) waits for the record (acceptGate), so the open's
	// bound covers that write too.
	octx, ocancel := context.WithTimeout(ctx, c.cfg.Tunnel.WriteTimeout+durableWriteTimeout)
	params := j.params
	params.User = j.users[id]
	st, err := n.sess.OpenGated(octx, protocol.KindExec, params, j.acceptGate)
	ocancel()
	if errors.Is(err, errNotAccepted) {
		return fail("job %s: %v", j.id, err)
	}
	if err != nil {
		if j.ctx.Err() != nil {
			res.Cancelled = true
			return fail("job %s was cancelled before it started there", j.id)
		}
		if errors.Is(err, yamux.ErrSessionShutdown) || errors.Is(err, yamux.ErrRemoteGoAway) {
			// Its stream never opened, or went without its header: the
			// agent acted on nothing.
			j.moved.Store(true)
		}
		return fail("open exec stream: %v", err)
	}
	c.m.streamsOpened.WithLabelValues(protocol.KindExec.String()).Inc()
	final := false // a final frame (exit or error) was read
	// The out-of-band cancel (control.go), sent at most once.
	cancelOOB := sync.OnceFunc(func() { n.cancelStream(st, j.id, c.log) })
	defer func() {
		if !final {
			cancelOOB()
			st.SetWriteDeadline(time.Now().Add(cancelWriteTimeout))
			if err := protocol.WriteFrame(st, protocol.FrameCancel, nil); err != nil {
				c.log.Debug("send cancel before closing exec stream", "job_id", j.id, "node_id", n.id, "stream_id", st.StreamID(), "err", err)
			}
		}
		st.Close()
	}()

	// On cancel, tell the agent to stop and give it CancelGrace to report:
	// out of band first (the in-band cancel waits behind stdin the command
	// may not read), then in band.
	// AfterFunc runs no goroutine unless ctx ends; if it started, wait for it.
	var cancelSent atomic.Bool
	watchDone := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		defer close(watchDone)
		cancelSent.Store(true)
		cancelOOB()
		st.SetWriteDeadline(time.Now().Add(c.cfg.Tunnel.WriteTimeout))
		if err := protocol.WriteFrame(st, protocol.FrameCancel, nil); err != nil {
			c.log.Debug("send cancel", "job_id", j.id, "node_id", n.id, "err", err)
		}
		st.SetReadDeadline(time.Now().Add(j.cancelGrace()))
	})
	defer func() {
		if !stopWatch() {
			<-watchDone
		}
	}()

	if j.params.Stdin {
		if err := writeStdin(st, j.stdin); err != nil {
			// The final frame (or the broken stream) tells what happened.
			c.log.Debug("send stdin", "job_id", j.id, "node_id", n.id, "stream_id", st.StreamID(), "err", err)
		}
	}

	protoErr := func(format string, args ...any) protocol.NodeResult {
		return fail("exec stream %d: protocol error: %s", st.StreamID(), fmt.Sprintf(format, args...))
	}
	fr := protocol.NewFrameReader(st)
	for {
		f, err := fr.Next()
		if err != nil {
			switch {
			case cancelSent.Load() && isTimeout(err):
				res.Cancelled = j.ctx.Err() != nil
				return fail("no exit status within %v of cancelling job %s", j.cancelGrace(), j.id)
			case errors.Is(err, io.EOF), errors.Is(err, yamux.ErrConnectionReset), n.sess.IsClosed():
				// The stream or the whole session ended between frames,
				// or the session died mid-frame.
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				if j.params.Detach && j.ctx.Err() == nil {
					// It may have started and outlive the tunnel (a
					// drain hands its agent on): ask the node.
					if started, why := j.confirmDetached(id); started {
						res.Detached = true
						c.owners.set(id, j.params.JobID, j.ownerString())
						return res
					} else if why != "" {
						return fail("tunnel lost while starting the detached job: %v; %s", err, why)
					}
				}
				return fail("tunnel lost during exec: %v", err)
			default:
				// A truncated frame on a live session, an unknown frame
				// type, an oversized frame.
				return protoErr("%v", err)
			}
		}
		switch f.Type {
		case protocol.FrameStdout, protocol.FrameStderr:
			typ := protocol.ReplyStdout
			if f.Type == protocol.FrameStderr {
				typ = protocol.ReplyStderr
				res.StderrBytes += int64(len(f.Payload))
				tail.write(f.Payload)
				j.c.m.outputBytes.WithLabelValues("stderr").Add(float64(len(f.Payload)))
			} else {
				res.StdoutBytes += int64(len(f.Payload))
				j.c.m.outputBytes.WithLabelValues("stdout").Add(float64(len(f.Payload)))
			}
			if err := j.publishOutput(n.id, typ, f.Payload); err != nil {
				return fail("output reply lost, giving up: %v", err)
			}
		case protocol.FrameExit:
			var es protocol.ExitStatus
			if err := protocol.DecodeJSON(f.Payload, &es); err != nil {
				return protoErr("exit status: %v", err)
			}
			final = true
			res.ExitCode = es.ExitCode
			res.Signal = truncateAgentString(es.Signal)
			res.TimedOut = es.TimedOut
			res.Cancelled = es.Cancelled
			res.DurationMS = es.DurationMS
			res.StdoutBytes = es.StdoutBytes
			res.StderrBytes = es.StderrBytes
			res.StdoutTruncated = es.StdoutTruncated
			res.StderrTruncated = es.StderrTruncated
			res.FailedCommand = es.FailedCommand
			res.OutputCut = es.OutputCut
			res.Truncated = res.OutputTruncated()
			res.Detached = es.Detached
			if es.Detached {
				res.ExitCode = 0
				c.owners.set(id, j.params.JobID, j.ownerString())
			}
			return res
		case protocol.FrameError:
			var ei protocol.ErrorInfo
			if err := protocol.DecodeJSON(f.Payload, &ei); err != nil {
				return protoErr("error frame: %v", err)
			}
			final = true
			res.ErrorCode = truncateAgentString(ei.Code)
			return fail("%s", withoutNodePrefix(n.id, truncateAgentString(ei.Message)))
		default:
			return protoErr("unexpected %s frame: %v", f.Type, protocol.ErrUnexpected)
		}
	}
}

// cancelGrace is how long a cancelled node run waits for its exit status:
// Config.CancelGrace, at most revokeGrace for a job whose caller's access
// was revoked (RecheckCallers).
func (j *job) cancelGrace() time.Duration {
	g := j.c.cfg.CancelGrace
	if errors.As(context.Cause(j.ctx), new(*revokedError)) {
		g = min(g, revokeGrace)
	}
	return g
}

// detachedConfirmWait bounds how long a detached job whose tunnel was
// lost as it started waits for its node to answer whether it started:
// long enough for a drained agent to re-register elsewhere.
const detachedConfirmWait = 15 * time.Second

// confirmDetached asks node id, wherever it re-registers, whether it
// knows the detached job j (it started there and runs on, or ended).
// started is true when it does; else why says what is known: the node
// answered that it has no such job, or it could not be asked within
// detachedConfirmWait (whether the job started is then unknown).
func (j *job) confirmDetached(id string) (started bool, why string) {
	ctx, cancel := context.WithTimeout(j.ctx, detachedConfirmWait)
	defer cancel()
	var last error
	for {
		_, err := j.c.JobStatus(ctx, id, j.params.JobID)
		switch {
		case err == nil:
			return true, ""
		case errors.Is(err, jobstore.ErrNoSuchJob):
			return false, "the node says it did not start"
		}
		last = err
		select {
		case <-ctx.Done():
			return false, fmt.Sprintf("whether it started is unknown (the node did not answer within %v: %v): tether job status %s", detachedConfirmWait, last, j.params.JobID)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// writeStdin sends data as stdin frames of at most ChunkSize, then
// FrameStdinClose.
func writeStdin(w io.Writer, data []byte) error {
	for len(data) > 0 {
		n := min(len(data), protocol.ChunkSize)
		if err := protocol.WriteFrame(w, protocol.FrameStdin, data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return protocol.WriteFrame(w, protocol.FrameStdinClose, nil)
}

// maxData returns the largest reply body that fits the NATS server's max
// payload next to the reply's headers, or 0 if the limit is unknown (not
// connected).
func (j *job) maxData() int {
	mp := int(j.c.cfg.NATS.MaxPayload())
	if mp <= 0 {
		return 0
	}
	return max(mp-replyHeaderRoom, 1)
}

// publishOutput publishes one output chunk, split into several replies (each
// with its own sequence number) if it does not fit the server's max payload.
func (j *job) publishOutput(nodeID, typ string, data []byte) error {
	max := j.maxData()
	for {
		n := len(data)
		if max > 0 {
			n = min(n, max)
		}
		if err := j.publish(nodeID, typ, data[:n]); err != nil {
			return err
		}
		data = data[n:]
		if len(data) == 0 {
			return nil
		}
	}
}

// publish sends one reply of the job with the next sequence number. Replies
// are published under pubMu, so their order on the wire is seq order. A
// failed publish is logged (at warn: the client will see a gap or never see
// its result) and returned.
func (j *job) publish(nodeID, typ string, data []byte) error {
	h := nats.Header{}
	h.Set(protocol.HeaderType, typ)
	if nodeID != "" {
		h.Set(protocol.HeaderNode, nodeID)
	}
	return j.publishMsg(h, data, typ)
}

// publishNodeResult sends r as a node-result reply, shortening its failure
// text if the reply would not fit the server's max payload.
func (j *job) publishNodeResult(r *protocol.NodeResult) {
	body, err := json.Marshal(r)
	if err != nil { // cannot happen: plain data
		return
	}
	if max := j.maxData(); max > 0 && len(body) > max && r.Failure != "" {
		short := *r
		short.Failure = shortenFailure(short.Failure, len(body)-max+64)
		body, _ = json.Marshal(&short)
	}
	j.publish(r.Node, protocol.ReplyNodeResult, body)
}

// publishError sends e as the job's last reply, a micro error as the API's
// other errors are (status and message in the micro headers, e as the JSON
// body).
func (j *job) publishError(e *protocol.APIError) error {
	body, _ := json.Marshal(e)
	h := nats.Header{}
	h.Set(micro.ErrorCodeHeader, strconv.Itoa(e.Status))
	h.Set(micro.ErrorHeader, e.Message)
	return j.publishMsg(h, body, "error")
}

// publishMsg adds the job and sequence headers to h and publishes.
func (j *job) publishMsg(h nats.Header, data []byte, what string) error {
	j.pubMu.Lock()
	defer j.pubMu.Unlock()
	h.Set(protocol.HeaderJob, j.id)
	h.Set(protocol.HeaderSeq, strconv.FormatUint(j.seq, 10))
	j.seq++
	j.lastPub = time.Now()
	// PublishMsg copies data into the connection's buffer before returning,
	// so the caller may reuse it.
	if err := j.c.cfg.NATS.PublishMsg(&nats.Msg{Subject: j.reply, Header: h, Data: data}); err != nil {
		j.c.log.Warn("publish exec reply", "job_id", j.id, "type", what, "bytes", len(data), "err", err)
		return fmt.Errorf("job %s: publish %s reply: %w", j.id, what, err)
	}
	return nil
}

// outcome classifies a node result for the exec results metric.
func outcome(r *protocol.NodeResult) string {
	switch {
	case r.Cancelled:
		return outcomeCancelled
	case r.TimedOut:
		return outcomeTimeout
	case r.Error != "":
		return outcomeError
	case r.ExitCode == 0:
		return outcomeSuccess
	}
	return outcomeFailure
}

// sortNodes sorts ns by node id.
func sortNodes(ns []*node) {
	slices.SortFunc(ns, func(a, b *node) int { return strings.Compare(a.id, b.id) })
}
