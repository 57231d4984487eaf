// Package coordinator is Tether's fleet coordinator. It owns the tunnel
// listener and the registry of connected nodes, the dispatch of jobs from
// the NATS API (the micro service "tether": tether.v1.exec, tether.v1.nodes,
// tether.v1.cancel), the admin HTTP handler (/metrics, /healthz, /readyz) and
// the embedded nats-server used when no external NATS is configured
// (StartEmbeddedNATS).
//
// It does not listen on its own: Serve takes a net.Listener (the caller wraps
// it in TLS) and a *nats.Conn the caller owns; AdminHandler returns an
// http.Handler the caller serves.
//
// # Agent sessions
//
// Agents dial out to the coordinator. Per connection, one goroutine does the
// TLS handshake, starts the yamux session (tunnel.Server), accepts the
// control stream, checks the Hello (join token in constant time, protocol
// version, node id and labels), registers the node (a newer session of the
// same node id replaces and closes the older one), sends the Welcome, and then
// reads heartbeats on the control stream with a read deadline of three
// heartbeat intervals. Silence or an error drops the session. No goroutine
// accepts further streams from agents: the coordinator opens the streams it
// needs (exec), which keeps an idle agent's cost to one goroutine plus
// yamux's two.
//
// # Jobs
//
// micro runs each endpoint's handler on a single goroutine of the NATS
// connection, so handlers decode and validate synchronously (a bad request
// gets a micro error and runs nothing) and hand the run to a job goroutine.
// A job opens one exec stream per target node, at most MaxParallel at once,
// publishes output chunks to the request's reply subject as they arrive
// (headers Tether-Job, Tether-Type, Tether-Node, Tether-Seq; one sequence per
// job, publishes serialised so wire order is seq order), and ends with one
// result message. The coordinator does not know how an agent runs a process;
// it only speaks the exec stream's frames.
//
// # Goroutines
//
//   - the accept loop, started by Serve;
//   - one per agent connection (handshake, then heartbeat reader);
//   - one per running job, plus one per node of the job while it runs;
//   - while a node's run is being cancelled, a short-lived context.AfterFunc
//     that writes the cancel frame; the node goroutine waits for it.
//
// Serve waits for all of them before it returns. yamux adds its own receive
// and send loops per session, stopped by closing the session.
//
// # Locks
//
// Coordinator.mu guards the registry, the job table and the shutdown state;
// it is never held during I/O. job.pubMu serialises a job's publishes. The
// two are never held together. agentConn.mu is a leaf lock around one
// pointer. Heartbeat data lives in atomics.
//
// # Imports
//
// coordinator may import protocol, tunnel, nats.go, nats-server and
// prometheus. It must not import agent or cmd/...: the agent is reached only
// through the tunnel protocol.
package coordinator
