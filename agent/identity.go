package agent

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"reflect"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// Per-node identity, the agent's side. An agent without a certificate
// enrolls with its join token (an Enroll on the control stream, see
// package protocol): it generates a key, sends a CSR, stores the
// certificate it receives (0600, in Config.IdentityDir) with the CA that
// verified the coordinator at that moment (pinned: from then on the
// coordinator's certificate must chain to it), closes the session and
// redials with the certificate, by which alone it then authenticates. At
// two thirds of the certificate's lifetime it renews it on the control
// stream, with a new key; the session goes on.

// loadIdentity reads the identity in Config.IdentityDir into a.ident; none
// there is not an error. A certificate of another node id is.
func (a *Agent) loadIdentity() error {
	if err := os.MkdirAll(a.cfg.IdentityDir, 0o700); err != nil {
		return fmt.Errorf("agent %s: create identity dir: %w", a.cfg.NodeID, err)
	}
	id, err := tunnel.LoadIdentity(a.cfg.IdentityDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("agent %s: %w", a.cfg.NodeID, err)
	}
	if got := id.NodeID(); got != a.cfg.NodeID {
		return fmt.Errorf("agent %s: the certificate in %s is node %s's: give --node-id %s, or another --identity-dir to enroll as %s",
			a.cfg.NodeID, a.cfg.IdentityDir, got, got, a.cfg.NodeID)
	}
	a.ident.Store(id)
	a.log.Info("loaded node certificate", "cert_serial", tunnel.SerialHex(id.Cert), "not_after", id.Cert.NotAfter, "pinned_ca", id.Pinned != nil)
	return nil
}

// needsEnrollment reports whether the next session must enroll: there is
// no certificate, it expired, or a coordinator refused it (revoked, say)
// and the agent has a join token to try (after one attempt, whatever its
// outcome, the certificate is tried again: a refusal may have been a
// coordinator's passing state).
func (a *Agent) needsEnrollment() bool {
	id := a.ident.Load()
	return id == nil || !time.Now().Before(id.Cert.NotAfter) || (a.certRefused.Load() && a.cfg.Token != "")
}

// tlsConfig is the client config of the next dial: Config.TLS, with the
// pinned CA as the only root once there is one, and the certificate.
func (a *Agent) tlsConfig() *tls.Config {
	tc := tunnel.TunedTLS(a.cfg.TLS)
	id := a.ident.Load()
	if id == nil {
		return tc
	}
	if id.Pinned != nil {
		pool := x509.NewCertPool()
		pool.AddCert(id.Pinned)
		tc.RootCAs = pool
	}
	if !a.needsEnrollment() {
		tc.Certificates = []tls.Certificate{*id.TLSCertificate()}
	}
	return tc
}

// enroll runs an enrollment session over conn (see the file comment). It
// returns nil when the certificate was stored (the redialer then dials the
// same coordinator again, with it), else why not.
func (a *Agent) enroll(ctx context.Context, conn net.Conn, addr string) error {
	a.certRefused.Store(false)
	if a.cfg.Token == "" {
		return fmt.Errorf("agent %s: no valid certificate in %s and no join token to enroll with: create one (tether token create) and give it with --token-file",
			a.cfg.NodeID, a.cfg.IdentityDir)
	}
	sess, err := tunnel.Client(conn, a.cfg.Tunnel)
	if err != nil {
		return fmt.Errorf("agent %s: tunnel to %s: %w", a.cfg.NodeID, addr, err)
	}
	defer sess.Close()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	key, err := tunnel.NewNodeKey()
	if err != nil {
		return fmt.Errorf("agent %s: generate key: %w", a.cfg.NodeID, err)
	}
	csr, err := tunnel.NewNodeCSR(key, a.cfg.NodeID)
	if err != nil {
		return fmt.Errorf("agent %s: certificate request: %w", a.cfg.NodeID, err)
	}
	hctx, cancel := context.WithTimeout(ctx, a.cfg.HandshakeTimeout)
	defer cancel()
	ctl, err := sess.Open(hctx, protocol.KindControl, protocol.ControlParams{})
	if err != nil {
		return fmt.Errorf("agent %s: open control stream to %s: %w", a.cfg.NodeID, addr, err)
	}
	f, err := a.exchange(ctl, protocol.FrameEnroll, &protocol.Enroll{ProtocolVersion: protocol.Version, Token: a.cfg.Token, NodeID: a.cfg.NodeID, CSR: csr})
	if err != nil {
		return fmt.Errorf("agent %s: enroll with %s: %w", a.cfg.NodeID, addr, err)
	}
	cert, labels, err := a.acceptCert(f, protocol.FrameEnrolled, key)
	if err != nil {
		err = fmt.Errorf("agent %s: enroll with %s: %w", a.cfg.NodeID, addr, err)
		if info := (*protocol.ErrorInfo)(nil); errors.As(err, &info) && permanentEnrollRefusal(info.Code) {
			a.m.enrollments.WithLabelValues("refused").Inc()
			a.log.Error("enrollment refused: no retry can succeed; stopping the agent: give it a new join token (tether token create) with --token-file, or, if the node id is enrolled already, revoke it first (tether node revoke)",
				"coordinator", addr, "code", info.Code, "reason", info.Message, "exit_status", ExitEnrollRefused)
			return tunnel.Permanent(&enrollRefusedError{node: a.cfg.NodeID, addr: addr, info: info})
		}
		return err
	}
	id := &tunnel.Identity{Cert: cert, Key: key}
	if old := a.ident.Load(); old != nil && old.Pinned != nil {
		id.Pinned = old.Pinned
	} else if tc, ok := conn.(interface{ ConnectionState() tls.ConnectionState }); ok {
		id.Pinned = tunnel.PinnedRoot(tc.ConnectionState())
	}
	if err := tunnel.SaveIdentity(a.cfg.IdentityDir, id); err != nil {
		return fmt.Errorf("agent %s: %w", a.cfg.NodeID, err)
	}
	a.ident.Store(id)
	a.m.enrollments.WithLabelValues("enrolled").Inc()
	a.log.Info("enrolled: node certificate stored", "coordinator", addr, "cert_serial", tunnel.SerialHex(cert),
		"not_after", cert.NotAfter, "identity_dir", a.cfg.IdentityDir, "bound_labels", labels, "pinned_ca", id.Pinned != nil)
	// Leave the session up until the coordinator ends the control stream
	// (it closes it right after the certificate): its yamux write of the
	// frame reports the session's shutdown if that comes first, even for
	// bytes we read, and the coordinator then logs a delivered certificate
	// as "could not be sent". Bounded: a coordinator that keeps the stream
	// open delays the redial by enrollEndWait at most.
	ctl.SetReadDeadline(time.Now().Add(enrollEndWait))
	_, _ = io.Copy(io.Discard, io.LimitReader(ctl, 64<<10))
	return nil
}

// enrollRefusedError is a permanent enrollment refusal, said once:
// "agent N: enrollment refused by ADDR: REASON (CODE)", not "enrollment
// refused: agent N: enroll with ADDR: refused: CODE: REASON". It is
// ErrEnrollRefused (errors.Is) and unwraps to the coordinator's reject.
type enrollRefusedError struct {
	node, addr string
	info       *protocol.ErrorInfo
}

func (e *enrollRefusedError) Error() string {
	return fmt.Sprintf("agent %s: enrollment refused by %s: %s (%s)", e.node, e.addr, e.info.Message, e.info.Code)
}
func (e *enrollRefusedError) Is(target error) bool { return target == ErrEnrollRefused }
func (e *enrollRefusedError) Unwrap() error        { return e.info }

// enrollEndWait is how long enroll waits, after storing its certificate,
// for the coordinator to end the control stream.
const enrollEndWait = 2 * time.Second

// ErrEnrollRefused is what Run returns when a coordinator refused the
// agent's enrollment for good (protocol.CodeEnrollRefused: the join token
// is unknown, expired or used up, the node id is enrolled already or
// revoked, the request is bad; protocol.CodeVersion): redialing with the
// same token cannot succeed, so the agent stops rather than retry forever.
// A refusal the coordinator says is passing (CodeInternal: its store is
// unavailable) is retried with the usual backoff.
var ErrEnrollRefused = errors.New("enrollment refused")

// ExitEnrollRefused is the exit status tether agent ends with on
// ErrEnrollRefused: EX_CONFIG of sysexits.h, which the systemd unit
// (RestartPreventExitStatus) does not restart.
const ExitEnrollRefused = 78

// permanentEnrollRefusal reports whether a reject of an Enroll with code
// is one no retry with the same token can change.
func permanentEnrollRefusal(code string) bool {
	return code == protocol.CodeEnrollRefused || code == protocol.CodeVersion
}

// exchange writes one JSON frame on ctl and reads the answer, both within
// the handshake timeout.
func (a *Agent) exchange(ctl *yamux.Stream, t protocol.FrameType, v any) (protocol.Frame, error) {
	deadline := time.Now().Add(a.cfg.HandshakeTimeout)
	ctl.SetWriteDeadline(deadline)
	writeErr := protocol.WriteJSONFrame(ctl, t, v)
	ctl.SetWriteDeadline(time.Time{})
	ctl.SetReadDeadline(deadline)
	f, err := protocol.NewFrameReader(ctl).Next()
	ctl.SetReadDeadline(time.Time{})
	if err != nil && writeErr != nil {
		return f, fmt.Errorf("send %s: %w", t, writeErr)
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return f, err
}

// acceptCert checks an Enrolled payload in f (of type want, or a reject):
// a certificate of this node for key.
func (a *Agent) acceptCert(f protocol.Frame, want protocol.FrameType, key crypto.Signer) (*x509.Certificate, map[string]string, error) {
	switch f.Type {
	case want:
	case protocol.FrameReject:
		info := &protocol.ErrorInfo{}
		if err := protocol.DecodeJSON(f.Payload, info); err != nil {
			return nil, nil, fmt.Errorf("reject: %w", err)
		}
		return nil, nil, fmt.Errorf("refused: %w", info)
	default:
		return nil, nil, fmt.Errorf("%w: got %s frame, want %s or reject", protocol.ErrUnexpected, f.Type, want)
	}
	var e protocol.Enrolled
	if err := protocol.DecodeJSON(f.Payload, &e); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(e.Certificate)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate: %w", err)
	}
	if id, err := tunnel.NodeIDOf(cert); err != nil || id != a.cfg.NodeID {
		return nil, nil, fmt.Errorf("the coordinator sent a certificate for node %q (%v), not %s", id, err, a.cfg.NodeID)
	}
	if pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(key.Public()) {
		return nil, nil, fmt.Errorf("the coordinator sent a certificate for another key (%s)", reflect.TypeOf(cert.PublicKey))
	}
	return cert, e.Labels, nil
}

// renewLoop renews the session's certificate at two thirds of its
// lifetime (retrying every tenth of it, at most every minute, after a
// failure), until ctx ends. replies carries the coordinator's answers
// from the control reader. Each renewal writes a Renew on ctl.
func (a *Agent) renewLoop(ctx context.Context, ctl *yamux.Stream, replies <-chan protocol.Frame, log *slog.Logger) {
	for {
		id := a.ident.Load()
		if id == nil {
			return
		}
		life := id.Cert.NotAfter.Sub(id.Cert.NotBefore)
		retry := min(life/10, time.Minute)
		t := time.NewTimer(time.Until(id.RenewAt()))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if err := a.renewOnce(ctx, ctl, replies, id); err != nil {
			if ctx.Err() != nil {
				return
			}
			a.m.enrollments.WithLabelValues("renew_failed").Inc()
			log.Warn("certificate renewal failed; retrying", "err", err, "retry_in", retry, "not_after", id.Cert.NotAfter)
			t := time.NewTimer(retry)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		nid := a.ident.Load()
		a.m.enrollments.WithLabelValues("renewed").Inc()
		log.Info("certificate renewed", "cert_serial", tunnel.SerialHex(nid.Cert), "not_after", nid.Cert.NotAfter)
	}
}

// renewOnce sends one Renew and stores the renewed certificate.
func (a *Agent) renewOnce(ctx context.Context, ctl *yamux.Stream, replies <-chan protocol.Frame, id *tunnel.Identity) error {
	key, err := tunnel.NewNodeKey()
	if err != nil {
		return err
	}
	csr, err := tunnel.NewNodeCSR(key, a.cfg.NodeID)
	if err != nil {
		return err
	}
	if err := a.writeControl(ctl, protocol.FrameRenew, &protocol.Renew{CSR: csr}); err != nil {
		return fmt.Errorf("send renew: %w", err)
	}
	t := time.NewTimer(a.cfg.HandshakeTimeout)
	defer t.Stop()
	var f protocol.Frame
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("no answer to the renewal within %v", a.cfg.HandshakeTimeout)
	case f = <-replies:
	}
	cert, _, err := a.acceptCert(f, protocol.FrameRenewed, key)
	if err != nil {
		return err
	}
	nid := &tunnel.Identity{Cert: cert, Key: key, Pinned: id.Pinned}
	if err := tunnel.SaveIdentity(a.cfg.IdentityDir, nid); err != nil {
		return err
	}
	a.ident.Store(nid)
	return nil
}
