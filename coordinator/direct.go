package coordinator

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// The direct data path (protocol/direct.go has the wire format). A client
// asks on SubjectStream with Direct set; handleStream authorizes the
// request as it would a relayed one (after forwarding it to the
// coordinator holding the node) and issueTicket answers with a ticket
// bound to that one authorized request. The client then connects to the
// tunnel listener with ALPN tether-client/1 (dispatchClient), runs one yamux
// session (clientSession) and opens a data stream per operation, whose
// first frame carries the ticket; redeem spends it once, and the stream
// becomes the client's end (directEnd) of an ordinary relay (relay.go), so
// cancel, abort, shutdown, counting and auditing are the relay's.
//
// Lock order: directState.mu and clientSession.mu are leaves; neither is
// held while doing I/O or while taking Coordinator.mu.

// Reasons of tether_coordinator_direct_refusals_total (metrics.go's Help
// and the README describe them).
const (
	directOff      = "direct_off"
	directPreamble = "bad_preamble"
	// directNoCtl is a connection that opened no control stream within
	// the handshake timeout (or went away first): idle, not malformed.
	directNoCtl = "no_control_stream"
	// directNoRedeem is a session whose control stream was fine but that
	// redeemed no ticket within the handshake timeout.
	directNoRedeem = "no_redemption"
	directBadTkt   = "bad_ticket"
	directUnknown  = "unknown_ticket"
	directExpired  = "expired_ticket"
	directReused   = "reused_ticket"
)

var directRefusalReasons = []string{directOff, directPreamble, directNoCtl, directNoRedeem, directBadTkt, directUnknown, directExpired, directReused}

// directForget is how long a ticket is remembered after its expiry, so a
// late or replayed redemption is told "expired" or "already redeemed"
// rather than "unknown".
const directForget = time.Minute

// maxDirectRefusals is how many refused opens a client session may have
// before it is closed: anyone who reaches the port can cause them.
const maxDirectRefusals = 8

// directBuf is the size of a direct stream's read buffer toward the node
// (the other direction reads through the relay's own buffer).
const directBuf = protocol.DefaultPipeMessage

// grantState is where a ticket is in its life.
type grantState int

const (
	grantIssued grantState = iota
	grantRedeemed
	grantExpired
)

// directGrant is an issued ticket: the stream request it was issued for, as
// handleStream authorized it.
type directGrant struct {
	req    micro.Request // the stream request (its audit event, its caller)
	n      *node
	kind   protocol.Kind
	params json.RawMessage
	ssh    *protocol.SSHParams
	op     policy.Operation
	// openerAccount and openerUser are the sender the NATS server stamped.
	openerAccount, openerUser string
	expires                   time.Time

	state grantState  // guarded by directState.mu
	timer *time.Timer // expires the ticket
}

// directState holds the issued tickets and the clients' sessions. Its
// zero value is ready.
type directState struct {
	mu       sync.Mutex
	tickets  map[[protocol.DirectTicketSize]byte]*directGrant
	sessions map[*clientSession]struct{}
	closing  bool // the drain began: no tickets, no sessions
}

// issueTicket answers an authorized direct stream request with a ticket
// for it (protocol.DirectStreamReply), or 501 direct_unavailable without a
// direct listener. The request's audit event is left to the stream: the
// relay records it when it ends, or expireTicket when the ticket is never
// redeemed.
func (c *Coordinator) issueTicket(req micro.Request, g *directGrant) {
	if c.cfg.Direct.Addr == "" {
		// Not an operation but the transport's negotiation: the relayed
		// request the client sends next is the one audited.
		c.replyError(unaudited(req), protocol.NewAPIError(501, protocol.ErrCodeDirectUnavailable,
			"coordinator %s has no direct listener for client streams; relay over NATS (a stream request without direct)", c.cfg.ID))
		return
	}
	var t [protocol.DirectTicketSize]byte
	rand.Read(t[:]) // crypto/rand.Read never fails
	ttl := c.cfg.Direct.TicketTTL
	g.req = req
	g.expires = time.Now().Add(ttl)
	d := &c.direct
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		c.replyError(req, c.unavailable())
		return
	}
	if d.tickets == nil {
		d.tickets = map[[protocol.DirectTicketSize]byte]*directGrant{}
	}
	d.tickets[t] = g
	g.timer = time.AfterFunc(ttl, func() { c.expireTicket(t, g) })
	d.mu.Unlock()

	body, err := json.Marshal(protocol.DirectStreamReply{
		Addr: c.cfg.Direct.Addr, Pin: c.cfg.Direct.Pin, Ticket: protocol.FormatDirectTicket(t),
		TTLMS: ttl.Milliseconds(), Coordinator: c.cfg.ID,
	})
	if err != nil { // cannot happen: plain data
		c.replyError(req, protocol.NewAPIError(500, protocol.ErrCodeInternal, "encode direct stream reply: %v", err))
		return
	}
	// Past the audit wrapper: the reply is not the outcome.
	if err := unaudited(req).Respond(body); err != nil {
		c.log.Warn("send direct stream reply", "node_id", g.n.id, "err", err)
	}
}

// unaudited is req without its audit wrapper: a reply through it records
// no event (the request's event is recorded elsewhere, or not at all).
func unaudited(req micro.Request) micro.Request {
	if a := auditOf(req); a != nil {
		return a.Request
	}
	return req
}

// expireTicket ends ticket t's life once its TTL passed: a ticket never
// redeemed gets its request's audit event (410 bad_ticket), and the entry is
// forgotten directForget later.
func (c *Coordinator) expireTicket(t [protocol.DirectTicketSize]byte, g *directGrant) {
	d := &c.direct
	d.mu.Lock()
	unredeemed := g.state == grantIssued
	if unredeemed {
		g.state = grantExpired
	}
	closing := d.closing
	d.mu.Unlock()
	if unredeemed {
		if a := auditOf(g.req); a != nil {
			a.finish(410, protocol.ErrCodeTicket, fmt.Sprintf("direct stream ticket for node %s expired unredeemed after %v", g.n.id, c.cfg.Direct.TicketTTL))
		}
	}
	if closing {
		return
	}
	d.mu.Lock()
	g.timer = time.AfterFunc(directForget, func() {
		d.mu.Lock()
		if d.tickets[t] == g {
			delete(d.tickets, t)
		}
		d.mu.Unlock()
	})
	d.mu.Unlock()
}

// redeem spends ticket t: the grant it was issued for, or the refusal's
// metric reason and error (401 bad_ticket) when it is unknown, expired or
// already spent.
func (c *Coordinator) redeem(t [protocol.DirectTicketSize]byte) (*directGrant, string, *protocol.APIError) {
	d := &c.direct
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.tickets[t]
	switch {
	case g == nil:
		return nil, directUnknown, protocol.NewAPIError(401, protocol.ErrCodeTicket,
			"direct stream ticket unknown to coordinator %s: never issued here, or forgotten %v after its expiry; ask for the stream again", c.cfg.ID, directForget)
	case g.state == grantRedeemed:
		return nil, directReused, protocol.NewAPIError(401, protocol.ErrCodeTicket,
			"direct stream ticket for node %s was already redeemed: a ticket opens one stream", g.n.id)
	case g.state == grantExpired || !time.Now().Before(g.expires):
		// A late redemption before the timer ran: expireTicket still
		// records the request's event.
		return nil, directExpired, protocol.NewAPIError(401, protocol.ErrCodeTicket,
			"direct stream ticket for node %s expired (tickets last %v); ask for the stream again", g.n.id, c.cfg.Direct.TicketTTL)
	}
	g.state = grantRedeemed
	return g, "", nil
}

// closeDirect ends the direct path at the start of the drain: no more
// tickets or sessions; the client sessions get GoAway (their open streams
// go on, as relays do), and tickets not redeemed yet expire now.
func (c *Coordinator) closeDirect() {
	d := &c.direct
	d.mu.Lock()
	d.closing = true
	var pending []*directGrant
	for _, g := range d.tickets {
		if g.timer != nil {
			g.timer.Stop()
		}
		if g.state == grantIssued {
			pending = append(pending, g)
		}
	}
	sessions := make([]*clientSession, 0, len(d.sessions))
	for cs := range d.sessions {
		sessions = append(sessions, cs)
	}
	d.mu.Unlock()
	for _, g := range pending {
		c.expireTicket([protocol.DirectTicketSize]byte{}, g)
	}
	for _, cs := range sessions {
		cs.sess.GoAway()
	}
}

// refuseDirect counts and logs (rate-limited: anyone who reaches the port
// can cause it) a refusal on the direct path.
func (c *Coordinator) refuseDirect(reason, remote string, err error) {
	c.m.directRefusals.WithLabelValues(reason).Inc()
	c.preauth.Warn("direct client stream refused (each one counted in tether_coordinator_direct_refusals_total)",
		"reason", reason, "remote_addr", remote, "err", err)
}

// dispatchClient hands a TLS connection whose handshake is done and that
// negotiated protocol.ALPNClient to the client's direct session
// (serveClientConn), whose rest of life it returns with handled true; every
// other connection (an agent's, on any transport: dispatchALPN) goes on in
// serveConn, handled false.
func (c *Coordinator) dispatchClient(ctx context.Context, ac *agentConn, tc *tls.Conn) (rest func(), handled bool) {
	if tc.ConnectionState().NegotiatedProtocol != protocol.ALPNClient {
		return nil, false
	}
	return c.serveClientConn(ctx, ac), true
}

// clientTunnel is the yamux configuration of client sessions: the agents'
// but for an accept backlog (clients open every stream) and no pings of
// our own (clients ping, tunnel.DefaultConfig; silence for three of their
// intervals closes the session).
func (c *Coordinator) clientTunnel() tunnel.Config {
	t := c.cfg.Tunnel
	t.Flow = nil // the agents' tunnels' telemetry only (metrics.go)
	t.AcceptBacklog = 256
	t.KeepAliveInterval = 0
	t.IdleTimeout = max(t.IdleTimeout, 3*tunnel.DefaultConfig().KeepAliveInterval)
	return t
}

// serveClientConn starts a client's direct session on ac, a TLS
// connection that negotiated protocol.ALPNClient, and returns the rest of
// its life (clientSession.serve), or nil when it is refused (no direct
// listener configured, the drain began).
func (c *Coordinator) serveClientConn(ctx context.Context, ac *agentConn) func() {
	remote := ac.conn.RemoteAddr().String()
	if c.cfg.Direct.Addr == "" {
		c.refuseDirect(directOff, remote, errors.New("this coordinator has no direct listener for client streams (Config.Direct.Addr)"))
		ac.conn.Close()
		return nil
	}
	sess, err := tunnel.Server(ac.conn, c.clientTunnel())
	if err != nil {
		c.preauth.Warn("start direct client session", "remote_addr", remote, "err", err)
		return nil // tunnel.Server closed the conn
	}
	ac.setSession(sess)
	cs := &clientSession{c: c, sess: sess, remote: remote, ends: map[uint32]*directEnd{},
		log: c.log.With("remote_addr", remote, "direct", true)}
	d := &c.direct
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		sess.Close()
		return nil
	}
	if d.sessions == nil {
		d.sessions = map[*clientSession]struct{}{}
	}
	d.sessions[cs] = struct{}{}
	d.mu.Unlock()
	return func() {
		defer func() {
			d.mu.Lock()
			delete(d.sessions, cs)
			d.mu.Unlock()
		}()
		cs.serve(ctx)
	}
}

// clientSession is one client's yamux session on the tunnel listener.
type clientSession struct {
	c      *Coordinator
	sess   *tunnel.Session
	remote string
	log    *slog.Logger

	wmu sync.Mutex    // orders the writes on ctl
	ctl *yamux.Stream // the control stream; set by serve before any data stream

	// redeemed is set once a ticket was redeemed on the session: until
	// then it is not authenticated, and it is closed HandshakeTimeout
	// after its control stream (serve).
	redeemed atomic.Bool
	refusals atomic.Int32 // refused opens (maxDirectRefusals)

	mu   sync.Mutex
	ends map[uint32]*directEnd // the data streams by yamux stream id
	gone error                 // set once the session ended: why
	wg   sync.WaitGroup        // openData goroutines
}

// serve reads the session's control stream (its first stream) and accepts
// its data streams until the session ends, then fails the data streams
// still open (their relays abort) and returns.
func (cs *clientSession) serve(ctx context.Context) {
	c := cs.c
	defer cs.sess.Close()
	actx, cancel := context.WithTimeout(ctx, c.cfg.HandshakeTimeout)
	ctl, err := cs.sess.AcceptRaw(actx)
	cancel()
	if err != nil {
		c.refuseDirect(directNoCtl, cs.remote, fmt.Errorf("no control stream within %v: %w", c.cfg.HandshakeTimeout, err))
		return
	}
	ctl.SetReadDeadline(time.Now().Add(c.cfg.HandshakeTimeout))
	fr := protocol.NewFrameReader(ctl)
	fr.Max = protocol.MaxDirectFrame
	f, err := fr.Next()
	ctl.SetReadDeadline(time.Time{})
	if err == nil && f.Type != protocol.FrameDirectControl {
		err = fmt.Errorf("first frame is %s, want %s: a connection that negotiated ALPN %s speaks the direct client protocol (agents connect without ALPN, or with %s)",
			f.Type, protocol.FrameDirectControl, protocol.ALPNClient, tunnel.ALPNTunnel)
	}
	if err != nil {
		c.refuseDirect(directPreamble, cs.remote, err)
		ctl.SetWriteDeadline(time.Now().Add(c.cfg.Tunnel.WriteTimeout))
		protocol.WriteJSONFrame(ctl, protocol.FrameReject, &protocol.ErrorInfo{Code: protocol.CodeBadRequest, Message: err.Error()})
		ctl.Close()
		// A lingering close: closing the session at once can reach the
		// client before the reject it has not read yet (it then sees a
		// bare "session shutdown"; 3 in 12 runs of
		// TestDirectListenerKeepsProtocolsApart). The client hangs up
		// once it has read it; a second bounds the wait.
		t := time.NewTimer(time.Second)
		select {
		case <-cs.sess.Done():
		case <-t.C:
		}
		t.Stop()
		return
	}
	cs.ctl = ctl
	// Not authenticated until a ticket is redeemed: a session that
	// redeems none in time is closed, so unauthenticated sessions stay
	// bounded by the handshake admission.
	unproven := time.AfterFunc(c.cfg.HandshakeTimeout, func() {
		if !cs.redeemed.Load() {
			c.refuseDirect(directNoRedeem, cs.remote, fmt.Errorf("no ticket redeemed within %v of the session's start; closed", c.cfg.HandshakeTimeout))
			cs.sess.Close()
		}
	})
	defer unproven.Stop()
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer c.guard.Recover("direct control stream", func(*panics.Error) { cs.sess.Close() })
		cs.readControl(fr)
	}()
	for {
		st, err := cs.sess.AcceptRaw(ctx)
		if err != nil {
			break
		}
		cs.wg.Add(1)
		go func() {
			defer cs.wg.Done()
			defer c.guard.Recover("direct stream open", func(*panics.Error) { st.Close() })
			cs.openData(st)
		}()
	}
	cs.sess.Close()
	<-read
	cs.wg.Wait()
	var gone error = directGone(cs.remote)
	if err := cs.sess.Err(); err != nil {
		gone = fmt.Errorf("%w: %w", gone, err)
	}
	cs.mu.Lock()
	cs.gone = gone
	ends := make([]*directEnd, 0, len(cs.ends))
	for _, e := range cs.ends {
		ends = append(ends, e)
	}
	cs.mu.Unlock()
	for _, e := range ends {
		e.fail(gone)
	}
}

// readControl reads the client's control frames (cancel and close of a
// data stream) until the stream or session ends; anything else closes the
// session.
func (cs *clientSession) readControl(fr *protocol.FrameReader) {
	for {
		f, err := fr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && !cs.sess.IsClosed() {
				cs.log.Debug("direct control stream failed", "err", err)
			}
			cs.sess.Close()
			return
		}
		var ref protocol.DirectRef
		switch f.Type {
		case protocol.FrameDirectCancel, protocol.FrameDirectClose:
			if err := protocol.DecodeJSON(f.Payload, &ref); err != nil {
				cs.c.refuseDirect(directPreamble, cs.remote, fmt.Errorf("%s frame: %w", f.Type, err))
				cs.sess.Close()
				return
			}
		default:
			cs.c.refuseDirect(directPreamble, cs.remote, fmt.Errorf("%s frame on the direct control stream", f.Type))
			cs.sess.Close()
			return
		}
		cs.mu.Lock()
		e := cs.ends[ref.Stream]
		cs.mu.Unlock()
		if e == nil {
			continue // ended meanwhile, or never ours: nothing to do
		}
		if f.Type == protocol.FrameDirectCancel {
			e.peerReset()
		} else {
			if !ref.HalfClosed {
				e.mu.Lock()
				e.closedOpen = true
				e.mu.Unlock()
			}
			e.fail(errClientClosed)
		}
	}
}

// errClientClosed is why a direct stream the client closed (Stream.Close)
// ended.
var errClientClosed = errors.New("the client closed the stream")

// writeControl writes a frame on the control stream; a failure closes the
// session, which has lost its control.
func (cs *clientSession) writeControl(t protocol.FrameType, v any) error {
	cs.wmu.Lock()
	defer cs.wmu.Unlock()
	cs.ctl.SetWriteDeadline(time.Now().Add(cs.c.cfg.Tunnel.WriteTimeout))
	err := protocol.WriteJSONFrame(cs.ctl, t, v)
	if err != nil {
		cs.sess.Close()
		return fmt.Errorf("direct control stream to client %s: %w", cs.remote, err)
	}
	return nil
}

// openData reads a data stream's ticket, redeems it and starts its relay;
// a refusal is answered on the stream (FrameDirectAnswer), counted and
// logged.
func (cs *clientSession) openData(st *yamux.Stream) {
	c := cs.c
	refuse := func(reason string, e *protocol.APIError) {
		c.refuseDirect(reason, cs.remote, e)
		writeAnswer(st, c.cfg.Tunnel.WriteTimeout, e)
		st.Close()
		if n := cs.refusals.Add(1); n >= maxDirectRefusals {
			c.preauth.Warn("direct client session closed after too many refused streams", "remote_addr", cs.remote, "refused", n)
			cs.sess.Close()
		}
	}
	st.SetReadDeadline(time.Now().Add(c.cfg.Tunnel.HeaderTimeout))
	fr := protocol.NewFrameReader(st)
	fr.Max = protocol.MaxDirectFrame
	f, err := fr.Next()
	st.SetReadDeadline(time.Time{})
	if err == nil && f.Type != protocol.FrameDirectOpen {
		err = fmt.Errorf("first frame is %s, want %s", f.Type, protocol.FrameDirectOpen)
	}
	if err != nil {
		refuse(directPreamble, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "direct stream: %v", err))
		return
	}
	var o protocol.DirectOpen
	if e := protocol.DecodeRequest(f.Payload, &o); e != nil {
		// Strict: a ticket comes alone, and names everything it opens.
		refuse(directBadTkt, protocol.NewAPIError(401, protocol.ErrCodeTicket, "direct stream open: %s", e.Message))
		return
	}
	t, err := protocol.ParseDirectTicket(o.Ticket)
	if err != nil {
		refuse(directBadTkt, protocol.NewAPIError(401, protocol.ErrCodeTicket, "direct stream open: %v", err))
		return
	}
	g, reason, e := c.redeem(t)
	if e != nil {
		refuse(reason, e)
		return
	}
	cs.redeemed.Store(true)
	end := &directEnd{cs: cs, st: st, id: st.StreamID(), reset: make(chan struct{}), done: make(chan struct{})}
	cs.mu.Lock()
	if cs.gone != nil {
		cs.mu.Unlock()
		end.refuseAudited(g, c.unavailable())
		return
	}
	cs.ends[end.id] = end
	cs.mu.Unlock()
	c.startDirectRelay(g, end)
}

// startDirectRelay starts the relay of a redeemed ticket's stream, as
// handleStream starts a relayed one: the caller's job slot, then the relay.
// A node that reconnected since the ticket was issued is refused (its
// session, which was authorized, is gone).
func (c *Coordinator) startDirectRelay(g *directGrant, end *directEnd) {
	c.mu.Lock()
	cur := c.nodes[g.n.id]
	c.mu.Unlock()
	if cur != g.n {
		end.refuseAudited(g, protocol.NewAPIError(503, protocol.ErrCodeUnavailable,
			"node %s: its tunnel to coordinator %s changed since the ticket was issued; retry", g.n.id, c.cfg.ID))
		return
	}
	release, e := c.authorizer().Acquire(g.req, g.op)
	if e != nil {
		end.refuseAudited(g, e)
		return
	}
	c.mu.Lock()
	if c.closing || c.life == nil {
		c.mu.Unlock()
		release()
		end.refuseAudited(g, c.unavailable())
		return
	}
	rel := &relay{
		release: release,
		c:       c,
		req:     g.req,
		n:       g.n,
		kind:    g.kind,
		params:  g.params,
		ssh:     g.ssh,
		direct:  end,
		log:     c.log.With("node_id", g.n.id, "kind", g.kind.String(), "direct", true),

		openerAccount: g.openerAccount,
		openerUser:    g.openerUser,
		aborted:       make(chan struct{}),
		stopping:      make(chan struct{}),
	}
	if id, ok := caller.Of(g.req); ok {
		rel.log = rel.log.With("caller", id.String())
	}
	rel.ctx, rel.cancel = context.WithCancel(c.life)
	c.relays.add(rel)
	c.mu.Unlock()
	c.m.directStreams.Inc()
	go rel.run()
}

// writeAnswer writes a data stream's FrameDirectAnswer: nil e when open.
func writeAnswer(st *yamux.Stream, timeout time.Duration, e *protocol.APIError) error {
	a := protocol.DirectAnswer{Error: e}
	if e != nil && len(e.Message) > protocol.MaxDirectFrame/2 {
		c := *e
		c.Message = protocol.ClipUTF8(c.Message, protocol.MaxDirectFrame/2)
		a.Error = &c
	}
	st.SetWriteDeadline(time.Now().Add(timeout))
	err := protocol.WriteJSONFrame(st, protocol.FrameDirectAnswer, &a)
	st.SetWriteDeadline(time.Time{})
	return err
}

// directEnd is the client's end of a relay on the direct path: its data
// stream, plus what the control stream says of it (clientEnd has the
// meaning of its methods).
type directEnd struct {
	cs *clientSession
	st *yamux.Stream
	id uint32

	resetOnce sync.Once
	reset     chan struct{} // closed by the client's cancel

	mu       sync.Mutex
	done     chan struct{} // closed by fail, CloseWithError or Close
	closed   bool          // done is closed
	err      error         // why it failed; nil after a clean end
	endedOK  bool          // a clean DirectEnd was sent (CloseWrite)
	endedErr bool          // a failed DirectEnd was sent
	// closedOpen: the client closed the stream without half-closing it
	// first; the data stream's EOF is then part of the abort (WriteTo).
	closedOpen bool
	released   bool // Close ran
}

// name identifies the end in logs.
func (e *directEnd) name() string { return fmt.Sprintf("direct:%s/%d", e.cs.remote, e.id) }

// open tells the client its stream is open.
func (e *directEnd) open() error {
	return writeAnswer(e.st, e.cs.c.cfg.Tunnel.WriteTimeout, nil)
}

// refuse answers the client that its stream did not open, with e, and
// releases the data stream.
func (e *directEnd) refuse(ae *protocol.APIError) {
	writeAnswer(e.st, e.cs.c.cfg.Tunnel.WriteTimeout, ae)
	e.release()
}

// refuseAudited is refuse for a stream that has no relay (yet): the
// ticket's request gets its audit event here.
func (e *directEnd) refuseAudited(g *directGrant, ae *protocol.APIError) {
	if a := auditOf(g.req); a != nil {
		a.finish(ae.Status, ae.Code, ae.Message)
	}
	e.refuse(ae)
}

func (e *directEnd) Write(b []byte) (int, error) {
	n, err := e.st.Write(b)
	if err != nil {
		if ferr := e.Err(); ferr != nil {
			return n, ferr
		}
		return n, fmt.Errorf("direct stream %s: %w", e.name(), err)
	}
	return n, nil
}

// errPeerReset is WriteTo's error after the client's cancel.
var errPeerReset = errors.New("the client cancelled its direction")

// WriteTo copies the client's bytes to w until the client's half-close
// (nil), its cancel (errPeerReset) or a failure.
func (e *directEnd) WriteTo(w io.Writer) (int64, error) {
	buf := make([]byte, directBuf)
	var total int64
	for {
		n, err := e.st.Read(buf)
		if n > 0 {
			m, werr := w.Write(buf[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
		}
		if err == io.EOF {
			select {
			case <-e.cs.sess.Done():
				// yamux ends a dead session's streams with EOF.
				return total, e.cs.goneErr()
			default:
			}
			// The client's close (or cancel) of a stream it had not
			// half-closed came first on the control stream, and the FIN
			// it sends once the relay answered may beat this read's
			// wake-up by its deadline: yamux answers a read of a remotely
			// closed stream with EOF before it looks at the deadline.
			// That FIN is no half-close (protocol.DirectRef).
			select {
			case <-e.reset:
				return total, errPeerReset
			default:
			}
			e.mu.Lock()
			aborted, ferr := e.closedOpen, e.err
			e.mu.Unlock()
			if aborted {
				return total, ferr
			}
			return total, nil
		}
		if err != nil {
			select {
			case <-e.reset:
				return total, errPeerReset
			default:
			}
			if ferr := e.Err(); ferr != nil {
				return total, ferr
			}
			return total, fmt.Errorf("direct stream %s: %w", e.name(), err)
		}
	}
}

// goneErr is why the session ended, once serve noticed it.
func (cs *clientSession) goneErr() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.gone != nil {
		return cs.gone
	}
	return directGone(cs.remote)
}

// directGone is why a direct stream ended with its client's session
// (serve, goneErr); it may wrap the session's error (tunnel.Session.Err).
type directGone string

func (g directGone) Error() string {
	return fmt.Sprintf("direct session of client %s ended", string(g))
}

// peerReset is the client's cancel: WriteTo stops now, dropping what the
// client wrote and the relay did not read.
func (e *directEnd) peerReset() {
	e.resetOnce.Do(func() {
		close(e.reset)
		e.st.SetReadDeadline(time.Now())
	})
}

// fail ends the end because of err (the client's close, its session's
// end): Done is closed and blocked reads and writes return.
func (e *directEnd) fail(err error) {
	e.mu.Lock()
	if !e.closed {
		e.closed, e.err = true, err
		close(e.done)
	}
	e.mu.Unlock()
	e.st.SetReadDeadline(time.Now())
	e.st.SetWriteDeadline(time.Now())
}

// sendEnd tells the client how the coordinator's side ended (msg empty:
// cleanly): at most one clean end and one failure, each before the data
// stream's FIN, so the client knows how its EOF came.
func (e *directEnd) sendEnd(msg string) error {
	e.mu.Lock()
	if e.endedErr || (msg == "" && e.endedOK) {
		e.mu.Unlock()
		return nil
	}
	if msg == "" {
		e.endedOK = true
	} else {
		e.endedErr = true
	}
	e.mu.Unlock()
	return e.cs.writeControl(protocol.FrameDirectEnd, &protocol.DirectEnd{Stream: e.id, Error: protocol.ClipUTF8(msg, protocol.MaxDirectFrame/2)})
}

// CloseWrite sends the client EOF after the bytes written so far.
func (e *directEnd) CloseWrite() error {
	if err := e.sendEnd(""); err != nil {
		return err
	}
	return e.st.Close() // yamux's close is a half-close
}

// CloseWithError aborts the stream, telling the client reason.
func (e *directEnd) CloseWithError(reason error) error {
	msg := fmt.Sprintf("coordinator %s closed the stream", e.cs.c.cfg.ID)
	if reason != nil {
		msg = reason.Error()
	}
	e.mu.Lock()
	if !e.closed {
		e.closed, e.err = true, reason
		close(e.done)
	}
	e.mu.Unlock()
	e.st.SetWriteDeadline(time.Now())
	e.st.SetReadDeadline(time.Now())
	e.sendEnd(msg)
	e.st.Close()
	return nil
}

// Close releases the stream, aborting it unless it ended cleanly.
func (e *directEnd) Close() error {
	e.mu.Lock()
	if !e.closed {
		e.closed = true
		close(e.done)
	}
	clean := e.endedOK || e.endedErr
	e.mu.Unlock()
	if !clean {
		e.sendEnd(fmt.Sprintf("coordinator %s closed the stream", e.cs.c.cfg.ID))
	}
	e.release()
	return nil
}

// release closes the data stream and forgets it.
func (e *directEnd) release() {
	e.mu.Lock()
	done := e.released
	e.released = true
	e.mu.Unlock()
	if done {
		return
	}
	e.st.Close()
	e.cs.mu.Lock()
	if e.cs.ends[e.id] == e {
		delete(e.cs.ends, e.id)
	}
	e.cs.mu.Unlock()
}

func (e *directEnd) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

func (e *directEnd) Done() <-chan struct{}      { return e.done }
func (e *directEnd) PeerReset() <-chan struct{} { return e.reset }
