// Package natspipe implements the pipe of protocol/pipe.go: a reliable,
// ordered, flow-controlled, bidirectional byte stream over NATS core
// subjects. The coordinator uses it to relay a tunnel stream to a NATS client
// (tether.v1.stream); the client package wraps it as client.Stream.
//
// A Pipe is an io.ReadWriteCloser with TCP-like half-close (CloseWrite: the
// peer reads io.EOF), abort (Close or CloseWithError: the peer's reads and
// writes fail with the reason) and, like QUIC's RESET_STREAM, the abort of
// one direction (ResetWrite: the peer drops what it has not read of it and
// its reads fail with the reason at once, while it goes on writing). Done
// and PeerReset are channels closed when the pipe failed or was closed and
// when the peer reset its direction, for callers blocked elsewhere (the
// coordinator's relay, writing to a tunnel stream).
//
// Ends are created by Dial (the opener: subscribes its inbox, then
// publishes a request with that inbox as reply subject and waits for the
// answering end's open message), Accept (the answering end: subscribes its
// own inbox, then sends open to the opener's inbox), AcceptOn (Accept on a
// subject the caller chose, with a filter that drops messages not from
// the opener: the coordinator's end across NATS accounts) or New (both
// subjects already known and subscribed).
//
// # Flow control and memory
//
// A receiver grants its peer credit (cumulative bytes) only as its own
// reader consumes them, in batches of half its window, so the bytes it
// buffers never exceed Config.Window (plus one message in WriteTo). Data
// past the granted credit fails the pipe. Write blocks while it is out of
// credit; Close, a failure and the peer-silence timer unblock it.
//
// # Goroutines
//
// A Pipe starts none of its own for data: nats.go delivers the inbox's
// messages on its subscription's goroutine to a callback that only parses
// headers, queues data and wakes waiters (it never blocks). A keepalive
// timer (time.AfterFunc) runs briefly every KeepAlive/2 to send pings and
// detect silence. Close stops the timer and unsubscribes.
//
// # Locks
//
// Pipe.wmu serialises writers (data and eof leave in sequence order) and
// is taken before Pipe.mu, which guards all other state and is never held
// while publishing.
//
// # Imports
//
// natspipe imports protocol and nats.go only; it must not import agent,
// coordinator, client or tunnel.
package natspipe
