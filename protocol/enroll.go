package protocol

import (
	"fmt"
	"time"
)

// Enrollment on the tunnel (see the package doc, control stream).
//
// An agent that holds a join token but no certificate opens the control
// stream and sends [FrameEnroll] instead of [FrameHello]: its node id, the
// token and a PKCS #10 certificate signing request for a key it generated.
// The coordinator answers [FrameEnrolled] with a certificate from its node
// CA naming the node id (URI SAN "urn:tether:node:<id>", CN the id), or
// [FrameReject]; either way it then closes the session. The agent stores
// the certificate and redials: from then on the TLS client certificate is
// its identity, and Hello.NodeID must equal the certificate's.
//
// An agent whose session was authenticated by its certificate renews it on
// the control stream after Welcome: it sends [FrameRenew] (a CSR, usually
// for a new key) and the coordinator answers [FrameRenewed] (an Enrolled
// payload) or, if the renewal is refused, [FrameReject] on the same stream
// without ending the session. The session goes on with the old certificate;
// the new one is used from the next dial.

// Enroll is the payload of FrameEnroll.
type Enroll struct {
	// ProtocolVersion is the agent's Version.
	ProtocolVersion int `json:"protocol_version"`
	// Token is the join token (tether token create). It is never logged.
	Token string `json:"token"`
	// NodeID is the node id the certificate will name (ValidNodeID).
	NodeID string `json:"node_id"`
	// CSR is the DER of a PKCS #10 request whose subject CN is NodeID,
	// signed by the agent's new key (ECDSA P-256 or Ed25519).
	CSR []byte `json:"csr"`
}

// MaxCSRSize bounds Enroll.CSR and Renew.CSR, in bytes (a P-256 request is
// about 250).
const MaxCSRSize = 2 << 10

// Validate reports the first problem with e's fields. It does not check
// the token or parse the CSR.
func (e *Enroll) Validate() error {
	if e.ProtocolVersion != Version {
		return fmt.Errorf("enroll: %w: agent speaks %d, coordinator %d", ErrVersion, e.ProtocolVersion, Version)
	}
	if err := ValidNodeID(e.NodeID); err != nil {
		return fmt.Errorf("enroll: %w", err)
	}
	if len(e.CSR) == 0 || len(e.CSR) > MaxCSRSize {
		return fmt.Errorf("enroll: node %q: csr is %d bytes, want 1 to %d", e.NodeID, len(e.CSR), MaxCSRSize)
	}
	return nil
}

// Enrolled is the payload of FrameEnrolled and FrameRenewed.
type Enrolled struct {
	// Certificate is the DER of the node's certificate.
	Certificate []byte `json:"certificate"`
	// NotAfter is the certificate's expiry (also in Certificate), for logs.
	NotAfter time.Time `json:"not_after"`
	// Labels are the labels the join token bound to the node: the
	// coordinator applies them over the agent's own (a token's label wins
	// over a Hello label of the same key).
	Labels map[string]string `json:"labels,omitempty"`
}

// Renew is the payload of FrameRenew.
type Renew struct {
	// CSR is as in Enroll: subject CN the session's node id.
	CSR []byte `json:"csr"`
}

// Tunnel error codes of enrollment and certificate authentication (in
// ErrorInfo; see the Code* constants in control.go).
const (
	// CodeCertRequired: the agent presented no client certificate and the
	// coordinator takes no shared token (or the node id is enrolled: only
	// its certificate's holder may use it).
	CodeCertRequired = "cert_required"
	// CodeCertRefused: the client certificate is not one the coordinator
	// accepts (another CA, expired, revoked, superseded, another node's).
	CodeCertRefused = "cert_refused"
	// CodeEnrollRefused: an Enroll was refused (token unknown, expired or
	// used up; node id already enrolled; bad CSR).
	CodeEnrollRefused = "enroll_refused"
)

// NATS API of node identity (admin operations; see api.go).
const (
	// SubjectTokensCreate takes a TokenCreateRequest and replies with a
	// TokenCreateResponse holding the new join token (shown once; the
	// coordinator keeps only its hash).
	SubjectTokensCreate = "tether.v1.tokens.create"
	// SubjectNodesRevoke takes a NodeRevokeRequest, refuses every
	// certificate issued to the node so far (at once on every coordinator),
	// closes its session and replies with a NodeRevokeResponse.
	SubjectNodesRevoke = "tether.v1.nodes.revoke"
)

// Bounds of join tokens.
const (
	DefaultTokenTTL = time.Hour
	MaxTokenTTL     = 365 * 24 * time.Hour
	DefaultTokenUse = 1
)

// TokenCreateRequest is the body of a SubjectTokensCreate request.
type TokenCreateRequest struct {
	// TTLSeconds is how long the token may be used, in seconds; 0 means
	// DefaultTokenTTL. At most MaxTokenTTL.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// Uses is how many enrollments the token allows; 0 means
	// DefaultTokenUse (one), -1 means unlimited within its TTL.
	Uses int `json:"uses,omitempty"`
	// Labels are bound to every node enrolled with the token; they win
	// over the labels its agent declares.
	Labels map[string]string `json:"labels,omitempty"`
}

// Validate checks r's fields.
func (r *TokenCreateRequest) Validate() *APIError {
	if r.TTLSeconds < 0 || time.Duration(r.TTLSeconds)*time.Second > MaxTokenTTL {
		return NewAPIError(400, ErrCodeInvalid, "ttl_seconds %d: want 0 (default %v) to %d", r.TTLSeconds, DefaultTokenTTL, int64(MaxTokenTTL/time.Second))
	}
	if r.Uses < -1 {
		return NewAPIError(400, ErrCodeInvalid, "uses %d: want -1 (unlimited), 0 (default %d) or more", r.Uses, DefaultTokenUse)
	}
	if err := ValidateLabels(r.Labels); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "labels: %v", err)
	}
	return nil
}

// TokenCreateResponse is the reply to SubjectTokensCreate.
type TokenCreateResponse struct {
	// Token is the join token: give it to agents (--token-file). It is
	// shown only here.
	Token string `json:"token"`
	// ID names the token in logs and listings (a prefix of its hash).
	ID string `json:"id"`
	// ExpiresAt is when the token stops working.
	ExpiresAt time.Time `json:"expires_at"`
	// Uses is how many enrollments it allows; -1 unlimited.
	Uses int `json:"uses"`
	// Labels are the labels it binds.
	Labels map[string]string `json:"labels,omitempty"`
}

// NodeRevokeRequest is the body of a SubjectNodesRevoke request.
type NodeRevokeRequest struct {
	Node string `json:"node"`
}

// Validate checks r's node id.
func (r *NodeRevokeRequest) Validate() *APIError {
	if err := ValidNodeID(r.Node); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "node: %v", err)
	}
	return nil
}

// NodeRevokeResponse is the reply to SubjectNodesRevoke.
type NodeRevokeResponse struct {
	Node string `json:"node"`
	// Serials are the certificate serials (hex) refused from now on.
	Serials []string `json:"serials"`
	// SessionClosed says whether this coordinator held the node's session
	// and closed it (other coordinators close theirs when they see the
	// revocation).
	SessionClosed bool `json:"session_closed"`
}
