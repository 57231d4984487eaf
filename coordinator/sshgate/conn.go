package sshgate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/internal/admission"
	"github.com/tetherfleet/tether/internal/countcopy"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// SessionMessage is the reason text of a rejected "session" channel: what
// a user who ran ssh against the jump host itself reads.
const SessionMessage = "this is the Tether SSH jump host: it runs no shell or command; reach a node through it with ssh -J THIS-HOST NODE (or ProxyJump)"

// connState is one client connection.
type connState struct {
	g      *Gate
	conn   net.Conn
	remote net.Addr

	triedKey    atomic.Bool       // a key was offered in the handshake
	lastRefusal string            // why the last key was refused; set by the handshake's callbacks, which run in serve's goroutine
	ticket      *admission.Ticket // its pre-auth place; Evicted when cut for another source
	authed      bool              // guarded by g.mu
	proven      proven
	user        string // the SSH user name the client sent (logged, not used)
	channels    atomic.Int32
	wg          sync.WaitGroup // the channel goroutines
	done        chan struct{}  // closed when the client connection ended
	revoked     atomic.Bool    // Recheck closed it: its key is no longer trusted

	mu   sync.Mutex            // guards live; a leaf
	live map[*channel]struct{} // the channels joined to a node, for Recheck
}

// serve runs the connection: admission, handshake, then its channels until
// the client disconnects or the gate closes.
func (cs *connState) serve() {
	g := cs.g
	defer g.wg.Done()
	defer g.forget(cs)
	defer cs.conn.Close()
	defer g.guard.Recover("ssh connection", nil)

	cs.ticket = admission.NewTicket(cs.remote, cs)
	victim, refused := g.adm.Enter(cs.ticket)
	if refused != "" {
		g.m.connections.WithLabelValues(refused).Inc()
		if g.preauthLog.Allow() {
			g.log.Warn("ssh connection refused before its handshake (each one counted in tether_ssh_connections_total)",
				"remote", cs.remote, "reason", refused, "max_handshakes", g.cfg.MaxHandshakes, "max_handshakes_per_source", g.cfg.MaxHandshakesPerSource)
		}
		return
	}
	if victim != nil {
		victim.Owner.(*connState).conn.Close()
	}
	deadline := time.Now().Add(g.cfg.HandshakeTimeout)
	cs.conn.SetDeadline(deadline)
	rb := &readBuffered{Conn: cs.conn}
	sconn, chans, reqs, err := ssh.NewServerConn(rb, g.serverConfig(cs))
	g.adm.Leave(cs.ticket)
	if err != nil {
		result := connHandshake
		switch {
		case cs.ticket.Evicted():
			result = connEvicted
		case errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(deadline):
			result = connTimeout
		case cs.triedKey.Load():
			result = connAuthFailed
		}
		if result == connAuthFailed {
			cs.auditAuthFailure()
		}
		g.m.connections.WithLabelValues(result).Inc()
		g.log.Debug("ssh handshake failed", "remote", cs.remote, "result", result, "err", err)
		return
	}
	// Once authenticated, the connection's end (the client's, the gate's
	// Close, a contained panic) ends its channels: done tells their
	// splices, which close their node streams.
	defer func() {
		sconn.Close()
		close(cs.done)
		cs.wg.Wait()
	}()
	cs.conn.SetDeadline(time.Time{})
	rb.buffer()
	pr, err := provenOf(sconn.Permissions)
	if err != nil {
		g.m.connections.WithLabelValues(connInternalErr).Inc()
		g.log.Error("ssh connection closed: its authentication is inconsistent", "remote", cs.remote, "err", err)
		return
	}
	cs.proven, cs.user = pr, sconn.User()
	g.mu.Lock()
	cs.authed = true
	g.mu.Unlock()
	g.m.connections.WithLabelValues(connOK).Inc()
	g.log.Debug("ssh client authenticated", "remote", cs.remote, "identity", pr.id.String(), "user", cs.user)
	// A reload that put new keys in force during the handshake rechecked
	// the connections authenticated then, not this one: check it here.
	g.recheckConn(cs)
	if stop := g.expiry(cs); stop != nil {
		defer stop()
	}

	cs.wg.Add(1)
	go func() {
		defer cs.wg.Done()
		defer g.guard.Recover("ssh global requests", func(*panics.Error) { sconn.Close() })
		for r := range reqs {
			// tcpip-forward (ssh -R), keepalives and the rest: the jump host
			// serves none.
			g.m.globalReqs.Inc()
			if r.WantReply {
				r.Reply(false, nil)
			}
		}
	}()
	for nc := range chans {
		cs.dispatch(nc)
	}
}

// auditAuthFailure records the one audit event of a connection that
// offered keys and had none accepted: no identity, reason
// unauthenticated, the client's address (Source, and in the error) and
// the last key's refusal as the error. (Connections that offered no key —
// scanners, timeouts, floods — are counted only.)
func (cs *connState) auditAuthFailure() {
	why := cs.lastRefusal
	if why == "" {
		why = "no key offered was accepted"
	}
	cs.g.cfg.Auditor.Record(&protocol.AuditEvent{
		Operation: policy.OpSSH.String(),
		Method:    "auth",
		Result:    protocol.AuditRefused,
		Reason:    "unauthenticated",
		Source:    cs.source(),
		Error:     clipAudit(fmt.Sprintf("from %s: %s", cs.remote, why)),
	})
}

// source is the connection's AuditEvent.Source: the TCP peer as the
// gate's listener accepted it ("IP:PORT"), "" when unknown.
func (cs *connState) source() string {
	if cs.remote == nil {
		return ""
	}
	return cs.remote.String()
}

// dispatch answers one channel open.
func (cs *connState) dispatch(nc ssh.NewChannel) {
	g := cs.g
	switch nc.ChannelType() {
	case "direct-tcpip":
	case "session":
		g.m.channels.WithLabelValues(chanSession).Inc()
		nc.Reject(ssh.Prohibited, SessionMessage)
		return
	default:
		g.m.channels.WithLabelValues(chanUnsupported).Inc()
		nc.Reject(ssh.UnknownChannelType, fmt.Sprintf("channel type %s is not served: the Tether jump host opens direct-tcpip to NODE:22 only", clipString(nc.ChannelType(), 40)))
		return
	}
	if int(cs.channels.Add(1)) > g.cfg.MaxChannelsPerConn {
		cs.channels.Add(-1)
		g.m.channels.WithLabelValues(chanLimit).Inc()
		nc.Reject(ssh.ResourceShortage, fmt.Sprintf("this connection has %d channels open, the most the jump host allows", g.cfg.MaxChannelsPerConn))
		return
	}
	cs.wg.Add(1)
	go func() {
		defer cs.wg.Done()
		defer cs.channels.Add(-1)
		ch := &channel{cs: cs, nc: nc, start: time.Now()}
		defer g.guard.Recover("ssh direct-tcpip", func(*panics.Error) { ch.fail(chanError, "", "internal error") })
		ch.run()
	}()
}

// directTCPIP is a direct-tcpip channel's extra data (RFC 4254 §7.2).
type directTCPIP struct {
	Host       string
	Port       uint32
	OriginHost string
	OriginPort uint32
}

// channel is one direct-tcpip channel, from its open to its end.
type channel struct {
	cs    *connState
	nc    ssh.NewChannel
	start time.Time
	ev    protocol.AuditEvent
	done  bool // answered and audited

	// What the stream to the node was vouched at the open, set before the
	// channel is registered for Recheck (cs.live) and read-only then.
	node    policy.Node
	logins  []string // SSHParams.Logins
	targets []string // SSHParams.Targets
	// cut is closed by revoke: the splice then closes both ends.
	cut     chan struct{}
	revoked atomic.Pointer[string] // why revoke cut it
}

// run decides, opens and splices the channel, and audits it.
func (ch *channel) run() {
	g, cs := ch.cs.g, ch.cs
	ch.ev = protocol.AuditEvent{
		Operation: policy.OpSSH.String(),
		Method:    "connect",
		Identity:  cs.proven.id.String(),
		Source:    cs.source(),
	}
	var req directTCPIP
	if err := ssh.Unmarshal(ch.nc.ExtraData(), &req); err != nil {
		ch.reject(chanBadTarget, ssh.ConnectionFailed, protocol.ErrCodeMalformed, "", "malformed direct-tcpip request")
		return
	}
	name := strings.TrimSuffix(req.Host, protocol.SSHHostSuffix)
	ch.ev.Target = clipAudit(req.Host + ":" + fmt.Sprint(req.Port))
	if req.Port != 22 {
		ch.reject(chanBadTarget, ssh.Prohibited, protocol.ErrCodeInvalid, "",
			fmt.Sprintf("port %d refused: the jump host joins ssh to a node's SSH server, NODE:22 or NODE%s:22, only", req.Port, protocol.SSHHostSuffix))
		return
	}
	if protocol.ValidNodeID(name) != nil {
		ch.reject(chanError, ssh.ConnectionFailed, protocol.ErrCodeUnknownNode, "", "unknown node "+clipString(req.Host, 80))
		return
	}
	ch.ev.Nodes = []string{name}
	if err := stillTrusted(g.keys.Load(), cs.proven.key, g.cfg.Now(), g.cfg.ClockSkew); err != nil {
		ch.reject(chanRefused, ssh.Prohibited, protocol.ErrCodeUnauthenticated, "unauthenticated", err.Error())
		return
	}
	node, known := g.cfg.Nodes.Node(name)
	if known {
		name = node.ID // its own case: OpenSSH lowercases host names
		ch.ev.Nodes = []string{name}
	}
	if !known {
		// An unknown node is decided as a node without labels: a caller
		// whose rules would not grant ssh on it gets the policy's refusal,
		// the answer it would get for an existing unlabelled node it may
		// not use, so that probing tells it nothing about the fleet. Only
		// a caller the policy would let in there learns the node is
		// unknown.
		node = policy.Node{ID: name}
	}
	grants, err := g.cfg.Policy.Grants(cs.proven.id, policy.OpSSH, node)
	if err != nil {
		var r *policy.Refusal
		if errors.As(err, &r) {
			code := protocol.ErrCodeForbidden
			if r.Reason == policy.ReasonRateLimit || r.Reason == policy.ReasonJobLimit {
				code = protocol.ErrCodeRateLimited
			}
			ch.reject(chanRefused, ssh.Prohibited, code, r.Reason.String(), r.Error())
			return
		}
		g.log.Error("ssh policy decision failed", "identity", ch.ev.Identity, "node", name, "err", err)
		ch.reject(chanError, ssh.ConnectionFailed, protocol.ErrCodeInternal, "", "the policy could not decide")
		return
	}
	if !known {
		ch.reject(chanError, ssh.ConnectionFailed, protocol.ErrCodeUnknownNode, "",
			fmt.Sprintf("unknown node %s: no node of this id is connected and serving SSH", name))
		return
	}
	logins, rules := loginsOf(grants)
	ch.ev.RunAs = clipN(strings.Join(logins, ", "), protocol.MaxAuditProgramLen)
	ch.ev.Rule = clipAudit(strings.Join(rules, "; "))
	if len(logins) == 0 {
		ch.reject(chanRefused, ssh.Prohibited, protocol.ErrCodeForbidden, policy.ReasonNoRule.String(), "the policy grants ssh on "+name+" as no login")
		return
	}
	var targets []string
	if fwd, err := g.cfg.Policy.Peek(cs.proven.id, policy.OpForward, node); err == nil {
		targets = targetsOf(fwd)
	} else if !errors.Is(err, policy.ErrRefused) {
		g.log.Warn("ssh forward grants not decided: no port forwarding", "identity", ch.ev.Identity, "node", name, "err", err)
	}
	params := protocol.SSHParams{
		Session:   newSession(),
		Identity:  ch.ev.Identity,
		Logins:    logins,
		Targets:   targets,
		Auth:      protocol.SSHAuthPublicKey,
		PublicKey: cs.proven.key.Marshal(),
	}
	ch.ev.Session = params.Session
	if hk := g.cfg.Nodes.HostKey(name); hk != nil {
		cert, err := g.ca.Certify(name, hk)
		if err != nil {
			g.log.Warn("node host key not certified: clients that check host keys by the CA will refuse it", "node", name, "err", err)
		} else {
			params.HostCertificate = cert
		}
	}
	if err := params.Validate(); err != nil {
		g.log.Error("ssh params invalid", "node", name, "identity", ch.ev.Identity, "err", err)
		ch.reject(chanError, ssh.ConnectionFailed, protocol.ErrCodeInternal, "", "the jump host could not build the stream's parameters for "+name)
		return
	}
	// The open ends early when the gate closes or the client goes away.
	// Its ctx names the client for the node's channel events (SourceOf).
	ctx, cancel := context.WithTimeout(WithSource(g.ctx, cs.source()), g.cfg.OpenTimeout)
	go func() {
		select {
		case <-cs.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := g.cfg.Nodes.OpenSSH(ctx, name, params)
	cancel()
	if err != nil {
		var info *protocol.ErrorInfo
		if errors.As(err, &info) && info.Code == protocol.CodeForbidden {
			ch.reject(chanRefused, ssh.Prohibited, info.Code, protocol.AuditReasonLocalPolicy, "node "+name+": "+info.Message)
			return
		}
		code := protocol.ErrCodeUnavailable
		if info != nil {
			code = info.Code
		}
		g.log.Warn("ssh stream to node not opened", "node", name, "identity", ch.ev.Identity, "err", err)
		ch.reject(chanError, ssh.ConnectionFailed, code, "", "node "+name+": "+clipN(err.Error(), 200))
		return
	}
	sch, reqs, err := ch.nc.Accept()
	if err != nil {
		conn.Close()
		ch.fail(chanError, protocol.ErrCodeUnavailable, "the client went away before the channel opened")
		return
	}
	go ssh.DiscardRequests(reqs)
	ch.node, ch.logins, ch.targets, ch.cut = node, logins, params.Targets, make(chan struct{})
	cs.track(ch)
	defer cs.untrack(ch)
	// A reload that applied a new policy after this channel's decision
	// and rechecked before it was tracked did not see it: check it here.
	g.recheckChannel(ch)
	in, out, err := splice(sch, conn, g.m, cs.done, ch.cut)
	ch.ev.BytesIn, ch.ev.BytesOut = in, out
	if why := ch.revoked.Load(); why != nil {
		ch.ev.Reason = protocol.AuditReasonRevoked
		ch.ev.ErrorCode = protocol.ErrCodeForbidden
		ch.ev.Error = clipAudit(*why)
		ch.finish(chanRevoked, protocol.AuditFailed)
		return
	}
	if err != nil {
		g.log.Debug("ssh splice ended with an error", "node", name, "session", params.Session, "err", err)
		ch.fail(chanError, protocol.ErrCodeUnavailable, "")
		return
	}
	ch.finish(chanOK, protocol.AuditOK)
}

// reject rejects the channel with the SSH reason and message (what the
// client's user reads), and audits it: refused for chanRefused, error
// otherwise.
func (ch *channel) reject(result string, reason ssh.RejectionReason, code, auditReason, msg string) {
	ch.nc.Reject(reason, msg)
	ch.ev.Reason = auditReason
	ch.ev.ErrorCode = code
	ch.ev.Error = clipAudit(msg)
	if result == chanRefused {
		ch.finish(result, protocol.AuditRefused)
	} else {
		ch.finish(result, protocol.AuditError)
	}
}

// fail audits an accepted channel that ended in error.
func (ch *channel) fail(result, code, msg string) {
	ch.ev.ErrorCode = code
	if msg != "" {
		ch.ev.Error = clipAudit(msg)
	}
	ch.finish(result, protocol.AuditError)
}

// finish counts and audits the channel, once.
func (ch *channel) finish(result, audit string) {
	if ch.done {
		return
	}
	ch.done = true
	g := ch.cs.g
	g.m.channels.WithLabelValues(result).Inc()
	ch.ev.Result = audit
	ch.ev.DurationMS = float64(time.Since(ch.start).Microseconds()) / 1000
	g.cfg.Auditor.Record(&ch.ev)
}

// loginsOf returns the grants' logins, sorted and without repeats, and
// their rules, in grant order without repeats.
func loginsOf(grants []policy.Grant) (logins, rules []string) {
	for _, gr := range grants {
		if gr.RunAs != "" {
			logins = append(logins, gr.RunAs)
		}
		if r := gr.Rule(); r != "" && !slices.Contains(rules, r) {
			rules = append(rules, r)
		}
	}
	slices.Sort(logins)
	return slices.Compact(logins), rules
}

// targetsOf returns the forward grants' targets, sorted, without repeats,
// at most protocol.MaxSSHTargets.
func targetsOf(grants []policy.Grant) []string {
	out := allTargets(grants)
	if len(out) > protocol.MaxSSHTargets {
		out = out[:protocol.MaxSSHTargets]
	}
	return out
}

// allTargets returns the forward grants' targets, sorted, without
// repeats.
func allTargets(grants []policy.Grant) []string {
	var out []string
	for _, gr := range grants {
		out = append(out, gr.Targets...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// newSession returns 32 random lowercase hex digits.
func newSession() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func clipAudit(s string) string { return clipN(s, protocol.MaxAuditErrorLen) }

// clipN cuts s to at most n bytes, on a UTF-8 boundary.
func clipN(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && s[len(s)-1]&0xC0 == 0x80 {
		s = s[:len(s)-1]
	}
	if len(s) > 0 && s[len(s)-1] >= 0xC0 {
		s = s[:len(s)-1]
	}
	return s
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// closeWriter is a conn that can half-close (TCP, a yamux stream).
type closeWriter interface{ CloseWrite() error }

// splice copies bytes both ways between the client's channel and the
// node's stream until both directions end, counting them (in: client to
// node) into m as they pass. An end of file is passed on as a half-close
// where the far side can take one (the channel's EOF; CloseWrite on the
// stream); a stream that cannot half-close is closed when the client's side
// ends, since the client sends EOF only when it is done. When stop is
// closed (the client connection ended, or the gate closes) or cut is (the
// channel was revoked) both ends are closed at once, so that a node that
// does not close after a half-close cannot hold the splice. It closes both
// ends before returning, and returns the first error that was not an end
// of file or a close.
func splice(ch ssh.Channel, conn net.Conn, m *metrics, stop, cut <-chan struct{}) (in, out int64, err error) {
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-stop:
			conn.Close()
			ch.Close()
		case <-cut:
			conn.Close()
			ch.Close()
		case <-finished:
		}
	}()
	var once sync.Once
	var first error
	record := func(e error) {
		if e != nil && !isClosed(e) {
			once.Do(func() { first = e })
		}
	}
	cw, halfClose := conn.(closeWriter)
	inC := m.bytes.WithLabelValues("in")
	outC := m.bytes.WithLabelValues("out")
	upDone := make(chan struct{})
	go func() {
		defer close(upDone)
		n, e := copyFromChannel(conn, ch, inC)
		in = n
		record(e)
		if e == nil && halfClose {
			record(cw.CloseWrite())
			return
		}
		conn.Close()
	}()
	n, e := copyCounting(ch, conn, outC)
	out = n
	record(e)
	if e == nil {
		record(ch.CloseWrite())
	}
	if e != nil || !halfClose {
		// The stream is over both ways: end the channel so that the
		// upstream copy's read returns.
		ch.Close()
	}
	<-upDone
	ch.Close()
	conn.Close()
	return in, out, first
}

// copyCounting copies src to dst until src's EOF (a nil error), adding
// every chunk written to c. An SSH channel's Read returns every packet
// already buffered (up to the channel window, 2 MiB), so the copy's
// buffer grows to 256 KiB under bulk (countcopy.CopyPooled), turning
// 32 KiB packets into few large writes to the tunnel stream (each write
// costs a yamux frame and its TLS records), and stays at 32 KiB while the
// channel is interactive or idle.
func copyCounting(dst io.Writer, src io.Reader, c countcopy.Counter) (int64, error) {
	return countcopy.CopyPooled(dst, src, c)
}

// copyFromChannel is copyCounting from the client's channel to the node's
// stream: under bulk it reads the channel up to 1 MiB at once, so that
// the client gets a window adjust (a packet encrypted, written and
// decrypted) per MiB rather than per 256 KiB read, and writes the stream
// in 256 KiB frames still (countcopy.CopyFromChannel).
func copyFromChannel(dst io.Writer, src io.Reader, c countcopy.Counter) (int64, error) {
	return countcopy.CopyFromChannel(dst, src, c)
}
