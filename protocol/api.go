package protocol

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The NATS micro service. `nats micro ls` lists it as ServiceName.
const (
	ServiceName        = "tether"
	ServiceDescription = "Tether fleet coordinator: run jobs on nodes through their tunnels"
)

// Request/reply subjects of the public NATS API, version 1.
const (
	// SubjectExec takes an ExecRequest and streams replies, each with
	// HeaderJob and HeaderSeq: output messages (HeaderType stdout or stderr;
	// raw bytes; HeaderNode), one node-result message per node as it
	// finishes (JSON NodeResult; HeaderNode), keepalive messages (empty)
	// after every KeepAliveInterval of silence, then exactly one result
	// message (HeaderType result; JSON ExecResult). An invalid request gets
	// one micro error reply instead and runs nothing. Messages of HeaderType
	// probe (no HeaderSeq, empty) may also arrive. A client answers every
	// keepalive and probe with a heartbeat on SubjectExecAlive.
	SubjectExec = "tether.v1.exec"
	// SubjectExecAlive takes a client's heartbeat for a running exec job:
	// a message with HeaderJob (the job id), no body and no reply subject,
	// published for each keepalive and probe reply the client receives.
	// Once the coordinator got one from the job's sender it expects one
	// per keepalive interval, and cancels the job after 3 intervals without
	// (its client is gone). A client that never sends one (the nats CLI) is
	// never cancelled so. Heartbeats from anyone but the job's sender are
	// ignored; nothing is answered.
	SubjectExecAlive = "tether.v1.exec.alive"
	// SubjectNodes takes a NodesRequest (an empty body is allowed) and replies
	// with a NodesResponse.
	SubjectNodes = "tether.v1.nodes"
	// SubjectCancel takes a CancelRequest and replies with a CancelResponse.
	// Published without a reply subject (fire and forget, as the Go client
	// does when it gives up on a job) it cancels all the same and answers
	// nothing; the job's result then reports the cancel.
	SubjectCancel = "tether.v1.cancel"
	// SubjectStream takes a StreamRequest, opens a tunnel stream of that
	// kind to the node, and relays its bytes over a NATS pipe (pipe.go) in
	// both directions until either end closes. Clients use it for copies,
	// terminals and interactive exec.
	SubjectStream = "tether.v1.stream"
	// SubjectJobStatus takes a JobRequest and replies with a JobStatus of a
	// detached job.
	SubjectJobStatus = "tether.v1.job.status"
	// SubjectJobOutput takes a JobOutputRequest and replies with raw bytes
	// of a detached job's stdout or stderr file, with HeaderTotal and
	// HeaderEOF.
	SubjectJobOutput = "tether.v1.job.output"
	// SubjectJobCancel takes a JobRequest, kills a detached job's process
	// group and replies with its JobStatus.
	SubjectJobCancel = "tether.v1.job.cancel"
)

// StreamRequest is the body of a SubjectStream request.
type StreamRequest struct {
	Node string `json:"node"`
	// Kind is the stream kind's name: "exec", "copy", "pty", "dial" or
	// "ssh".
	Kind string `json:"kind"`
	// Params are the kind's params (ExecParams, CopyParams, PTYParams,
	// DialParams), sent to the agent in the stream header; the agent
	// validates them. For "ssh" they must be empty or {}: the coordinator
	// writes the SSHParams itself, from the caller's identity and the
	// policy (ssh.go), and the client's end of the pipe carries the raw
	// SSH protocol (tether ssh-proxy).
	Params json.RawMessage `json:"params"`
	// Direct asks for the direct data path (direct.go): instead of a NATS
	// pipe, the coordinator that holds the node answers with a
	// DirectStreamReply, a single-use ticket for this one stream (node,
	// kind, params and the caller's identity, as authorized now) to
	// redeem on its tunnel listener. A coordinator without a direct
	// listener answers 501 direct_unavailable; the client then asks again
	// without Direct.
	Direct bool `json:"direct,omitempty"`
}

// Reply headers on SubjectExec's streamed replies.
const (
	HeaderJob  = "Tether-Job"  // the job id, on every reply
	HeaderType = "Tether-Type" // one of the Reply* values
	HeaderNode = "Tether-Node" // the node an output chunk or node result is about
	HeaderSeq  = "Tether-Seq"  // decimal sequence number, from 0, across the job's replies
	// HeaderHeartbeats is "1" on an exec request whose client answers
	// every keepalive and probe with a heartbeat (SubjectExecAlive), as
	// package client does: the coordinator then expects heartbeats from
	// the job's start, so a client that dies before its first keepalive
	// (5 s) is noticed too. Without it (the nats CLI, older clients) a
	// job is watched only once a first heartbeat came.
	HeaderHeartbeats = "Tether-Heartbeats"
)

// Values of HeaderType.
const (
	ReplyStdout     = "stdout"
	ReplyStderr     = "stderr"
	ReplyNodeResult = "node-result" // JSON NodeResult, one per node as it finishes
	ReplyKeepAlive  = "keepalive"   // empty; the job is still running
	ReplyResult     = "result"      // JSON ExecResult; the last reply
	// ReplyProbe marks an empty message without HeaderSeq that the
	// coordinator publishes to check that the client still listens; the
	// client answers with a heartbeat (SubjectExecAlive).
	ReplyProbe = "probe"
)

// Headers of SubjectJobOutput replies.
const (
	HeaderTotal = "Tether-Total" // decimal size of the output file so far
	HeaderEOF   = "Tether-EOF"   // "true" when the reply reaches the end and the job exited
)

// DefaultKeepAliveInterval is how often a coordinator sends a keepalive reply
// to a silent exec job's client, and probes that the client still listens.
const DefaultKeepAliveInterval = 5 * time.Second

// Limits of the NATS API.
const (
	// MaxRequestSize bounds an API request body, in bytes (NATS's default
	// max_payload).
	MaxRequestSize = 1 << 20
	// MaxStdinSize bounds ExecRequest.Stdin once decoded, in bytes.
	MaxStdinSize = 512 << 10
	// MaxJobIDLen bounds a client-chosen job id.
	MaxJobIDLen = 64
	// MaxArgs bounds len(ExecRequest.Argv).
	MaxArgs = 4096
	// MaxEnv bounds len(ExecRequest.Env).
	MaxEnv = 1024
	// MaxJobOutputLimit bounds JobOutputRequest.Limit.
	MaxJobOutputLimit = 512 << 10
	// ClipLen bounds how much of a client-supplied value an error message
	// repeats.
	ClipLen = 64
)

// Clip quotes s for an error message, cut to ClipLen bytes ("…" marks a cut).
func Clip(s string) string {
	if len(s) <= ClipLen {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:ClipLen]) + "…"
}

// QuoteName returns name (a path, a program name: a client's bytes) as it
// is when a terminal shows it faithfully, else quoted as strconv.Quote
// quotes it: a name holding a control character (a newline, an escape
// sequence), a character that is not printable (a bidirectional
// override), a byte that is not UTF-8, or a quote or backslash (so that a
// name shown quoted is never mistaken for one shown as it is). An error
// repeating such a name thus cannot forge lines or terminal output. It is
// the one rule of every Tether message that names a file or program (the
// agent's, the copy's, the CLI's).
func QuoteName(name string) string {
	if q := strconv.Quote(name); q[1:len(q)-1] != name {
		return q
	}
	return name
}

// CharAt names what starts at byte i of s, for an error that refuses it:
// "character 'é'" for a UTF-8 character (the whole character, not its
// first byte read as Latin-1), "byte 0xff (not UTF-8)" for a byte that
// starts none. i must be within s.
func CharAt(s string, i int) string {
	if r, n := utf8.DecodeRuneInString(s[i:]); r != utf8.RuneError || n > 1 {
		return fmt.Sprintf("character %q", r)
	}
	return fmt.Sprintf("byte %#02x (not UTF-8)", s[i])
}

// Duration is a time.Duration that encodes as a Go duration string ("1m30s")
// and decodes from either such a string or a JSON number of seconds.
type Duration time.Duration

// MarshalJSON encodes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON accepts "90s", "1m30s" or 90 (seconds, may be fractional);
// null leaves d unchanged. Negative values decode (validation rejects them
// with a clearer message than a decoding error could give).
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return &durationError{fmt.Sprintf("%s is not a duration: want a string like \"30s\" or a number of seconds", Clip(s))}
		}
		*d = Duration(v)
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return &durationError{"want a string like \"30s\" or a number of seconds"}
	}
	if f > float64(1<<62)/1e9 || f < -float64(1<<62)/1e9 {
		return &durationError{fmt.Sprintf("%s seconds is out of range", Clip(string(b)))}
	}
	*d = Duration(f * float64(time.Second))
	return nil
}

// durationError is a Duration decoding problem; DecodeRequest names the
// field it happened in.
type durationError struct{ msg string }

func (e *durationError) Error() string { return e.msg }

// Target names the nodes a job runs on. Exactly one field is set.
type Target struct {
	Node     string `json:"node,omitempty"`     // one node id
	Selector string `json:"selector,omitempty"` // a label selector (ParseSelector)
	All      bool   `json:"all,omitempty"`      // every connected node
}

// String describes the target for messages: "node a", "selector k=v", "all".
func (t Target) String() string {
	switch {
	case t.Node != "":
		return "node " + t.Node
	case t.Selector != "":
		return "selector " + t.Selector
	case t.All:
		return "all nodes"
	}
	return "no target"
}

// DefaultMaxParallel is how many nodes of a fan-out a coordinator runs at
// once when ExecRequest.MaxParallel is zero and its configuration names no
// other bound. A constant of the API, not of the coordinator, so that a
// client (the progress display of `tether exec`) need not link the
// coordinator to know it.
const DefaultMaxParallel = 64

// ExecRequest is the body of a SubjectExec request.
type ExecRequest struct {
	// ID is an optional client-chosen job id (1–64 of [A-Za-z0-9-_.]), used to
	// cancel the job through SubjectCancel. The coordinator picks one if empty
	// and reports it in HeaderJob. With a job store an id is its record's
	// owner's (the submitting identity) until the record expires: the owner
	// may reuse it once the job ended; while the job runs, 409
	// duplicate_job. Another caller's request under it, the job live or
	// ended, is refused with 409 duplicate_job "job ID ... is already in
	// use", a text that tells nothing of that job, and changes nothing.
	ID     string `json:"id,omitempty"`
	Target Target `json:"target"`
	// Script runs through `bash -s` (NeMo Gym's SSH run semantics); Argv runs
	// without a shell; Commands are a batch (see ExecParams). Exactly one is
	// set.
	Script   string   `json:"script,omitempty"`
	Argv     []string `json:"argv,omitempty"`
	Commands []string `json:"commands,omitempty"`
	// FailFast runs Commands one by one through `bash -c`, stopping at the
	// first that fails; without it Commands are one `bash -s` script.
	FailFast bool              `json:"fail_fast,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	// Timeout bounds each node's run; zero means the coordinator's default.
	Timeout Duration `json:"timeout,omitempty"`
	// Stdin is fed to the process (base64 in JSON); argv mode only.
	Stdin []byte `json:"stdin,omitempty"`
	// MaxParallel bounds how many nodes run at once; zero means the
	// coordinator's default (DefaultMaxParallel unless configured).
	MaxParallel int `json:"max_parallel,omitempty"`
	// OutputLimit caps each of stdout and stderr per node, in bytes; zero
	// means the agent's default (64 MiB), OutputUnlimited means no cap.
	// Output past it is dropped and the node's result is Truncated.
	OutputLimit int64 `json:"output_limit,omitempty"`
	// Detach starts the job detached on each node (output to files there,
	// surviving tunnel loss) and replies as soon as it started; query it
	// with SubjectJobStatus, SubjectJobOutput and SubjectJobCancel.
	Detach bool `json:"detach,omitempty"`
	// Idempotent marks a job that may run more than once: a repeat of
	// its submission (same caller, same IdempotencyKey, or same ID when
	// the key is empty; keys are per caller, so another caller's equal
	// key is another job's) within the job store's retention is refused with
	// 409 duplicate_job naming the first job, instead of running again,
	// unless that job was lost (its coordinator died while it ran): then
	// the repeat runs (at least once; client.ExecWith repeats it itself).
	// Without it a job runs at most once.
	Idempotent bool `json:"idempotent,omitempty"`
	// IdempotencyKey is the key of an Idempotent job, at most
	// MaxIdempotencyKeyLen bytes.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// MaxIdempotencyKeyLen bounds ExecRequest.IdempotencyKey, in bytes.
const MaxIdempotencyKeyLen = 256

// ExecResult is the final reply of a SubjectExec request.
type ExecResult struct {
	ID string `json:"id"`
	// Results are the nodes' outcomes sorted by node id, unless
	// ResultsOmitted.
	Results []NodeResult `json:"results"`
	// ResultsOmitted is set when the results did not fit the NATS server's
	// max payload; they were each sent as a node-result reply, and the
	// client rebuilds the list from those.
	ResultsOmitted bool `json:"results_omitted,omitempty"`
	// Nodes, Succeeded and Failed count the job's nodes and those whose
	// result is and is not OK.
	Nodes     int `json:"nodes"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	// Truncated is set when any node's output was truncated or cut (see
	// NodeResult.Truncated): the output the client received is not all the
	// job wrote.
	Truncated bool `json:"truncated,omitempty"`
}

// NodeResult is one node's outcome. Error is set, and ExitCode is -1, when the
// node could not run the job at all (unreachable, tunnel lost, start failed).
type NodeResult struct {
	Node            string  `json:"node"`
	ExitCode        int     `json:"exit_code"`
	Signal          string  `json:"signal,omitempty"`
	TimedOut        bool    `json:"timed_out,omitempty"`
	Cancelled       bool    `json:"cancelled,omitempty"`
	DurationMS      float64 `json:"duration_ms"`
	StdoutBytes     int64   `json:"stdout_bytes"`
	StderrBytes     int64   `json:"stderr_bytes"`
	StdoutTruncated bool    `json:"stdout_truncated,omitempty"`
	StderrTruncated bool    `json:"stderr_truncated,omitempty"`
	// Truncated is StdoutTruncated || StderrTruncated || OutputCut: output
	// past the output limit was dropped, or output after the agent killed
	// the process group was lost, so the output received is incomplete
	// even when ExitCode is 0.
	Truncated bool   `json:"truncated,omitempty"`
	Error     string `json:"error,omitempty"`
	// ErrorCode is the agent's ErrorInfo.Code (CodeCommandNotFound,
	// CodeNotExecutable, CodeStartFailed, CodeBusy…) or a coordinator's
	// ResultCode*; empty for a tunnel lost or a protocol error.
	ErrorCode string `json:"error_code,omitempty"`
	// Failure is set when the job ran and failed (non-zero exit, signal,
	// timeout), in NeMo Gym's error shape: "Command failed (exec on
	// <node>) with exit code N:\n  <command>\n<stderr stripped>", with the
	// last 64 KiB of the node's stderr.
	Failure string `json:"failure,omitempty"`
	// FailedCommand is the index of the command that stopped a fail-fast
	// batch; nil when none did.
	FailedCommand *int `json:"failed_command,omitempty"`
	// OutputCut is set when the agent killed the process group because
	// something kept the output pipes open after the main process exited
	// (the agent's pipe wait): output after that was lost, so Truncated is
	// set too.
	OutputCut bool `json:"output_cut,omitempty"`
	// Detached is set when the job was started detached on the node and
	// is running there (see ExecRequest.Detach).
	Detached bool `json:"detached,omitempty"`
}

// Node result error codes set by the coordinator (agents' codes are the
// Code* constants of control.go).
const (
	// ResultCodeShutdown: the coordinator cancelled the job because it is
	// shutting down.
	ResultCodeShutdown = "shutdown"
	// ResultCodeLost: how the node's run of a detached job ended is
	// unknown (its agent lost the job, or the node stayed unreachable past
	// the coordinator's JobLostAfter); ExitCode is -1.
	ResultCodeLost = "lost"
	// ResultCodeRevoked: the coordinator cancelled the job while it ran
	// because its caller lost the right to run it there: a policy reload
	// no longer grants the caller exec on the node (as the user it ran
	// as), or the caller's NATS credentials were revoked (or expired).
	// Cancelled is set; Error says what went away ("access revoked: …").
	ResultCodeRevoked = "revoked"
)

// OK reports whether the node ran (or started, when detached) the job and
// it exited 0. A truncated output does not make a result not OK (the
// command succeeded); OutputTruncated tells.
func (r *NodeResult) OK() bool { return r.Error == "" && r.ExitCode == 0 }

// OutputTruncated reports whether the output received is incomplete:
// output past the output limit was dropped on either stream, or output was
// lost when the agent cut it (OutputCut).
func (r *NodeResult) OutputTruncated() bool {
	return r.Truncated || r.StdoutTruncated || r.StderrTruncated || r.OutputCut
}

// OutputUnlimited is the OutputLimit (ExecRequest, ExecParams) that means no
// cap: the agent forwards (or, detached, keeps) every byte.
const OutputUnlimited int64 = math.MaxInt64

// Paging of SubjectNodes.
const (
	// DefaultNodesLimit is the page size when NodesRequest.Limit is 0.
	DefaultNodesLimit = 500
	// MaxNodesLimit bounds NodesRequest.Limit.
	MaxNodesLimit = 1000
)

// NodesRequest is the body of a SubjectNodes request. The matching nodes are
// sorted by id and one page of them is returned: Limit nodes from Offset.
type NodesRequest struct {
	// Selector filters nodes by label (ParseSelector); empty matches all.
	Selector string `json:"selector,omitempty"`
	// Limit is the page size, 1 to MaxNodesLimit; 0 means
	// DefaultNodesLimit.
	Limit int `json:"limit,omitempty"`
	// Offset is how many matching nodes to skip, from 0.
	Offset int `json:"offset,omitempty"`
}

// Validate checks r's paging fields and selector.
func (r *NodesRequest) Validate() *APIError {
	if r.Limit < 0 || r.Limit > MaxNodesLimit {
		return NewAPIError(400, ErrCodeInvalid, "limit %d: must be 0 (default %d) to %d", r.Limit, DefaultNodesLimit, MaxNodesLimit)
	}
	if r.Offset < 0 {
		return NewAPIError(400, ErrCodeInvalid, "offset %d is negative", r.Offset)
	}
	if _, err := ParseSelector(r.Selector); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "selector: %v", err)
	}
	return nil
}

// NodeInfo describes one connected node.
type NodeInfo struct {
	// ID is the node id (ValidNodeID).
	ID string `json:"id"`
	// Labels are the node's labels; never null.
	Labels map[string]string `json:"labels"`
	// Capacity is what the agent measured at its start.
	Capacity Capacity `json:"capacity"`
	// AgentVersion is the agent binary's version string (at most 1 KiB).
	AgentVersion string `json:"agent_version"`
	// Coordinator is the id of the coordinator the node is connected to.
	Coordinator string `json:"coordinator"`
	// SessionID names the node's current tunnel session.
	SessionID string `json:"session_id"`
	// RemoteAddr is the agent's address (host:port) as the coordinator
	// sees it.
	RemoteAddr string `json:"remote_addr"`
	// ConnectedAt is when the current session was welcomed (UTC).
	ConnectedAt time.Time `json:"connected_at"`
	// LastHeartbeat is when the last heartbeat arrived (UTC); ConnectedAt
	// until the first one.
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// RTTMicros is the tunnel round trip the agent last measured, in
	// microseconds; 0 if not measured yet.
	RTTMicros int64 `json:"rtt_us"`
	// RunningExecs counts the exec operations the agent reported in flight
	// in its last heartbeat.
	RunningExecs int `json:"running_execs"`
	// WindowStalls counts the times one of the coordinator's streams to
	// this node ran out of the agent's flow-control window in the current
	// session (the agent read slower than the coordinator wrote: a slow
	// link or a slow node), a stall in progress included.
	WindowStalls uint64 `json:"window_stalls"`
	// WindowStallSeconds is the total time those streams waited for the
	// agent's window in the current session, in seconds.
	WindowStallSeconds float64 `json:"window_stall_seconds"`
	// SendQueuedBytes is the body bytes of the tunnel frame the
	// coordinator is writing to this node and that the connection has not
	// taken yet: 0 while idle, above 0 while the link is slower than what
	// is sent on it.
	SendQueuedBytes int64 `json:"send_queued_bytes"`
	// AgentWindowStalls, AgentWindowStallSeconds and AgentSendQueuedBytes
	// are the same for the other direction, the agent's streams to the
	// coordinator (exec output, copies from the node, forwarded
	// responses), as the agent's last heartbeat reported them; 0 from
	// agents that predate them.
	AgentWindowStalls       uint64  `json:"agent_window_stalls"`
	AgentWindowStallSeconds float64 `json:"agent_window_stall_seconds"`
	AgentSendQueuedBytes    int64   `json:"agent_send_queued_bytes"`
	// Targets names the local targets the agent dials (Hello.Targets), e.g.
	// "openshell", "opensandbox".
	Targets []string `json:"targets,omitempty"`
	// Transport is how the agent's tunnel reached the coordinator: "tls"
	// (raw TLS) or "wss" (the WebSocket transport, perhaps through an HTTP
	// proxy). Empty from coordinators that predate it.
	Transport string `json:"transport,omitempty"`
}

// NodesResponse is the reply to SubjectNodes: one page of the matching
// nodes, sorted by id.
type NodesResponse struct {
	Nodes []NodeInfo `json:"nodes"`
	// Total is how many nodes matched, across all pages.
	Total int `json:"total"`
}

// CancelRequest is the body of a SubjectCancel request.
type CancelRequest struct {
	ID string `json:"id"`
}

// CancelResponse is the reply to SubjectCancel.
type CancelResponse struct {
	ID        string `json:"id"`
	Cancelled bool   `json:"cancelled"`
}

// APIError is an error reply of the NATS API. It travels in the micro error
// headers (Nats-Service-Error-Code: Status as decimal, Nats-Service-Error:
// Message) and, as JSON, in the body, so clients can branch on Code.
type APIError struct {
	Status  int    `json:"status"`  // HTTP-like class: 400, 404, 409, 413, 500, 503
	Code    string `json:"code"`    // stable slug, one of the Err* codes below
	Message string `json:"message"` // what failed and where
}

// Error returns "tether: message (status code)".
func (e *APIError) Error() string {
	return fmt.Sprintf("tether: %s (%d %s)", e.Message, e.Status, e.Code)
}

// Is makes errors.Is match APIErrors by Code.
func (e *APIError) Is(target error) bool {
	var t *APIError
	return errors.As(target, &t) && t.Code == e.Code
}

// Stable API error codes.
const (
	ErrCodeMalformed    = "malformed_request" // body is not valid JSON of the right shape
	ErrCodeUnknownField = "unknown_field"     // body has a field the API does not define
	ErrCodeInvalid      = "invalid_request"   // a field's value is invalid
	ErrCodeNoTarget     = "no_target"         // no node, selector or all
	ErrCodeTooLarge     = "too_large"         // body, script or stdin over its limit
	ErrCodeUnknownNode  = "unknown_node"      // the named node is not connected
	ErrCodeNoMatch      = "no_match"          // the selector matched no connected node
	ErrCodeDuplicateJob = "duplicate_job"     // a running job already has this id
	ErrCodeNotFound     = "not_found"         // no running job has this id
	ErrCodeUnavailable  = "unavailable"       // the coordinator is shutting down, or a node did not answer
	ErrCodeUnsupported  = "unsupported"       // the node's agent does not support the operation
	ErrCodeInternal     = "internal"          // a bug or an unexpected failure
	// ErrCodeUnauthenticated (401): the NATS server did not vouch for the
	// caller (no Nats-Request-Info stamped, or its user JWT is not one of
	// Tether's client users, expired or revoked).
	ErrCodeUnauthenticated = "unauthenticated"
	// ErrCodeForbidden (403): the caller is known but policy does not allow
	// the operation; the message names the identity, the operation and the
	// rule missing.
	ErrCodeForbidden = "forbidden"
	// ErrCodeRateLimited (429): the caller is over its policy limit of
	// requests per second or concurrent jobs.
	ErrCodeRateLimited = "rate_limited"
	// ErrCodeNotRecorded (404): no durable record of the job submitted by
	// the caller exists (job.get with JobGetRequest.Mine): no coordinator
	// accepted the request, so it did not run.
	ErrCodeNotRecorded = "not_recorded"
)

// NewAPIError builds an APIError with a formatted message.
func NewAPIError(status int, code, format string, args ...any) *APIError {
	return &APIError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// DecodeRequest decodes an API request body strictly into v, because a
// request that is only partly understood must not run. It refuses, with
// the JSON path of what it names:
//   - a key that is not exactly (case-sensitively) one of the struct's
//     field names, at any depth: 400 unknown_field (`request has unknown
//     field "target.Node" (field names are case-sensitive: the field is
//     "node")`);
//   - a key given twice in any object, field or map key (env), after
//     unescaping: 400 malformed_request (`request has duplicate key
//     "argv"`);
//   - bytes that are not UTF-8, and \uXXXX escapes of unpaired UTF-16
//     surrogates: 400 malformed_request (`request has invalid UTF-8 in
//     "argv[1]" at byte offset 40`);
//   - invalid JSON and trailing data: 400 malformed_request;
//   - a body over MaxRequestSize: 413 too_large.
//
// An empty body decodes as "{}". A value of the wrong JSON type is reported
// by its field path and the JSON type expected. v is not touched when a
// key, UTF-8 or syntax problem is found.
func DecodeRequest(data []byte, v any) *APIError {
	if len(data) > MaxRequestSize {
		return NewAPIError(413, ErrCodeTooLarge, "request body is %d bytes, over the %d byte limit", len(data), MaxRequestSize)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	if err := decodeStrict(data, v); err != nil {
		var te *json.UnmarshalTypeError
		var de *durationError
		var je *JSONError
		var be base64.CorruptInputError
		msg := err.Error()
		switch {
		case errors.As(err, &je):
			code := ErrCodeMalformed
			if je.Problem == ProblemUnknownField || je.Problem == ProblemFieldCase {
				code = ErrCodeUnknownField
			}
			return NewAPIError(400, code, "request has %s", je.Error())
		case strings.HasPrefix(msg, "json: unknown field "):
			return NewAPIError(400, ErrCodeUnknownField, "request has unknown field %s", Clip(strings.Trim(strings.TrimPrefix(msg, "json: unknown field "), `"`)))
		case errors.As(err, &te):
			field := te.Field
			if field == "" {
				return NewAPIError(400, ErrCodeMalformed, "request body must be a JSON object, not %s", jsonValueName(te.Value))
			}
			return NewAPIError(400, ErrCodeMalformed, "%s: want %s, got %s", field, jsonTypeName(te.Type), jsonValueName(te.Value))
		case errors.As(err, &de):
			// Only Duration fields produce it; the one there is is timeout.
			return NewAPIError(400, ErrCodeMalformed, "timeout: %s", de.msg)
		case errors.As(err, &be):
			// encoding/json does not say which field; only []byte fields
			// decode base64.
			return NewAPIError(400, ErrCodeMalformed, "%s: not valid base64 (standard alphabet, padded): bad data at byte %d", base64Fields(v), int64(be))
		}
		return NewAPIError(400, ErrCodeMalformed, "request body is not valid JSON: %s", strings.TrimPrefix(msg, "json: "))
	}
	return nil
}

// base64Fields names the top-level fields of the struct v points to that
// decode from base64 ([]byte), for an error message: "stdin", "stdin or
// data", or "a base64 field" when there is none.
func base64Fields(v any) string {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var names []string
	if t != nil && t.Kind() == reflect.Struct {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Type.Kind() != reflect.Slice || f.Type.Elem().Kind() != reflect.Uint8 {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			if name != "-" {
				names = append(names, name)
			}
		}
	}
	if len(names) == 0 {
		return "a base64 field"
	}
	return strings.Join(names, " or ")
}

// jsonTypeName names the JSON type a Go type decodes from.
func jsonTypeName(t reflect.Type) string {
	if t == nil {
		return "a JSON value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[Duration]() {
		return `a duration string like "30s" or a number of seconds`
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64 string"
		}
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a JSON value"
}

// jsonValueName turns encoding/json's description of a value ("string",
// "number 1.5", "array", "object", "bool") into plain words.
func jsonValueName(v string) string {
	switch {
	case v == "bool":
		return "a boolean"
	case v == "array", v == "object":
		return "an " + v
	case v == "string":
		return "a string"
	case strings.HasPrefix(v, "number"):
		return v
	}
	return v
}

// DecodeExecRequest decodes and validates a SubjectExec request body.
func DecodeExecRequest(data []byte) (*ExecRequest, *APIError) {
	var r ExecRequest
	if e := DecodeRequest(data, &r); e != nil {
		return nil, e
	}
	if r.Script == "" && len(r.Argv) == 0 && len(r.Commands) == 0 && hasKey(data, "script") {
		return nil, NewAPIError(400, ErrCodeInvalid, "script is empty")
	}
	if e := r.Validate(); e != nil {
		return nil, e
	}
	return &r, nil
}

// hasKey reports whether the JSON object data has the top-level key k.
func hasKey(data []byte, k string) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return false
	}
	_, ok := m[k]
	return ok
}

// Validate checks r and returns the first class of problem found, with every
// problem of that class in the message.
func (r *ExecRequest) Validate() *APIError {
	if len(r.IdempotencyKey) > MaxIdempotencyKeyLen {
		return NewAPIError(400, ErrCodeInvalid, "idempotency_key: %d bytes, at most %d", len(r.IdempotencyKey), MaxIdempotencyKeyLen)
	}
	if r.IdempotencyKey != "" && !r.Idempotent {
		return NewAPIError(400, ErrCodeInvalid, "idempotency_key is given without idempotent")
	}
	// The key is stored and hashed (jobstore: the Nats-Msg-Id is its
	// hash, never the key), but it is the caller's name for the job and
	// shows in errors and listings: a control character there forges
	// lines of a terminal or a log.
	for i, c := range r.IdempotencyKey {
		if c < 0x20 || c == 0x7f {
			return NewAPIError(400, ErrCodeInvalid, "idempotency_key: control character %q at byte %d", c, i)
		}
	}
	if r.ID != "" {
		if err := ValidJobID(r.ID); err != nil {
			return NewAPIError(400, ErrCodeInvalid, "%v", err)
		}
	}
	n := 0
	if r.Target.Node != "" {
		n++
		if err := ValidNodeID(r.Target.Node); err != nil {
			return NewAPIError(400, ErrCodeInvalid, "target: %v", err)
		}
	}
	if r.Target.Selector != "" {
		n++
		if _, err := ParseSelector(r.Target.Selector); err != nil {
			return NewAPIError(400, ErrCodeInvalid, "target: %v", err)
		}
	}
	if r.Target.All {
		n++
	}
	switch {
	case n == 0:
		return NewAPIError(400, ErrCodeNoTarget, "request has no target: set target.node, target.selector or target.all")
	case n > 1:
		return NewAPIError(400, ErrCodeInvalid, "target: set exactly one of node, selector and all")
	}
	if len(r.Stdin) > MaxStdinSize {
		return NewAPIError(413, ErrCodeTooLarge, "stdin is %d bytes, over the %d byte limit", len(r.Stdin), MaxStdinSize)
	}
	if r.Timeout < 0 {
		return NewAPIError(400, ErrCodeInvalid, "timeout must not be negative")
	}
	if r.MaxParallel < 0 {
		return NewAPIError(400, ErrCodeInvalid, "max_parallel %d is negative", r.MaxParallel)
	}
	// What runs is checked by the agent's own rules (ExecParams.Validate),
	// on the params the coordinator will send.
	p := r.Params(0)
	if p.Detach && p.JobID == "" {
		p.JobID = "placeholder" // the coordinator picks the id
	}
	if err := p.Validate(); err != nil {
		if big := sizeErrors(err); len(big) > 0 {
			return NewAPIError(413, ErrCodeTooLarge, "%s", joinLines(errors.Join(big...)))
		}
		return NewAPIError(400, ErrCodeInvalid, "%s", joinLines(err))
	}
	// The params travel in the exec stream's header: check what they weigh
	// encoded (escapes of control characters can inflate a script sixfold),
	// leaving room for the timeout a coordinator's default may add.
	if err := CheckHeaderSize("exec params (script, argv, env, cwd)", &p); err != nil {
		if errors.Is(err, ErrTooLarge) {
			return NewAPIError(413, ErrCodeTooLarge, "%v", err)
		}
		return NewAPIError(400, ErrCodeInvalid, "%v", err)
	}
	return nil
}

// Params returns the exec stream params for r, using timeout when r has none.
func (r *ExecRequest) Params(timeout time.Duration) ExecParams {
	if r.Timeout > 0 {
		timeout = time.Duration(r.Timeout)
	}
	p := ExecParams{
		Script:      r.Script,
		Argv:        r.Argv,
		Commands:    r.Commands,
		FailFast:    r.FailFast,
		Env:         r.Env,
		Cwd:         r.Cwd,
		TimeoutMS:   ceilMillis(timeout),
		Stdin:       len(r.Stdin) > 0,
		OutputLimit: r.OutputLimit,
		Detach:      r.Detach,
	}
	if r.Detach {
		p.JobID = r.ID
	}
	return p
}

// ceilMillis rounds d up to whole milliseconds, so a positive timeout never
// becomes 0 ("no timeout") on the wire.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	// d/ms rounded up, without d+ms-1, which overflows to a negative
	// count for the longest durations ("2562047h47m16.854775807s").
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}
