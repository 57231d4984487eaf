package coordinator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/protocol"
)

// The one-reply exec (protocol.SubjectExecOnce, issue 13).
//
// DESIGN: a request/reply client (`nats req`, any library's Request) takes
// the first reply of tether.v1.exec as its answer, and that is the first
// output chunk or a keepalive. The once endpoint runs the very same job
// and answers once: handleExecOnce hands the request to handleExec with
// its reply subject swapped for a private inbox of this coordinator (the
// caller's identity, headers and body kept, so that authorization, the
// run-as users, admission, the job record and forwarding to the node's
// coordinator are exec's own, not a copy), collects the streamed replies
// there, and answers the caller's reply subject with one ExecOnceResult.
// Whatever handleExec answers itself (a bad request, a refusal, a busy
// coordinator) goes to the caller unchanged, and ends the collection.
//
// Authorization comes first. handleExecOnce decides nothing on its own:
// its checks (the timeout cap) travel to handleExec in headerOnceBound and
// are made there after the caller's exec grant, so a caller who may not
// exec on the nodes hears 403, never what is wrong with a job it could not
// run anyway (handleExec's refuseInvalid does the same for a request that
// fails validation, as far as its target can be read).
//
// The bound is the whole job's. A request/reply client waits for one
// answer, so the answer must come within the bound however the job fans
// out: exec.once does not refuse a fan-out whose nodes × timeout /
// max_parallel could outlast it (most commands end long before their
// timeout, and the default timeout is the bound itself), it cancels the
// job when the bound is reached and answers with what ran: the finished
// nodes' results and output, the running ones killed and the unstarted
// ones never started, both Cancelled with ErrorCode
// protocol.ResultCodeExecOnceBound, and the reply's TimedOut set. The
// bound runs from the job's start on the coordinator that runs it (the
// node's, for a request forwarded there: headerOnceBound carries it).
//
// The collector never heartbeats the job (tether.v1.exec.alive): a job
// whose client never heartbeats is never cancelled for silence, as with
// the stock nats CLI on tether.v1.exec. Its goroutine is counted in jobWG
// and ends with the job's result, with a direct answer, or a bounded
// while after the coordinator began to shut down (the job's shutdown
// result normally comes first).

// onceShutdownWait bounds how long a once collection waits for its job's
// result after the coordinator began to shut down.
const onceShutdownWait = 15 * time.Second

// onceSlack is how long past the job's bound a once collection waits
// for the result (the kill, the final frame and the relay take a moment).
const onceSlack = 30 * time.Second

// headerOnceBound marks an exec request as exec.once's (handleExecOnce
// sets it, forwarding keeps it): its value is the whole job's bound, a
// Go duration ("5m0s") of at most protocol.ExecOnceMaxTimeout. handleExec
// then refuses (after authorizing) a timeout over it and cancels the job
// when it is reached. A client setting it on tether.v1.exec only bounds
// its own job; a value that does not parse, or is out of range, is
// ignored.
const headerOnceBound = "Tether-Exec-Once-Bound"

// onceBoundOf returns the bound headerOnceBound gives req, 0 for none.
func onceBoundOf(req micro.Request) time.Duration {
	v := req.Headers().Get(headerOnceBound)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > protocol.ExecOnceMaxTimeout {
		return 0
	}
	return d
}

// onceBound is this coordinator's exec.once bound: protocol.
// ExecOnceMaxTimeout (or a test's, export_test.go).
func (c *Coordinator) onceBound() time.Duration {
	if d := time.Duration(c.onceBoundForTest.Load()); d > 0 {
		return d
	}
	return protocol.ExecOnceMaxTimeout
}

// checkOnce refuses an exec.once job (bound > 0) whose timeout exceeds
// bound: 400 naming the streaming endpoint. handleExec calls it once the
// caller is authorized.
func checkOnce(r *protocol.ExecRequest, bound time.Duration) *protocol.APIError {
	if timeout := time.Duration(r.Timeout); bound > 0 && timeout > bound {
		return protocol.NewAPIError(400, protocol.ErrCodeInvalid,
			"timeout %v: %s answers jobs of at most %v; use %s, which streams, for longer ones", timeout, protocol.SubjectExecOnce, bound, protocol.SubjectExec)
	}
	return nil
}

// onceBoundError is the cancel cause of an exec.once job that reached its
// whole-job bound.
type onceBoundError struct{ bound time.Duration }

func (e *onceBoundError) Error() string {
	return fmt.Sprintf("%s's whole-job bound of %v was reached; job cancelled (use %s, which streams, for longer jobs)", protocol.SubjectExecOnce, e.bound, protocol.SubjectExec)
}

// redirected is a request whose replies go to an inbox of this
// coordinator (Reply), while what the handler answers itself (Respond,
// Error) goes to the caller as it would have, and is noted.
type redirected struct {
	micro.Request
	inbox    string
	answered func()
}

func (r *redirected) Reply() string { return r.inbox }

func (r *redirected) Respond(data []byte, opts ...micro.RespondOpt) error {
	r.answered()
	return r.Request.Respond(data, opts...)
}

func (r *redirected) RespondJSON(v any, opts ...micro.RespondOpt) error {
	r.answered()
	return r.Request.RespondJSON(v, opts...)
}

func (r *redirected) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	r.answered()
	return r.Request.Error(code, description, data, opts...)
}

// withBody is a request with its body replaced (the once endpoint's
// default timeout written into it) and its own headers: the request's,
// with headerOnceBound set (newWithBody). Headers returns that one map
// every time, so what handleExec changes in it (dropCoordinatorHeaders)
// is what it and forward read afterwards; a fresh copy per call let a
// client's forged coordinator headers through exec.once (review).
type withBody struct {
	micro.Request
	body   []byte
	header micro.Headers
}

// newWithBody wraps req with body and headerOnceBound set to bound.
func newWithBody(req micro.Request, body []byte, bound time.Duration) *withBody {
	h := micro.Headers{}
	for k, v := range req.Headers() {
		h[k] = slices.Clone(v)
	}
	nats.Header(h).Set(headerOnceBound, bound.String())
	return &withBody{Request: req, body: body, header: h}
}

func (r *withBody) Data() []byte { return r.body }

func (r *withBody) Headers() micro.Headers { return r.header }

// onceCollector gathers one job's streamed replies into an ExecOnceResult.
type onceCollector struct {
	mu      sync.Mutex
	outputs map[string]*protocol.ExecOnceNodeResult
	nodes   map[string]protocol.NodeResult // from node-result replies
	total   int
	clipped bool
	result  *protocol.ExecResult
	relay   *nats.Msg // an error reply to pass on as it is
	done    chan struct{}
	once    sync.Once
}

func (o *onceCollector) finish() { o.once.Do(func() { close(o.done) }) }

func (o *onceCollector) out(node string) *protocol.ExecOnceNodeResult {
	r := o.outputs[node]
	if r == nil {
		r = &protocol.ExecOnceNodeResult{NodeResult: protocol.NodeResult{Node: node}}
		o.outputs[node] = r
	}
	return r
}

// add takes one reply of the job (a NATS message handler: messages come
// one at a time, in order).
func (o *onceCollector) add(m *nats.Msg) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.result != nil || o.relay != nil {
		return
	}
	if m.Header.Get(micro.ErrorCodeHeader) != "" {
		o.relay = m
		o.finish()
		return
	}
	node := m.Header.Get(protocol.HeaderNode)
	switch m.Header.Get(protocol.HeaderType) {
	case protocol.ReplyStdout, protocol.ReplyStderr:
		r := o.out(node)
		buf, cut := &r.Stdout, &r.StdoutClipped
		if m.Header.Get(protocol.HeaderType) == protocol.ReplyStderr {
			buf, cut = &r.Stderr, &r.StderrClipped
		}
		room := min(protocol.ExecOnceStreamLimit-len(*buf), protocol.ExecOnceTotalLimit-o.total)
		data := m.Data
		if len(data) > room {
			data = data[:max(room, 0)]
			*cut, o.clipped = true, true
		}
		*buf += string(data)
		o.total += len(data)
	case protocol.ReplyNodeResult:
		var nr protocol.NodeResult
		if json.Unmarshal(m.Data, &nr) == nil {
			o.nodes[nr.Node] = nr
		}
	case protocol.ReplyResult:
		var res protocol.ExecResult
		if err := json.Unmarshal(m.Data, &res); err != nil {
			res = protocol.ExecResult{ID: m.Header.Get(protocol.HeaderJob)}
		}
		o.result = &res
		o.finish()
	}
}

// answer builds the one reply from what was collected. o.result is set.
func (o *onceCollector) answer() *protocol.ExecOnceResult {
	o.mu.Lock()
	defer o.mu.Unlock()
	res := o.result
	results := res.Results
	if res.ResultsOmitted || len(results) == 0 {
		// The final reply left them out (too large): the node-result
		// replies carry them.
		results = results[:0]
		for _, nr := range o.nodes {
			results = append(results, nr)
		}
	}
	once := &protocol.ExecOnceResult{ID: res.ID, Nodes: res.Nodes, Succeeded: res.Succeeded, Failed: res.Failed, Truncated: res.Truncated, Clipped: o.clipped}
	for _, nr := range results {
		r := o.out(nr.Node)
		r.NodeResult = nr
		once.Results = append(once.Results, *r)
		once.TimedOut = once.TimedOut || nr.ErrorCode == protocol.ResultCodeExecOnceBound
	}
	sort.Slice(once.Results, func(i, j int) bool { return once.Results[i].Node < once.Results[j].Node })
	return once
}

// handleExecOnce serves protocol.SubjectExecOnce (see the DESIGN note
// above). The request was identified by guardHandler: req is a
// *caller.Request. A request that does not decode goes to handleExec as it
// came, which authorizes what it can of it before it answers 400; one that
// does runs as exec with headerOnceBound, its timeout defaulting to the
// bound.
func (c *Coordinator) handleExecOnce(req micro.Request) {
	if req.Reply() == "" {
		c.log.Debug("exec.once request without a reply subject ignored")
		return
	}
	// As handleExec does, before the request is wrapped: a client may not
	// set the headers only coordinators set.
	dropCoordinatorHeaders(req)
	cr, ok := req.(*caller.Request)
	if !ok { // cannot happen: every endpoint is guarded
		c.replyError(req, protocol.NewAPIError(500, protocol.ErrCodeInternal, "exec.once: request not identified"))
		return
	}
	r, apiErr := protocol.DecodeExecRequest(req.Data())
	if apiErr != nil {
		// Nothing runs: handleExec answers the caller (403 before 400
		// where the target says which nodes to authorize on).
		c.handleExec(req)
		return
	}
	bound := c.onceBound()
	if r.Timeout == 0 {
		r.Timeout = protocol.Duration(bound)
	}
	body, err := json.Marshal(r)
	if err != nil { // cannot happen: plain data
		c.replyError(req, protocol.NewAPIError(500, protocol.ErrCodeInternal, "exec.once: encode request: %v", err))
		return
	}
	life, ok := c.enter(&c.jobWG)
	if !ok {
		c.replyError(req, c.unavailable())
		return
	}
	col := &onceCollector{outputs: map[string]*protocol.ExecOnceNodeResult{}, nodes: map[string]protocol.NodeResult{}, done: make(chan struct{})}
	inbox := c.cfg.NATS.NewInbox()
	sub, err := c.cfg.NATS.Subscribe(inbox, col.add)
	if err != nil {
		c.jobWG.Done()
		c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "exec.once: subscribe for the job's replies: %v", err))
		return
	}
	// Output can come faster than a slow moment of this coordinator
	// drains it: the default pending limits would drop messages.
	sub.SetPendingLimits(-1, -1)

	// The job as exec runs it, for the same caller, its replies to inbox.
	inner := &caller.Request{
		Request:  &redirected{Request: newWithBody(cr.Request, body, bound), inbox: inbox, answered: col.finish},
		Identity: cr.Identity,
	}
	c.handleExec(inner)

	go func() {
		defer c.jobWG.Done()
		defer sub.Unsubscribe()
		// The job is cancelled at bound (handleExec); its result comes
		// within the cancel's grace after that.
		wait := time.NewTimer(bound + c.cfg.CancelGrace + onceSlack)
		defer wait.Stop()
		lifeDone := life.Done()
		var drain <-chan time.Time
		for {
			select {
			case <-col.done:
				c.answerOnce(req, col)
				return
			case <-lifeDone:
				lifeDone = nil
				t := time.NewTimer(onceShutdownWait)
				defer t.Stop()
				drain = t.C
			case <-drain:
				c.replyError(req, c.unavailable())
				return
			case <-wait.C:
				c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable,
					"exec.once: no result within %v of the job's start (its bound %v passed; the job was cancelled then); see tether job status", bound+c.cfg.CancelGrace+onceSlack, bound))
				return
			}
		}
	}()
}

// answerOnce sends the caller the collection's outcome: nothing when the
// handler answered it directly, the relayed error, or the one result.
func (c *Coordinator) answerOnce(req micro.Request, col *onceCollector) {
	col.mu.Lock()
	relay, res := col.relay, col.result
	col.mu.Unlock()
	switch {
	case relay != nil:
		code, desc := relay.Header.Get(micro.ErrorCodeHeader), relay.Header.Get(micro.ErrorHeader)
		if err := req.Error(code, desc, relay.Data); err != nil {
			c.log.Warn("send exec.once error reply", "err", err)
		}
	case res != nil:
		once := col.answer()
		// Without HTML escaping: people read this reply (nats req), and
		// a command's "2>&1" should read as written.
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(once); err == nil {
			if mp := int(c.cfg.NATS.MaxPayload()); mp <= 0 || b.Len()+replyHeaderRoom <= mp {
				if err := req.Respond(bytes.TrimSuffix(b.Bytes(), []byte("\n"))); err != nil {
					c.log.Warn("send exec.once reply", "err", err)
				}
				return
			}
		}
		// Too large (or unencodable): replyJSON answers 413 saying so.
		c.replyJSON(req, once, fmt.Sprintf("%d nodes' results and output", len(once.Results)),
			"ask "+protocol.SubjectExec+", which streams")
	}
	// Else handleExec answered the caller itself (a refusal, a bad
	// request): nothing more to say.
}
