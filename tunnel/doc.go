// Package tunnel owns the agent–coordinator transport: TLS over TCP dialing,
// the WebSocket transport (ws.go: the same session in binary WebSocket
// messages over TLS to the same port, selected by ALPN http/1.1, dialed
// directly or through an HTTP CONNECT proxy from the environment),
// the yamux session with Tether's tuned configuration, typed stream
// open/accept (a protocol stream header on every stream), the agent's
// redialer (several coordinator addresses and the records of their names,
// in an order the agent's seed picks so that a fleet spreads over them;
// capped exponential backoff with full jitter, capped lower while dials are
// refused outright by the coordinator's host, for a restart's span
// (RefusedFor), never for a refused proxy; a coordinator's busy refusal before TLS honoured as a
// retry-after bounded by the backoff cap; a drain honoured by moving on to
// the next address while the drained session finishes), the development
// PKI helpers, and node identity with
// crypto/x509 only (identity.go: the node CA that signs agents' CSRs and
// verifies their client certificates, the URI SAN naming a node id, the
// agent's identity file and pinned CA).
//
// It knows nothing of jobs, sandboxes or NATS, and must not import the agent
// or coordinator packages.
//
// Goroutines: a Session runs yamux's receive and send loops, plus its
// keepalive loop when Config.KeepAliveInterval is positive; Close stops them
// all. Config.IdleTimeout adds a timer, not a goroutine (idle.go): it
// re-arms itself for the time left and closes a session whose peer sent
// nothing for that long. OpenStream runs no goroutine of its own.
// Redialer.Run runs in the caller's goroutine. A WebSocket connection runs
// no goroutine of its own: its keepalive ping is a timer that re-arms
// itself (ws.go).
//
// Dead peers: a peer that stopped answering with its connection left open
// (a frozen process: writes still succeed into its kernel buffers) is found
// within Config.DeadPeerBound, 15 s with DefaultConfig (pings) and with the
// coordinator's IdleTimeout of three 5 s heartbeat intervals. The tests run
// these bounds on synctest's fake clock (tunneltest.Synctest).
//
// Frame coalescing: stock yamux writes a data frame as two Writes (the
// 12-byte header, then the body). Over TLS each Write becomes its own record
// and syscall, which costs throughput and small-message latency. Sessions
// wrap their net.Conn in a coalescing writer that holds a data-frame header
// and sends it in the same Write as the body that always follows it (see
// coalesce.go), and the transport beneath the TLS (Cork) gathers a frame's
// records into one write and, under bulk, reads everything the socket holds
// (up to 256 KiB) in one system call instead of one per record
// (readahead.go). yamux itself is unmodified.
//
// Flow telemetry (flow.go): a session with Config.Flow set watches the same
// frame headers, written (coalesceConn) and read (watchConn), to keep each
// stream's send window as yamux keeps it (256 KiB at the open, plus the
// peer's window updates, less the data sent). A data frame that takes it to
// zero starts a window stall, the peer's next window update for the stream
// ends it; the data frame in the connection's hands is the session's
// queued bytes; every answered Ping keeps its round trip. Session.FlowStats
// reports one session, Config.Flow (a FlowCounters) adds up many. It costs
// a few atomics per frame, no lock, no allocation per frame and no
// goroutine. Its mutex (flowState.mu) is a leaf lock, held only to replace
// the stream table when a stream opens or closes.
package tunnel
