package coordinator

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/internal/admission"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// maxHelloSize bounds the Hello frame, in bytes: a node id, 64 labels,
// capacity and a version string fit easily.
const maxHelloSize = 64 << 10

// maxHeartbeatSize bounds a Heartbeat frame, in bytes.
const maxHeartbeatSize = 4 << 10

// maxAgentString bounds a free-form string an agent supplies (versions, GPU
// model, error messages, signal names) as the coordinator keeps and relays
// it, in bytes; longer ones are cut (truncateAgentString).
const maxAgentString = 1 << 10

// truncateAgentString cuts s to at most maxAgentString bytes, at a UTF-8
// character boundary, marking the cut with "...".
func truncateAgentString(s string) string {
	if len(s) <= maxAgentString {
		return s
	}
	const mark = "..."
	cut := maxAgentString - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// agentConn is one accepted agent connection, from TCP accept to close. The
// drain closes every agentConn to end its goroutine.
type agentConn struct {
	conn net.Conn
	// ticket is its place in the pre-auth admission (Owner: the
	// agentConn); Evicted once its handshake was cut to make room for
	// another source's: the cut is already counted, its failure is not.
	ticket *admission.Ticket

	// peer is the client certificate the agent presented in its TLS
	// handshake; nil if none (or not TLS). Set before the Hello is read.
	peer *x509.Certificate

	mu   sync.Mutex
	sess *tunnel.Session // set once the tunnel session exists
}

// close closes the session if there is one, else the raw connection.
func (ac *agentConn) close() {
	ac.mu.Lock()
	s := ac.sess
	ac.mu.Unlock()
	if s != nil {
		s.Close()
		return
	}
	ac.conn.Close()
}

func (ac *agentConn) setSession(s *tunnel.Session) {
	ac.mu.Lock()
	ac.sess = s
	ac.mu.Unlock()
}

// node is a registered agent session. Fields other than the atomics are
// immutable after registration.
type node struct {
	id          string
	sess        *tunnel.Session
	hello       protocol.Hello // Token cleared
	sessionID   string
	remoteAddr  string
	connectedAt time.Time
	// ctl writes on the agent's control stream after Welcome (control.go).
	ctl *controlWriter
	// cert is the certificate the session was authenticated with; nil
	// for a session admitted by the deprecated shared token.
	cert *nodeCert

	lastHeartbeat atomic.Int64 // unix nanoseconds
	rttMicros     atomic.Int64
	runningExecs  atomic.Int64
	// The agent's side's flow telemetry, from its last heartbeat.
	agentStalls      atomic.Uint64
	agentStallMicros atomic.Int64
	agentQueued      atomic.Int64
	// inventoried is set once an inventory of this session was reconciled
	// into the ledger (sandboxes.go); the reaper treats the node as unknown
	// until then.
	inventoried atomic.Bool
	// fleetRev is the fleet registry revision of this session's record
	// (fleet.go); 0 until it was put.
	fleetRev atomic.Uint64
	// transport is how the session reached us: "tls", "wss" (the
	// WebSocket transport) or "tcp" (no TLS: tests).
	transport string
	// owner, set only on stand-ins for nodes another coordinator holds
	// (remoteNode), is that coordinator's id; sess is then nil.
	owner string
}

// startConn starts the goroutine that owns conn, unless the drain began or
// admission refuses it (too many handshakes in progress from its source,
// or in all: then conn is closed unread and counted as an auth failure,
// reason source_limit or overload). Admitting it may cut another source's
// handshake (admission.enter), which is counted as overload.
func (c *Coordinator) startConn(conn net.Conn) {
	ac := &agentConn{conn: conn}
	ac.ticket = admission.NewTicket(conn.RemoteAddr(), ac)
	victim, refused := c.admit.Enter(ac.ticket)
	if refused != "" {
		c.m.authFailures.WithLabelValues(refused).Inc()
		c.preauth.Warn("agent connection refused before its handshake (each one counted in tether_coordinator_auth_failures_total)",
			"reason", refused, "remote_addr", conn.RemoteAddr().String(), "source", ac.ticket.Source.String(),
			"max_handshakes", c.cfg.MaxHandshakes, "max_handshakes_per_source", c.Limits().MaxHandshakesPerSource)
		conn.Close()
		return
	}
	if victim != nil {
		vc := victim.Owner.(*agentConn)
		c.m.authFailures.WithLabelValues(reasonOverload).Inc()
		c.preauth.Warn("agent handshake cut to make room for another source's (each one counted in tether_coordinator_auth_failures_total)",
			"reason", reasonOverload, "remote_addr", vc.conn.RemoteAddr().String(), "source", victim.Source.String(),
			"for_remote_addr", conn.RemoteAddr().String(), "max_handshakes", c.cfg.MaxHandshakes)
		vc.close()
	}
	// The handshake place is released when the handshake ends, whatever
	// its outcome (serveConn), or here if no goroutine starts.
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		c.admit.Leave(ac.ticket)
		conn.Close()
		return
	}
	c.conns[ac] = struct{}{}
	c.connWG.Add(1)
	life := c.life
	c.mu.Unlock()
	done := func() {
		c.mu.Lock()
		delete(c.conns, ac)
		c.mu.Unlock()
		c.connWG.Done()
	}
	go func() {
		var start func(done func())
		c.containConn("agent handshake", ac, func() { start = c.serveConn(life, ac) })
		if start == nil {
			done()
			return
		}
		// The session needs no goroutine of its own from here on: its
		// control stream is read when data comes (controlReader) and its
		// end is handled when its connection closes, each in a short-lived
		// goroutine, so an idle agent holds yamux's two goroutines only
		// (BenchmarkIdleAgentMemory). start registers both and returns;
		// done runs at the session's end.
		c.containConn("agent session", ac, func() { start(done) })
	}()
}

// handshakeError is a refused handshake: the metric reason, and what the
// agent is told in FrameReject (no reject is sent when info is nil).
type handshakeError struct {
	reason string
	info   *protocol.ErrorInfo
	err    error
}

func (e *handshakeError) Error() string { return e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

func refuse(reason, code string, err error) *handshakeError {
	var info *protocol.ErrorInfo
	if code != "" {
		info = &protocol.ErrorInfo{Code: code, Message: err.Error()}
	}
	return &handshakeError{reason: reason, info: info, err: err}
}

// serveConn runs one agent connection's handshake and registration. When the
// agent is registered it returns the rest of the connection's life, start,
// which the caller calls once: it arranges for the control stream to be
// read as frames come and for the session's end to deregister the node and
// then call done, and returns at once. Otherwise serveConn returns nil and
// the connection is closed. It releases the connection's handshake slot
// (startConn) when it returns.
func (c *Coordinator) serveConn(ctx context.Context, ac *agentConn) func(done func()) {
	defer c.admit.Leave(ac.ticket)
	remote := ac.conn.RemoteAddr().String()
	// Until the Hello proved the join token, every line goes to the
	// rate-limited log.
	log := c.preauth.With("remote_addr", remote)
	start := time.Now()
	deadline := start.Add(c.cfg.HandshakeTimeout)
	// failed reports whether a failure of this connection should be
	// counted and logged: not when the drain or the admission cut it.
	failed := func() bool { return ctx.Err() == nil && !ac.ticket.Evicted() }
	// conn is what the session runs over: ac.conn, or the WebSocket
	// connection inside it (dispatchALPN).
	conn, transport := ac.conn, "tcp"

	if tc, ok := ac.conn.(*tls.Conn); ok {
		// A silent connection is closed after FirstByteTimeout, well
		// before the handshake's budget: an agent's ClientHello comes at
		// once.
		err := waitFirstByte(tc.NetConn(), start.Add(min(c.cfg.FirstByteTimeout, c.cfg.HandshakeTimeout)))
		if errors.Is(err, errNoFirstByte) {
			// Closed before sending a byte: a load balancer's or port
			// scanner's health check, not a failed agent.
			log.Debug("connection closed before the TLS handshake began")
			ac.conn.Close()
			return nil
		}
		if err != nil {
			if failed() {
				c.m.authFailures.WithLabelValues(reasonTimeout).Inc()
				log.Debug("connection sent nothing; closed", "first_byte_timeout", c.cfg.FirstByteTimeout, "err", err)
			}
			ac.conn.Close()
			return nil
		}
		if !c.pace(tc.NetConn(), ac.ticket.Source) {
			ac.conn.Close()
			return nil
		}
		hctx, cancel := context.WithDeadline(ctx, deadline)
		err = tc.HandshakeContext(hctx)
		cancel()
		if errors.Is(err, io.EOF) {
			// Closed before a whole ClientHello (peers whose first byte
			// cannot be peeked at land here too).
			log.Debug("connection closed before the TLS handshake began")
			ac.conn.Close()
			return nil
		}
		if err != nil {
			reason := reasonProtocol
			if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
				reason = reasonTimeout
			}
			if failed() {
				c.m.authFailures.WithLabelValues(reason).Inc()
				// Usually an agent that does not trust our certificate
				// (wrong --ca-file): worth a warning, rate-limited, since a
				// misconfigured fleet retries in a loop.
				log.Warn("agent TLS handshake failed (each one counted in tether_coordinator_auth_failures_total)", "reason", reason, "err", err)
			}
			ac.conn.Close()
			return nil
		}
		if pc := tc.ConnectionState().PeerCertificates; len(pc) > 0 {
			ac.peer = pc[0]
		}
		if rest, handled := c.dispatchClient(ctx, ac, tc); handled {
			if rest == nil {
				return nil
			}
			// A client's direct session reads its streams in a
			// goroutine of its own, started fresh: the handshake grew
			// this one's stack.
			return func(done func()) {
				go func() {
					defer done()
					c.containConn("direct client session", ac, rest)
				}()
			}
		}
		if conn, transport, err = c.dispatchALPN(ctx, tc, deadline); err != nil {
			if failed() {
				c.transportRefused(err, transport, log)
			}
			ac.conn.Close()
			return nil
		}
	}

	sess, err := tunnel.Server(conn, c.cfg.Tunnel)
	if err != nil {
		log.Warn("start tunnel session", "err", err)
		return nil // tunnel.Server closed the conn
	}
	if ac.ticket.Evicted() {
		sess.Close() // cut while its TLS handshake finished
		return nil
	}
	ac.setSession(sess)
	// Until the agent is registered and welcomed, every return closes the
	// session; afterwards start owns it.
	handedOff := false
	defer func() {
		if !handedOff {
			sess.Close()
		}
	}()

	ctrl, hello, cert, herr := c.handshake(ctx, sess, deadline, ac.peer, log)
	if herr != nil {
		if herr.reason == reasonEnrolled || !failed() {
			return nil // enrolled (the agent redials with its certificate), shutting down or cut
		}
		if herr.reason != reasonEnroll { // counted in tether_coordinator_enrollments_total
			c.m.authFailures.WithLabelValues(herr.reason).Inc()
		}
		attrs := []any{"reason", herr.reason, "err", herr.err}
		if hello != nil && hello.NodeID != "" {
			attrs = append(attrs, "node_id", hello.NodeID)
		}
		switch herr.reason {
		case reasonBadToken, reasonNoToken, reasonVersion, reasonBadHello,
			reasonCertRequired, reasonForeignCA, reasonCertExpired, reasonBadCert, reasonWrongNode, reasonRevoked, reasonUnknownCert,
			reasonEnroll:
			log.Warn("agent refused", attrs...)
		default:
			log.Debug("agent handshake failed", attrs...)
		}
		if herr.info != nil && ctrl != nil {
			ctrl.SetWriteDeadline(time.Now().Add(c.cfg.Tunnel.WriteTimeout))
			protocol.WriteJSONFrame(ctrl, protocol.FrameReject, herr.info)
			ctrl.Close()
		}
		return nil
	}
	defer func() {
		if !handedOff {
			ctrl.Close()
		}
	}()

	if hello.Labels == nil {
		hello.Labels = map[string]string{} // listed as {}, not null
	}
	n := &node{
		id:          hello.NodeID,
		sess:        sess,
		hello:       *hello,
		sessionID:   rand.Text(),
		remoteAddr:  remote,
		connectedAt: time.Now().UTC(),
		ctl:         newControlWriter(ctrl, hello, c.cfg.Tunnel.WriteTimeout),
		cert:        cert,
		transport:   transport,
	}
	n.lastHeartbeat.Store(n.connectedAt.UnixNano())
	// The join token is proven: from here on lines are not rate-limited.
	log = c.log.With("remote_addr", remote, "node_id", n.id, "session_id", n.sessionID)

	if refusal := c.register(n, log); refusal != nil {
		if refusal.Code == protocol.CodeDuplicate {
			c.m.authFailures.WithLabelValues(reasonDuplicate).Inc()
			log.Warn("agent refused", "reason", reasonDuplicate, "err", refusal.Message)
		}
		ctrl.SetWriteDeadline(time.Now().Add(c.cfg.Tunnel.WriteTimeout))
		protocol.WriteJSONFrame(ctrl, protocol.FrameReject, refusal)
		return nil
	}
	defer func() {
		if !handedOff {
			c.deregister(n)
		}
	}()

	err = n.ctl.welcome(&protocol.Welcome{
		SessionID:           n.sessionID,
		CoordinatorID:       c.cfg.ID,
		HeartbeatIntervalMS: c.cfg.HeartbeatInterval.Milliseconds(),
		Limits:              protocol.Limits{MaxFrameSize: protocol.MaxFrameSize},
		Features:            c.welcomeFeatures(),
	})
	if err != nil {
		log.Warn("send welcome", "err", err)
		return nil
	}
	if cert != nil {
		log.Info("agent connected", "labels", n.hello.Labels, "agent_version", n.hello.AgentVersion,
			"cert_serial", cert.current(), "transport", transport)
	} else {
		log.Info("agent connected", "labels", n.hello.Labels, "agent_version", n.hello.AgentVersion, "auth", "shared_token")
	}
	handedOff = true
	return func(done func()) {
		r := &controlReader{c: c, n: n, st: ctrl}
		// OnClose first: whatever happens next, the session's end runs
		// done.
		sess.OnClose(func() {
			defer done()
			c.containConn("agent session end", ac, func() {
				defer ctrl.Close()
				defer c.deregister(n)
				c.logSessionEnd(ctx, sess, n, r.endErr(), log)
			})
		})
		sess.Watch(ctrl, func() {
			c.containConn("agent control stream", ac, func() {
				if err := r.drain(); err != nil {
					r.fail(err)
					sess.Close()
				}
			})
		})
	}
}

// logSessionEnd logs why an agent's session ended: err is what ended the
// control stream's reading, nil if the session closed first.
func (c *Coordinator) logSessionEnd(ctx context.Context, sess *tunnel.Session, n *node, err error, log *slog.Logger) {
	if serr := sess.Err(); errors.Is(serr, tunnel.ErrPeerSilent) {
		err = fmt.Errorf("node %s: read control stream: %w", n.id, serr) // says more than the closed stream
	}
	switch {
	case ctx.Err() != nil:
		log.Debug("agent session closed by shutdown")
	case errors.Is(err, tunnel.ErrPeerSilent):
		log.Warn("agent session dropped: the agent went silent", "err", err)
	case err == nil || errors.Is(err, io.EOF) || sess.IsClosed() && !isControlError(err):
		log.Info("agent disconnected", "err", err)
	default:
		log.Warn("agent session dropped", "err", err)
	}
}

// handshake accepts the control stream and checks its Hello. On failure the
// control stream, when there is one, is returned for the reject frame.
//
// The first frame may also be an Enroll (identity.go): then the agent is
// enrolled or refused, and the returned error's reason is reasonEnrolled
// or reasonEnroll. A Hello is authenticated by peer, the TLS client
// certificate, or by the deprecated shared token (authenticate); cert is
// what a certificate-authenticated session holds.
func (c *Coordinator) handshake(ctx context.Context, sess *tunnel.Session, deadline time.Time, peer *x509.Certificate, log *slog.Logger) (st *yamux.Stream, hello *protocol.Hello, cert *nodeCert, herr *handshakeError) {
	actx, cancel := context.WithDeadline(ctx, deadline)
	st, h, err := sess.Accept(actx)
	cancel()
	if err != nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
			return nil, nil, nil, refuse(reasonTimeout, "", fmt.Errorf("no control stream within %v: %w", c.cfg.HandshakeTimeout, err))
		case errors.Is(err, protocol.ErrVersion):
			return nil, nil, nil, refuse(reasonVersion, "", err) // Accept already answered
		default:
			return nil, nil, nil, refuse(reasonProtocol, "", fmt.Errorf("accept control stream: %w", err))
		}
	}
	c.m.streamsOpened.WithLabelValues(h.Kind.String()).Inc()
	if h.Kind != protocol.KindControl {
		return st, nil, nil, refuse(reasonProtocol, protocol.CodeBadRequest, fmt.Errorf("first stream is %s, want control", h.Kind))
	}
	if err := h.DecodeParams(&protocol.ControlParams{}); err != nil {
		return st, nil, nil, refuse(reasonProtocol, protocol.CodeBadRequest, err)
	}

	st.SetReadDeadline(deadline)
	fr := protocol.NewFrameReader(st)
	fr.Max = maxHelloSize
	f, err := fr.Next()
	st.SetReadDeadline(time.Time{})
	if err != nil {
		if isTimeout(err) {
			return st, nil, nil, refuse(reasonTimeout, "", fmt.Errorf("no hello within %v: %w", c.cfg.HandshakeTimeout, err))
		}
		return st, nil, nil, refuse(reasonProtocol, protocol.CodeBadHello, fmt.Errorf("read hello: %w", err))
	}
	if f.Type == protocol.FrameEnroll {
		return st, nil, nil, c.enroll(ctx, deadline, st, f.Payload, log)
	}
	if f.Type != protocol.FrameHello {
		return st, nil, nil, refuse(reasonProtocol, protocol.CodeBadHello, fmt.Errorf("got %s frame, want hello: %w", f.Type, protocol.ErrUnexpected))
	}
	hello = &protocol.Hello{}
	if err := protocol.DecodeJSON(f.Payload, hello); err != nil {
		return st, nil, nil, refuse(reasonBadHello, protocol.CodeBadHello, fmt.Errorf("decode hello: %w", err))
	}
	// Free-form fields are kept for listings: bound them.
	hello.AgentVersion = truncateAgentString(hello.AgentVersion)
	hello.Capacity.GPUModel = truncateAgentString(hello.Capacity.GPUModel)
	for i, t := range hello.Targets {
		hello.Targets[i] = truncateAgentString(t)
	}
	if !hello.HasFeature(protocol.FeatureSSH) {
		hello.SSHHostKey = nil // meaningless without SSH: not kept
	}
	token := hello.Token
	hello.Token = "" // never kept, never logged
	cert, herr = c.authenticate(peer, hello, token, log)
	if herr != nil {
		return st, hello, nil, herr
	}
	if err := hello.Validate(); err != nil {
		if errors.Is(err, protocol.ErrVersion) {
			return st, hello, nil, refuse(reasonVersion, protocol.CodeVersion, err)
		}
		return st, hello, nil, refuse(reasonBadHello, protocol.CodeBadHello, err)
	}
	return st, hello, cert, nil
}

// tokenOK compares token with the configured one in constant time. Both are
// hashed first so that not even the length leaks.
func (c *Coordinator) tokenOK(token string) bool {
	got := sha256.Sum256([]byte(token))
	want := sha256.Sum256([]byte(c.cfg.Token))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// register adds n to the registry. A node id that is already connected is
// taken over only by the same agent process (Hello.Instance: a reconnect that
// beat the old session's timeout) or when the old session missed two
// heartbeats, and in either case a session authenticated by a certificate
// only by another one (whose node id the certificate names: see
// authenticate); a certificate's holder takes over a session admitted by
// the shared token at once. Otherwise the newcomer is refused with CodeDuplicate, because
// two live agents with one node id would replace each other forever and
// jobs would run on whichever holds the id at the moment. It also refuses
// everything once the drain began. The returned ErrorInfo is the refusal.
func (c *Coordinator) register(n *node, log *slog.Logger) *protocol.ErrorInfo {
	if c.partitioned() {
		// Cut off from NATS while other coordinators serve (fleet.go shed).
		return &protocol.ErrorInfo{Code: protocol.CodeShutdown, Message: fmt.Sprintf("coordinator %s cannot reach NATS; connect to another coordinator", c.cfg.ID)}
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return &protocol.ErrorInfo{Code: protocol.CodeShutdown, Message: fmt.Sprintf("coordinator %s is shutting down", c.cfg.ID)}
	}
	old := c.nodes[n.id]
	if old != nil && n.cert == nil && old.cert != nil {
		// Whatever the old session's state: only a certificate's holder
		// may take over a certificate-authenticated node.
		c.mu.Unlock()
		return &protocol.ErrorInfo{Code: protocol.CodeDuplicate, Message: fmt.Sprintf(
			"node id %q is connected to coordinator %s with its certificate; an agent without it cannot replace that session", n.id, c.cfg.ID)}
	}
	// A certificate's holder replaces a session admitted by the shared
	// token at once; otherwise two live processes (different instances)
	// holding one node id, or one certificate, would replace each other
	// forever, so the newcomer waits until the old session missed two
	// heartbeats.
	takeover := n.cert != nil && old != nil && old.cert == nil
	if old != nil && old.hello.Instance != n.hello.Instance && !takeover {
		since := time.Since(time.Unix(0, old.lastHeartbeat.Load()))
		if since < 2*c.cfg.HeartbeatInterval {
			c.mu.Unlock()
			return &protocol.ErrorInfo{Code: protocol.CodeDuplicate, Message: fmt.Sprintf(
				"node id %q is already connected to coordinator %s from %s (another agent process, heard from %v ago); give each agent its own --node-id",
				n.id, c.cfg.ID, old.remoteAddr, since.Round(time.Millisecond))}
		}
	}
	c.nodes[n.id] = n
	c.m.agentsConnected.Set(float64(len(c.nodes)))
	c.mu.Unlock()
	c.nodeUp(n)
	c.fleetUp(n)
	if old != nil || n.hello.Reconnects > 0 {
		c.m.reconnects.Inc()
	}
	if old != nil {
		log.Warn("node id already connected: replacing the older session",
			"old_session_id", old.sessionID, "old_remote_addr", old.remoteAddr)
		old.sess.Close()
	}
	return nil
}

// deregister removes n from the registry unless a newer session replaced it.
func (c *Coordinator) deregister(n *node) {
	c.mu.Lock()
	removed := c.nodes[n.id] == n
	if removed {
		delete(c.nodes, n.id)
	}
	c.m.agentsConnected.Set(float64(len(c.nodes)))
	c.mu.Unlock()
	if removed {
		// A session replaced here by a newer one leaves its record alone:
		// the newer session's put superseded it.
		c.fleetDown(n)
	}
}

// controlFrameError marks an error of the control stream's content (a
// frame not allowed there, a malformed heartbeat), as opposed to its end.
type controlFrameError struct{ err error }

func (e *controlFrameError) Error() string { return e.err.Error() }
func (e *controlFrameError) Unwrap() error { return e.err }

func isControlError(err error) bool {
	var ce *controlFrameError
	return errors.As(err, &ce)
}

// controlBufSize is the buffer a control stream is read into: two of the
// largest frames, so that after the frames it holds are handled the start
// of the next one always leaves room to read more.
const controlBufSize = 2 * (maxHeartbeatSize + 5)

// controlBufPool holds control read buffers; one is borrowed for a drain
// and returned, so an idle session holds none.
var controlBufPool = sync.Pool{New: func() any { b := make([]byte, 0, controlBufSize); return &b }}

// controlReader reads an agent's control stream after Welcome without a
// goroutine of its own: the session runs drain whenever data came for the
// stream (tunnel.Session.Watch), never two at once. Between drains it holds
// only the start of a frame whose rest has not come (usually nothing). No
// deadline is set: the session's IdleTimeout (three heartbeat intervals)
// closes a session from which nothing arrives. Judging the whole session
// rather than this stream keeps a busy agent whose heartbeat waits behind
// a large frame from being taken for a dead one.
type controlReader struct {
	c       *Coordinator
	n       *node
	st      *yamux.Stream
	partial []byte // owned by drain (calls never overlap)

	mu  sync.Mutex
	err error // the first error that ended the reading
}

// drain handles every whole frame the stream holds and returns. Its error
// ends the session: the stream ended (io.EOF, or a frame cut short), or it
// carried a frame the control stream does not take.
func (r *controlReader) drain() error {
	bp := controlBufPool.Get().(*[]byte)
	buf := append((*bp)[:0], r.partial...)
	r.partial = nil
	defer func() {
		*bp = buf[:0]
		controlBufPool.Put(bp)
	}()
	for {
		got, rerr := tunnel.PollRead(r.st, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+got]
		off := 0
		for {
			f, m, err := protocol.ParseFrame(buf[off:], maxHeartbeatSize)
			if err != nil {
				return &controlFrameError{fmt.Errorf("node %s: read control stream: %w", r.n.id, err)}
			}
			if m == 0 {
				break
			}
			if err := r.c.controlFrame(r.n, f); err != nil {
				return err
			}
			off += m
		}
		buf = buf[:copy(buf, buf[off:])]
		if rerr != nil {
			if errors.Is(rerr, io.EOF) && len(buf) > 0 {
				rerr = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("node %s: read control stream: %w", r.n.id, rerr)
		}
		if got == 0 {
			break
		}
	}
	if len(buf) > 0 {
		r.partial = bytes.Clone(buf)
	}
	// yamux keeps a stream's receive buffer (grown to the largest burst)
	// once allocated; drop it now that it is empty, so that an idle
	// session holds none.
	r.st.Shrink()
	return nil
}

func (r *controlReader) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
}

func (r *controlReader) endErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// controlFrame handles one frame of n's control stream after Welcome. Its
// error (a *controlFrameError) ends the session.
func (c *Coordinator) controlFrame(n *node, f protocol.Frame) error {
	switch {
	case f.Type == protocol.FrameRenew && n.cert != nil:
		c.renew(n, f.Payload) // identity.go
	case f.Type == protocol.FrameSSHChannel && n.hello.HasFeature(protocol.FeatureSSH):
		c.sshChannelEvent(n, f.Payload) // ssh.go
	case f.Type == protocol.FrameJobExit && n.hello.HasFeature(protocol.FeatureJobExit):
		c.jobExitReport(n, f.Payload) // jobexit.go
	case f.Type != protocol.FrameHeartbeat:
		return &controlFrameError{fmt.Errorf("node %s: control stream: got %s frame, want heartbeat: %w", n.id, f.Type, protocol.ErrUnexpected)}
	default:
		var hb protocol.Heartbeat
		if err := protocol.DecodeJSON(f.Payload, &hb); err != nil {
			return &controlFrameError{fmt.Errorf("node %s: heartbeat: %w", n.id, err)}
		}
		n.lastHeartbeat.Store(time.Now().UnixNano())
		n.rttMicros.Store(hb.RTTMicros)
		if hb.RTTMicros > 0 {
			c.m.tunnelRTT.Observe(float64(hb.RTTMicros) / 1e6)
		}
		n.runningExecs.Store(int64(hb.RunningExecs))
		n.agentStalls.Store(hb.WindowStalls)
		n.agentStallMicros.Store(hb.WindowStallMicros)
		n.agentQueued.Store(hb.SendQueuedBytes)
	}
	return nil
}

// isTimeout reports whether err is a deadline expiry of a conn or stream.
func isTimeout(err error) bool {
	if errors.Is(err, yamux.ErrTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
