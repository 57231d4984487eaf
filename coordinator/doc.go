// Package coordinator is Tether's fleet coordinator. It owns the tunnel
// listener and the registry of connected nodes, the dispatch of jobs from
// the NATS API (the micro service "tether": tether.v1.exec, tether.v1.nodes,
// tether.v1.cancel, tether.v1.stream, tether.v1.job.*), the admin HTTP handler (/metrics, /healthz, /readyz) and
// the embedded nats-server used when no external NATS is configured
// (StartEmbeddedNATS).
//
// It does not listen on its own: Serve takes a net.Listener (the caller wraps
// it in TLS) and a *nats.Conn the caller owns; AdminHandler returns an
// http.Handler the caller serves.
//
// # Who asked
//
// NATS is never anonymous (package natsauth): the coordinator connects with
// TETHER account credentials, clients with CLIENTS users that reach the API
// through a service import stamping each request with its sender. Every
// micro handler, its own and those Config.Endpoints adds, runs behind a
// guard that identifies the sender with Config.Identify (required) and
// refuses the request with 401 unauthenticated when that fails; handlers
// read the identity with caller.Of. An exec job remembers its sender (its
// heartbeats must come from it). A stream relay's pipe receives on an
// exported pipe subject (natsauth.PipeSubject, an unguessable id) and
// admits only messages the server stamped with the opener's user
// (natsauth.RequestUser): another client's are dropped.
//
// # Agent sessions
//
// Agents dial out to the coordinator. Before a connection has proven the
// join token it is held to little (internal/admission): at most MaxHandshakes
// connections are in their handshake at once, at most
// MaxHandshakesPerSource of them from one source (an IPv4 address or an
// IPv6 /64; past it: closed unread, reason "source_limit"); SetLimits
// changes that bound, the admission rate, the default job timeout and the
// drain spread while serving (limits.go). When all places
// are taken, a newcomer from a source with at least two handshakes fewer
// than the busiest one takes the place of that source's oldest handshake
// (cut), else it is closed unread (both reason "overload"); so a flood from
// a few sources cannot keep agents from other sources out. A connection
// that sends nothing for FirstByteTimeout (2 s) is closed, and TLS plus
// Hello must be done within HandshakeTimeout (5 s). Every line such a peer
// can cause goes through a log rate-limited per message (lograte.go: three,
// then one per 10 s, with the count of lines dropped); each refusal is
// counted in tether_coordinator_auth_failures_total.
//
// Per connection, one goroutine waits for the first byte and does the TLS
// handshake (a connection closed before its first byte is a health check,
// logged at debug and not counted), starts the yamux session
// (tunnel.Server), accepts the control stream, checks the Hello (client certificate, or shared token in constant time; protocol
// version, node id and labels; free-form fields cut to 1 KiB), registers the
// node (a newer session of the same node id replaces and closes the older
// one), sends the Welcome, and then reads heartbeats on the control stream.
// The session itself watches for silence (tunnel.Config.IdleTimeout, three
// heartbeat intervals, a timer and no goroutine): an agent from which
// nothing at all arrives for that long, a frozen one included, is dropped,
// as is one whose control stream fails. No goroutine accepts further
// streams from agents: the coordinator opens the streams it needs
// (exec), which keeps an idle agent's cost to one goroutine plus yamux's two.
// The session's accept backlog is one, so yamux resets any further stream an
// agent opens instead of buffering it.
//
// The WebSocket transport (websocket.go) shares the port: a TLS handshake
// that negotiated ALPN http/1.1 is handed, from the same goroutine and
// within the same handshake deadline and admission place, to the one HTTP
// server of WebSocket dials, which upgrades GET tunnel.WebSocketPath (404
// for anything else) and hands the connection back; the session and
// handshake then run over it exactly as over raw TLS, with the TLS client
// certificate as the agent's identity.
//
// The registry holds connected nodes only. Reconnects are counted from the
// agent's own count (Hello.Reconnects) and from replaced live sessions.
//
// # Node identity
//
// identity.go: with Config.NodeCA and Config.Identities (package
// coordinator/enroll, JetStream KV), a Hello is authenticated by the TLS
// client certificate (the listener requests one: tunnel.RequestClientCert):
// it must chain to the node CA, be valid, name the Hello's node id (URI SAN
// urn:tether:node:<id>) and have a serial the node's identity record lists.
// An agent without a certificate sends an Enroll instead of a Hello (join
// token, CSR), gets a certificate and redials. Renewals arrive on the
// control stream and are answered there by the control stream's reader. Every
// change of an identity record (a revocation, here or on another
// coordinator) re-checks that node's session and closes it if its
// certificate is no longer listed. The deprecated shared token (Config.Token)
// admits agents without a certificate only for node ids not enrolled.
//
// # Jobs
//
// micro runs each endpoint's handler on a single goroutine of the NATS
// connection, so handlers decode and validate synchronously (a bad request
// gets a micro error and runs nothing) and hand the run to a job goroutine.
// At most MaxJobs jobs are in flight; more requests get 503 unavailable.
// A job opens one exec stream per target node, at most MaxParallel at once,
// looking each node up when its run starts (a node that left meanwhile gets
// an error result), publishes output chunks to the request's reply subject
// as they arrive (headers Tether-Job, Tether-Type, Tether-Node, Tether-Seq;
// one sequence per job, publishes serialised so wire order is seq order;
// a chunk larger than the NATS server's max payload is split) and one
// node-result message per node as it finishes (with the node's failure in
// NeMo Gym's shape, from the last 64 KiB of its stderr), and ends with one
// result message (carrying counts only, results_omitted, if the full list does not
// fit the max payload). While the job runs, a keeper goroutine publishes a
// keepalive after silence, else a probe, every KeepAliveInterval (jobs.go);
// the client answers each with a heartbeat on tether.v1.exec.alive, and once
// one came from the job's sender, three intervals without cancel the job
// (the 503 "no responders" a probe used to get never comes across the
// clients' NATS import). The drain cancels jobs
// with a shutdown cause, which their node results report. The job.*
// endpoints open one job stream to the node (a goroutine counted with the
// jobs) and relay its answer.
//
// Whenever a job gives up on an exec stream without a final frame (a protocol error, a publish failure, a cancel not answered in
// time) it writes a cancel frame before closing the stream, so the agent
// kills the process group; a cancel also goes out of band, on the agent's
// control stream (control.go), since the in-band one can wait behind the
// job's stdin when the command does not read it. The coordinator does not know how an agent runs
// a process; it only speaks the exec stream's frames.
//
// # Several coordinators
//
// fleet.go: with Config.Fleet (the KV bucket tether_nodes) any number of
// coordinators share one NATS cluster. Each serves the API in the same
// queue group, records the nodes it holds in the registry (fenced by the
// revision of its own put) and subscribes to their node subjects
// (tether.v1.node.<id>.>); a request for a node another one holds is
// forwarded there unchanged, headers and stamped caller included, and the
// owner answers the client directly. Cancels and heartbeats reach the
// coordinator running a job on its run subject (tether.v1.run.<job>.*);
// fan-outs resolve the whole registry and run remote nodes through their
// owners; facades, the SSH jump host and the reaper reach remote nodes
// through the owner (fleet_dial.go, fleet_delete.go). Clients may not
// publish to any of these subjects (natsauth.ClientPublishDeny).
//
// # Authorization
//
// Every handler asks Config.Policy before it acts (authz.go), as the
// caller Config.Identify named: exec on every target node (all or
// nothing; each node's params get the grant's run_as as their user),
// the stream kinds as exec, cp.write or cp.read (with the path), shell and
// forward (with the target), cancel and the job.* endpoints on the job's
// submitter (recorded when it was accepted, or, for a detached job, when
// its node started it; kept in memory), nodes as a listing of what the
// caller may see. Each request takes one from the caller's rate budget,
// and each running exec job and relayed stream holds one of its jobs
// (max_concurrent_jobs), whatever Config.MaxJobs leaves.
//
// # Audit
//
// With Config.Audit every request is an audit event (coordinator/audit),
// recorded once its outcome is known (audit.go): the guard wraps each
// request, and its first reply records the event, unless an exec job or a
// stream relay took it over (they record at their end, with the command's
// digest, the nodes, the exit code and the bytes; a relay reads the
// agent's last exit or error frame for it, the one place it looks into
// the frames it relays). A policy refusal that refuses the request makes
// its event a refusal, with the policy's reason; a facade call's refusal
// is recorded as the Authorizer decides it. Recording never blocks a
// handler.
//
// # Goroutines
//
//   - the accept loop, started by Serve; the HTTP server of WebSocket
//     dials (its Serve loop, and one per connection until it is upgraded
//     or answered), stopped by the drain;
//   - one per agent connection during its handshake; a registered agent
//     has none of its own (yamux's two are the session's): its control
//     stream is read by a short-lived goroutine started when frames came
//     (controlReader, tunnel.Session.Watch), and its end is handled by one
//     started when its connection closed (tunnel.Session.OnClose);
//   - one per running job, plus one per node of the job while it runs, plus
//     the job's keeper (keepalives, probes, the client's heartbeats);
//   - one per job.* request while its job stream runs;
//   - one per audit query (tether.v1.admin.audit) while it reads the audit
//     stream, at most four at once (audit.go);
//   - up to four settling the agents' job exit reports (jobexit.go) while
//     some wait, counted with the jobs; the control stream's reader only
//     queues them;
//   - while a node's run is being cancelled, a short-lived context.AfterFunc
//     that writes the cancel frame; the node goroutine waits for it;
//   - with Config.Fleet (fleet.go): the registry watcher, the dispatcher
//     of node, run and coordinator subjects (one goroutine serving them one
//     at a time, as micro serves an endpoint), the reconcile ticker; one
//     per forwarded request waiting for its owner's acknowledgement, per
//     fleet-wide nodes.list, per forwarded delete (all counted with the
//     jobs), and per dial or ssh stream spliced for another coordinator
//     (counted with the connections, so closing the sessions ends them);
//     a fan-out's remote node run is its node goroutine;
//   - per stream relay (relay.go): its goroutine, which copies the client's
//     bytes to the node, one copier of the node's bytes to the client, and
//     one watch of the pipe, which cuts a write blocked on a node that
//     does not read short and cancels the node's operation out of band
//     (FrameCancelStream on the agent's control stream, control.go) when
//     the client resets its direction (a cancel) or the pipe ends early;
//     on the direct path (direct.go) the client's end is a data stream of
//     its session instead of the pipe, with the same three goroutines;
//   - per client session on the tunnel listener (ALPN tether-client/1,
//     direct.go): its goroutine (counted with the connections), which
//     accepts data streams, one reader of its control stream, and one
//     short-lived goroutine per data stream until its ticket is redeemed
//     and its relay started (bounded by the tunnel's header timeout);
//     serve waits for them;
//   - with Config.Notify (notify.go): the systemd notifier, from READY=1
//     until the drain begins (drain stops and waits for it, then sends
//     STOPPING=1), and per watchdog check one short-lived goroutine that
//     takes and releases the registry lock.
//
// Serve waits for all of them before it returns (the lock check's
// goroutine ends as soon as the lock is free). yamux adds its own receive
// and send loops per session, stopped by closing the session.
//
// # Panics
//
// Every per-caller goroutine above, and every micro handler (its own and
// those Config.Endpoints adds, through a wrapped service), contains a panic
// (panic.go): the request gets a 500 internal micro error, a node run an
// internal node result (the job's other nodes go on), a job whose goroutine
// or keeper panicked an internal error as its last reply or its nodes
// cancelled with it, a stream relay's client its pipe closed with an
// internal error, an agent connection is closed (the agent redials), a
// node's inventory counts as failed. Each is counted in
// tether_panics_total{component="coordinator"} and logged once with its
// stack; the coordinator keeps serving. Left unguarded, so that a panic
// takes the process down and its supervisor restarts it: the goroutines
// that own shared state or the daemon's lifetime (the accept loop, Serve's
// drain, RunInventory's loop), context.AfterFunc callbacks, and the
// goroutines of the tunnel and natspipe packages.
//
// # Locks
//
// controlWriter.mu (control.go) is a leaf lock held while one frame is
// written on an agent's control stream (bounded by the write timeout);
// relay.mu is a leaf lock.
//
// Coordinator.mu guards the registry, the job table and the shutdown state;
// it is never held during I/O. fleetState.mu (fleet.go) is a leaf lock
// guarding the watched registry and the node subscriptions; it is never
// held with Coordinator.mu. pipeConn.mu is a leaf lock around its
// deadline timer. job.pubMu serialises a job's publishes. The
// two are never held together. agentConn.mu is a leaf lock around one
// pointer; admission.mu and the log limiter's mutex are leaf locks too.
// directState.mu (the tickets and client sessions) and clientSession.mu
// (its data streams) are leaf locks, never held during I/O;
// clientSession.wmu is held while one frame is written on its control
// stream (bounded by the write timeout); directEnd.mu is a leaf lock.
// Heartbeat data lives in atomics, as does each agent session's flow
// telemetry (tunnel.Session.FlowStats, read by listings; every agent
// session adds up into Config.Tunnel.Flow, which metrics.go exports with
// no per-node label; the agent's side of each session arrives in its
// heartbeats). Client direct sessions are not tracked.
//
// # Imports
//
// coordinator may import protocol, natsauth, natspipe, policy, tunnel,
// nats.go, nats-server and prometheus. It must not import agent or
// cmd/...: the agent is reached only through the tunnel protocol.
package coordinator
