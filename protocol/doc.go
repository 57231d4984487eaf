// Package protocol owns every wire format Tether speaks: the tunnel's
// per-stream header and frames, the control messages exchanged on the first
// stream (hello, welcome, heartbeat), the parameters of each stream kind, and
// the public NATS API (subjects, JSON request and reply types, header names
// and error codes).
//
// It is pure encode/decode over io.Reader and io.Writer. It must not open
// sockets, start processes or import NATS; the dependency test in
// cmd/internal/repocheck enforces this. Every decoder has a size limit and a
// fuzz test.
//
// # Tunnel streams
//
// One yamux stream carries one operation. The opener writes a stream header
// first:
//
//	+---------+--------+-------------------+----------------------+
//	| version | kind   | length            | params (JSON)        |
//	| uint8   | uint8  | uint32 big endian | length bytes         |
//	+---------+--------+-------------------+----------------------+
//
// version is [Version]; a peer that does not speak it answers with an error
// frame and closes the stream. kind is a [Kind]; params is the JSON encoding
// of the kind's parameter struct ([ControlParams], [ExecParams], ...) and is
// at most [MaxHeaderSize] bytes. Params are decoded strictly
// ([Header.DecodeParams]) so that a request is never half understood: a
// key that is not exactly (case-sensitively) a field name, a key given
// twice in one object, bytes that are not UTF-8 and \u escapes of unpaired
// surrogates are refused with a [*JSONError] naming the JSON path; JSON
// frames ([DecodeJSON]) skip unknown keys but refuse the rest. See
// strictjson.go.
//
// Before TLS, a coordinator that admits agents at a bounded rate may
// answer a connection with a 12-byte busy refusal instead of its
// ServerHello, naming when to come back; it is unauthenticated, so
// agents bound the wait (drain.go, ParseBusyRefusal).
//
// After the header both directions carry frames:
//
//	+--------+-------------------+----------------------+
//	| type   | length            | payload              |
//	| uint8  | uint32 big endian | length bytes         |
//	+--------+-------------------+----------------------+
//
// length is at most [MaxFrameSize]. Data frames ([FrameStdin],
// [FrameStdout], [FrameStderr]) carry raw bytes; the others carry JSON.
// Which frames are legal depends on the stream kind:
//
//   - control: the agent sends [FrameHello] (or, to enroll, [FrameEnroll]:
//     see enroll.go); the coordinator answers [FrameWelcome] or
//     [FrameReject] (then closes). Afterwards the agent
//     sends [FrameHeartbeat] every Welcome.HeartbeatInterval, and the
//     coordinator may send [FrameCancelStream] ([CancelStream], at most
//     [MaxControlFrameSize] bytes) if the agent's Hello.Features listed
//     [FeatureCancelStream], and answers an agent's [FrameRenew] with
//     [FrameRenewed] or [FrameReject] (enroll.go). When it drains, it sends
//     [FrameDrain] ([Drain]: when to dial another coordinator) to an agent
//     that listed [FeatureDrain], then a yamux GoAway; the streams in
//     flight go on (drain.go). Such an agent reads the control stream until
//     the session ends; one that did not list it may never read it after
//     Welcome, so the coordinator sends it nothing. Features are how this
//     stream grows within a Version: a new coordinator→agent frame comes
//     with a new feature name, a coordinator ignores feature names it does
//     not know, and an agent that reads a frame it cannot parse (a
//     coordinator breaking this rule) stops interpreting the stream but
//     keeps reading it, so that the coordinator never blocks on it.
//     Agent → coordinator frames grow the other way round: the agent
//     lists the feature in its Hello and sends the frame only when the
//     coordinator's Welcome.Features listed it too (a coordinator ends a
//     session on a frame type it does not know). [FrameJobExit]
//     ([JobStatus], at most [MaxJobExitSize] bytes; [FeatureJobExit]) is
//     one: the agent reports each detached job of its node that exited
//     or was found lost, and the coordinator settles the job's durable
//     record, so that job listings are current (jobexit.go). How a
//     node's word changes that record is one pure rule, the job store's
//     and the CLI's (ObserveJob, AddJobResult: jobobserve.go).
//   - exec: the coordinator sends [FrameStdin]* then [FrameStdinClose], and
//     may send [FrameCancel] at any time; the agent sends [FrameStdout] and
//     [FrameStderr] as output is produced, then exactly one [FrameExit] or
//     [FrameError], then closes the stream. Params may carry a batch
//     (Commands, FailFast) or ask for a detached job (Detach, JobID).
//   - copy: a manifest, entries with data and checksums, and a commit; see
//     copy.go. [FrameFileData] carries raw bytes.
//   - pty: a terminal: stdin, output, resize, signals, exit; see pty.go.
//   - job: one query of a detached job (status, output, cancel), answered
//     with [FrameJob] (and [FrameStdout] for output).
//
// Every kind a client reaches through the coordinator's stream relay
// (exec, copy, pty) accepts [FrameCancel] at any point: the relay, which
// does not parse the streams it carries beyond frame boundaries, sends one
// when the client cancelled or vanished before the operation ended. yamux
// has no stream reset, so an abort must be said in-band, and an in-band
// cancel waits behind every byte the stream already carries: stdin a
// command leaves unread fills the agent's pipe, the stream's window and the
// relay's buffers, and the cancel never arrives. The relay therefore also
// sends [FrameCancelStream] on the control stream (to an agent with
// [FeatureCancelStream]), which the agent acts on as on a FrameCancel of
// that stream: an exec's or pty's process group is killed and its exit
// frame (cancelled) still sent if the stream can carry it; a copy is
// aborted as when its session ends.
//
// A stream that breaks without a final frame (the session died) means the
// operation's outcome is unknown; the agent kills work it can no longer
// report.
//
// # NATS API
//
// See api.go: subjects live under "tether.v1.", bodies are JSON, errors use
// the NATS micro error headers with the stable codes listed there. Byte
// streams between a NATS client and a tunnel stream (tether.v1.stream) run
// over the flow-controlled pipe of pipe.go.
//
// # Audit events
//
// See audit.go: an [AuditEvent] (JSON, versioned by [AuditVersion]) per
// operation and refusal, published by coordinators on [AuditSubject]
// (tether.v1.audit.<operation>.<result>) and read by clients through
// [SubjectAuditQuery] ([AuditQueryRequest], decoded strictly and fuzzed;
// [AuditQueryResponse]). Events carry no secret: a command is its SHA-256
// ([CommandDigest]) and argv[0], the environment its keys.
package protocol
