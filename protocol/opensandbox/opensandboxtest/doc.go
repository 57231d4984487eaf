// Package opensandboxtest is a test double of an OpenSandbox deployment,
// written from reference/wire-facts.md §2–3 to behave like the real one on
// the wire: a lifecycle server ([Server], REST at the root and under /v1,
// API-key auth, expiry, the HTTP and WebSocket server proxy) and the
// in-sandbox daemon execd ([Execd]: /ping, /command as server-sent events,
// and the PTY API with replay, takeover and keepalive). Commands and PTY
// sessions run real processes (sh, bash) in a temporary directory.
//
// It may use sockets and processes, unlike its parent: packages whose name
// ends in "test" are exempt from protocol's purity rule. Only tests import
// it.
package opensandboxtest
