// Package natsauth is Tether's NATS identity layer: the operator-mode
// layout every Tether NATS runs with, its keys and JWTs, client and
// coordinator credentials (.creds files), the options that give an embedded
// nats-server that layout, and the extraction of a caller's Identity from
// what the server stamps on a request. It writes no crypto of its own: the
// server authenticates users by their JWT and NKey (nats-io/jwt, nkeys), and
// stamps the caller on every request that crosses a service import.
//
// # Layout
//
// One operator ("tether") and three accounts:
//
//   - SYS, the system account.
//   - TETHER, the coordinators: the micro service and its queue group,
//     JetStream (streams, KV buckets, tether_locks), events, audit, the
//     coordinators' own inboxes and pipe ends. Its users (MintCoordinator,
//     signed by the account key) have no permission limits. JetStream is
//     enabled with no limits.
//   - CLIENTS, the submitters. No JetStream. It imports from TETHER, with
//     share: true, exactly the subjects of ServiceExports: each public API
//     subject of package protocol (exec and stream with response type
//     stream, the rest singleton; sandboxes.sync with a 3-minute response
//     threshold) and tether.v1.pipe.>. Its users are issued by a scoped
//     signing key (role "client").
//
// The client signing key's template, which the server applies to each of
// its users:
//
//	publish    allow tether.v1.>
//	           deny  tether.v1.node.>, tether.v1.run.>, tether.v1.coord.>   (coordinator routing)
//	subscribe  allow _INBOX_{{subject()}}.>   (the user's own public key)
//	responses  none (allow_responses off)
//
// A scoped key's users cannot carry other permissions: the server refuses
// them. A user signed by the CLIENTS account key itself gets the account's
// default permissions, which deny everything, and bearer tokens are
// refused.
//
// What that gives, each checked by a test against a real server: a
// connection without a user JWT of this operator is refused; a client may
// publish API requests and receive replies on its private inbox prefix
// (InboxPrefix; Creds.Options sets nats.CustomInboxPrefix), and nothing
// else: not publish to the coordinators' node and run subjects
// (ClientPublishDeny: the coordinator that serves them trusts the caller
// identity in their headers), not subscribe to >, another user's inbox, the API subjects, their
// queue group, $JS.API.> or $KV.>, not publish to a coordinator's inbox,
// another user's inbox or JetStream. Subjects under tether.v1. that are not
// exported (events, audit, node routing) stay in CLIENTS, where nobody may
// subscribe to them: a client cannot forge events or audit records in
// TETHER.
//
// # Who asked
//
// For every request crossing the import the server puts a header
// Nats-Request-Info (server.ClientInfoHdr) in the message TETHER receives:
// JSON naming the caller's account, user public key, user JWT and issuing
// key. The server removes any header of that exact name the client wrote
// (other spellings pass through untouched, so Identify reads the exact name
// only). Verifier.Identify checks the header's JWT (signature, issued by a
// client signing key of a trusted client account, subject = the
// authenticated user, not bearer, not expired, not revoked by the account
// JWT) and returns Identity{Kind: "nats", Name: the JWT's name, Key: the
// user's public key, Account: "CLIENTS"}. A request without the header came
// from inside TETHER (coordinator credentials) and is refused
// (ErrNoRequestInfo): the server does not say which TETHER user sent it,
// and an administrator is a CLIENTS user that policy makes admin, named in
// the audit log. JetStream strips the header: record the identity when a
// job is accepted. Identify caches parsed headers and verified JWTs
// (measured on 2 busy cores: 2.5-8 µs for a header seen before, 12-50 µs
// for a new connection of a known user, 0.1-0.4 ms for a new user, whose
// signature is checked).
//
// # Streamed replies and pipes across the import
//
// Verified against nats-server v2.15.2 (server/client.go
// processServiceImport): a response mapping of a streamed export lives as
// long as each response comes within the response threshold (2 minutes by
// default) of the previous one, and until the client unsubscribes its reply
// subject. A response with neither header nor body ends the mapping at
// once: every streamed reply must carry a header or a body (pipe acks,
// pings and keepalives are header-only, which is fine). The coordinator's
// probe (a response with a reply subject of its own, counting 503 "no
// responders" answers) gets no answer across the import: the server drops
// responses to a departed client silently. So clients answer keepalives
// and probes with heartbeats on the exported tether.v1.exec.alive, which
// the coordinator counts only from the job's sender.
//
// A client cannot publish to a coordinator's inbox (it is in TETHER), so
// the coordinator's end of a pipe receives on an exported subject,
// PipeSubject(coordinator, NewPipeID()) =
// tether.v1.pipe.<coordinator>.<pipe>; the other direction is the stream
// of responses to the client's tether.v1.stream request. Every message a
// client publishes there carries the stamped header: RequestUser tells the
// coordinator which user sent it, so it can drop what another client
// publishes to a pipe it did not open.
//
// # Files
//
// Load keeps the seeds in a directory of mode 0700 (see Layout): seed and
// .creds files are written 0600 atomically, and refused when the group or
// others may access them, naming the file and its mode. A directory missing
// some seeds is refused, not completed. The JWTs are signed afresh by each
// Load from the seeds; the CLIENTS JWT file also keeps the revocations.
//
// # External NATS
//
// An operator running their own NATS gives it the same layout. Either copy
// this layout's JWTs (Layout.ServerConfig returns the server configuration
// block: operator JWT, system_account, resolver MEMORY and the preloaded
// account JWTs; a test starts a server from it), or build it with nsc:
//
//	nsc add operator --name tether --sys
//	nsc add account --name TETHER
//	nsc edit account --name TETHER --js-mem-storage -1 --js-disk-storage -1 --js-streams -1 --js-consumer -1
//	# one export per ServiceExports entry; exec and stream streamed:
//	nsc add export --account TETHER --service --subject tether.v1.exec --response-type Stream
//	nsc add export --account TETHER --service --subject tether.v1.stream --response-type Stream
//	nsc add export --account TETHER --service --subject tether.v1.sandboxes.sync --response-threshold 3m
//	nsc add export --account TETHER --service --subject tether.v1.exec.once --response-threshold 6m
//	nsc add export --account TETHER --service --subject tether.v1.nodes
//	...                                   (every other ServiceExports subject, and tether.v1.pipe.>)
//	nsc add account --name CLIENTS
//	nsc edit account --name CLIENTS --disallow-bearer --deny-pubsub '>'
//	# one import per export, sharing the caller's identity:
//	nsc add import --account CLIENTS --service --share --src-account <TETHER public key> --remote-subject tether.v1.exec
//	...
//	nsc edit account --name CLIENTS --sk generate
//	nsc edit signing-key --account CLIENTS --sk <that key> --role client \
//	    --allow-pub 'tether.v1.>' --allow-sub '_INBOX_{{subject()}}.>'
//	nsc add user --account TETHER --name coordinator
//	nsc add user --account CLIENTS --name alice -K client
//	nsc generate creds --account CLIENTS --name alice > alice.creds
//	nsc generate config --mem-resolver --sys-account SYS --config-file resolver.conf
//
// and include resolver.conf in the server's configuration, with jetstream
// enabled and no no_auth_user, accounts or authorization blocks. Revoking a
// user is nsc revocations add-user --account CLIENTS --name alice, then a
// new resolver.conf (or nsc push with a NATS resolver). The coordinator
// needs the coordinator's .creds and, to identify callers, the operator JWT
// and the CLIENTS account JWT (nsc describe account --name CLIENTS --raw);
// clients need their .creds and, with the stock nats CLI, --inbox-prefix
// _INBOX_<their public key> (nsc describe user --account CLIENTS --name
// alice shows it).
//
// # Concurrency and imports
//
// Layout and Verifier are safe for concurrent use; neither starts
// goroutines. Layout.mu guards the CLIENTS claims and the JWTs; Verifier.mu
// guards its caches (never held while decoding). natsauth imports protocol,
// nats.go, nats-server, jwt and nkeys; it must not import agent,
// coordinator, client or tunnel. Built with -tags tetherclient (the
// client-only tether, which reads .creds files and links no nats-server)
// it lacks Layout.ConfigureServer and Layout.UpdateServer (server.go), and
// with them its nats-server import; what calls them (the coordinator, its
// tests) does not build with that tag.
package natsauth
