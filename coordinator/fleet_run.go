package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/protocol"
)

// runRemote runs the job on node id, which coordinator owner holds: it
// forwards a single-node exec of the job's request (its own run id, the
// caller's headers; a detached job's run has the job's own id, so that
// the node's job is the fan-out's: its exit report and job.status by id
// reach the fan-out's record, which the owner then does not write a
// record of its own for, see fanoutPartOf) to the node's subject with an inbox of this
// coordinator as the reply subject, republishes the run's output chunks in
// the job's sequence and returns its node result. Cancelling the job
// aborts the run on the owner (RunSubjectPrefix+<run>+".abort"), which
// then reports the node's exit within its CancelGrace. It never fails:
// problems become the result's Error. tail keeps the stderr tail as runNode's does.
func (j *job) runRemote(id, owner string, tail *stderrTail) (res protocol.NodeResult) {
	c := j.c
	res.Node = id
	fail := func(format string, args ...any) protocol.NodeResult {
		res.ExitCode = -1
		res.Error = fmt.Sprintf(format, args...)
		return res
	}
	r, apiErr := protocol.DecodeExecRequest(j.request)
	if apiErr != nil { // it was decoded once already
		return fail("re-decode the exec request for node %s: %s", id, apiErr.Message)
	}
	runID := rand.Text()
	if j.params.Detach {
		runID = j.id
	}
	r.ID = runID
	r.Target = protocol.Target{Node: id}
	r.MaxParallel = 0
	body, err := json.Marshal(r)
	if err != nil {
		return fail("encode the exec request for node %s: %v", id, err)
	}
	nc := c.cfg.NATS
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fail("subscribe to the reply inbox of node %s's run: %v", id, err)
	}
	defer sub.Unsubscribe()
	sub.SetPendingLimits(-1, 64<<20)
	h := nats.Header{}
	for k, v := range j.header {
		h[k] = slices.Clone(v)
	}
	h.Set(HeaderForwardReply, inbox)
	h.Set(HeaderForwardedBy, c.cfg.ID)
	h.Set(headerFanoutRun, j.id)
	c.m.forwarded.Inc()
	if err := nc.PublishMsg(&nats.Msg{Subject: nodeSubject(id, "exec"), Reply: inbox, Header: h, Data: body}); err != nil {
		return fail("forward to coordinator %s: %v", owner, err)
	}

	ctx := j.ctx
	if j.params.TimeoutMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(j.params.TimeoutMS)*time.Millisecond+execSlack)
		defer cancel()
	}
	aborted, acked := false, false
	// Until the owner acknowledged, wait forwardAckTimeout at most: a
	// stale record (or a non-coordinator subscriber in TETHER, which keeps
	// the server from answering "no responders") must not hold the node's
	// run for the job's whole timeout.
	ackCtx, ackCancel := context.WithTimeout(ctx, forwardAckTimeout)
	defer ackCancel()
	var nodeRes *protocol.NodeResult
	for {
		wctx := ctx
		if !acked {
			wctx = ackCtx
		}
		m, err := sub.NextMsgWithContext(wctx)
		if err != nil {
			if !acked && ctx.Err() == nil && j.ctx.Err() == nil {
				return fail("coordinator %s holding node %s did not take the run within %v", owner, id, forwardAckTimeout)
			}
			if j.ctx.Err() != nil && !aborted {
				// Cancelled here: stop the run there and wait for its
				// result a little.
				aborted, acked = true, true // wait on the grace below, acknowledged or not
				nc.PublishMsg(&nats.Msg{Subject: runSubject(runID, "abort"), Header: abortHeader(c.cfg.ID, id)})
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(context.Background(), c.cfg.CancelGrace+c.cfg.Tunnel.WriteTimeout)
				defer cancel()
				continue
			}
			if aborted {
				res.Cancelled = true
				j.cancelReason(&res)
				return fail("coordinator %s: no exit status within %v of cancelling job %s", owner, c.cfg.CancelGrace, j.id)
			}
			return fail("coordinator %s: no answer for node %s: %v", owner, id, err)
		}
		if m.Header.Get("Status") == "503" {
			return fail("coordinator %s holding node %s does not answer (no responders)", owner, id)
		}
		acked = true // an acknowledgement, or a reply after one
		if m.Header.Get("Tether-Forward-Ack") != "" {
			continue
		}
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			var e protocol.APIError
			json.Unmarshal(m.Data, &e)
			msg := m.Header.Get(micro.ErrorHeader)
			if e.Code != "" {
				res.ErrorCode = e.Code
			}
			return fail("coordinator %s: %s", owner, msg)
		}
		switch typ := m.Header.Get(protocol.HeaderType); typ {
		case protocol.ReplyStdout, protocol.ReplyStderr:
			if typ == protocol.ReplyStderr {
				tail.write(m.Data)
			}
			if err := j.publishOutput(id, typ, m.Data); err != nil {
				// Stop the run there too: nobody reads it.
				nc.PublishMsg(&nats.Msg{Subject: runSubject(runID, "abort"), Header: abortHeader(c.cfg.ID, id)})
				return fail("output reply lost, giving up: %v", err)
			}
		case protocol.ReplyNodeResult:
			var nr protocol.NodeResult
			if err := json.Unmarshal(m.Data, &nr); err != nil {
				return fail("coordinator %s: node result: %v", owner, err)
			}
			nodeRes = &nr
		case protocol.ReplyResult:
			if nodeRes == nil {
				var er protocol.ExecResult
				if err := json.Unmarshal(m.Data, &er); err != nil || len(er.Results) != 1 {
					return fail("coordinator %s: result without node %s's result", owner, id)
				}
				nodeRes = &er.Results[0]
			}
			res = *nodeRes
			res.Node = id
			if res.Cancelled {
				j.cancelReason(&res)
			}
			return res
		}
	}
}

// abortHeader is the header of coordinator by's abort of node's run
// (RunSubjectPrefix+<run>+".abort"): it names the node, since a detached
// fan-out's runs on one coordinator share the fan-out's id (runKey) and
// giving up on one node must not stop the others.
func abortHeader(by, node string) nats.Header {
	h := nats.Header{HeaderForwardedBy: []string{by}}
	h.Set(protocol.HeaderNode, node)
	return h
}
