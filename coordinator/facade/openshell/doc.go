// Package openshell is the coordinator's OpenShell facade: a gRPC server
// that looks like one OpenShell gateway (service openshell.v1.OpenShell,
// reference/wire-facts.md §1) and fronts the gateways of every node of the
// fleet, so that NeMo Gym's OpenShell provider works unchanged against it.
//
// # Forwarding
//
// The server registers no service: grpc.UnknownServiceHandler receives
// every call, and a raw codec (forced on the server and on every call
// toward a gateway, never registered globally) carries each message as the
// bytes the peer sent. A call goes to one node's gateway through that
// node's *grpc.ClientConn, whose dialer opens a tunnel dial stream to the
// node's "openshell" target (Fleet.DialTarget); there is one conn per node
// and tunnel session, closed when the node reconnects or leaves, with
// plaintext HTTP/2 inside the tunnel and no gRPC keepalive of its own (the
// tunnel has one; a proxy's pings could earn GOAWAY too_many_pings).
//
// Streams of every kind are relayed message by message, each message on
// its own: the caller's messages and half-close go to the gateway, the
// gateway's header metadata, messages, trailer metadata and status (code,
// message, details) come back verbatim, and a gateway that answers
// trailers-only gets a trailers-only answer to the caller. A stream the
// gateway ends without an exec exit event ends the same way through the
// facade; a broken tunnel ends it with the UNAVAILABLE grpc reports, never
// with OK. The caller's metadata passes through verbatim ("authorization"
// included) except the facade's own keys (tether-*), HTTP/2 pseudo-headers
// and the transport's own headers, which each gRPC stack writes itself.
// The caller's deadline and cancellation reach the gateway. A message over
// the gateway's 1 MiB decode limit (wire-facts §1.1) is refused with
// RESOURCE_EXHAUSTED before it is sent.
//
// # Routing
//
// The facade decodes only what routing and accounting need (wire-facts §7),
// with the generated messages of protocol/openshell:
//
//   - CreateSandbox is placed on the node that already has its (workspace,
//     name) in the ledger, the facade's index or a create forwarded in the
//     last 15 minutes (so NeMo Gym's retry after an ambiguous failure meets
//     ALREADY_EXISTS where the first attempt landed, OS-3), else on the node
//     of label tether.node (forwarded like every label), else metadata
//     tether-node, else the least loaded node (ledger live count plus
//     creates in flight; ties: fewer running execs, then id) among those
//     matching metadata tether-node-selector, or all nodes with a gateway.
//     A selector together with tether-node (or label tether.node) is
//     INVALID_ARGUMENT. Placement by load passes over nodes whose gateway
//     could not be dialed in the last 30 s (per node and tunnel session; a
//     successful dial clears it), unless every candidate is failing; and
//     when the chosen node's conn fails to connect (so nothing was sent),
//     the create moves to the next least loaded candidate, at most 3 nodes
//     in all. A create placed on a named node is never moved.
//     A successful create is recorded in the ledger (managed, owner from
//     metadata tether-run, which must be a valid run id
//     (protocol.ValidRunID) or the create is INVALID_ARGUMENT; TTL from
//     tether-ttl, a non-negative Go duration or whole seconds with 0 for
//     none, else Config.DefaultTTL); a ledger failure is logged and
//     counted, never returned.
//   - GetSandbox, DeleteSandbox, StopSandbox and StartSandbox address a
//     sandbox by (workspace, name): they go to the node the ledger or the
//     index names; a name nobody knows, or a NOT_FOUND where a hint
//     pointed, is looked up with GetSandbox on every (other) node in
//     parallel. Found on several nodes (names are unique per gateway
//     only): FAILED_PRECONDITION asking for tether-node. Found nowhere:
//     the gateway's own NOT_FOUND, or UNAVAILABLE naming the nodes that
//     could not be asked (the sandbox may be there).
//     A delete answered deleted=true marks the record deleting (the
//     inventory confirms it gone); deleted=false or NOT_FOUND marks it
//     deleted.
//   - ExecSandbox, WatchSandbox and ExecSandboxInteractive (its first
//     message, start) address a sandbox by id: the ledger, the index, else
//     every gateway's listing.
//   - ListSandboxes lists every node in full, merges, sorts by
//     (created_at_ms, name, workspace, id) and pages the merged list with
//     the caller's limit and offset; any node failing makes it UNAVAILABLE
//     naming the node (never a silently partial list).
//
// A fan-out (list, lookup by name or id) leaves out a node whose gateway
// cannot be dialed (UNAVAILABLE after a failed dial) while the ledger
// holds no live OpenShell sandbox on it: it has nothing to contribute, and
// one node's dead gateway must not fail every list. With live sandboxes
// on it, or without a ledger, it fails the call as above.
//   - Health is answered by the first node whose gateway answers it.
//   - Any other method goes to the node metadata tether-node names, or to
//     the only node with a gateway; with several, FAILED_PRECONDITION asks
//     for tether-node.
//
// Metadata tether-node also overrides the routing of the by-name and by-id
// methods.
//
// # Names and limits
//
// A call whose :authority names none of the facade's names (Config.Hosts,
// see coordinator/facade/hostcheck; by default those of a facade on
// loopback) is refused with PERMISSION_DENIED naming the authority and the
// accepted names, before it is authorized or routed; refusals are counted
// in refused_total and warned about at most once per 10 s.
//
// Caller connections are bounded: at most Config.MaxConcurrentStreams calls
// in flight each (callers queue more), Config.HandshakeTimeout to complete
// the TLS handshake and HTTP/2 preface, GOAWAY after Config.MaxConnectionIdle
// without a call, and a ping after 2 minutes of silence that must be
// answered within 20 s. The keepalive policy is lenient (pings as often as
// Config.MinPingInterval, with or without calls): a caller's pings must
// never earn GOAWAY too_many_pings.
//
// # Authentication
//
// With Config.CheckToken set, every call must carry metadata tether-token
// that it accepts, or come over TLS with a verified client certificate;
// other calls get UNAUTHENTICATED "tether: missing or invalid tether-token".
// The gateway's own "authorization" header is not the facade's business.
// Wrong tokens are throttled per source IP (coordinator/authlimit: the TCP
// peer, never x-forwarded-for, so callers behind one proxy share a
// bucket): past 10 at once, then one a second, every call of that IP with
// a tether-token gets RESOURCE_EXHAUSTED with a retry-after trailer (whole
// seconds), its token unchecked (a correct one too: the answer must not
// tell a hit from a miss). A verified client certificate and a call
// without a token are never throttled.
//
// # Authorization
//
// Every call is attributed to an identity (cert:CN, token:NAME through
// Config.TokenName, or Config.Local of the uid owning the caller's
// socket: package peeruid, never for a call whose metadata carries
// forwarded, x-forwarded-for, -host, -proto, x-real-ip or via, which a
// proxy on this host forwarded for someone else) and decided by Config.Authorizer's
// policy: forward to target openshell on each node it reaches, the
// sandbox's owner for calls on one sandbox, the run's owner for a create;
// a list shows the caller's own sandboxes (authz.go). A refusal is
// PERMISSION_DENIED naming the identity, the operation and the rule
// missing.
//
// # Audit
//
// With Config.Audit set, every answered call is one audit event (audit.go):
// identity, operation, method, nodes, sandbox, result, duration; never a
// token, header or body.
//
// # Concurrency
//
// Each call runs on grpc's handler goroutine; a relayed stream adds one
// goroutine for the caller-to-gateway direction, tracked by the Server and
// waited for by GracefulStop and Stop. Fan-outs ask at most 32 nodes at
// once and wait for all. The Server's mutex guards the creates-in-flight
// counts; the pool and the index have their own, and no lock is held
// while another is taken or while calling the Fleet or the Ledger.
package openshell
