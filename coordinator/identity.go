package coordinator

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/enroll"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// Per-node identity: enrollment on the tunnel (an Enroll instead of a
// Hello), certificate authentication of Hellos, renewal on the control
// stream, revocation. The state shared by coordinators (join tokens,
// accepted serials, revocations) is in Config.Identities; the node CA is
// Config.NodeCA.

// Internal handshake outcomes (never metric labels).
const (
	reasonEnrolled = "enrolled" // the agent enrolled: close, it redials with its certificate
	reasonEnroll   = "enroll"   // the enrollment was refused (counted in enrollments_total)
)

// identityTimeout bounds one identity store operation on the handshake
// or control path.
const identityTimeout = 5 * time.Second

// nodeCert is what a session authenticated by its certificate holds: the
// serial (hex) of the certificate it currently holds, which a renewal on
// the session replaces (the agent proved it holds the new key by signing
// the CSR), so that the next renewal, after the first certificate
// expired, still finds it listed. mu is a leaf lock.
type nodeCert struct {
	mu     sync.Mutex
	serial string
}

func (nc *nodeCert) current() string {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	return nc.serial
}

func (nc *nodeCert) renewed(serial string) {
	nc.mu.Lock()
	nc.serial = serial
	nc.mu.Unlock()
}

// authenticate proves hello's node id: by peer, the TLS client
// certificate (it must chain to the node CA, be valid, name hello's node
// id and have a serial the identity store accepts), or, when the agent
// presented none, by the deprecated shared token, for a node id that is
// not enrolled. On success with a certificate the node's bound labels are
// laid over hello's.
func (c *Coordinator) authenticate(peer *x509.Certificate, hello *protocol.Hello, token string, log *slog.Logger) (*nodeCert, *handshakeError) {
	if peer != nil && c.cfg.NodeCA != nil {
		return c.checkCert(peer, hello)
	}
	if c.cfg.Token == "" {
		return nil, refuse(reasonCertRequired, protocol.CodeCertRequired, fmt.Errorf(
			"coordinator %s admits agents by certificate only and node %s presented none: enroll it with a join token (tether token create; tether agent --token-file)",
			c.cfg.ID, protocol.Clip(hello.NodeID)))
	}
	if token == "" {
		return nil, refuse(reasonNoToken, protocol.CodeAuth, errors.New("hello has no join token and the agent presented no certificate"))
	}
	if !c.tokenOK(token) {
		return nil, refuse(reasonBadToken, protocol.CodeAuth, errors.New("join token is not valid"))
	}
	if c.cfg.Identities != nil && c.cfg.Identities.Enrolled(hello.NodeID) {
		return nil, refuse(reasonCertRequired, protocol.CodeCertRequired, fmt.Errorf(
			"node %s is enrolled: only the holder of its certificate may register as it", protocol.Clip(hello.NodeID)))
	}
	log.Warn("agent admitted with the deprecated shared token; enroll it with a join token (tether token create) and drop --allow-shared-token",
		"node_id", hello.NodeID)
	return nil, nil
}

// checkCert verifies peer for hello (see authenticate).
func (c *Coordinator) checkCert(peer *x509.Certificate, hello *protocol.Hello) (*nodeCert, *handshakeError) {
	id, err := c.cfg.NodeCA.VerifyNode(peer, time.Now())
	switch {
	case errors.Is(err, tunnel.ErrCertExpired):
		return nil, refuse(reasonCertExpired, protocol.CodeCertRefused, fmt.Errorf("client certificate: %w; enroll again with a join token", err))
	case errors.Is(err, tunnel.ErrCertNoNode):
		return nil, refuse(reasonBadCert, protocol.CodeCertRefused, fmt.Errorf("client certificate: %w", err))
	case err != nil:
		return nil, refuse(reasonForeignCA, protocol.CodeCertRefused, fmt.Errorf("client certificate: %w", err))
	}
	if id != hello.NodeID {
		return nil, refuse(reasonWrongNode, protocol.CodeCertRefused, fmt.Errorf(
			"hello names node %s but the client certificate is node %s's", protocol.Clip(hello.NodeID), id))
	}
	serial := tunnel.SerialHex(peer)
	if err := c.cfg.Identities.CheckCert(id, serial); err != nil {
		reason := reasonUnknownCert
		if errors.Is(err, enroll.ErrCertRevoked) {
			reason = reasonRevoked
		}
		return nil, refuse(reason, protocol.CodeCertRefused, fmt.Errorf("client certificate: %w", err))
	}
	if rec, ok := c.cfg.Identities.Record(id); ok && len(rec.Labels) > 0 {
		if hello.Labels == nil {
			hello.Labels = map[string]string{}
		}
		maps.Copy(hello.Labels, rec.Labels) // the token's labels win
	}
	return &nodeCert{serial: serial}, nil
}

// enroll serves an Enroll (the payload of the control stream's first
// frame): it takes one use of the join token, signs the CSR and records
// the certificate, answers FrameEnrolled and returns reasonEnrolled; or
// refuses with reasonEnroll. Results are counted in
// tether_coordinator_enrollments_total.
func (c *Coordinator) enroll(ctx context.Context, deadline time.Time, st *yamux.Stream, payload []byte, log *slog.Logger) *handshakeError {
	refused := func(result, code string, err error) *handshakeError {
		c.m.enrollments.WithLabelValues(result).Inc()
		return refuse(reasonEnroll, code, err)
	}
	if c.cfg.NodeCA == nil {
		return refused(enrollBadRequest, protocol.CodeEnrollRefused, fmt.Errorf("coordinator %s does not enroll agents (it has no node CA)", c.cfg.ID))
	}
	var e protocol.Enroll
	if err := protocol.DecodeJSON(payload, &e); err != nil {
		return refused(enrollBadRequest, protocol.CodeEnrollRefused, fmt.Errorf("decode enroll: %w", err))
	}
	token := e.Token
	e.Token = ""
	if err := e.Validate(); err != nil {
		if errors.Is(err, protocol.ErrVersion) {
			return refused(enrollBadRequest, protocol.CodeVersion, err)
		}
		return refused(enrollBadRequest, protocol.CodeEnrollRefused, err)
	}
	csr, err := tunnel.ParseNodeCSR(e.CSR, e.NodeID)
	if err != nil {
		return refused(enrollBadRequest, protocol.CodeEnrollRefused, err)
	}
	store := c.cfg.Identities
	sctx, cancel := context.WithDeadline(ctx, deadline.Add(identityTimeout))
	defer cancel()
	tokenErr := func(err error) *handshakeError {
		switch {
		case errors.Is(err, enroll.ErrTokenUnknown):
			return refused(enrollBadToken, protocol.CodeEnrollRefused, err)
		case errors.Is(err, enroll.ErrTokenExpired):
			return refused(enrollTokenExpired, protocol.CodeEnrollRefused, err)
		case errors.Is(err, enroll.ErrTokenUsed):
			return refused(enrollTokenUsed, protocol.CodeEnrollRefused, err)
		}
		log.Error("enrollment: identity store failed", "node_id", e.NodeID, "err", err)
		return refused(enrollError, protocol.CodeInternal, fmt.Errorf("coordinator %s: cannot check the join token now; retry", c.cfg.ID))
	}
	shared := c.cfg.Token != "" && c.tokenOK(token)
	// The token is checked first, so that a peer without one learns
	// nothing (not even which node ids are enrolled); and the node id
	// before the token is used, so that a refused enrollment does not
	// burn a one-time token. Enroll below checks the node id again,
	// atomically.
	if !shared {
		if _, err := store.CheckToken(sctx, token); err != nil {
			return tokenErr(err)
		}
	}
	if store.Enrolled(e.NodeID) {
		return refused(enrollAlreadyEnrolled, protocol.CodeEnrollRefused, fmt.Errorf(
			"%w: node %s holds a certificate; revoke it first (tether node revoke %s) to enroll it again", enroll.ErrAlreadyEnrolled, e.NodeID, e.NodeID))
	}
	var tok enroll.Token
	if shared {
		// The deprecated shared token enrolls like a token of unlimited
		// uses created at the epoch: it cannot re-admit a revoked node.
		tok = enroll.Token{ID: "shared-token", UsesLeft: -1}
		log.Warn("agent enrolled with the deprecated shared token; mint join tokens (tether token create) and drop --allow-shared-token", "node_id", e.NodeID)
	} else if tok, err = store.RedeemToken(sctx, token); err != nil {
		return tokenErr(err)
	}
	cert, err := c.cfg.NodeCA.Sign(csr, e.NodeID, time.Now(), c.cfg.CertTTL)
	if err != nil {
		log.Error("enrollment: sign", "node_id", e.NodeID, "err", err)
		return refused(enrollError, protocol.CodeInternal, fmt.Errorf("coordinator %s: cannot sign the certificate", c.cfg.ID))
	}
	serial := tunnel.SerialHex(cert)
	if err := store.Enroll(sctx, e.NodeID, enroll.Serial{Serial: serial, NotAfter: cert.NotAfter}, tok); err != nil {
		switch {
		case errors.Is(err, enroll.ErrAlreadyEnrolled):
			return refused(enrollAlreadyEnrolled, protocol.CodeEnrollRefused, err)
		case errors.Is(err, enroll.ErrRevokedNode):
			return refused(enrollRevokedNode, protocol.CodeEnrollRefused, err)
		}
		log.Error("enrollment: identity store failed", "node_id", e.NodeID, "err", err)
		return refused(enrollError, protocol.CodeInternal, fmt.Errorf("coordinator %s: cannot record the certificate now; retry", c.cfg.ID))
	}
	// Counted once recorded, before the answer: what the agent sees has
	// been counted.
	c.m.enrollments.WithLabelValues(enrollOK).Inc()
	st.SetWriteDeadline(time.Now().Add(c.cfg.Tunnel.WriteTimeout))
	err = protocol.WriteJSONFrame(st, protocol.FrameEnrolled, &protocol.Enrolled{Certificate: cert.Raw, NotAfter: cert.NotAfter, Labels: tok.Labels})
	st.Close()
	if err != nil {
		// The certificate is recorded but never arrived: the node id is
		// taken until it is revoked or the certificate expires.
		log.Warn("enrollment: the certificate could not be sent", "node_id", e.NodeID, "cert_serial", serial, "err", err)
		return &handshakeError{reason: reasonEnrolled, err: err}
	}
	c.log.Info("agent enrolled", "node_id", e.NodeID, "cert_serial", serial, "cert_not_after", cert.NotAfter, "token_id", tok.ID, "labels", tok.Labels)
	return &handshakeError{reason: reasonEnrolled, err: errors.New("enrolled")}
}

// renew serves a Renew on n's control stream: a new certificate for the
// same node id, if n's current one is still accepted, answered with
// FrameRenewed, or FrameReject (the session goes on either way; a
// revoked node's session is closed by the revocation).
func (c *Coordinator) renew(n *node, payload []byte) {
	log := c.log.With("node_id", n.id, "session_id", n.sessionID)
	fail := func(msg string, err error) {
		c.m.enrollments.WithLabelValues(enrollRenewRefused).Inc()
		log.Warn("certificate renewal refused", "err", err)
		n.ctl.send(protocol.FrameReject, &protocol.ErrorInfo{Code: protocol.CodeCertRefused, Message: msg})
	}
	var r protocol.Renew
	if err := protocol.DecodeJSON(payload, &r); err != nil {
		fail(err.Error(), err)
		return
	}
	if len(r.CSR) == 0 || len(r.CSR) > protocol.MaxCSRSize {
		err := fmt.Errorf("renew: csr is %d bytes, want 1 to %d", len(r.CSR), protocol.MaxCSRSize)
		fail(err.Error(), err)
		return
	}
	csr, err := tunnel.ParseNodeCSR(r.CSR, n.id)
	if err != nil {
		fail(err.Error(), err)
		return
	}
	cert, err := c.cfg.NodeCA.Sign(csr, n.id, time.Now(), c.cfg.CertTTL)
	if err != nil {
		fail(fmt.Sprintf("coordinator %s cannot sign the certificate", c.cfg.ID), err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), identityTimeout)
	defer cancel()
	serial := tunnel.SerialHex(cert)
	old := n.cert.current()
	if err := c.cfg.Identities.Renew(ctx, n.id, old, enroll.Serial{Serial: serial, NotAfter: cert.NotAfter}); err != nil {
		fail(err.Error(), err)
		return
	}
	n.cert.renewed(serial)
	// Counted once recorded, before the answer: what the agent sees has
	// been counted.
	c.m.enrollments.WithLabelValues(enrollRenewed).Inc()
	rec, _ := c.cfg.Identities.Record(n.id)
	if err := n.ctl.send(protocol.FrameRenewed, &protocol.Enrolled{Certificate: cert.Raw, NotAfter: cert.NotAfter, Labels: rec.Labels}); err != nil {
		log.Warn("certificate renewed but not sent", "cert_serial", serial, "err", err)
		return
	}
	log.Info("certificate renewed", "cert_serial", serial, "cert_not_after", cert.NotAfter, "old_serial", old)
}

// send writes one frame on the control stream after Welcome, whatever the
// agent's features (the agent asked for it), waiting at most the write
// timeout. After a failed write nothing more is sent.
func (w *controlWriter) send(t protocol.FrameType, v any) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if !w.open {
		return errors.New("control stream: welcome not sent yet")
	}
	w.st.SetWriteDeadline(time.Now().Add(w.timeout))
	if err := protocol.WriteJSONFrame(w.st, t, v); err != nil {
		w.err = fmt.Errorf("write %s frame on the control stream: %w", t, err)
		return w.err
	}
	return nil
}

// startIdentityWatch makes every change of a node's identity record (a
// revocation here or on another coordinator) re-check that node's
// session.
func (c *Coordinator) startIdentityWatch() {
	if c.cfg.Identities != nil {
		c.cfg.Identities.OnChange(func(node string) { c.recheck(node) })
	}
}

// stopIdentityWatch undoes startIdentityWatch.
func (c *Coordinator) stopIdentityWatch() {
	if c.cfg.Identities != nil {
		c.cfg.Identities.OnChange(nil)
	}
}

// recheck closes node's session if its certificate is no longer accepted
// and reports whether it did.
func (c *Coordinator) recheck(node string) bool {
	c.mu.Lock()
	n := c.nodes[node]
	c.mu.Unlock()
	if n == nil || n.cert == nil {
		return false
	}
	err := c.cfg.Identities.CheckCert(node, n.cert.current())
	if err == nil {
		return false
	}
	c.log.Warn("closing the session of a node whose certificate is no longer accepted", "node_id", node, "session_id", n.sessionID, "err", err)
	n.sess.Close()
	return true
}

// handleTokenCreate mints a join token (admin only).
func (c *Coordinator) handleTokenCreate(req micro.Request) {
	if c.cfg.Identities == nil {
		c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeUnsupported, "coordinator %s has no per-node identity (no node CA)", c.cfg.ID))
		return
	}
	if _, e := c.authorizer().Authorize(req, policy.OpAdmin, nil, policy.Object{}); e != nil { // the rate budget, then the decision
		c.replyError(req, e)
		return
	}
	var r protocol.TokenCreateRequest
	if !c.decodeValid(req, &r) {
		return
	}
	ttl := time.Duration(r.TTLSeconds) * time.Second
	if ttl == 0 {
		ttl = protocol.DefaultTokenTTL
	}
	uses := r.Uses
	if uses == 0 {
		uses = protocol.DefaultTokenUse
	}
	who := "unidentified"
	if id, ok := caller.Of(req); ok {
		who = id.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), identityTimeout)
	defer cancel()
	token, t, err := c.cfg.Identities.CreateToken(ctx, ttl, uses, r.Labels, who)
	if err != nil {
		c.log.Error("create join token", "err", err)
		c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s cannot store the token now: %v", c.cfg.ID, err))
		return
	}
	c.log.Info("join token created", "token_id", t.ID, "expires_at", t.ExpiresAt, "uses", t.UsesLeft, "labels", t.Labels, "by", who)
	c.replyJSON(req, protocol.TokenCreateResponse{Token: token, ID: t.ID, ExpiresAt: t.ExpiresAt, Uses: t.UsesLeft, Labels: t.Labels},
		"a token", "raise the server's max_payload")
}

// handleNodeRevoke revokes a node's certificates and closes its session
// (admin only).
func (c *Coordinator) handleNodeRevoke(req micro.Request) {
	if c.cfg.Identities == nil {
		c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeUnsupported, "coordinator %s has no per-node identity (no node CA)", c.cfg.ID))
		return
	}
	if _, e := c.authorizer().Authorize(req, policy.OpAdmin, nil, policy.Object{}); e != nil { // the rate budget, then the decision
		c.replyError(req, e)
		return
	}
	var r protocol.NodeRevokeRequest
	if !c.decodeValid(req, &r) {
		return
	}
	// The session the node holds now: the bucket watcher may cut it
	// before recheck below looks (the revoke is a KV write it sees too).
	c.mu.Lock()
	before := c.nodes[r.Node]
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), identityTimeout)
	defer cancel()
	serials, err := c.cfg.Identities.Revoke(ctx, r.Node)
	if errors.Is(err, enroll.ErrNotEnrolled) {
		c.replyError(req, protocol.NewAPIError(404, protocol.ErrCodeNotFound, "%v", err))
		return
	}
	if err != nil {
		c.log.Error("revoke node", "node_id", r.Node, "err", err)
		c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s cannot revoke now: %v", c.cfg.ID, err))
		return
	}
	closed := c.recheck(r.Node)
	if !closed && before != nil && before.cert != nil {
		c.mu.Lock()
		now := c.nodes[r.Node]
		c.mu.Unlock()
		closed = now != before || before.sess.IsClosed()
	}
	who := "unidentified"
	if id, ok := caller.Of(req); ok {
		who = id.String()
	}
	c.log.Warn("node revoked", "node_id", r.Node, "serials", serials, "session_closed", closed, "by", who)
	if serials == nil {
		serials = []string{}
	}
	c.replyJSON(req, protocol.NodeRevokeResponse{Node: r.Node, Serials: serials, SessionClosed: closed}, "a revoke response", "raise the server's max_payload")
}
