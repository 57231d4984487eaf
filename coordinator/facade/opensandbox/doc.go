// Package opensandbox is the coordinator's OpenSandbox facade: one HTTP
// endpoint that looks like an OpenSandbox lifecycle server (wire-facts §2)
// and fronts the lifecycle servers of every node of the fleet, so that
// NeMo Gym's OpenSandbox provider and the SDKs work unchanged against it.
//
// # Routing
//
// Every route is served at the root and under /v1, as the server does.
// Requests reach a node's lifecycle server (node target "opensandbox")
// through a tunnel dial stream: each node has its own http.Transport whose
// DialContext calls Fleet.DialTarget; the transport is dropped when the
// node's tunnel session changes or the node leaves.
//
//   - POST /sandboxes places the sandbox: on the node named by the
//     Tether-Node header, else on the least loaded matching node of the
//     Tether-Node-Selector header (protocol.ParseSelector), else on the least
//     loaded node with the target (ledger live count, ties broken by id);
//     both headers together are a 400. Placement by load passes over nodes
//     whose lifecycle server could not be dialed in the last 30 s (per node
//     and tunnel session; a successful dial clears it) unless every
//     candidate is failing, and a create whose dial fails (nothing was
//     sent) goes to the next least loaded candidate, at most 3 nodes in
//     all; a Tether-Node create is never moved. A Tether-Run header that is
//     not a valid run id (protocol.ValidRunID) is a 400
//     TETHER::INVALID_RUN. The body is forwarded verbatim; a 202 is
//     recorded in the ledger (managed, owner from the Tether-Run header). A
//     ledger failure is logged and never fails the create.
//   - GET /sandboxes fans out to every node with the target, reads every
//     page with the caller's state and metadata filters passed verbatim,
//     merges, sorts by (createdAt, id, node) and pages the result itself.
//     It answers a complete list or an error naming the node that failed,
//     never a silently partial list: a node whose request fails, or a node
//     that holds live sandboxes in the ledger but is not connected, makes it
//     a 502/503. The one node left out is one whose lifecycle server cannot
//     be dialed while the ledger holds no live OpenSandbox sandbox on it
//     (id lookups leave it out too): one node's dead server must not fail
//     every list.
//   - /sandboxes/{id} and every /sandboxes/{id}/... route go to the node the
//     ledger names for the id (503 while that node is away). An id the
//     ledger does not know (or holds as deleted) is looked up on every node (GET /v1/sandboxes/{id},
//     all answers awaited): one node with it → routed there and remembered
//     (not written to the ledger: the node's inventory records it under the
//     ledger's own rules; Ledger.Created would make it managed, which the
//     reaper acts on); several → 409; a node that failed → 502, never a 404 that would let a
//     client think the sandbox gone; all 404 → the server's own 404.
//     Deletes mark the record deleting, then deleted on 204 or 404;
//     renew-expiration and GET record a new expiresAt (wire-facts §8.4).
//   - The endpoint of GET /sandboxes/{id}/endpoints/{port} (with or without
//     use_server_proxy) and any absolute Location header are rewritten to
//     point back at the facade (wire-facts §8.1).
//   - /sandboxes/{id}/proxy/{port}/... (the server proxy to execd) passes
//     through httputil.ReverseProxy unbuffered (FlushInterval -1, so execd's
//     server-sent events stream); a WebSocket upgrade is spliced byte for
//     byte after the 101, so frames, pings and close codes (4001, 1008,
//     1000) arrive as the node sent them.
//
// Errors of the facade itself have the server's flat shape
// {"code":"TETHER::...","message":"..."} and name the node and target
// concerned; errors of a node pass through verbatim.
//
// # Authentication boundary
//
// The lifecycle servers behind the facade trust loopback. When
// Config.CheckToken is set, every request must carry a Tether-Token header
// that it accepts or arrive over TLS with a verified client certificate;
// else 401 TETHER::UNAUTHENTICATED. Wrong tokens are throttled per source
// IP (coordinator/authlimit: the TCP peer, never X-Forwarded-For, so
// callers behind one proxy share a bucket): past 10 at once, then one a
// second, every request of that IP with a Tether-Token, WebSocket upgrades
// included, is answered 429 TETHER::AUTH_THROTTLED with Retry-After (whole
// seconds), its token unchecked (a correct one too: the answer must not
// tell a hit from a miss). A verified client certificate and a request
// without a token are never throttled. Tether-* headers never reach a node.
// OPEN-SANDBOX-API-KEY and Authorization pass through untouched: they
// belong to the node's server, which strips them on its proxy route.
//
// # Authorization
//
// Every request is attributed to an identity (cert:CN, token:NAME through
// Config.TokenName, or Config.Local of the uid owning the caller's
// socket: package peeruid, never for a request carrying Forwarded,
// X-Forwarded-For, -Host, -Proto, X-Real-IP or Via, which a proxy on
// this host forwarded for someone else) and decided by Config.Authorizer's
// policy: forward to target opensandbox on the node, the sandbox's owner
// for the requests on one sandbox, the run's owner for a create; a list
// shows the caller's own sandboxes (authz.go). A refusal is 403
// TETHER::FORBIDDEN naming the identity, the operation and the rule
// missing.
//
// # Audit
//
// With Config.Audit set, every answered call is one audit event (audit.go):
// identity, operation, method, nodes, sandbox, result, duration; never a
// token, header or body.
//
// # Names
//
// Before anything else, the Host header must name one of the facade's
// names (Config.Hosts, see coordinator/facade/hostcheck; by default those
// of a facade on loopback), else 421 TETHER::MISDIRECTED_REQUEST: a page
// that rebound its own name to this address reaches nothing. A request
// that carries an Origin of another site (a cross-site WebSocket upgrade
// or POST from a browser) gets 403 TETHER::FORBIDDEN_ORIGIN. Both name
// what they refused and what the facade accepts, and are counted in
// refused_total{reason} and warned about at most once per 10 s.
//
// # Streams and limits
//
// Forwarded requests are served full duplex (http.ResponseController's
// EnableFullDuplex): the HTTP/1 server otherwise closes the request body
// when the answer's headers go out, while the reverse proxy's transport
// may still read it, and the transport then drops the node's connection
// mid-answer (golang/go#40747). An answer whose body the node's connection
// still ends early reaches the caller as a broken stream (the server drops
// the caller's connection: a short answer never looks whole), is counted
// as requests_total{status="cut"} and warned about at most once per 10 s
// with its route, sandbox and node. HTTPServer returns the server the
// facade runs in, with a header timeout, an idle timeout and a header size
// limit, and no timeout on a whole request or answer (long uploads, event
// streams and WebSockets).
//
// # Goroutines and ownership
//
// The facade runs no goroutine of its own. A list or an id lookup starts
// one goroutine per node (at most 64 at once) and waits for all of them
// before it answers.
// Tunnel conns are tracked from dial to close; Close closes every one of
// them (ending spliced WebSockets) and refuses later requests.
//
// It imports coordinator/ledger for the record types only, and never the
// coordinator package: the coordinator satisfies Fleet.
package opensandbox
