// Package opensandbox holds the wire formats of an OpenSandbox deployment
// (reference/wire-facts.md §2, §3): the lifecycle server's REST JSON bodies,
// paths and route parser, the metadata filter of the list call, NeMo Gym's
// metadata-value sanitiser, and the in-sandbox daemon execd's command events
// and PTY WebSocket frames.
//
// Like its parent it is pure encode/decode: standard library and
// [github.com/tetherfleet/tether/protocol] only, no sockets, no processes
// (cmd/internal/repocheck enforces it). The fake server and execd that speak
// these formats on loopback live in the opensandboxtest sub-package.
//
// # Lifecycle API
//
// The server mounts every route both at the root and under /v1
// ([ParsePath] accepts both). JSON field names are camelCase. Errors raised
// by handlers are [ErrorBody] {"code","message"}; request-schema failures
// are FastAPI's 422 [ValidationErrorBody] {"detail":[...]}. Auth is the
// [HeaderAPIKey] header; the proxy route is exempt.
//
// # execd PTY WebSocket
//
// Binary frames carry a channel byte then bytes ([BinaryFrame]); the replay
// frame (channel 0x03) adds an 8-byte big-endian absolute offset. Text
// frames are JSON objects with a "type" ([ControlFrame]). On attach the
// server sends the replay frame, if any, BEFORE the connected frame.
package opensandbox
