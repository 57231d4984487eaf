package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Re-runs (issue 11 item 2: an idempotent job runs at least once). A
// detached idempotent job's exec request is stored with its submitter as
// the job is accepted (storeSpec). When a write of this coordinator's
// store ends such a job lost (its agent reported the process lost, its
// node stayed away past JobLostAfter, or its coordinator died and this
// one took the record over: jobstore.Store.OnEnd), the coordinator claims
// the re-run on the lost record (jobstore.Store.ClaimRerun, compare-and-
// set: one coordinator runs it) and submits the stored request again as
// its owner, under the next attempt's id (<id>.2, <id>.3), through
// handleExec: the current policy authorizes it again, and it runs on the
// job's own node. A refused re-run (the owner's grant revoked, the node
// gone...) is recorded on the lost record (RefuseRerun), which stays lost;
// so is one past jobstore.MaxAttempts. A job that never ran because the
// client was told to retry (refuseMoved: "not run: ...") is not re-run.

// rerunReplyWait bounds the wait for a re-run's first reply (its refusal,
// or that it started).
const rerunReplyWait = 10 * time.Second

// jobSpec is what a re-run needs of a job (jobstore spec.<id>).
type jobSpec struct {
	Request json.RawMessage `json:"request"`
	// Identity is the submitter, Known false when the guard identified
	// none (no policy).
	Identity policy.Identity `json:"identity"`
	Known    bool            `json:"known,omitempty"`
	// RequestInfo is the request's Nats-Request-Info header, the NATS
	// server's stamp of its sender: a re-run carries it, so that
	// Config.Identify names the owner again (its credentials not expired
	// nor revoked since), here or on the coordinator holding the node.
	RequestInfo []string `json:"request_info,omitempty"`
}

// requestInfoHeader is the header the NATS server stamps a request's
// sender in (natsauth), looked up by its exact name.
const requestInfoHeader = "Nats-Request-Info"

// storeSpec stores j's spec when j may be re-run: detached, idempotent,
// recorded by this coordinator.
func (j *job) storeSpec() {
	if j.durable == nil || !j.params.Detach || !j.idempotent || j.fanoutPart {
		return
	}
	var r protocol.ExecRequest
	if err := json.Unmarshal(j.request, &r); err != nil {
		return
	}
	r.ID = j.id
	req, _ := json.Marshal(&r)
	b, _ := json.Marshal(jobSpec{Request: req, Identity: j.owner, Known: j.ownerKnown, RequestInfo: j.header[requestInfoHeader]})
	ctx, cancel := j.storeCtx()
	defer cancel()
	if err := j.c.cfg.Jobs.PutSpec(ctx, j.id, b); err != nil {
		j.c.log.Warn("store the spec of an idempotent job; it cannot be re-run", "job_id", j.id, "err", err)
	}
}

// onJobEnd is the store's OnEnd hook: a lost idempotent detached job is
// re-run on a goroutine of its own.
func (c *Coordinator) onJobEnd(rec *jobstore.Record) {
	if !jobstore.Rerunnable(rec) || strings.HasPrefix(rec.Error, "not run:") {
		return
	}
	if _, ok := c.enter(&c.jobWG); !ok {
		return
	}
	go func() {
		defer c.jobWG.Done()
		defer c.guard.Recover("job re-run", nil)
		c.rerun(rec.ID)
	}()
}

// nextAttemptID is the id of the attempt after rec's on a run of its
// own: base (rec's first attempt's id; for one node of a job on several,
// that job's id and ".n<index of the node>") with ".N", N the attempt,
// shortened to fit protocol.MaxJobIDLen.
func nextAttemptID(rec *jobstore.Record, part int) string {
	n := max(rec.Attempt, 1) + 1
	base := rec.ID
	switch {
	case part >= 0:
		base += ".n" + strconv.Itoa(part)
	case rec.RerunOf != "":
		if i := strings.LastIndexByte(base, '.'); i > 0 {
			base = base[:i]
		}
	}
	suffix := "." + strconv.Itoa(n)
	if len(base)+len(suffix) > protocol.MaxJobIDLen {
		base = strings.TrimRight(base[:protocol.MaxJobIDLen-len(suffix)], "-_.")
	}
	return base + suffix
}

// rerunPart is one run of a re-run: a node and the job id it runs under.
type rerunPart struct{ node, id string }

// rerunParts are the runs that re-run lost job rec: on one node, the
// next attempt there; on several, one run per lost node, on that node
// only.
func rerunParts(rec *jobstore.Record) []rerunPart {
	if len(rec.Nodes) <= 1 {
		node := ""
		if len(rec.Nodes) == 1 {
			node = rec.Nodes[0]
		}
		return []rerunPart{{node, nextAttemptID(rec, -1)}}
	}
	var out []rerunPart
	for _, n := range jobstore.LostNodes(rec) {
		out = append(out, rerunPart{n, nextAttemptID(rec, slices.Index(rec.Nodes, n))})
	}
	return out
}

// rerun runs lost job id again, if it still may be and this coordinator
// wins its claim.
func (c *Coordinator) rerun(id string) {
	s := c.cfg.Jobs
	ctx, cancel := context.WithTimeout(context.Background(), durableWriteTimeout)
	defer cancel()
	lost, err := s.Get(ctx, id)
	if err != nil || !jobstore.Rerunnable(&lost.Record) {
		return
	}
	parts := rerunParts(&lost.Record)
	ids := make([]string, len(parts))
	for i, p := range parts {
		ids[i] = p.id
	}
	if err := s.ClaimRerun(ctx, lost, strings.Join(ids, ",")); err != nil {
		if errors.Is(err, jobstore.ErrAttemptsExhausted) {
			c.log.Warn("lost idempotent job not re-run: attempts exhausted", "job_id", id, "attempts", lost.Attempt)
		} else {
			c.log.Debug("claim a job's re-run", "job_id", id, "err", err)
		}
		return
	}
	var started, whys []string
	transient := len(parts) == 1
	spec, err := c.readSpec(ctx, id)
	if err != nil {
		whys, transient = append(whys, err.Error()), false
	} else {
		for _, p := range parts {
			why, again := c.rerunOn(lost, spec, p)
			if why != "" {
				whys = append(whys, why)
				transient = transient && again
			} else {
				started = append(started, p.id)
			}
		}
	}
	if len(whys) == 0 {
		return
	}
	if transient {
		// Refused for the moment (503): release the claim, for a later
		// scan (rerunStranded) to run it.
		c.log.Info("lost idempotent job's re-run put off", "job_id", id, "why", whys[0])
		rctx, rcancel := context.WithTimeout(context.Background(), durableWriteTimeout)
		defer rcancel()
		if err := s.RefuseRerun(rctx, lost, "", ""); err != nil {
			c.log.Warn("release a put-off re-run", "job_id", id, "err", err)
		}
		return
	}
	why := strings.Join(whys, "; ")
	c.log.Warn("lost idempotent job not re-run", "job_id", id, "rerun_as", strings.Join(started, ","), "why", why)
	rctx, rcancel := context.WithTimeout(context.Background(), durableWriteTimeout)
	defer rcancel()
	if err := s.RefuseRerun(rctx, lost, strings.Join(started, ","), why); err != nil {
		c.log.Warn("record a refused re-run", "job_id", id, "err", err)
	}
}

// readSpec is job id's stored spec.
func (c *Coordinator) readSpec(ctx context.Context, id string) (*jobSpec, error) {
	b, err := c.cfg.Jobs.Spec(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("its spec cannot be read: %v", err)
	}
	var spec jobSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("its spec cannot be decoded: %v", err)
	}
	return &spec, nil
}

// rerunOn submits spec's request again as p (its node, its id), as the
// spec's owner, through handleExec, and returns why it did not start
// ("" when it did, or nothing was heard: its record tells its fate) and
// whether the refusal was for the moment (503 unavailable).
func (c *Coordinator) rerunOn(lost *jobstore.Job, spec *jobSpec, p rerunPart) (string, bool) {
	why, status := c.rerunOnce(lost, spec, p)
	return why, status == 503
}

// rerunOnce is rerunOn, with the refusal's status (0 if none).
func (c *Coordinator) rerunOnce(lost *jobstore.Job, spec *jobSpec, p rerunPart) (string, int) {
	var r protocol.ExecRequest
	if err := json.Unmarshal(spec.Request, &r); err != nil {
		return fmt.Sprintf("its spec cannot be decoded: %v", err), 0
	}
	r.ID = p.id
	if p.node != "" {
		r.Target = protocol.Target{Node: p.node} // its own node, whatever a selector matches now
	}
	body, _ := json.Marshal(&r)
	rr := &rerunRequest{body: body, reply: c.cfg.NATS.NewInbox(), attempt: max(lost.Attempt, 1) + 1, of: lost.ID, header: micro.Headers{}}
	id, known := spec.Identity, spec.Known
	if len(spec.RequestInfo) > 0 {
		rr.header[requestInfoHeader] = spec.RequestInfo
		got, err := c.cfg.Identify(nats.Header(rr.header))
		if err != nil {
			return fmt.Sprintf("re-run as %s refused: its owner %s is no longer identified: %v", p.id, lost.Owner, err), 0
		}
		id, known = got, true
	}
	replies, err := c.cfg.NATS.SubscribeSync(rr.reply)
	if err != nil {
		return fmt.Sprintf("cannot subscribe to the replies of %s: %v", p.id, err), 503
	}
	defer replies.Unsubscribe()
	var req micro.Request = rr
	if known {
		req = &caller.Request{Request: rr, Identity: id}
	}
	c.log.Info("re-running a lost idempotent job", "job_id", lost.ID, "rerun_as", p.id, "node", p.node, "attempt", rr.attempt, "owner", lost.Owner)
	c.handleExec(req)
	if why, status := rr.refusal(); why != "" {
		return fmt.Sprintf("re-run as %s %s", p.id, why), status
	}
	// The first reply says whether it started, or why it did not (a
	// refusal by the coordinator holding the node, or a refused record).
	m, err := replies.NextMsg(rerunReplyWait)
	if err == nil {
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			status, _ := strconv.Atoi(code)
			return fmt.Sprintf("re-run as %s refused (%s): %s", p.id, code, errorText(m.Data, m.Header.Get(micro.ErrorHeader))), status
		}
	}
	c.m.reruns.Inc()
	return "", 0
}

// errorText is an error reply's message.
func errorText(body []byte, desc string) string {
	var e protocol.APIError
	if json.Unmarshal(body, &e) == nil && e.Message != "" {
		return e.Message
	}
	return desc
}

// rerunRequest is the exec request of a re-run, made by the coordinator
// (no client sent it): its replies go to an inbox rerun reads, and an
// error reply made through it (handleExec's refusals) is kept.
type rerunRequest struct {
	body    []byte
	reply   string
	attempt int
	of      string
	header  micro.Headers

	mu     sync.Mutex
	err    string // guarded by mu
	status int    // err's status (guarded by mu)
}

func (r *rerunRequest) Respond([]byte, ...micro.RespondOpt) error  { return nil }
func (r *rerunRequest) RespondJSON(any, ...micro.RespondOpt) error { return nil }
func (r *rerunRequest) Error(code, desc string, data []byte, _ ...micro.RespondOpt) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == "" {
		r.err = fmt.Sprintf("refused (%s): %s", code, errorText(data, desc))
		r.status, _ = strconv.Atoi(code)
	}
	return nil
}
func (r *rerunRequest) Data() []byte           { return r.body }
func (r *rerunRequest) Headers() micro.Headers { return r.header }
func (r *rerunRequest) Subject() string        { return protocol.SubjectExec }
func (r *rerunRequest) Reply() string          { return r.reply }

func (r *rerunRequest) refusal() (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err, r.status
}

// rerunOf is req's re-run, nil for a client's request.
func rerunOf(req micro.Request) *rerunRequest {
	if cr, ok := req.(*caller.Request); ok {
		req = cr.Request
	}
	rr, _ := req.(*rerunRequest)
	return rr
}

// strandedAfter is how long a lost idempotent job may wait unclaimed
// before rerunStranded takes it for stranded (the coordinator that wrote
// it lost claims its re-run at once), and how long after its start a
// coordinator first scans for them (its agents are back by then);
// strandedScanInterval is the pause between later scans. Variables for
// tests (export_test.go).
var (
	strandedAfter        = 30 * time.Second
	strandedScanInterval = 5 * time.Minute
)

// rerunStranded re-runs the lost idempotent jobs that nobody claimed
// (their coordinator stopped between writing the record lost and
// claiming the re-run) or whose re-run was refused for the moment (503:
// a coordinator shutting down or without its store): the claims are
// compare-and-set, so coordinators scanning together run each once. It
// reads every record, so the reconcile loop runs it strandedAfter after
// the start and then every strandedScanInterval, not every pass.
func (c *Coordinator) rerunStranded(ctx context.Context, s *jobstore.Store) {
	defer c.guard.Recover("job re-run scan", nil)
	lctx, cancel := context.WithTimeout(ctx, jobAnswerTimeout)
	defer cancel()
	now := time.Now()
	js, err := s.List(lctx, jobstore.Filter{State: jobstore.Lost}, func(r *jobstore.Record) bool {
		return jobstore.Rerunnable(r) && !strings.HasPrefix(r.Error, "not run:") && now.Sub(r.FinishedAt) >= strandedAfter
	}, 0)
	if err != nil {
		c.log.Debug("list lost idempotent jobs", "err", err)
		return
	}
	for _, j := range js {
		if ctx.Err() != nil {
			return
		}
		c.rerun(j.ID)
	}
}
