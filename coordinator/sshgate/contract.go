// Package sshgate is the coordinator's SSH jump host: OpenSSH clients
// authenticate to it with a public key (an authorized-keys file) or a user
// certificate (a configured user CA), and each direct-tcpip channel to
// NODE:22 (ssh -J coordinator NODE) is joined, through the node's tunnel,
// to the agent's own SSH server (protocol/ssh.go), which the client then
// authenticates to end to end with the same key. The gate asks the policy
// which logins (and forward targets) the caller has on the node and writes
// them, with the key the caller proved, into the stream's SSHParams. It
// also holds the SSH host CA that certifies node host keys, so that
// clients check every node with one @cert-authority line.
//
// This file is the contract between the gate and the rest of the
// coordinator: the coordinator implements Nodes and passes its policy
// store and audit recorder; the gate implements everything SSH.
package sshgate

import (
	"context"
	"net"

	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Nodes is the coordinator's fleet, as the gate needs it.
type Nodes interface {
	// Node returns the node with this id as the policy sees it (id and
	// labels) and whether it is connected and serves SSH (its Hello
	// listed protocol.FeatureSSH).
	Node(id string) (node policy.Node, ok bool)
	// HostKey returns the node's SSH host key in wire form
	// (Hello.SSHHostKey) as its current session reported it; nil when
	// the node is not connected or sent none.
	HostKey(id string) []byte
	// OpenSSH opens a KindSSH stream to the node with params, waits for
	// the agent's FrameDialOK and returns the stream, from then on raw
	// SSH bytes both ways; or the agent's refusal as a
	// *protocol.ErrorInfo, or a tunnel error. Closing the conn ends the
	// stream. The coordinator remembers params.Session → params.Identity
	// so that the agent's SSHChannelEvents are audited under the identity
	// the gate proved, never one the agent names.
	// ctx carries the SSH client's address (SourceOf), so that those
	// events name where the connection came from too.
	OpenSSH(ctx context.Context, node string, params protocol.SSHParams) (net.Conn, error)
}

// sourceKey is the context key of SourceOf.
type sourceKey struct{}

// WithSource returns ctx carrying source (SourceOf), the SSH client's
// address as the gate's listener accepted it: the ctx the gate gives
// Nodes.OpenSSH (and a test of a Nodes gives it).
func WithSource(ctx context.Context, source string) context.Context {
	return context.WithValue(ctx, sourceKey{}, source)
}

// SourceOf returns the address of the SSH client a Nodes.OpenSSH call
// opens a stream for, from its ctx: the connection's TCP peer as the
// gate's listener accepted it ("IP:PORT", protocol.AuditEvent.Source),
// never an address the client names. "" for a ctx the gate did not give.
func SourceOf(ctx context.Context) string {
	s, _ := ctx.Value(sourceKey{}).(string)
	return s
}

// Policy is the part of the policy the gate uses (*policy.Store has it).
type Policy interface {
	Grants(id policy.Identity, op policy.Operation, node policy.Node) ([]policy.Grant, error)
	// Peek is Grants without counting a refusal: the gate asks it for a
	// connection's forward targets, which most callers have none of, and
	// for the decisions of Gate.Recheck, which refuse no request.
	Peek(id policy.Identity, op policy.Operation, node policy.Node) ([]policy.Grant, error)
}

// Auditor records audit events (*audit.Recorder has it). The gate records
// one event per connection refused before a channel (auth failures are
// counted, not each audited: see Metrics) and one per direct-tcpip
// channel: operation "ssh", method "connect", result ok/refused/error
// (or failed, reason revoked: closed by Gate.Recheck), identity, node,
// logins, bytes both ways, duration, Session, and Source: the TCP peer
// as the gate's listener accepted it, never an address the client names
// (a direct-tcpip's originator fields are the client's to write).
type Auditor interface {
	Record(ev *protocol.AuditEvent)
}
