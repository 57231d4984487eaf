package protocol

import (
	"encoding/base64"
	"fmt"
	"time"
)

// The direct data path for client streams.
//
// NATS carries the control: a client sends a StreamRequest with Direct set
// on SubjectStream; the coordinator that holds the node authorizes it as it
// would a relayed stream and answers with a DirectStreamReply. The data
// goes over the coordinator's own TLS tunnel listener, to which the client
// connects with the ALPN protocol ALPNClient (agents offer none,
// tether/1 or http/1.1), verifying the certificate against the reply's Pin. Over that
// connection the client runs one yamux session (the client opens every
// stream), whose streams begin with one frame:
//
//   - FrameDirectControl (no payload): the session's control stream, opened
//     first and once. The client sends FrameDirectCancel and
//     FrameDirectClose naming a data stream by its yamux stream id
//     (DirectRef); the coordinator sends FrameDirectEnd (DirectEnd) for each
//     data stream, before it closes its side of it, saying whether it ended
//     cleanly (the agent's EOF) or why it failed.
//   - FrameDirectOpen (DirectOpen): a data stream. The coordinator redeems
//     the ticket (once), opens the node's tunnel stream and answers with
//     FrameDirectAnswer (DirectAnswer: nil Error when open). Raw bytes
//     follow in both directions: the stream kind's own frames, exactly as
//     on the tunnel stream.
//
// A yamux stream close is a half-close (CloseWrite); Close of the whole
// operation (abort) and Cancel (stop the operation, keep reading its
// answer) are the control stream's messages, so they overtake the bytes
// queued in the data stream.

// ALPNClient is the ALPN protocol of a client's direct data session on the
// coordinator's tunnel listener (agents offer none, tunnel.ALPNTunnel, or
// tunnel.ALPNHTTP for the WebSocket transport).
const ALPNClient = "tether-client/1"

// DirectTicketSize is the size of a direct stream ticket, in random bytes
// (its text is their unpadded base64url encoding, 43 characters).
const DirectTicketSize = 32

// DefaultDirectTicketTTL is how long a ticket may be redeemed after it was
// issued, unless the coordinator is configured otherwise.
const DefaultDirectTicketTTL = 10 * time.Second

// ErrCodeDirectUnavailable is the APIError code of a direct stream request
// to a coordinator that has no direct listener (501): the client relays
// over NATS instead.
const ErrCodeDirectUnavailable = "direct_unavailable"

// ErrCodeTicket is the APIError code (401) of a data stream whose ticket is
// missing, malformed, unknown, expired or already redeemed.
const ErrCodeTicket = "bad_ticket"

// DirectStreamReply is the coordinator's answer to a StreamRequest with
// Direct set.
type DirectStreamReply struct {
	// Addr is the tunnel listener's host:port. The host is empty when the
	// listener is on every interface: the client then uses the host of
	// its NATS server.
	Addr string `json:"addr"`
	// Pin is the listener certificate's public key pin (tunnel.CertPin): the
	// client accepts the TLS connection only if the leaf certificate's
	// key matches it. It comes over the authenticated NATS connection, so
	// the client needs no CA of its own.
	Pin string `json:"pin"`
	// Ticket is the single-use ticket, DirectTicketSize random bytes in
	// unpadded base64url, bound to this stream request.
	Ticket string `json:"ticket"`
	// TTLMS is how long the ticket may be redeemed, in milliseconds from
	// when it was issued.
	TTLMS int64 `json:"ttl_ms"`
	// Coordinator is the id of the coordinator that issued it (the one
	// holding the node).
	Coordinator string `json:"coordinator"`
}

// DirectOpen is the payload of FrameDirectOpen.
type DirectOpen struct {
	Ticket string `json:"ticket"`
}

// DirectAnswer is the payload of FrameDirectAnswer: Error is nil when the
// stream is open, else why it is not (the same errors a relayed stream's
// request gets, and 401 bad_ticket).
type DirectAnswer struct {
	Error *APIError `json:"error,omitempty"`
}

// DirectRef is the payload of FrameDirectCancel and FrameDirectClose: the
// data stream's yamux stream id. HalfClosed, in a close, says the client
// had half-closed the data stream before it closed it: the coordinator
// then takes the data stream's EOF for the end of the client's bytes, as
// on the relayed path. Without it, the EOF that follows a close (the
// client sends its FIN once the coordinator answered the close, but the
// two travel on different streams) is part of the abort.
type DirectRef struct {
	Stream     uint32 `json:"stream"`
	HalfClosed bool   `json:"half_closed,omitempty"`
}

// DirectEnd is the payload of FrameDirectEnd: the data stream whose
// coordinator side ended, and how: Error is empty after the agent's clean
// EOF, else what failed (a tunnel lost, the coordinator's shutdown, the
// client's own abort).
type DirectEnd struct {
	Stream uint32 `json:"stream"`
	Error  string `json:"error,omitempty"`
}

// MaxDirectFrame bounds the payload of every direct control frame; a
// DirectAnswer's message is clipped to fit.
const MaxDirectFrame = 16 << 10

// ParseDirectTicket decodes a ticket's text into its bytes, or names what is
// wrong with it.
func ParseDirectTicket(s string) ([DirectTicketSize]byte, error) {
	var t [DirectTicketSize]byte
	b, err := base64.RawURLEncoding.Strict().DecodeString(s) // one text per ticket
	if err != nil {
		return t, fmt.Errorf("ticket: not unpadded base64url: %w", err)
	}
	if len(b) != DirectTicketSize {
		return t, fmt.Errorf("ticket: %d bytes, want %d", len(b), DirectTicketSize)
	}
	copy(t[:], b)
	return t, nil
}

// FormatDirectTicket is the text of ticket bytes t.
func FormatDirectTicket(t [DirectTicketSize]byte) string {
	return base64.RawURLEncoding.EncodeToString(t[:])
}
