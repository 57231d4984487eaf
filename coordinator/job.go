package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/protocol"
)

// execSlack is how long past a request's timeout the coordinator waits
// before it cancels a node's run itself. The agent enforces the timeout; this
// only guards against an agent that never answers while its heartbeats keep
// the session alive.
const execSlack = 30 * time.Second

// job is one exec request in flight. Its goroutine (run) starts one goroutine
// per node, at most maxParallel at a time, and waits for them.
type job struct {
	c           *Coordinator
	id          string
	reply       string // the request's reply subject
	targets     []*node
	params      protocol.ExecParams
	stdin       []byte
	maxParallel int
	ctx         context.Context // cancelled by SubjectCancel or the drain
	cancel      context.CancelFunc

	// pubMu serialises publishes so that replies leave in Tether-Seq order.
	pubMu     sync.Mutex
	seq       uint64
	pubFailed bool // a publish failed (logged once)
}

// run executes the job on every target and publishes the final result.
func (j *job) run() {
	defer j.cancel()
	log := j.c.log.With("job_id", j.id)
	log.Debug("job started", "nodes", len(j.targets), "max_parallel", j.maxParallel)

	results := make([]protocol.NodeResult, len(j.targets))
	if len(j.targets) == 1 {
		// The common case: no fan-out, so no extra goroutine.
		results[0] = j.runNode(j.targets[0])
	} else {
		j.fanOut(results)
	}

	// Forget the job before the final reply, so a client may reuse its id
	// as soon as it sees the result.
	j.c.mu.Lock()
	if j.c.jobs[j.id] == j {
		delete(j.c.jobs, j.id)
	}
	j.c.mu.Unlock()

	slices.SortFunc(results, func(a, b protocol.NodeResult) int { return strings.Compare(a.Node, b.Node) })
	body, err := json.Marshal(protocol.ExecResult{ID: j.id, Results: results})
	if err != nil { // cannot happen: plain data
		log.Error("encode exec result", "err", err)
		return
	}
	j.publish("", protocol.ReplyResult, body)
	log.Debug("job finished")
}

// fanOut runs the job on every target, at most maxParallel at once, one
// goroutine per running node, and fills results in target order.
func (j *job) fanOut(results []protocol.NodeResult) {
	sem := make(chan struct{}, j.maxParallel)
	var wg sync.WaitGroup
	for i, n := range j.targets {
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
			results[i] = j.notStarted(n)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = j.runNode(n)
		}()
	}
	wg.Wait()
}

// notStarted is the result of a node the job was cancelled before reaching.
func (j *job) notStarted(n *node) protocol.NodeResult {
	r := protocol.NodeResult{
		Node:      n.id,
		ExitCode:  -1,
		Cancelled: true,
		Error:     fmt.Sprintf("node %s: job %s was cancelled before it started there", n.id, j.id),
	}
	j.c.m.execResults.WithLabelValues(outcomeCancelled).Inc()
	return r
}

// runNode runs the job on one node through a new exec stream and returns
// the node's result. It never fails: problems become the result's Error.
func (j *job) runNode(n *node) (res protocol.NodeResult) {
	c := j.c
	res.Node = n.id
	start := time.Now()
	defer func() {
		d := time.Since(start)
		if res.DurationMS == 0 {
			res.DurationMS = float64(d) / float64(time.Millisecond)
		}
		c.m.execDuration.Observe(d.Seconds())
		c.m.execResults.WithLabelValues(outcome(&res)).Inc()
	}()
	fail := func(format string, args ...any) protocol.NodeResult {
		res.ExitCode = -1
		res.Error = fmt.Sprintf(format, args...)
		return res
	}

	ctx := j.ctx
	if j.params.TimeoutMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(j.params.TimeoutMS)*time.Millisecond+execSlack)
		defer cancel()
	}

	octx, ocancel := context.WithTimeout(ctx, c.cfg.Tunnel.WriteTimeout)
	st, err := n.sess.Open(octx, protocol.KindExec, j.params)
	ocancel()
	if err != nil {
		if j.ctx.Err() != nil {
			res.Cancelled = true
			return fail("node %s: job %s was cancelled before it started there", n.id, j.id)
		}
		return fail("node %s: open exec stream: %v", n.id, err)
	}
	c.m.streamsOpened.WithLabelValues(protocol.KindExec.String()).Inc()
	defer st.Close()

	// On cancel, tell the agent to stop and give it CancelGrace to report.
	// AfterFunc runs no goroutine unless ctx ends; if it started, wait for it.
	var cancelSent atomic.Bool
	watchDone := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		defer close(watchDone)
		cancelSent.Store(true)
		st.SetWriteDeadline(time.Now().Add(c.cfg.Tunnel.WriteTimeout))
		if err := protocol.WriteFrame(st, protocol.FrameCancel, nil); err != nil {
			c.log.Debug("send cancel", "job_id", j.id, "node_id", n.id, "err", err)
		}
		st.SetReadDeadline(time.Now().Add(c.cfg.CancelGrace))
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

	fr := protocol.NewFrameReader(st)
	for {
		f, err := fr.Next()
		if err != nil {
			if cancelSent.Load() && isTimeout(err) {
				res.Cancelled = j.ctx.Err() != nil
				return fail("node %s: no exit status within %v of cancelling job %s", n.id, c.cfg.CancelGrace, j.id)
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fail("node %s: tunnel lost during exec: %v", n.id, err)
		}
		switch f.Type {
		case protocol.FrameStdout:
			res.StdoutBytes += int64(len(f.Payload))
			j.publish(n.id, protocol.ReplyStdout, f.Payload)
		case protocol.FrameStderr:
			res.StderrBytes += int64(len(f.Payload))
			j.publish(n.id, protocol.ReplyStderr, f.Payload)
		case protocol.FrameExit:
			var es protocol.ExitStatus
			if err := protocol.DecodeJSON(f.Payload, &es); err != nil {
				return fail("node %s: exit status: %v", n.id, err)
			}
			res.ExitCode = es.ExitCode
			res.Signal = es.Signal
			res.TimedOut = es.TimedOut
			res.Cancelled = es.Cancelled
			res.DurationMS = es.DurationMS
			res.StdoutBytes = es.StdoutBytes
			res.StderrBytes = es.StderrBytes
			res.StdoutTruncated = es.StdoutTruncated
			res.StderrTruncated = es.StderrTruncated
			return res
		case protocol.FrameError:
			var ei protocol.ErrorInfo
			if err := protocol.DecodeJSON(f.Payload, &ei); err != nil {
				return fail("node %s: error frame: %v", n.id, err)
			}
			res.ErrorCode = ei.Code
			return fail("node %s: %s", n.id, ei.Message)
		default:
			return fail("node %s: exec stream %d: unexpected %s frame: %v", n.id, st.StreamID(), f.Type, protocol.ErrUnexpected)
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

// publish sends one reply of the job with the next sequence number. Replies
// are published under pubMu, so their order on the wire is seq order.
func (j *job) publish(nodeID, typ string, data []byte) {
	j.pubMu.Lock()
	defer j.pubMu.Unlock()
	h := nats.Header{}
	h.Set(protocol.HeaderJob, j.id)
	h.Set(protocol.HeaderType, typ)
	if nodeID != "" {
		h.Set(protocol.HeaderNode, nodeID)
	}
	h.Set(protocol.HeaderSeq, strconv.FormatUint(j.seq, 10))
	j.seq++
	// PublishMsg copies data into the connection's buffer before returning,
	// so the caller may reuse it.
	if err := j.c.cfg.NATS.PublishMsg(&nats.Msg{Subject: j.reply, Header: h, Data: data}); err != nil && !j.pubFailed {
		j.pubFailed = true
		j.c.log.Warn("publish exec reply", "job_id", j.id, "type", typ, "err", err)
	}
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
