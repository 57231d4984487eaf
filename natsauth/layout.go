package natsauth

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/tetherfleet/tether/protocol"
)

// Names of the operator, the accounts and the client signing key's role, as
// they appear in the JWTs (and in nsc, for an external NATS).
const (
	OperatorName = "tether"
	// AccountSYS is the NATS system account.
	AccountSYS = "SYS"
	// AccountTether holds the coordinators: the micro service, JetStream
	// (streams, KV buckets, locks), events, audit, the coordinators' inboxes
	// and pipe ends. Only coordinator credentials live here.
	AccountTether = "TETHER"
	// AccountClients holds the submitters. It imports the API from
	// AccountTether (share: true) and has no JetStream.
	AccountClients = "CLIENTS"
	// ClientRole is the role of AccountClients' scoped signing key: every
	// client user is issued by it, and its template gives each user the
	// client permissions (ClientPublishAllow, ClientSubscribeAllow).
	ClientRole = "client"
)

// Client permissions: the template of the client signing key. The server
// expands {{subject()}} to the connecting user's public key, so each user
// may subscribe to its own inbox prefix only (InboxPrefix).
const (
	// ClientPublishAllow is what a client user may publish to. Only the
	// subjects AccountTether exports (ServiceExports) lead anywhere: the
	// rest of tether.v1. stays inside AccountClients, where nobody may
	// subscribe to it.
	ClientPublishAllow = "tether.v1.>"
	// ClientPublishDeny are the subjects under ClientPublishAllow a client
	// user is refused publishing to (a permissions violation, not a silent
	// drop): the coordinators' internal routing, node subjects
	// (tether.v1.node.<id>.>), run subjects (tether.v1.run.<job>.>) and
	// coordinator subjects (tether.v1.coord.<id>.>).
	// Coordinators trust the caller identity in what arrives there
	// (coordinator/fleet.go); they are not exported either, so in TETHER
	// only coordinators can publish them.
	ClientPublishDeny = "tether.v1.node.>,tether.v1.run.>,tether.v1.coord.>"
	// ClientSubscribeAllow is the template of what a client user may
	// subscribe to: its private inbox prefix.
	ClientSubscribeAllow = inboxPrefixBase + "{{subject()}}.>"
	inboxPrefixBase      = "_INBOX_"
)

// InboxPrefix is the private inbox prefix of the user with public key
// userKey: "_INBOX_" + userKey, a single subject token. A client user may
// subscribe under it only; its reply subjects must start with it followed by
// a dot (nats.CustomInboxPrefix(InboxPrefix(key)) does that; the nats CLI
// takes --inbox-prefix).
//
// The key, not the JWT's name, is what the prefix is made of: names are
// labels whoever mints a user chooses, and two users given the same name
// must not read each other's replies.
func InboxPrefix(userKey string) string { return inboxPrefixBase + userKey }

// PipeSubjectPrefix prefixes the subjects on which a coordinator receives
// the client-to-coordinator direction of a pipe (tether.v1.stream):
// PipeSubjectPrefix + <coordinator> + "." + <pipe>. A client cannot reach
// the coordinator's own inboxes (they are in AccountTether), so the
// coordinator's end of a pipe must be an exported subject; the opposite
// direction is the stream of responses to the client's request.
const PipeSubjectPrefix = "tether.v1.pipe."

// PipeSubject returns the subject of a coordinator's end of one pipe.
// coordinator and pipe must each be one subject token (letters, digits, '-'
// and '_'; pipe ids come from NewPipeID).
func PipeSubject(coordinator, pipe string) (string, error) {
	if err := checkToken(coordinator); err != nil {
		return "", fmt.Errorf("natsauth: pipe subject: coordinator id: %w", err)
	}
	if err := checkToken(pipe); err != nil {
		return "", fmt.Errorf("natsauth: pipe subject: pipe id: %w", err)
	}
	return PipeSubjectPrefix + coordinator + "." + pipe, nil
}

// NewPipeID returns a pipe id for PipeSubject: 26 characters of base32 from
// 128 random bits. Any client may publish to any pipe subject, so the id
// must not be guessable (a nuid is: it counts up from a prefix shared by
// every id of a process); the coordinator also drops pipe messages whose
// RequestUser is not the opener.
func NewPipeID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return pipeIDEncoding.EncodeToString(b[:])
}

var pipeIDEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// checkToken accepts 1 to 64 bytes of [A-Za-z0-9_-].
func checkToken(s string) error {
	if s == "" {
		return fmt.Errorf("empty")
	}
	if len(s) > 64 {
		return fmt.Errorf("%q is %d bytes, over 64", s[:64]+"…", len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("%q has %q (letters, digits, '-' and '_' only)", s, c)
		}
	}
	return nil
}

// ServiceExport is one service subject AccountTether exports and
// AccountClients imports with share: true.
type ServiceExport struct {
	// Subject is the literal subject (or, for pipes, a subject ending in >).
	Subject string
	// Streamed: the coordinator may send many responses to one request
	// (response type stream). Otherwise the server drops the response
	// mapping after the first response (singleton), which keeps its maps
	// small: a streamed mapping lives until the client unsubscribes its
	// reply subject or the response threshold passes without a response.
	Streamed bool
	// ResponseThreshold is how long the server waits for a (next) response
	// before it drops the mapping; 0 is the server's default, 2 minutes.
	ResponseThreshold time.Duration
}

// execOnceSlack is how long past its longest job's timeout the server
// keeps a tether.v1.exec.once request's reply mapping (the coordinator
// answers within 30 s of the timeout: coordinator/execonce.go).
const execOnceSlack = time.Minute

// syncThreshold outlasts the coordinator's own limit on a sandboxes sync
// (2 minutes, protocol.SubjectSandboxesSync), which would otherwise tie with
// the server's default threshold.
const syncThreshold = 3 * time.Minute

// ServiceExports lists, in a fixed order, every subject a client can reach:
// the public API of package protocol, and the pipe subjects. Subjects under
// tether.v1. that are not here (events, audit, node routing) are invisible
// to clients: a client may publish to them, but that stays in
// AccountClients. Exporting tether.v1.> instead would let any client forge
// events and audit records in AccountTether.
func ServiceExports() []ServiceExport {
	single := func(s string) ServiceExport { return ServiceExport{Subject: s} }
	return []ServiceExport{
		{Subject: protocol.SubjectExec, Streamed: true},
		// One reply, when the job ended: the mapping must outlive the
		// longest such job.
		{Subject: protocol.SubjectExecOnce, ResponseThreshold: protocol.ExecOnceMaxTimeout + execOnceSlack},
		// Heartbeats carry no reply subject; nothing is ever answered.
		single(protocol.SubjectExecAlive),
		single(protocol.SubjectNodes),
		single(protocol.SubjectCancel),
		{Subject: protocol.SubjectStream, Streamed: true},
		single(protocol.SubjectJobStatus),
		single(protocol.SubjectJobOutput),
		single(protocol.SubjectJobCancel),
		single(protocol.SubjectJobGet),
		single(protocol.SubjectJobList),
		single(protocol.SubjectTokensCreate),
		single(protocol.SubjectNodesRevoke),
		single(protocol.SubjectLeaseOpen),
		single(protocol.SubjectLeaseRenew),
		single(protocol.SubjectLeaseClose),
		single(protocol.SubjectSandboxesList),
		single(protocol.SubjectSandboxesRegister),
		single(protocol.SubjectSandboxesReap),
		{Subject: protocol.SubjectSandboxesSync, ResponseThreshold: syncThreshold},
		single(protocol.SubjectAuditQuery),
		single(protocol.SubjectSSHInfo),
		// Pipe data carries no reply subject; nothing is ever answered.
		single(PipeSubjectPrefix + ">"),
	}
}

// clientScope is the template of the client signing key.
func clientScope(signingKey string) *jwt.UserScope {
	s := jwt.NewUserScope()
	s.Key = signingKey
	s.Role = ClientRole
	s.Description = "tether client: publishes API requests, receives its own replies"
	s.Template.Pub.Allow.Add(ClientPublishAllow)
	s.Template.Pub.Deny.Add(strings.Split(ClientPublishDeny, ",")...)
	s.Template.Sub.Allow.Add(ClientSubscribeAllow)
	return s
}

// checkClientScope reports why a scoped signing key's template may give its
// users more than the client permissions; nil if it gives at most them.
// Narrower templates (fewer publish subjects, more deny entries, limits)
// pass.
func checkClientScope(s *jwt.UserScope) error {
	t := s.Template
	if len(t.Pub.Allow) == 0 {
		return fmt.Errorf("its template allows publishing anywhere (no pub allow list); want at most %q", ClientPublishAllow)
	}
	for _, p := range t.Pub.Allow {
		if !strings.HasPrefix(p, "tether.v1.") || len(p) == len("tether.v1.") {
			return fmt.Errorf("its template allows publishing to %q, outside %q", p, ClientPublishAllow)
		}
	}
	if len(t.Sub.Allow) == 0 {
		return fmt.Errorf("its template allows subscribing anywhere (no sub allow list); want at most %q", ClientSubscribeAllow)
	}
	for _, p := range t.Sub.Allow {
		// A queue group after a space only narrows the entry.
		if !strings.HasPrefix(p, inboxPrefixBase+"{{subject()}}.") {
			return fmt.Errorf("its template allows subscribing to %q, outside %q", p, ClientSubscribeAllow)
		}
	}
	if t.Resp != nil {
		return fmt.Errorf("its template allows publishing responses (allow_responses)")
	}
	if t.BearerToken {
		return fmt.Errorf("its template issues bearer tokens")
	}
	return nil
}
