package coordinator

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// relayKinds are the stream kinds a client may open through SubjectStream.
// Every one of them but dial and ssh (rawKind) frames its bytes with protocol frames, accepts
// FrameCancel from the coordinator's side, which the relay relies on to
// abort (see relay.finishWrite), and takes a FrameError on the agent's
// side at any frame boundary as the end of the operation, which the relay
// relies on to report its own shutdown (relay.shutdown); a dial or ssh
// stream carries raw bytes after the agent's first frame, so an aborted
// one only closes.
var relayKinds = map[string]protocol.Kind{
	protocol.KindExec.String(): protocol.KindExec,
	protocol.KindCopy.String(): protocol.KindCopy,
	protocol.KindPTY.String():  protocol.KindPTY,
	protocol.KindDial.String(): protocol.KindDial,
	protocol.KindSSH.String():  protocol.KindSSH,
}

// rawKind reports whether a relayed stream of kind k carries raw bytes
// after the agent's first frame (dial, ssh): the relay never injects a
// frame into it.
func rawKind(k protocol.Kind) bool { return k == protocol.KindDial || k == protocol.KindSSH }

// handleStream validates a stream request and starts its relay. Everything
// that makes the request invalid is answered here with a micro error, the
// params included (protocol.StreamParamsAPIError: the agent's own checks of
// the kind's params, 400 invalid_request or 413 too_large); the
// tunnel stream is opened by the relay goroutine, which answers with the
// pipe's open message (or an error) once it knows.
func (c *Coordinator) handleStream(req micro.Request) {
	if req.Reply() == "" {
		c.log.Debug("stream request without a reply subject ignored")
		return
	}
	var r protocol.StreamRequest
	if e := protocol.DecodeRequest(req.Data(), &r); e != nil {
		c.replyError(req, e)
		return
	}
	kind, ok := relayKinds[r.Kind]
	if !ok {
		c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "kind %q: want exec, copy, pty, dial or ssh", r.Kind))
		return
	}
	if err := protocol.ValidNodeID(r.Node); err != nil {
		c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "node: %v", err))
		return
	}
	if kind == protocol.KindSSH {
		// ssh-proxy gets the host name as OpenSSH lowercased it.
		r.Node = c.sshCanonical(r.Node)
	}
	if c.forwardForNode(req, r.Node, "stream") {
		return
	}
	params := bytes.TrimSpace(r.Params)
	switch {
	case kind == protocol.KindSSH:
		// The coordinator writes an ssh stream's params (sshStreamParams).
		if len(params) > 0 && !bytes.Equal(params, []byte("null")) {
			if e := protocol.DecodeRequest(params, &struct{}{}); e != nil {
				c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "params: an ssh stream takes none (want {} or nothing; the coordinator writes them from your identity and the policy): %s", e.Message))
				return
			}
		}
	case len(params) > protocol.MaxHeaderSize:
		// The bytes as they came are what the header would carry.
		c.replyError(req, protocol.NewAPIError(413, protocol.ErrCodeTooLarge, "%v", protocol.HeaderSizeError("params", len(params))))
		return
	case len(params) == 0 || params[0] != '{':
		c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "params: want the %s stream's params as a JSON object", kind))
		return
	}
	// The agent's own checks, on the request: what the agent would refuse
	// gets its 400 (or 413) here, and never opens a stream. The bytes are
	// passed on as they came, but for an exec's default timeout.
	if kind != protocol.KindSSH {
		if e := protocol.StreamParamsAPIError(kind, params); e != nil {
			c.replyError(req, e)
			return
		}
	}
	if kind == protocol.KindExec {
		// Measured as the job path measures them (ExecRequest.Validate):
		// without a timeout of their own they must leave room for the
		// default one added here, or they would run without it.
		if e := execHeaderSizeError(params); e != nil {
			c.replyError(req, e)
			return
		}
		params = withDefaultTimeout(params, c.Limits().DefaultTimeout)
	}
	if err := protocol.ValidPipeInbox(req.Reply()); err != nil && !r.Direct {
		c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "reply subject: %v", err))
		return
	}
	// The guard identified the sender from the header the server stamped;
	// the pipe admits only that user's messages (relay.fromOpener).
	acc, user, err := natsauth.RequestUser(nats.Header(req.Headers()))
	if err != nil {
		c.replyError(req, protocol.NewAPIError(401, protocol.ErrCodeUnauthenticated, "coordinator %s: stream: the NATS server did not stamp the sender: %v", c.cfg.ID, err))
		return
	}

	c.mu.Lock()
	n, ok := c.nodes[r.Node]
	c.mu.Unlock()
	if !ok {
		c.replyError(req, c.notConnected(r.Node))
		return
	}
	var (
		op   policy.Operation
		e    *protocol.APIError
		sshp *protocol.SSHParams
	)
	if kind == protocol.KindSSH {
		op = policy.OpSSH
		if sshp, e = c.sshStreamParams(req, n); e == nil {
			params, err = protocol.MarshalJSON(sshp)
			if err != nil {
				e = protocol.NewAPIError(500, protocol.ErrCodeInternal, "node %s: encode ssh params: %v", n.id, err)
			}
		}
	} else {
		params, op, e = c.authorizeStream(req, kind, n, params)
	}
	if e != nil {
		c.replyError(req, e)
		return
	}
	if r.Direct {
		// Authorized as a relay would be; the data goes over this
		// coordinator's own listener (direct.go).
		c.issueTicket(req, &directGrant{
			n: n, kind: kind, params: json.RawMessage(params), ssh: sshp, op: op,
			openerAccount: acc, openerUser: user,
		})
		return
	}
	// A relayed stream is one of the caller's running jobs.
	release, e := c.authorizer().Acquire(req, op)
	if e != nil {
		c.replyError(req, e)
		return
	}
	c.mu.Lock()
	if c.closing || c.life == nil {
		c.mu.Unlock()
		release()
		c.replyError(req, c.unavailable())
		return
	}
	rel := &relay{
		release: release,
		c:       c,
		req:     req,
		n:       n,
		kind:    kind,
		params:  json.RawMessage(params),
		ssh:     sshp,
		log:     c.log.With("node_id", n.id, "kind", kind.String()),

		openerAccount: acc,
		openerUser:    user,
		aborted:       make(chan struct{}),
		stopping:      make(chan struct{}),
	}
	if id, ok := caller.Of(req); ok {
		rel.log = rel.log.With("caller", id.String())
	}
	rel.ctx, rel.cancel = context.WithCancel(c.life)
	c.relays.add(rel)
	c.mu.Unlock()

	go rel.run()
}

// clientEnd is the client's side of a relay: a NATS pipe
// (*natspipe.Pipe), or a data stream on the direct path (*directEnd). Its
// methods have the pipe's meaning: WriteTo copies the client's bytes until
// its EOF (nil) or a failure; PeerReset is closed once the client cancelled
// its direction (Stream.Cancel), after which WriteTo fails; Done is closed
// once the end failed or was closed, Err saying why (nil after a clean
// end); CloseWrite sends the client EOF; CloseWithError aborts, telling
// the client reason.
type clientEnd interface {
	io.Writer
	WriteTo(w io.Writer) (int64, error)
	CloseWrite() error
	CloseWithError(reason error) error
	Close() error
	Err() error
	Done() <-chan struct{}
	PeerReset() <-chan struct{}
}

var (
	_ clientEnd = (*natspipe.Pipe)(nil)
	_ clientEnd = (*directEnd)(nil)
)

// relaySet tracks the running relays so the drain can abort and wait for
// them. Its zero value is ready. mu is a leaf lock (taken under
// Coordinator.mu by handleStream, never the other way round).
type relaySet struct {
	mu sync.Mutex
	m  map[*relay]struct{}
	wg sync.WaitGroup
}

func (s *relaySet) add(r *relay) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[*relay]struct{}{}
	}
	s.m[r] = struct{}{}
	s.wg.Add(1)
}

func (s *relaySet) done(r *relay) {
	s.mu.Lock()
	delete(s.m, r)
	s.mu.Unlock()
	s.wg.Done()
}

// shutdownAll ends every running relay because the coordinator is
// shutting down (relay.shutdown).
func (s *relaySet) shutdownAll() {
	for _, r := range s.list() {
		r.shutdown()
	}
}

// list returns the running relays.
func (s *relaySet) list() []*relay {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := make([]*relay, 0, len(s.m))
	for r := range s.m {
		rs = append(rs, r)
	}
	return rs
}

// wait blocks until every relay returned.
func (s *relaySet) wait() { s.wg.Wait() }

// relay is one SubjectStream request: a tunnel stream to a node and a NATS
// pipe to the client, with bytes copied both ways. Its goroutine (run)
// copies pipe→stream itself and starts two more: one for stream→pipe, one
// that watches the pipe (watch) for the client's reset or failure while the
// copies may be blocked elsewhere.
type relay struct {
	c       *Coordinator
	release func() // the caller's job slot (policy limits), released when run returns
	req     micro.Request
	n       *node
	kind    protocol.Kind
	params  json.RawMessage
	ssh     *protocol.SSHParams // an ssh stream's params (their encoding is params)
	// direct, for a stream on the direct data path (direct.go), is the
	// client's data stream; nil on the NATS path (the pipe).
	direct *directEnd
	log    *slog.Logger
	ctx    context.Context // bounds the stream open; cancelled by abort
	cancel context.CancelFunc
	// openerAccount and openerUser are the account and user public key
	// the NATS server stamped on the stream request: the pipe admits only
	// their messages.
	openerAccount, openerUser string
	admitted                  atomic.Pointer[string] // the last header value fromOpener admitted

	abortOnce sync.Once
	aborted   chan struct{} // closed by abort, after the pipe was closed
	// revoked is why RecheckCallers aborted a stream whose caller lost
	// the right to it (audited with reason revoked).
	revoked atomic.Pointer[string]

	// agentEOF is set when the agent closed its side of the stream: its
	// operation is over, and there is nothing left to cancel.
	agentEOF   atomic.Bool
	cancelOnce sync.Once // the out-of-band cancel (cancelAgent)

	// stopping is closed by shutdown: streamToPipe then ends what the
	// client reads with stopInfo, at a frame boundary.
	stopping chan struct{}
	stopOnce sync.Once
	stopInfo *protocol.ErrorInfo // set before stopping is closed
	stopAt   *time.Timer         // shutdown's abort once CancelGrace passed

	// mu guards st and pipe, set once both are open, and writesDone.
	mu   sync.Mutex
	st   *yamux.Stream
	pipe clientEnd
	// writesDone is set when pipeToStream stopped copying the client's
	// bytes; watch no longer cuts its writes short then.
	writesDone bool

	// For the audit event (recordAudit, after both copies returned): the
	// bytes relayed each way, how the relay ended (the pipe's error, or a
	// contained panic), and the agent's last exit or error frame.
	bytesIn, bytesOut atomic.Int64
	endErr            error
	// copyDone and copySkips are what a copy's cursors (frameCursor.copy)
	// saw, in either direction: the receiver's FrameCopyDone, and the
	// sender's FrameCopySkip frames.
	copyDone  atomic.Bool
	copySkips atomic.Int64
	exit      *protocol.ExitStatus
	agentErr  *protocol.ErrorInfo
	// rawOpen: a raw stream's first frame (the agent's dial-ok, or its
	// error: agentErr) reached the client.
	rawOpen atomic.Bool
}

// run opens the tunnel stream and the pipe, relays until both directions
// ended or either side failed, and releases everything.
func (r *relay) run() {
	c := r.c
	defer c.relays.done(r)
	defer r.recordAudit()
	defer r.release()
	defer r.cancel()
	defer func() {
		r.mu.Lock()
		if r.stopAt != nil {
			r.stopAt.Stop()
		}
		r.mu.Unlock()
	}()
	var wg sync.WaitGroup
	defer wg.Wait() // after a contained panic too: the copier below
	defer c.guard.Recover("stream relay", r.panicked)

	if r.ssh != nil {
		// The agent's channel events of this connection are audited under
		// the caller's identity (ssh.go).
		rec := &sshSession{node: r.n.id, start: time.Now(), source: natsauth.RequestHost(nats.Header(r.req.Headers()))}
		if id, ok := caller.Of(r.req); ok {
			rec.identity, rec.key, rec.account = id.String(), id.Key, id.Account
		}
		if err := c.ssh.add(r.ssh.Session, rec); err != nil {
			r.refuse(protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "node %s: %v", r.n.id, err))
			return
		}
		defer c.ssh.end(r.ssh.Session, c.cfg.SSH.SessionGrace)
	}
	// A reload that applied a new policy (or revocations) after this
	// stream's decision and rechecked (RecheckCallers) before it was in
	// c.relays did not see it: decide it again here.
	if why := c.streamRevoked(r); why != "" {
		r.refuse(protocol.NewAPIError(403, protocol.ErrCodeForbidden, "%s", why))
		return
	}
	octx, ocancel := context.WithTimeout(r.ctx, c.cfg.Tunnel.WriteTimeout)
	st, err := r.n.sess.Open(octx, r.kind, r.params)
	ocancel()
	if err != nil {
		if r.ctx.Err() != nil {
			r.refuse(c.unavailable())
			return
		}
		r.refuse(protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "node %s: open %s stream: %v", r.n.id, r.kind, err))
		return
	}
	st.SetWriteDeadline(time.Time{})
	c.m.streamsOpened.WithLabelValues(r.kind.String()).Inc()

	var (
		p    clientEnd
		name string // the client's end, for the log
	)
	if r.direct != nil {
		// The client's data stream on this coordinator's listener
		// (direct.go): open once the answer reached it.
		if err := r.direct.open(); err != nil {
			st.Close()
			r.endErr = err
			r.direct.Close()
			r.log.Debug("direct stream: the open answer was not delivered", "err", err)
			return
		}
		p, name = r.direct, r.direct.name()
	} else {
		np, err := r.openPipe()
		if err != nil {
			st.Close()
			r.refuse(protocol.NewAPIError(500, protocol.ErrCodeInternal, "node %s: %v", r.n.id, err))
			return
		}
		p, name = np, np.LocalInbox()
	}
	if f := c.clientEndForTest.Load(); f != nil {
		p = (*f)(p)
	}
	log := r.log.With("stream_id", st.StreamID(), "pipe", name)
	log.Debug("relay started")
	r.mu.Lock()
	r.st, r.pipe = st, p
	r.mu.Unlock()
	select {
	case <-r.aborted: // the drain came first: do what abort could not
		r.abortIO(st, p, c.unavailable())
	default:
	}
	r.relayBytes(st, p, &wg)
	p.Close() // after both eofs this only tells the client we are gone
	st.Close()
	if err := p.Err(); err != nil {
		r.endErr = err
		if r.exit != nil || r.agentErr != nil || r.copyDone.Load() {
			// The operation's end was relayed (what the audit records);
			// a client closes its end after reading it.
			log.Debug("relay finished; the client closed its end after the operation's end", "err", err)
		} else if r.clientEnded() {
			log.Debug("relay finished; the client closed its end of the raw stream", "err", err)
		} else {
			log.Info("relay aborted", "err", err)
		}
	} else {
		log.Debug("relay finished")
	}
}

// clientEnded reports whether a raw stream (dial, ssh) that the agent
// opened (its dial-ok) ended because the client closed its end: that is
// how such a stream normally ends (ssh exits, then tether ssh-proxy closes
// the stream or its process ends; tether forward's connection closed), so
// it is audited ok. The client's end is its close without a reason (the
// NATS pipe's close, the direct path's FrameDirectClose) or the end of its
// direct session, unless that session went silent. Any failure that came
// first (the tunnel lost, a shutdown, RecheckCallers' revoke) is endErr
// instead, as the pipe keeps the first error.
func (r *relay) clientEnded() bool {
	err := r.endErr
	if !rawKind(r.kind) || !r.rawOpen.Load() || r.agentErr != nil || err == nil || r.revoked.Load() != nil {
		return false
	}
	var pe *natspipe.Error
	var gone directGone
	switch {
	case errors.As(err, &pe) && errors.Is(pe.Kind, natspipe.ErrPeerClosed):
		return pe.Reason == ""
	case errors.Is(err, errClientClosed):
		return true
	case errors.As(err, &gone):
		return !errors.Is(err, tunnel.ErrPeerSilent)
	}
	return false
}

// openPipe opens the relay's NATS pipe to the client, which answers the
// stream request.
func (r *relay) openPipe() (*natspipe.Pipe, error) {
	c := r.c
	pcfg := c.cfg.Pipe
	if pcfg.Logger == nil {
		pcfg.Logger = c.log
	}
	// The client can publish only to exported subjects, so this end
	// receives on a pipe subject (natsauth.PipeSubject) with an id nobody
	// can guess, and admits only what the pipe's opener published there:
	// anyone may publish to an exported subject, and the server stamps
	// each message with its sender.
	local, err := natsauth.PipeSubject(c.pipeToken, natsauth.NewPipeID())
	if err != nil {
		return nil, err
	}
	return natspipe.AcceptOn(c.cfg.NATS, local, r.req.Reply(), r.fromOpener, pcfg)
}

// relayBytes copies both ways between the tunnel stream st and the
// client's end p until both directions ended or either side failed (see
// relay).
func (r *relay) relayBytes(st *yamux.Stream, p clientEnd, wg *sync.WaitGroup) {
	c := r.c
	copied := make(chan struct{})  // streamToPipe returned
	written := make(chan struct{}) // pipeToStream returned
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(copied)
		defer c.guard.Recover("stream relay copier", func(e *panics.Error) { r.abort(c.internalError(e)) })
		r.streamToPipe(st, p)
	}()
	go func() {
		defer wg.Done()
		defer c.guard.Recover("stream relay watch", func(e *panics.Error) { r.abort(c.internalError(e)) })
		r.watch(st, p, copied, written)
	}()
	func() {
		defer close(written)
		r.pipeToStream(st, p)
	}()
	wg.Wait()
}

// refuse answers a stream that could not open with e: the request's error
// reply on the NATS path, the data stream's answer on the direct one.
func (r *relay) refuse(e *protocol.APIError) {
	if r.direct != nil {
		r.direct.refuse(e)
		return
	}
	r.c.replyError(r.req, e)
}

// subjectToken turns id into one NATS subject token of at most 64 bytes of
// letters, digits, '-' and '_' (natsauth.PipeSubject's rule): every other
// byte becomes '_'. Host names, the default ids, have dots.
func subjectToken(id string) string {
	b := []byte(id)
	if len(b) > 64 {
		b = b[:64]
	}
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "coordinator"
	}
	return string(b)
}

// fromOpener admits a pipe message published by the user who opened the
// relay, as the NATS server stamped it (natsauth.RequestUser); everything
// else published to the pipe's subject is dropped.
func (r *relay) fromOpener(m *nats.Msg) bool {
	// The server writes the header; a value seen on an admitted message
	// names the same sender again (it changes when the connection's RTT
	// does), so only new values are parsed.
	vals := m.Header[server.ClientInfoHdr]
	if len(vals) == 1 {
		if p := r.admitted.Load(); p != nil && *p == vals[0] {
			return true
		}
	}
	acc, user, err := natsauth.RequestUser(m.Header)
	if err == nil && acc == r.openerAccount && user == r.openerUser {
		r.admitted.Store(&vals[0])
		return true
	}
	// Anyone may publish here: rate-limited, like what unauthenticated
	// peers can cause.
	r.c.preauth.Debug("pipe message from another sender dropped", "node_id", r.n.id, "opener", r.openerUser, "sender", user, "err", err)
	return false
}

// pipeToStream copies the client's bytes to the node. At the client's eof
// it half-closes the stream (the agent reads io.EOF). When the client reset
// its direction (a cancel: natspipe.ResetWrite) it tells the agent in band
// too if it can (cancelInBand) and half-closes, and the agent's answer
// goes on to the client. On any failure it aborts the relay and tells the
// agent (finishWrite).
func (r *relay) pipeToStream(st *yamux.Stream, p clientEnd) {
	// A dial or ssh stream's client bytes are raw from the first: they
	// are counted, never parsed (the relay injects no frame into them).
	fw := &frameCursor{w: st, copy: r.kind == protocol.KindCopy, raw: rawKind(r.kind)}
	defer func() { r.bytesIn.Store(fw.n); r.noteCopy(fw, false) }()
	_, err := p.WriteTo(fw)
	r.mu.Lock()
	r.writesDone = true // from here on the deadlines of st's writes are ours
	r.mu.Unlock()
	if err == nil {
		if err := st.Close(); err != nil {
			r.abort(r.lost(err))
		}
		return
	}
	select {
	case <-p.PeerReset():
		select {
		case <-r.aborted:
		default:
			r.cancelInBand(st, fw)
			return
		}
	default:
	}
	select {
	case <-r.aborted:
	default:
		if fw.err != nil {
			r.abort(r.lost(fw.err))
		} else {
			r.abort(err) // the client closed, went silent or broke the pipe
		}
	}
	r.finishWrite(st, fw)
}

// watch follows the pipe while the copies run, since either may be blocked
// where the pipe cannot wake it: pipeToStream writing the client's bytes
// to a node that does not read them, streamToPipe waiting for a node that
// has nothing to say. When the client reset its direction (its cancel) it
// cuts pipeToStream's write short and cancels the agent's operation out of
// band; when the pipe fails or is closed (the client vanished or aborted,
// the drain) it aborts the relay and cancels the operation too. It returns
// when both copies returned (copied, written), or after an abort.
func (r *relay) watch(st *yamux.Stream, p clientEnd, copied, written <-chan struct{}) {
	reset := p.PeerReset()
	for copied != nil || written != nil {
		select {
		case <-p.Done():
			err := p.Err()
			if err == nil {
				err = natspipe.ErrClosed
			}
			r.abort(err)
			r.cancelAgent(st)
			return
		case <-reset:
			reset = nil
			r.mu.Lock()
			if !r.writesDone {
				st.SetWriteDeadline(time.Now())
			}
			r.mu.Unlock()
			r.cancelAgent(st)
		case <-copied:
			copied = nil
		case <-written:
			written = nil
		}
	}
}

// cancelAgent tells the agent, once, on the session's control stream, to
// stop the operation of st (FrameCancelStream): a cancel that no stdin
// queued in st can hold up. Nothing is sent for a dial (closing it is its
// cancel), when the operation is over (the agent closed st), the session
// is gone or the agent does not take such cancels (it then has only the
// in-band FrameCancel). It blocks for at most the tunnel's write timeout.
func (r *relay) cancelAgent(st *yamux.Stream) {
	r.cancelOnce.Do(func() {
		if rawKind(r.kind) || r.agentEOF.Load() || r.n.sess.IsClosed() {
			return
		}
		sent, err := r.n.ctl.cancelStream(st.StreamID())
		switch {
		case err != nil:
			r.log.Warn("out-of-band cancel not sent", "stream_id", st.StreamID(), "err", err)
		case sent:
			r.log.Debug("out-of-band cancel sent", "stream_id", st.StreamID())
		default:
			r.log.Debug("agent takes no out-of-band cancel; in band only", "stream_id", st.StreamID())
		}
	})
}

// cancelInBand ends the write side of a relay whose client reset its
// direction: FrameCancel when the client's bytes stopped at a frame
// boundary (for an agent without the out-of-band cancel, or whose cancel
// is not stuck), then a half-close. The write may wait up to the tunnel's
// write timeout behind what the agent has not read; the agent's answer
// keeps flowing to the client meanwhile (streamToPipe).
func (r *relay) cancelInBand(st *yamux.Stream, fw *frameCursor) {
	if !rawKind(r.kind) && fw.atBoundary() {
		st.SetWriteDeadline(time.Now().Add(r.c.cfg.Tunnel.WriteTimeout))
		if err := protocol.WriteFrame(st, protocol.FrameCancel, nil); err != nil {
			r.log.Debug("send cancel after the client's reset", "err", err)
		}
	}
	if err := st.Close(); err != nil {
		r.abort(r.lost(err))
	}
}

// finishWrite ends the aborted relay's write side. The coordinator does not
// interpret the kinds' frames, but it follows their framing (frameCursor):
// at a frame boundary it writes FrameCancel, which every relayed kind
// accepts as "stop now", then closes the stream. If the client's bytes
// stopped mid-frame it only closes: the agent then reads a truncated frame,
// an error, which the handlers also treat as a cancel. (yamux has no
// stream reset, and a bare close reads as a clean EOF, i.e. a half-close.)
func (r *relay) finishWrite(st *yamux.Stream, fw *frameCursor) {
	if !rawKind(r.kind) && fw.err == nil && fw.atBoundary() {
		st.SetWriteDeadline(time.Now().Add(r.c.cfg.Tunnel.WriteTimeout))
		if err := protocol.WriteFrame(st, protocol.FrameCancel, nil); err != nil {
			r.log.Debug("send cancel on abort", "err", err)
		}
	}
	st.Close()
}

// noteCopy adds what a copy's cursor saw (of the agent's frames when
// fromAgent, else of the client's) to the relay's audit: the receiver's
// FrameCopyDone and the sender's FrameCopySkip frames count, so neither
// side can mark the other's outcome (a pushing client cannot send the
// copy-done only the agent may).
func (r *relay) noteCopy(f *frameCursor, fromAgent bool) {
	if !f.copy {
		return
	}
	agentReceives := relayOp(r.kind, r.params) == policy.OpCopyWrite.String()
	if fromAgent == agentReceives {
		if f.copyDone {
			r.copyDone.Store(true)
		}
	} else {
		r.copySkips.Add(int64(f.skips))
	}
}

// streamToPipe copies the node's bytes to the client. At the stream's EOF
// it half-closes the pipe (the client reads io.EOF) unless the EOF came
// from the session dying; on failure it aborts the relay and then drains
// what the agent still sends, for at most CancelGrace. Once shutdown asked
// the relay to stop, it finishes the frame under way (for at most
// CancelGrace) and ends the client's side there (endShutdown).
func (r *relay) streamToPipe(st *yamux.Stream, p clientEnd) {
	buf := make([]byte, protocol.DefaultPipeMessage)
	// A dial or ssh stream's first frame (dial-ok, or the agent's error)
	// is kept too; what follows it is raw bytes, not frames.
	out := &frameCursor{w: p, keep: true, rawAfterFirst: rawKind(r.kind), copy: r.kind == protocol.KindCopy}
	defer func() {
		r.bytesOut.Store(out.n)
		r.exit, r.agentErr = out.ends()
		r.noteCopy(out, true)
		r.rawOpen.Store(out.rawAfterFirst && out.frames > 0)
	}()
	var graceEnd time.Time // set once the stop found a frame under way
loop:
	for {
		b := buf
		if r.isStopping() {
			if out.atBoundary() {
				r.endShutdown(st, p, out)
				break
			}
			if graceEnd.IsZero() {
				graceEnd = time.Now().Add(r.c.cfg.CancelGrace)
				st.SetReadDeadline(graceEnd)
			}
			// Read no further than the end of this frame.
			if n := out.toBoundary(); n < len(b) {
				b = b[:n]
			}
		}
		n, err := st.Read(b)
		// A stop may come while Read waits: its wake-up then finds what
		// the agent sent meanwhile and returns it all, frames after the
		// one under way included. Once stopping, only the rest of that
		// frame is passed on; the bytes after it are dropped, as all the
		// agent sends after the stop is (CI of c238134: a frame written
		// after the stop reached the client, 2 in 100 runs under load).
		data := b[:n]
		stopping := r.isStopping()
		for len(data) > 0 {
			k := len(data)
			if stopping {
				if out.atBoundary() {
					break
				}
				k = min(k, out.toBoundary())
			}
			if _, werr := out.Write(data[:k]); werr != nil {
				r.abort(werr)
				break loop
			}
			data = data[k:]
		}
		if err == io.EOF {
			select {
			case <-r.n.sess.Done():
				// yamux reports a dead session as EOF on its streams.
				r.abort(r.lost(errors.New("session closed")))
			default:
				r.agentEOF.Store(true)
				if err := p.CloseWrite(); err != nil {
					r.abort(err)
				}
				return
			}
			break
		}
		if err != nil {
			if !errors.Is(err, yamux.ErrTimeout) {
				r.abort(r.lost(err))
				break
			}
			// Only abort and shutdown set read deadlines on st.
			select {
			case <-r.aborted:
				break loop
			case <-r.stopping:
			}
			switch {
			case graceEnd.IsZero():
				// shutdown's wake-up
			case time.Now().Before(graceEnd):
				st.SetReadDeadline(graceEnd) // a late wake-up
			default:
				r.log.Debug("shutting down: no frame boundary within the cancel grace", "cancel_grace", r.c.cfg.CancelGrace)
				r.abort(r.shutdownReason())
				break loop
			}
		}
	}
	// Aborted or stopped: let the agent finish its final frames without
	// filling the stream's receive window, until it closes or CancelGrace
	// passes.
	io.Copy(io.Discard, st)
}

// isStopping reports whether shutdown asked the relay to stop.
func (r *relay) isStopping() bool {
	select {
	case <-r.stopping:
		return true
	default:
		return false
	}
}

// shutdownReason is the reason a relay ended by shutdown gives when it
// closes the pipe (the client did not end it first, or a dial).
func (r *relay) shutdownReason() error {
	return fmt.Errorf("coordinator %s is shutting down", r.c.cfg.ID)
}

// shutdown ends a relay because the coordinator is shutting down (the
// drain timed out). A framed stream (every kind but dial) that is open
// ends as an operation the coordinator cancelled: the client reads a
// FrameError {"code": "shutdown"} (protocol.ResultCodeShutdown; an exec's
// message is the job path's, "coordinator ID is shutting down; job
// cancelled") at the next boundary of the frames the agent sends, then
// EOF; the agent is told to cancel (out of band, then in band once the
// client closed); and the relay is aborted when the client closed its end,
// or CancelGrace after the stop at the latest. A dial stream, or one not
// yet open, is aborted at once (the client reads the reason as the pipe's
// error). It does not block.
func (r *relay) shutdown() {
	r.mu.Lock()
	st := r.st
	r.mu.Unlock()
	if st == nil || rawKind(r.kind) || r.agentEOF.Load() {
		r.abort(r.shutdownReason())
		return
	}
	r.stopOnce.Do(func() {
		msg := fmt.Sprintf("coordinator %s is shutting down; %s stream cancelled", r.c.cfg.ID, r.kind)
		if r.kind == protocol.KindExec {
			msg = r.c.shutdownCause().Error()
		}
		r.stopInfo = &protocol.ErrorInfo{Code: protocol.ResultCodeShutdown, Message: msg}
		r.mu.Lock()
		r.stopAt = time.AfterFunc(r.c.cfg.CancelGrace, func() { r.abort(r.shutdownReason()) })
		r.mu.Unlock()
		close(r.stopping)
		st.SetReadDeadline(time.Now()) // wakes streamToPipe
		r.log.Debug("shutting down: ending the stream at the next frame boundary", "stream_id", st.StreamID())
	})
}

// endShutdown ends the client's side of a stopped relay at a frame
// boundary: the shutdown's FrameError, then EOF. It then cancels the
// agent's operation out of band and bounds the drain of what the agent
// still sends by CancelGrace; the in-band cancel follows when the relay is
// aborted (the client closed its end, or CancelGrace passed).
func (r *relay) endShutdown(st *yamux.Stream, p clientEnd, out *frameCursor) {
	if err := protocol.WriteJSONFrame(out, protocol.FrameError, r.stopInfo); err != nil {
		r.abort(r.shutdownReason())
	} else if err := p.CloseWrite(); err != nil {
		r.abort(r.shutdownReason())
	}
	r.cancelAgent(st)
	st.SetReadDeadline(time.Now().Add(r.c.cfg.CancelGrace))
}

// panicked ends a relay whose goroutine panicked: the client is told of an
// internal error (the request's error reply, or the pipe's close once it is
// open), and the stream and pipe are released.
func (r *relay) panicked(e *panics.Error) {
	r.mu.Lock()
	st, p := r.st, r.pipe
	r.mu.Unlock()
	r.endErr = e
	if p == nil {
		r.refuse(r.c.internalError(e))
	}
	r.abort(r.c.internalError(e))
	if st != nil {
		st.Close()
	}
	if p != nil {
		p.Close()
	}
}

// lost wraps a tunnel stream failure.
func (r *relay) lost(err error) error {
	return fmt.Errorf("tunnel to node %s lost: %w", r.n.id, err)
}

// abort ends the relay once: it cancels a stream open in progress, unblocks
// a write to the node, bounds the drain of the node's bytes by CancelGrace
// and closes the pipe, telling the client reason.
func (r *relay) abort(reason error) {
	r.abortOnce.Do(func() {
		r.cancel()
		r.mu.Lock()
		st, p := r.st, r.pipe
		r.mu.Unlock()
		if st != nil {
			r.abortIO(st, p, reason)
		}
		close(r.aborted)
	})
}

func (r *relay) abortIO(st *yamux.Stream, p clientEnd, reason error) {
	st.SetWriteDeadline(time.Now()) // pipeToStream resets it for the cancel frame
	st.SetReadDeadline(time.Now().Add(r.c.cfg.CancelGrace))
	p.CloseWithError(reason)
}

// frameCursor passes writes through to w and tracks where the bytes are in
// the protocol's frame layout (type byte, uint32 length, payload), so the
// relay knows whether it may inject a frame, and counts them. It does not
// interpret frames, except that with keep it keeps the payload of the last
// exit and error frame (at most maxKeptFrame bytes) for the audit log,
// including one whose write failed (Write).
type frameCursor struct {
	w    io.Writer
	err  error   // the first write error
	n    int64   // bytes written
	hdr  int     // header bytes of the current frame seen, 0..4
	lenb [4]byte // the length field so far
	left uint64  // payload bytes of the current frame still to come

	keep bool
	// raw: the bytes are not frames at all (a dial or ssh stream's
	// client side); they are counted only.
	raw bool
	// rawAfterFirst: only the first frame is a frame (a dial or ssh
	// stream's dial-ok or error); the bytes after it are counted only.
	rawAfterFirst bool
	frames        int // whole frames seen
	// copy, for a copy stream's cursors, has them note the frames that
	// end a copy (either side may be the receiver): FrameCopyDone, and
	// the FrameCopySkip frames that make it partial.
	copy     bool
	copyDone bool
	skips    int

	typ     protocol.FrameType // the current frame's type
	cur     []byte             // the current exit or error frame's payload so far
	lastTyp protocol.FrameType // the type of the last whole exit or error frame kept
	last    []byte             // its payload
}

// maxKeptFrame bounds an exit or error frame's payload frameCursor keeps;
// a longer one is not kept.
const maxKeptFrame = 4 << 10

func (f *frameCursor) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	f.n += int64(n)
	if err != nil && f.keep {
		// A failed write may have delivered more than it reports: on the
		// direct path yamux reports a frame it sent as failed when the
		// session ends before the write is confirmed, as it does when a
		// client reads the exit status and exits at once. The frames
		// are followed as the agent sent them, so its exit status (its
		// last word, for the audit) is kept all the same; n counts only
		// the bytes confirmed. Nothing is written after a failure.
		f.advance(b)
	} else {
		f.advance(b[:n])
	}
	if err != nil && f.err == nil {
		f.err = err
	}
	return n, err
}

func (f *frameCursor) advance(b []byte) {
	if f.raw {
		return
	}
	for len(b) > 0 {
		if f.rawAfterFirst && f.frames > 0 {
			return
		}
		if f.left > 0 {
			k := min(uint64(len(b)), f.left)
			if f.cur != nil && len(f.cur)+int(k) <= maxKeptFrame {
				f.cur = append(f.cur, b[:k]...)
			} else {
				f.cur = nil
			}
			f.left -= k
			b = b[k:]
			if f.left == 0 {
				f.endFrame()
			}
			continue
		}
		if f.hdr > 0 {
			f.lenb[f.hdr-1] = b[0]
		} else {
			f.typ = protocol.FrameType(b[0])
		}
		f.hdr++
		b = b[1:]
		if f.hdr == 5 {
			f.hdr = 0
			f.left = uint64(binary.BigEndian.Uint32(f.lenb[:]))
			f.cur = nil
			if f.copy {
				switch f.typ {
				case protocol.FrameCopyDone:
					f.copyDone = true
				case protocol.FrameCopySkip:
					f.skips++
				}
			}
			if f.keep && (f.typ == protocol.FrameExit || f.typ == protocol.FrameError) && f.left <= maxKeptFrame {
				f.cur = make([]byte, 0, f.left)
			}
			if f.left == 0 {
				f.endFrame()
			}
		}
	}
}

// endFrame counts a whole frame and keeps it if it is an exit or error
// frame.
func (f *frameCursor) endFrame() {
	f.frames++
	if f.cur != nil {
		f.lastTyp, f.last, f.cur = f.typ, f.cur, nil
	}
}

// ends decodes the last exit or error frame kept: nil, nil when none was
// (or it does not decode).
func (f *frameCursor) ends() (*protocol.ExitStatus, *protocol.ErrorInfo) {
	switch f.lastTyp {
	case protocol.FrameExit:
		var es protocol.ExitStatus
		if protocol.DecodeJSON(f.last, &es) == nil {
			return &es, nil
		}
	case protocol.FrameError:
		var ei protocol.ErrorInfo
		if protocol.DecodeJSON(f.last, &ei) == nil {
			return nil, &ei
		}
	}
	return nil, nil
}

// atBoundary reports whether the bytes written so far end with a whole
// frame.
func (f *frameCursor) atBoundary() bool { return f.hdr == 0 && f.left == 0 }

// toBoundary is how many more bytes may be written without passing the
// end of the current frame (at least 1 while not at a boundary: the
// header's bytes are counted one at a time until its length is known).
func (f *frameCursor) toBoundary() int {
	switch {
	case f.left > 0:
		return int(min(f.left, 1<<30))
	case f.hdr > 0:
		return 5 - f.hdr
	}
	return 0
}

// execHeaderSizeError is protocol.CheckHeaderSize of exec stream params
// (which handleStream checked with the agent's rules before) as a 413
// too_large, nil when they fit: without a timeout of their own, they must
// leave room for the coordinator's default one, as on the job path.
func execHeaderSizeError(params []byte) *protocol.APIError {
	var p protocol.ExecParams
	h := protocol.Header{Version: protocol.Version, Kind: protocol.KindExec, Params: params}
	if err := h.DecodeParams(&p); err != nil {
		return protocol.NewAPIError(400, protocol.ErrCodeInvalid, "%v", err)
	}
	if err := protocol.CheckHeaderSize("exec params (script, argv, env, cwd)", &p); err != nil {
		if errors.Is(err, protocol.ErrTooLarge) {
			return protocol.NewAPIError(413, protocol.ErrCodeTooLarge, "%v", err)
		}
		return protocol.NewAPIError(400, protocol.ErrCodeInvalid, "%v", err)
	}
	return nil
}

// withDefaultTimeout returns exec stream params with timeout_ms set to d
// when they have none (absent or 0), as the job path applies
// Config.DefaultTimeout: an exec through the relay (e.g. with streamed
// stdin) is bounded like any other. The client's encoding is kept, with
// the field added; when that would outgrow the header limit (escapes the
// client used where none were needed) the params are encoded anew
// (protocol.MarshalJSON), which fits whatever passed execHeaderSizeError.
// Params that do not decode as exec params (handleStream refused those
// before), or that would not fit either way, are returned unchanged.
func withDefaultTimeout(params []byte, d time.Duration) []byte {
	if d <= 0 {
		return params
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(params, &m); err != nil {
		return params
	}
	if v, ok := m["timeout_ms"]; ok && string(bytes.TrimSpace(v)) != "0" {
		return params
	}
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	m["timeout_ms"] = json.RawMessage(strconv.FormatInt(ms, 10))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err == nil && buf.Len() <= protocol.MaxHeaderSize {
		return bytes.TrimSpace(buf.Bytes())
	}
	var p protocol.ExecParams
	h := protocol.Header{Version: protocol.Version, Kind: protocol.KindExec, Params: params}
	if h.DecodeParams(&p) != nil {
		return params
	}
	p.TimeoutMS = ms
	if b, err := protocol.MarshalJSON(&p); err == nil && len(b) <= protocol.MaxHeaderSize {
		return b
	}
	return params
}
