// Package client is the Go client of Tether's public NATS API: it submits
// jobs to tether.v1.exec and streams their output, lists nodes through
// tether.v1.nodes, cancels jobs through tether.v1.cancel and reaches
// detached jobs through tether.v1.job.* (jobs.go). The wire format
// (subjects, headers, JSON bodies, error codes) is defined in package
// protocol; this package only drives it over a caller-owned *nats.Conn.
//
// That connection must hold a client user's credentials and its private
// inbox prefix (natsauth.Creds.Options, e.g. from ReadCreds of a .creds
// file): NATS admits no anonymous client, and a client user may receive
// replies under its own prefix only. Each call's reply inbox comes from
// the connection (nc.NewInbox), so it gets that prefix. Exec requests of
// a Client share one subscription, INBOX.* (replies.go), each request
// replying to INBOX.<n>: a subscription per request cost a SUB and an
// UNSUB per exec.
//
// # Exec and its waits
//
// The coordinator does not acknowledge an exec request, and a job that prints
// nothing sends nothing until its final result, which may be hours later.
// So Exec cannot use a "first reply" timeout. Instead it detects a missing coordinator deterministically: after
// publishing the request it flushes the connection (bounded by
// Client.RequestTimeout). The server answers a request nobody subscribes to
// with a 503 "no responders" status before it answers the flush's PING, so
// once the flush returns, either that status is already queued on the reply
// subscription or a coordinator has the request. From then on Exec waits for
// replies for as long as ctx allows; callers bound a job with ctx (and with
// ExecRequest.Timeout, which the coordinator enforces). While a job runs the
// coordinator sends a keepalive reply after every few seconds of silence, so
// a coordinator that died mid-job (or a final result lost while the NATS
// connection was reconnecting) is noticed after Client.KeepAliveTimeout
// without any reply: Exec then fails with an error matching
// ErrCoordinatorSilent. A connection that is closed while Exec waits (the
// server disconnects a user whose credentials were revoked, and it cannot
// reconnect) fails the wait at once, with an error matching
// nats.ErrConnectionClosed. Exec answers each keepalive and probe with a
// heartbeat (protocol.SubjectExecAlive), by which the coordinator knows
// this client still waits and cancels the job once heartbeats stop (lost output replies are noticed sooner, as a
// sequence gap once the next reply arrives). Node results stream in as each
// node finishes (ExecWith's NodeResultHandler); when the final result is too
// large for one message it omits them and Exec rebuilds the list.
//
// Output replies carry a sequence number; a gap (for example replies dropped
// because the caller's output handler was slower than the job and the
// subscription's pending limit was reached) is an error naming the missing
// number, never silently lost output. When Exec gives up on a job that may
// still be running (ctx ended, a gap, a broken connection) it asks the
// coordinator to cancel it, so abandoned jobs do not keep running.
//
// # Exec with streamed stdin
//
// An exec job's stdin travels in its request (ExecRequest.Stdin, at most
// protocol.MaxStdinSize). ExecStream runs a command on one node through an
// exec stream relayed by the coordinator (tether.v1.stream, OpenStream)
// instead, so stdin is streamed as it is read, with no size limit and the
// command's own pace as flow control; its output and result come in the
// same shapes as ExecWith's.
//
// # The direct data path
//
// OpenStream (and Dial, SSH, ExecStream on it) asks for a ticket over NATS
// and opens the stream on the coordinator's own tunnel listener (ALPN
// tether-client/1, the certificate checked against the pin of the ticket's
// reply), on one yamux session per coordinator listener, kept by the
// Client for all its streams and released by Close; when the listener
// cannot be reached, or the coordinator has none, it relays over NATS
// (Client.Direct: DirectAuto, DirectOff, DirectOnly; direct.go). A
// listener whose certificate does not match the pin is refused in every
// mode (*PinMismatchError), never fallen back from.
//
// # Goroutines and concurrency
//
// nats.go delivers messages on its connection's reader goroutine into a
// per-call synchronous subscription that the calling goroutine drains.
// ExecStream starts one goroutine that copies stdin to the stream (its
// cancel is the pipe's reset, sent without one), and returns once it ended, except a stdin copier
// blocked in a Read that cannot be interrupted (see ExecStream); natspipe
// runs its own. Each direct session has one reader of its control stream,
// ended by the session's end or Close, and yamux's own loops. Nothing else
// starts goroutines. A Client is safe for concurrent use (but not to copy:
// it holds its direct sessions); each call uses its own reply inbox.
//
// Locks: directClient.mu, directSession.mu and directStream.mu are leaf
// locks, never held during I/O; directSession.wmu is held while one frame
// is written on its control stream.
//
// # Imports
//
// client depends on protocol, natspipe, nats.go and tunnel (the direct
// path's transport). It must not import agent or coordinator, and the
// dependency test in cmd/internal/repocheck enforces it.
package client
