package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Durable jobs (Config.Jobs, package jobstore). A job goroutine records
// its job at four points, each one write to the store, all no-ops
// without a store:
//   - accept (startAccept, as the job is created; j.accept): running for an
//     attached job (its exec streams open right away), dispatched for a
//     detached one (it is started on its nodes right away): one write on
//     the path every exec takes, with the submitting identity. The write
//     runs while the job's exec stream opens: the stream's header, which
//     is what makes the agent start the process, is written only once the
//     store acknowledged the record (tunnel.Session.OpenGated), so a job
//     never runs unrecorded; a failed write closes the stream headerless,
//     refuses the job (409 or 503) and no node runs it. A fan-out waits
//     for the accept before it starts any node (some may run elsewhere:
//     runRemote);
//   - dispatch (recordDispatch, in the accept, once the record is
//     written): for a job recorded queued only (none today: the
//     coordinator dispatches what it accepts at once); a fenced write
//     (another coordinator took the job over) refuses the job;
//   - start and finish (recordEnd, just after the final reply, so that
//     the client's round trip has one store write, not two; a job.get
//     racing the reply may still see running; batched with the end
//     records of other jobs ending within endLinger): a detached
//     job whose nodes all started it is running (its node settles it:
//     its agent's exit report, jobexit.go, and job.get and
//     reconciliation ask), any other job ends succeeded,
//     failed or cancelled with the nodes' results. The write is
//     compare-and-set on the accept's revision and fenced by holder
//     (jobstore: a coordinator that lost the job gets ErrFenced and
//     writes nothing), and moves the record forward only.
//
// Writes after accept that fail are logged: the job's outcome reaches its
// client anyway, and reconciliation settles what the record misses.
//
// The accept overlaps the write with the stream's open; this is why each
// guarantee of issue 11 still holds:
//   - no job runs unrecorded: the agent acts on a stream only when it
//     reads its header, and the header leaves only after the server
//     acknowledged the record (stored; on disk under sync_interval:
//     always); on a failed or timed-out write the stream is closed
//     without one, the job is cancelled (errNotAccepted) and its only
//     reply is the refusal. Remote runs (runRemote) and fan-outs start
//     only after the accept. (A write whose answer was lost, timed out
//     or cut by a reconnect, may still land: jobstore settles it by
//     writing the record lost on the same revision, or finds it landed
//     and accepts the job. Only when that write's answer is lost too can
//     a record say running for a job that never ran, until
//     reconciliation by this coordinator's successor settles it lost; it
//     never makes a job run.)
//   - fencing: the accept writes the record compare-and-set on the key
//     having no revision (Nats-Expected-Last-Subject-Sequence 0, as KV
//     Create), so it never overwrites another holder's live record
//     (ErrExists), nor any record of another owner (ErrNotOwner: the id
//     is that owner's, errIDInUse); every later write (recordEnd) is a
//     compare-and-set on the revision it wrote, checked against holder,
//     boot and epoch, so a coordinator that lost the job gets ErrFenced
//     and writes nothing.
//   - idempotency: an idempotent submission goes the synchronous way
//     (its key is created first; a repeat gets ErrDuplicate and runs
//     nothing), and its record write carries the key as Nats-Msg-Id.
//   - forward only: the accept writes the first state; recordEnd's moves
//     are checked forward (jobstore.ErrBackward otherwise).
//   - the final write is off the client's path and off the next job's:
//     the caller's job slot is freed and the id forgotten before the
//     final reply, and a reuse of the id waits for the final record
//     (ending) instead of finding the job running.

// durableWriteTimeout bounds one write of a job's record.
const durableWriteTimeout = 5 * time.Second

// reconcileInterval is the pause between reconciliation passes while an
// orphaned detached job's node is away.
const reconcileInterval = 5 * time.Second

// errFenced is the cancel cause of a job another coordinator took over.
var errFenced = errors.New("another coordinator took the job over")

// storeCtx is a context for one write of j's record: j's cancellation
// must not stop it from recording how the job ended.
func (j *job) storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(j.ctx), durableWriteTimeout)
}

// startAccept starts recording j (jobstore.Store.Begin: the record's
// write is on its way when it returns) and sets j.accept, which waits for
// the outcome (once; later calls, from any goroutine, repeat it) and
// reports whether j may run: when not, j's error reply was published and
// j cancelled (errNotAccepted). Without a store j is accepted at once.
func (j *job) startAccept() {
	s := j.c.cfg.Jobs
	if s == nil || j.fanoutPart {
		// A part of another coordinator's fan-out: that coordinator
		// recorded the job before it forwarded the part here.
		j.accept = func() bool { return true }
		return
	}
	sub := jobstore.Submission{
		ID: j.id, Owner: j.ownerString(), Nodes: j.targets, Target: j.target,
		Detached: j.params.Detach, Script: j.command(),
		Idempotent: j.idempotent, IdempotencyKey: j.idempotencyKey,
		StartNow: !j.params.Detach, DispatchNow: j.params.Detach,
		Attempt: j.attempt, RerunOf: j.rerunOf,
	}
	j.c.mu.Lock()
	ending := j.c.ending[j.id]
	j.c.mu.Unlock()
	var wait func(context.Context) (*jobstore.Job, error)
	begun := time.Now()
	if ending == nil {
		wait = s.Begin(sub)
	}
	j.accept = sync.OnceValue(func() bool {
		ctx, cancel := j.storeCtx()
		defer cancel()
		if wait == nil {
			// The id's previous job replied and its final record is on
			// its way (recordEnd): submitted now, the id would still be
			// running (409), so wait for it in the job's goroutine.
			select {
			case <-ending:
			case <-ctx.Done():
			}
			begun = time.Now()
			wait = s.Begin(sub)
		}
		dj, err := wait(ctx)
		if err == nil {
			j.c.ends.observeWrite(time.Since(begun))
		}
		if !j.accepted(dj, err) || !j.recordDispatch() {
			return false
		}
		j.storeSpec() // rerun.go
		return true
	})
}

// ending registers j's final record write (recordEnd) as under way, till
// recordEnd returns; run calls it before the final reply, so that a
// client reusing j's id at once finds it (startAccept).
func (j *job) ending() {
	if j.durable == nil {
		return
	}
	j.c.mu.Lock()
	j.c.ending[j.id] = make(chan struct{})
	j.c.mu.Unlock()
}

// errNotAccepted is the cancel cause of a job whose record could not be
// written.
var errNotAccepted = errors.New("the job could not be recorded; not run")

// acceptGate is the gate of j's exec streams (tunnel.Session.OpenGated):
// nil once j's accept succeeded, else errNotAccepted.
func (j *job) acceptGate() error {
	if j.accept() {
		return nil
	}
	return errNotAccepted
}

// accepted takes the outcome of j's submission (dj, err): true when j may
// run; else false, having cancelled j and published its error reply.
func (j *job) accepted(dj *jobstore.Job, err error) bool {
	if err == nil {
		j.durable = dj
		return true
	}
	j.cancel(errNotAccepted)
	// Unregister the id and free the slot before the refusal goes out:
	// the caller may submit again the moment it reads it, and must then
	// meet what it met now (the record), not this refused job, still
	// registered until its goroutine unwinds ("already running"), nor its
	// slot (429). Both are idempotent; run's deferred calls do nothing.
	j.forget()
	if j.release != nil {
		j.release()
	}
	switch {
	case errors.Is(err, jobstore.ErrDuplicate):
		j.publishError(protocol.NewAPIError(409, protocol.ErrCodeDuplicateJob, "job %s repeats idempotent job %s (%s); its result: tether job wait %s", j.id, dj.ID, dj.State, dj.ID))
	case errors.Is(err, jobstore.ErrNotOwner):
		j.publishError(errIDInUse(j.id))
	case errors.Is(err, jobstore.ErrExists):
		j.publishError(protocol.NewAPIError(409, protocol.ErrCodeDuplicateJob, "job %s: %v", protocol.Clip(j.id), err))
	default:
		j.c.log.Warn("record job", "job_id", j.id, "err", err)
		j.publishError(protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s: cannot record job %s before running it: %v", j.c.cfg.ID, j.id, err))
	}
	return false
}

// errIDInUse refuses an exec request whose job id is another caller's
// (its record's owner is another identity, the job live or ended): 409
// duplicate_job, the same text whatever that job is, so that the caller
// learns only that the id is taken. A job id is its record's owner's
// until the record expires (jobstore, "Owners").
func errIDInUse(id string) *protocol.APIError {
	return protocol.NewAPIError(409, protocol.ErrCodeDuplicateJob, "job ID %s is already in use; choose another", protocol.Clip(id))
}

// command is what j runs, for its record's Command (jobstore keeps the
// first line, and how many follow): its script, its argv shell-joined,
// or its commands a line each.
func (j *job) command() string {
	switch {
	case j.params.Script != "":
		return j.params.Script
	case len(j.params.Argv) > 0:
		return shellJoin(j.params.Argv)
	case len(j.params.Commands) > 0:
		// A line each: the record's command says how many follow.
		return strings.Join(j.params.Commands, "\n")
	}
	return ""
}

// recordDispatch records that j's runs begin. It reports false, having
// cancelled j, when another coordinator holds the job now.
func (j *job) recordDispatch() bool {
	if j.durable == nil || j.durable.State != jobstore.Queued {
		return true // none, or recorded running at accept (attached)
	}
	ctx, cancel := j.storeCtx()
	defer cancel()
	err := j.c.cfg.Jobs.Dispatch(ctx, j.durable, !j.params.Detach)
	if errors.Is(err, jobstore.ErrFenced) {
		j.c.log.Warn("job taken over by another coordinator before dispatch; not running it", "job_id", j.id, "err", err)
		j.cancel(errFenced)
		j.publishError(protocol.NewAPIError(409, protocol.ErrCodeDuplicateJob, "coordinator %s: job %s: %v; not run here", j.c.cfg.ID, j.id, err))
		return false
	}
	if err != nil {
		j.c.log.Warn("record job dispatch", "job_id", j.id, "err", err)
	}
	return true
}

// recordEnd records how j's runs ended (see the package comment above).
// It returns once the record is written (or the write failed, logged):
// the job's goroutine, counted in jobWG, outlives its write, so a drain
// waits for it. The write is batched (endBatch): the end records of jobs
// ending within endLinger of each other go out together.
func (j *job) recordEnd(results []protocol.NodeResult) {
	if j.durable == nil {
		return
	}
	j.c.ends.add(j.c, &endWrite{j: j, results: results, done: make(chan struct{})})
}

// endLinger is how long the first end record of a batch waits for others
// before the batch is written, while record writes are quick (see
// endBatch.linger): off the moment of the job's final reply (whose
// delivery it would otherwise contend with, on the coordinator's
// connection and CPU), and long enough that jobs ending together share
// one flush, one server read and one acknowledgement flush. It delays
// what a job.get racing the reply sees (running) and a reuse of the id
// (ending) by as much.
const endLinger = 2 * time.Millisecond

// maxEndBatch bounds the writes of one batch in flight at once.
const maxEndBatch = 256

// endWrite is one job's end record on its way: done is closed once
// written.
type endWrite struct {
	j       *job
	results []protocol.NodeResult
	done    chan struct{}
}

// endBatch gathers end records (recordEnd). The first job to add one to
// an empty batch leads it: it waits (linger), then writes what gathered,
// every write sent before any acknowledgement is awaited, and goes on
// with what gathered meanwhile until none is left; the others wait for
// their own write's end. It runs no goroutine of its own.
type endBatch struct {
	mu      sync.Mutex
	pending []*endWrite // guarded by mu
	leading bool        // a job leads the batch (guarded by mu)
	// writeNS is a moving average of the accept writes' round trips
	// (startAccept), in nanoseconds.
	writeNS atomic.Int64
}

// observeWrite adds the round trip d of an accept write to the average.
func (b *endBatch) observeWrite(d time.Duration) {
	old := b.writeNS.Load()
	if old == 0 {
		old = int64(d)
	}
	b.writeNS.Store(old + (int64(d)-old)/8) // racing updates lose one sample: harmless
}

// linger is how long a batch's first end record waits: endLinger while
// the accept writes' average round trip is under half of it, else none.
// A slow write is a store syncing each write to disk (sync_interval:
// always, about a millisecond): there an end record held back lands on
// the next job's accept, which then waits behind its sync, while at once
// it costs the reply less than the wait would.
func (b *endBatch) linger() time.Duration {
	if time.Duration(b.writeNS.Load()) < endLinger/2 {
		return endLinger
	}
	return 0
}

// add queues w and returns once it is written.
func (b *endBatch) add(c *Coordinator, w *endWrite) {
	b.mu.Lock()
	b.pending = append(b.pending, w)
	lead := !b.leading
	b.leading = true
	b.mu.Unlock()
	if !lead {
		<-w.done
		return
	}
	done := false
	defer func() {
		if !done { // a panic (contained by the job's guard): let the next add lead
			b.mu.Lock()
			b.leading = false
			b.mu.Unlock()
		}
	}()
	if d := b.linger(); d > 0 {
		time.Sleep(d)
	}
	for {
		b.mu.Lock()
		batch := b.pending[:min(len(b.pending), maxEndBatch)]
		b.pending = b.pending[len(batch):]
		if len(batch) == 0 {
			b.pending = nil
			b.leading = false
		}
		b.mu.Unlock()
		if len(batch) == 0 {
			done = true
			return
		}
		c.writeEnds(batch)
	}
}

// writeEnds writes the end records of batch: each is sent (jobstore's
// StartAsync or FinishAsync) before the first acknowledgement is awaited.
// Each job's ending is cleared and its done closed once its write ended.
func (c *Coordinator) writeEnds(batch []*endWrite) {
	s := c.cfg.Jobs
	waits := make([]func(context.Context) error, len(batch))
	for i, w := range batch {
		j := w.j
		started, cancelled := 0, false
		for i := range w.results {
			if w.results[i].Detached {
				started++
			}
			cancelled = cancelled || w.results[i].Cancelled
		}
		switch {
		case j.params.Detach && started == len(w.results):
			waits[i] = s.StartAsync(j.durable)
		case j.params.Detach && started > 0 && !cancelled && len(j.durable.Nodes) > 1:
			// Some nodes started it and others did not: the record
			// runs on, holding the others' results, and ends once the
			// started nodes' runs end (their exit reports, job.get).
			waits[i] = partialStart(s, j.durable, w.results)
		default:
			waits[i] = s.FinishAsync(j.durable, w.results, cancelled, "")
		}
	}
	for i, w := range batch {
		j := w.j
		ctx, cancel := j.storeCtx()
		err := waits[i](ctx)
		cancel()
		switch {
		case errors.Is(err, jobstore.ErrBackward) && j.params.Detach:
			// A detached job quicker than this write: its node's exit
			// report (jobexit.go) settled the record already.
			c.log.Debug("record job end: already settled", "job_id", j.id, "err", err)
		case err != nil:
			c.log.Warn("record job end", "job_id", j.id, "err", err)
		}
		c.mu.Lock()
		if ch := c.ending[j.id]; ch != nil {
			delete(c.ending, j.id)
			close(ch)
		}
		c.mu.Unlock()
		close(w.done)
	}
}

// partialStart is the end record of a detached job on several nodes that
// some nodes started (results[i].Detached) and others did not: running,
// with the others' results (jobstore.Store.RecordResults), so that the
// started nodes' results end it.
func partialStart(s *jobstore.Store, dj *jobstore.Job, results []protocol.NodeResult) func(context.Context) error {
	start := s.StartAsync(dj)
	return func(ctx context.Context) error {
		if err := start(ctx); err != nil && !errors.Is(err, jobstore.ErrBackward) {
			return err
		}
		var failed []protocol.NodeResult
		for i := range results {
			if !results[i].Detached {
				failed = append(failed, results[i])
			}
		}
		_, err := s.RecordResults(ctx, dj, failed)
		return err
	}
}

// handleJobGet answers tether.v1.job.get from the store: the record, if
// the caller may see the job (policy job.status on its nodes, its owner
// as recorded), else 404 as if there were none.
func (c *Coordinator) handleJobGet(req micro.Request) {
	var r protocol.JobGetRequest
	if !c.decodeValid(req, &r) {
		return
	}
	c.goStore(req, "job get", func(ctx context.Context, s *jobstore.Store) {
		j, err := s.Get(ctx, r.ID)
		if r.Mine && (errors.Is(err, jobstore.ErrNotFound) || err == nil && j.Owner != callerOwner(req)) {
			// Asked as its submitter (protocol.JobGetRequest.Mine):
			// another's record is answered as none.
			c.replyError(req, protocol.NewAPIError(404, protocol.ErrCodeNotRecorded,
				"no job %s submitted by you is recorded: no coordinator accepted it, so it did not run", protocol.Clip(r.ID)))
			return
		}
		if err != nil {
			c.replyStoreError(req, r.ID, err)
			return
		}
		a := c.authorizer()
		nodes := c.jobPolicyNodes(j.Nodes)
		if _, e := a.Authorize(req, policy.OpJobStatus, nodes, policy.Object{Owner: j.Owner}); e != nil {
			if e.Status == 403 {
				e = notFound(r.ID)
			}
			c.replyError(req, e)
			return
		}
		// A job with no nodes passes any node rule: its submitter's and
		// admins' only (jobstore.VisibleTo), as job.list decides.
		if id, _ := caller.Of(req); len(nodes) == 0 && a.Policy != nil && !jobstore.VisibleTo(a.Policy.Policy(), id, &j.Record, nodes) {
			c.replyError(req, notFound(r.ID))
			return
		}
		j = c.settleIfOrphaned(ctx, s, j)
		c.refreshDetached(ctx, s, j)
		c.replyJSON(req, j.Record, "a job record", "")
	})
}

// refreshDetached asks the node of a detached job recorded dispatched or
// running for its status (through whichever coordinator holds the node)
// and settles the record with it. A job of several nodes asks each node
// that has no result recorded yet (jobstore.Store.SettleNodes) and ends
// once every node has one; a node that is unreachable or does not know
// the job (yet) is left for a later ask or reconciliation.
func (c *Coordinator) refreshDetached(ctx context.Context, s *jobstore.Store, j *jobstore.Job) {
	if !j.Detached || len(j.Nodes) == 0 || j.State.Terminal() || j.State == jobstore.Queued {
		return
	}
	if len(j.Nodes) > 1 {
		if _, err := s.SettleNodes(ctx, c, j, false, false); err != nil {
			c.log.Debug("settle detached job's nodes", "job_id", j.ID, "err", err)
		}
		return
	}
	st, err := c.JobStatus(ctx, j.Nodes[0], j.ID)
	if err != nil {
		return
	}
	if _, err := s.Observe(ctx, j, st); err != nil {
		c.log.Debug("settle detached job", "job_id", j.ID, "err", err)
	}
}

// handleJobList answers tether.v1.job.list with the records matching the
// filters that the caller may see (policy job.status on every node of the
// job, decided silently: a listing leaves out, it does not refuse).
func (c *Coordinator) handleJobList(req micro.Request) {
	var r protocol.JobListRequest
	if !c.decodeValid(req, &r) {
		return
	}
	a := c.authorizer()
	if e := a.Allow(req, policy.OpJobStatus); e != nil {
		c.replyError(req, e)
		return
	}
	id, _ := caller.Of(req)
	visible := func(rec *jobstore.Record) bool {
		if a.Policy == nil {
			return true
		}
		return jobstore.VisibleTo(a.Policy.Policy(), id, rec, c.jobPolicyNodes(rec.Nodes))
	}
	limit := r.Limit
	if limit == 0 {
		limit = 100
	}
	c.goStore(req, "job list", func(ctx context.Context, s *jobstore.Store) {
		js, err := s.List(ctx, jobstore.Filter{State: r.State, Node: r.Node, Owner: r.Owner}, visible, limit+1)
		if err != nil {
			c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s: %v", c.cfg.ID, err))
			return
		}
		resp := protocol.JobListResponse{Jobs: make([]protocol.JobRecord, 0, len(js))}
		if len(js) > limit {
			js, resp.More = js[:limit], true
		}
		for _, j := range js {
			resp.Jobs = append(resp.Jobs, j.Record)
		}
		c.replyJSON(req, resp, "a job list", "list with a smaller limit")
	})
}

func notFound(id string) *protocol.APIError {
	return protocol.NewAPIError(404, protocol.ErrCodeNotFound, "no job %s", protocol.Clip(id))
}

func (c *Coordinator) replyStoreError(req micro.Request, id string, err error) {
	if errors.Is(err, jobstore.ErrNotFound) {
		c.replyError(req, notFound(id))
		return
	}
	c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s: %v", c.cfg.ID, err))
}

// jobPolicyNodes are a job's nodes as policy sees them: with their labels
// when connected here, by id alone otherwise.
func (c *Coordinator) jobPolicyNodes(ids []string) []policy.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]policy.Node, len(ids))
	for i, id := range ids {
		if n, ok := c.nodes[id]; ok {
			out[i] = n.policyNode()
		} else {
			out[i] = policy.Node{ID: id}
		}
	}
	return out
}

// goStore runs f on a goroutine the coordinator owns (goRequest), with
// the store and a context bounded by jobAnswerTimeout; 501 without a
// store.
func (c *Coordinator) goStore(req micro.Request, what string, f func(context.Context, *jobstore.Store)) {
	s := c.cfg.Jobs
	if s == nil {
		c.replyError(req, protocol.NewAPIError(501, protocol.ErrCodeUnsupported, "coordinator %s keeps no job records", c.cfg.ID))
		return
	}
	c.goRequest(req, what, func(life context.Context) {
		ctx, cancel := context.WithTimeout(life, jobAnswerTimeout)
		defer cancel()
		f(ctx, s)
	})
}

// goRequest runs f(life) for req on a goroutine counted in jobWG, life
// ending with the coordinator; a panic in f answers req with an internal
// error, and a coordinator shutting down answers 503 without running f.
//
// life also ends when a drain's timeout passes (requestsDone): a request
// waiting on another coordinator (a job.get's remote status, up to
// jobAnswerTimeout) must not hold the drain past it.
func (c *Coordinator) goRequest(req micro.Request, what string, f func(life context.Context)) {
	life, ok := c.enterRequest()
	if !ok {
		c.replyError(req, c.unavailable())
		return
	}
	go func() {
		defer c.jobWG.Done()
		defer c.guard.Recover(what, func(e *panics.Error) { c.replyError(req, c.internalError(e)) })
		f(life)
	}()
}

// enterRequest is enter(&c.jobWG) for a request's goroutine: its context
// ends with the coordinator or when the drain timeout passed.
func (c *Coordinator) enterRequest() (context.Context, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.life == nil || c.requests == nil {
		return nil, false
	}
	c.jobWG.Add(1)
	return c.requests, true
}

// JobStatus asks node for detached job id's status (jobstore.Querier):
// through its tunnel when it is here, else through the coordinator
// holding it (fleet_jobquery.go). jobstore.ErrNodeUnreachable when no
// coordinator holds the node or it does not answer, jobstore.ErrNoSuchJob
// when its agent does not know the job.
func (c *Coordinator) JobStatus(ctx context.Context, nodeID, id string) (*protocol.JobStatus, error) {
	if !c.holds(nodeID) {
		if owner := c.remoteOwner(nodeID); owner != "" {
			return c.remoteJobStatus(ctx, owner, nodeID, id)
		}
	}
	return c.localJobStatus(ctx, nodeID, id)
}

// localJobStatus is JobStatus through this coordinator's own tunnel.
func (c *Coordinator) localJobStatus(ctx context.Context, nodeID, id string) (*protocol.JobStatus, error) {
	c.mu.Lock()
	n := c.nodes[nodeID]
	c.mu.Unlock()
	if n == nil {
		return nil, fmt.Errorf("node %s: not connected to coordinator %s: %w", nodeID, c.cfg.ID, jobstore.ErrNodeUnreachable)
	}
	ctx, cancel := context.WithTimeout(ctx, jobAnswerTimeout)
	defer cancel()
	octx, ocancel := context.WithTimeout(ctx, c.cfg.Tunnel.WriteTimeout)
	st, err := n.sess.Open(octx, protocol.KindJob, &protocol.JobParams{Op: protocol.JobOpStatus, ID: id})
	ocancel()
	if err != nil {
		return nil, fmt.Errorf("node %s: open job stream: %v: %w", nodeID, err, jobstore.ErrNodeUnreachable)
	}
	c.m.streamsOpened.WithLabelValues(protocol.KindJob.String()).Inc()
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetReadDeadline(time.Now()) })
	defer stop()
	f, err := protocol.NewFrameReader(st).Next()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("node %s: job %s status: %v: %w", nodeID, id, err, jobstore.ErrNodeUnreachable)
	}
	switch f.Type {
	case protocol.FrameJob:
		var js protocol.JobStatus
		if err := protocol.DecodeJSON(f.Payload, &js); err != nil {
			return nil, fmt.Errorf("node %s: job %s status: %w", nodeID, id, err)
		}
		js.Node = nodeID
		return &js, nil
	case protocol.FrameError:
		var ei protocol.ErrorInfo
		if err := protocol.DecodeJSON(f.Payload, &ei); err != nil {
			return nil, fmt.Errorf("node %s: job %s status: %w", nodeID, id, err)
		}
		if ei.Code == "job_not_found" {
			return nil, fmt.Errorf("node %s: job %s: %w", nodeID, id, jobstore.ErrNoSuchJob)
		}
		return nil, fmt.Errorf("node %s: job %s status: %s", nodeID, id, truncateAgentString(ei.Message))
	}
	return nil, fmt.Errorf("node %s: job %s status: unexpected %s frame", nodeID, id, f.Type)
}

var _ jobstore.Querier = (*Coordinator)(nil)

// reconcileSafetyInterval is the longest pause between reconciliation
// passes: a holder that vanished unseen (no sweep noticed it, no client
// asked) is found by the next one.
const reconcileSafetyInterval = time.Minute

// startReconcile starts the goroutine (counted in jobWG) that takes over
// and settles the jobs of gone holders (this coordinator's predecessors,
// and coordinators gone per holderGone): a pass at once, then one when
// woken (wakeReconcile: a sweep saw a coordinator vanish, job.get met a
// gone holder), every reconcileInterval while detached jobs wait for
// their nodes (lost once they waited JobLostAfter), and at least every
// reconcileSafetyInterval. It stops when ctx ends.
func (c *Coordinator) startReconcile(ctx context.Context) {
	s := c.cfg.Jobs
	if s == nil {
		return
	}
	s.OnEnd(c.onJobEnd) // rerun.go
	c.jobWG.Add(1)
	go func() {
		defer c.jobWG.Done()
		nextScan := time.Now().Add(strandedAfter) // rerun.go: agents are back by then
		for {
			if !time.Now().Before(nextScan) {
				c.rerunStranded(ctx, s)
				nextScan = time.Now().Add(strandedScanInterval)
			}
			wait := reconcileSafetyInterval
			if c.reconcilePass(ctx, s) > 0 {
				wait = reconcileInterval
			}
			t := time.NewTimer(max(0, min(wait, time.Until(nextScan))))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-c.holders.wake:
				t.Stop()
			case <-t.C:
			}
		}
	}()
}

// reconcilePass runs one pass and returns how many jobs it left pending.
func (c *Coordinator) reconcilePass(ctx context.Context, s *jobstore.Store) (pending int) {
	defer c.guard.Recover("job reconcile", nil)
	pctx, cancel := context.WithTimeout(ctx, jobAnswerTimeout)
	defer cancel()
	out, err := s.Reconcile(pctx, c, c.holderGone, c.cfg.JobLostAfter)
	c.m.takenOver.Add(float64(out.Claimed))
	switch {
	case err != nil:
		c.log.Warn("reconcile jobs", "err", err)
	case out.Claimed > 0 || out.Settled > 0 || out.Errs != nil:
		c.log.Info("reconciled jobs", "claimed", out.Claimed, "settled", out.Settled, "pending", out.Pending, "errs", out.Errs)
	}
	return out.Pending
}

// settleIfOrphaned takes job j over and settles it (TakeOver) when its
// holder is gone: a predecessor of this coordinator, or another
// coordinator per holderGone. j is then the record as it is now. It
// wakes the reconcile loop for the holder's other jobs.
func (c *Coordinator) settleIfOrphaned(ctx context.Context, s *jobstore.Store, j *jobstore.Job) *jobstore.Job {
	if j.State.Terminal() || (j.Coordinator == s.Coordinator() && j.Boot == s.Boot()) {
		return j
	}
	if j.Coordinator != s.Coordinator() && !c.holderGone(j.Coordinator) {
		return j
	}
	claimed, _, err := s.TakeOver(ctx, c, j, c.cfg.JobLostAfter)
	if claimed {
		c.m.takenOver.Inc()
	}
	if err != nil {
		c.log.Debug("take over an orphaned job", "job_id", j.ID, "err", err)
		if cur, gerr := s.Get(ctx, j.ID); gerr == nil {
			j = cur // someone else settled or claimed it first
		}
	}
	c.wakeReconcile()
	return j
}

// shellJoin is argv as one shell command line: a plain word as it is, any
// other argument (spaces, quotes, metacharacters, empty) single-quoted, so
// that a record's command reads as what was run and pastes back into a
// shell.
func shellJoin(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") == "" {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

// callerOwner is the owner a job submitted by req's caller is recorded
// with (job.ownerString): the caller's identity, "" when unknown.
func callerOwner(req micro.Request) string {
	if id, ok := caller.Of(req); ok {
		return id.String()
	}
	return ""
}
