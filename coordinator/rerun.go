package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

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
}

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
	b, _ := json.Marshal(jobSpec{Request: req, Identity: j.owner, Known: j.ownerKnown})
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

// nextAttemptID is the id of the attempt after rec's: its first
// attempt's id with ".N" (shortened to fit protocol.MaxJobIDLen).
func nextAttemptID(rec *jobstore.Record) string {
	n := max(rec.Attempt, 1) + 1
	base := rec.ID
	if rec.RerunOf != "" {
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
	next := nextAttemptID(&lost.Record)
	if err := s.ClaimRerun(ctx, lost, next); err != nil {
		if errors.Is(err, jobstore.ErrAttemptsExhausted) {
			c.log.Warn("lost idempotent job not re-run: attempts exhausted", "job_id", id, "attempts", lost.Attempt)
		} else {
			c.log.Debug("claim a job's re-run", "job_id", id, "err", err)
		}
		return
	}
	refuse := func(why string) {
		c.log.Warn("lost idempotent job not re-run", "job_id", id, "rerun_as", next, "why", why)
		rctx, rcancel := context.WithTimeout(context.Background(), durableWriteTimeout)
		defer rcancel()
		if err := s.RefuseRerun(rctx, lost, why); err != nil {
			c.log.Warn("record a refused re-run", "job_id", id, "err", err)
		}
	}
	b, err := s.Spec(ctx, id)
	if err != nil {
		refuse(fmt.Sprintf("its spec cannot be read: %v", err))
		return
	}
	var spec jobSpec
	var r protocol.ExecRequest
	if err := json.Unmarshal(b, &spec); err != nil {
		refuse(fmt.Sprintf("its spec cannot be decoded: %v", err))
		return
	}
	if err := json.Unmarshal(spec.Request, &r); err != nil {
		refuse(fmt.Sprintf("its spec cannot be decoded: %v", err))
		return
	}
	r.ID = next
	if len(lost.Nodes) == 1 {
		r.Target = protocol.Target{Node: lost.Nodes[0]} // its own node, whatever a selector matches now
	}
	body, _ := json.Marshal(&r)
	rr := &rerunRequest{body: body, reply: c.cfg.NATS.NewInbox(), attempt: max(lost.Attempt, 1) + 1, of: id}
	replies, err := c.cfg.NATS.SubscribeSync(rr.reply)
	if err != nil {
		refuse(fmt.Sprintf("cannot subscribe to its replies: %v", err))
		return
	}
	defer replies.Unsubscribe()
	var req micro.Request = rr
	if spec.Known {
		req = &caller.Request{Request: rr, Identity: spec.Identity}
	}
	c.m.reruns.Inc()
	c.log.Info("re-running a lost idempotent job", "job_id", id, "rerun_as", next, "attempt", rr.attempt, "owner", lost.Owner)
	c.handleExec(req)
	if why := rr.refusal(); why != "" {
		refuse(why)
		return
	}
	// The first reply says whether it started, or why it did not (a
	// refusal by the coordinator holding the node, or a refused record).
	m, err := replies.NextMsg(rerunReplyWait)
	if err != nil {
		return // the re-run's record tells its fate
	}
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		refuse(fmt.Sprintf("re-run as %s refused (%s): %s", next, code, errorText(m.Data, m.Header.Get(micro.ErrorHeader))))
	}
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

	mu  sync.Mutex
	err string // guarded by mu
}

func (r *rerunRequest) Respond([]byte, ...micro.RespondOpt) error  { return nil }
func (r *rerunRequest) RespondJSON(any, ...micro.RespondOpt) error { return nil }
func (r *rerunRequest) Error(code, desc string, data []byte, _ ...micro.RespondOpt) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == "" {
		r.err = fmt.Sprintf("re-run refused (%s): %s", code, errorText(data, desc))
	}
	return nil
}
func (r *rerunRequest) Data() []byte           { return r.body }
func (r *rerunRequest) Headers() micro.Headers { return micro.Headers{} }
func (r *rerunRequest) Subject() string        { return protocol.SubjectExec }
func (r *rerunRequest) Reply() string          { return r.reply }

func (r *rerunRequest) refusal() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// rerunOf is req's re-run, nil for a client's request.
func rerunOf(req micro.Request) *rerunRequest {
	if cr, ok := req.(*caller.Request); ok {
		req = cr.Request
	}
	rr, _ := req.(*rerunRequest)
	return rr
}
