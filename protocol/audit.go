package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// The audit log. Every operation a coordinator serves for a caller, and
// every refusal, is one AuditEvent, published by the coordinator on
// AuditSubject(operation, result) and kept in a JetStream stream of the
// coordinators' account. Clients have no JetStream and cannot publish into
// that account: they read the log through SubjectAuditQuery.
const (
	// SubjectAuditPrefix prefixes the subjects audit events are published
	// on: tether.v1.audit.<operation>.<result> (AuditSubject). The audit
	// stream captures SubjectAuditPrefix + ">", so no API subject may live
	// under it (a request on it would be stored as an event). Coordinators
	// publish there; it is not exported to clients.
	SubjectAuditPrefix = "tether.v1.audit."
	// SubjectAuditQuery takes an AuditQueryRequest (an empty body is
	// allowed) and replies with one page of audit events, an
	// AuditQueryResponse. It needs the admin operation of the policy. 503
	// ErrCodeUnavailable when the coordinator keeps no audit log.
	SubjectAuditQuery = "tether.v1.admin.audit"
)

// Operations of audit events that are not policy operations: a request
// no policy operation covers is recorded under its endpoint's name. An
// event's Operation is a policy operation's name (policy.Operations) or
// one of these (AuditOtherOperations), nothing else; the coordinator
// records only these names and the CLI's --operation accepts them.
const (
	// AuditOpStream is a SubjectStream request whose stream kind is not
	// one of exec, pty, copy or dial (those are recorded as exec, shell,
	// cp.read or cp.write, and forward), typically refused as invalid.
	AuditOpStream = "stream"
	// AuditOpExecAlive is a SubjectExecAlive request (a client's
	// keepalive of its running exec).
	AuditOpExecAlive = "exec-alive"
)

// AuditOtherOperations lists the audit operations that are not policy
// operations, in a fixed order.
func AuditOtherOperations() []string { return []string{AuditOpStream, AuditOpExecAlive} }

// PolicyOperations lists the names of the policy's operations (policy
// files' names, policy.Operations' String), in policy's declaration order:
// the audit operations beside AuditOtherOperations. A client checks names
// with it without linking policy and its YAML parser (issue 12);
// policy's TestOperationNamesInProtocol keeps the two lists equal.
func PolicyOperations() []string {
	return []string{"exec", "cp.read", "cp.write", "shell", "forward", "job.status", "job.logs", "job.cancel",
		"sandboxes.list", "sandboxes.register", "sandboxes.lease", "sandboxes.reap", "nodes.list", "admin", "ssh"}
}

// AuditVersion is the version of AuditEvent's shape (AuditEvent.Version).
// Fields may be added within a version; a reader skips fields it does not
// know.
const AuditVersion = 1

// Results of an audited operation (AuditEvent.Result).
const (
	// AuditOK: the operation ran and succeeded (exit code 0 on every node,
	// or the request answered without an error).
	AuditOK = "ok"
	// AuditFailed: the operation ran and failed on some node (a non-zero
	// exit code, a start failure, a lost node, a cancel).
	AuditFailed = "failed"
	// AuditRefused: the caller was not allowed: unauthenticated (401),
	// forbidden by policy (403) or over its limits (429), or refused by
	// the node's local policy (Reason AuditReasonLocalPolicy). Nothing ran.
	AuditRefused = "refused"
	// AuditError: the request was not served: invalid, unknown node,
	// coordinator unavailable, internal error. Nothing ran, or the
	// coordinator lost track of it.
	AuditError = "error"
)

// AuditReasonLocalPolicy is the Reason of an operation a node's local
// policy refused (the agent's CodeForbidden): its Result is AuditRefused,
// its ErrorCode CodeForbidden, and its Error the agent's message, which
// names the node, the local policy file and the rule missing.
const AuditReasonLocalPolicy = "local_policy"

// AuditReasonRevoked is the Reason of what the coordinator ended while it
// ran because what let it in went away: an SSH connection or channel (the
// jump host's, or an ssh-proxy stream) whose key or user CA a reload
// removed, whose certificate expired, or whose ssh grant (as a login the
// stream was vouched) the policy no longer holds; an attached exec job
// (its ErrorCode ResultCodeRevoked) or a stream of another kind whose
// caller the reloaded policy no longer grants the operation on its node,
// or whose NATS user was revoked. Its Result is AuditFailed, its Error
// says what went away.
const AuditReasonRevoked = "revoked"

// ErrCodeCopyPartial is the ErrorCode of a copy the receiver committed
// with entries the sender skipped (protocol.CopySkip; tether cp's exit
// 23): its Result is AuditFailed.
const ErrCodeCopyPartial = "copy_partial"

// AuditResults lists the results, in the order above.
func AuditResults() []string { return []string{AuditOK, AuditFailed, AuditRefused, AuditError} }

// AuditEvent is one entry of the audit log, as JSON. It never carries a
// secret: no environment value (only the keys), no stdin, no script or
// argument text (commands are a SHA-256 digest and the program name, see
// AuditCommand), no output, no node failure text (only codes).
type AuditEvent struct {
	// Version is AuditVersion.
	Version int `json:"v"`
	// ID is unique per event (also the JetStream message id, so a
	// republished event is stored once).
	ID string `json:"id"`
	// Seq is the event's sequence in the audit stream. It is not stored in
	// the event: queries set it, and a query's cursor is one.
	Seq uint64 `json:"seq,omitempty"`
	// Time is when the operation ended or was refused, on the coordinator's
	// clock, UTC.
	Time time.Time `json:"time"`
	// Coordinator is the id of the coordinator that served the request.
	Coordinator string `json:"coordinator"`
	// Identity is the caller as policy names it (KIND:NAME, e.g.
	// "nats:alice", or KIND:KEY); empty when the caller could not be
	// identified (then Result is AuditRefused).
	Identity string `json:"identity,omitempty"`
	// IdentityKey is a NATS caller's user public key; Account its account.
	IdentityKey string `json:"identity_key,omitempty"`
	Account     string `json:"account,omitempty"`
	// Source is where the call came from, as the coordinator's end of the
	// connection saw it; never what the caller wrote (X-Forwarded-For,
	// Forwarded, X-Real-IP, gRPC metadata), which names any address its
	// sender likes, so a refused guesser could blame another host. On a
	// coordinator listener (the OpenSandbox and OpenShell facades, the SSH
	// jump host, the web console) it is the TCP peer's IP and port,
	// "IP:PORT" ("[IPv6]:PORT"); a caller behind a proxy shows the proxy's.
	// For a NATS API request it is the client's IP alone, as the NATS
	// server saw its connection: the host of the Nats-Request-Info header
	// the server stamps on a request crossing the clients' service import
	// (share: true; a client cannot set it there), which has no port; a
	// client on a leafnode shows the leafnode's. An agent's SSH channel
	// event carries its connection's (the jump host's client, or the ssh
	// stream's NATS client), never one the agent names. Empty when nothing
	// vouches for one: a NATS request without that header, events
	// recorded before this field.
	Source string `json:"source,omitempty"`
	// Operation is the policy operation (exec, cp.read, cp.write, shell,
	// forward, job.status, job.logs, job.cancel, sandboxes.list,
	// sandboxes.register, sandboxes.lease, sandboxes.reap, nodes.list,
	// admin), or the endpoint's name for a request no operation covers.
	Operation string `json:"operation"`
	// Subject is the NATS subject the request came on.
	Subject string `json:"subject,omitempty"`
	// JobID is the exec job's id (or the detached job a job.* request is
	// about).
	JobID string `json:"job_id,omitempty"`
	// Run is the sandbox run a sandboxes.* request is about.
	Run string `json:"run,omitempty"`
	// Facade is the sandbox facade a call came through ("openshell",
	// "opensandbox"); empty for NATS requests. Method is the facade call:
	// the gRPC method's name (e.g. "DeleteSandbox"), or the HTTP method
	// and route class (e.g. "DELETE sandbox"). Sandbox is the sandbox the
	// call was about, when known: WORKSPACE/NAME or an id for OpenShell,
	// an id for OpenSandbox.
	Facade  string `json:"facade,omitempty"`
	Method  string `json:"method,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
	// Nodes are the nodes the operation ran on (or would have), sorted;
	// at most MaxAuditNodes of them, NodesTotal saying how many there were
	// when some are left out.
	Nodes      []string `json:"nodes,omitempty"`
	NodesTotal int      `json:"nodes_total,omitempty"`
	// Target is what the request addressed: "selector S", "all nodes", or
	// a forward's target name.
	Target string `json:"target,omitempty"`
	// Command describes what an exec or shell ran; nil for other
	// operations.
	Command *AuditCommand `json:"command,omitempty"`
	// Paths are the node paths of a copy, each as AuditPath records it:
	// as it is, or, when it holds a byte that is not UTF-8, a control or
	// other unprintable character, a double quote or a backslash, quoted
	// as Go's strconv.Quote quotes (the path /srv/caf and byte 0xe9 is
	// the text "/srv/caf\xe9", quotes included), so every byte is kept.
	// Only a quoted path starts with a double quote. Clipped to
	// MaxAuditErrorLen bytes, ending in "…" when clipped. (Events
	// recorded before this rule have U+FFFD for each byte not UTF-8.)
	Paths []string `json:"paths,omitempty"`
	// RunAs is the local user the operation ran as on the node (the policy
	// rule's run_as, which replaces the user a request names); empty when
	// none was named (the agent's own account). An exec job whose nodes
	// ran as different users (a fan-out matching rules with different
	// run_as) lists each of them once, sorted, joined by ", ", with "-"
	// for the nodes that ran as the agent's own account ("-, deploy,
	// nobody"); which node ran as which is the rules' (Rule) to tell. At
	// most MaxAuditProgramLen bytes.
	RunAs string `json:"run_as,omitempty"`
	// Rule names the policy rule that allowed the operation, or, with
	// Result AuditRefused, nothing (Error says what rule is missing).
	Rule string `json:"rule,omitempty"`
	// Result is one of AuditOK, AuditFailed, AuditRefused, AuditError.
	Result string `json:"result"`
	// ExitCode is the command's exit code on a single node; nil when the
	// operation has none (or ran on several nodes: see NodesOK,
	// NodesFailed).
	ExitCode *int `json:"exit_code,omitempty"`
	// NodesOK and NodesFailed count the nodes of a fan-out that succeeded
	// and failed.
	NodesOK     int `json:"nodes_ok,omitempty"`
	NodesFailed int `json:"nodes_failed,omitempty"`
	// ErrorCode is the API error code (ErrCode*) the request was answered
	// with, or a node result's code; Status its HTTP-like status.
	ErrorCode string `json:"error_code,omitempty"`
	Status    int    `json:"status,omitempty"`
	// Reason is a refusal's reason: unauthenticated, the policy's
	// (no_identity, no_rule, bad_request, rate_limit, job_limit), or
	// local_policy (AuditReasonLocalPolicy) for the node's own; or, for an
	// SSH connection, a job or a stream ended while it ran because its
	// grant or credentials went away, revoked (AuditReasonRevoked).
	Reason string `json:"reason,omitempty"`
	// Error is a refusal's message (which identity, which operation, which
	// rule is missing), clipped to MaxAuditErrorLen bytes. Other errors
	// give their ErrorCode only: their messages may quote what a client
	// sent.
	Error string `json:"error,omitempty"`
	// DurationMS is how long the operation took, from the request to its
	// end, in milliseconds.
	DurationMS float64 `json:"duration_ms"`
	// BytesIn counts the bytes from the client to the node (stdin, a
	// copy's push, a forward's upstream); BytesOut the bytes from the node
	// to the client (stdout and stderr, a copy's pull, a forward's
	// downstream). A stream relay counts its frames' bytes as relayed.
	BytesIn  int64 `json:"bytes_in,omitempty"`
	BytesOut int64 `json:"bytes_out,omitempty"`
	// Session is the SSH connection an ssh event is about
	// (SSHParams.Session): the events of one connection share it.
	// ExitSignal is the signal an SSH channel's command died of, without
	// "SIG" (SSHChannelEvent.ExitSignal).
	Session    string `json:"session,omitempty"`
	ExitSignal string `json:"exit_signal,omitempty"`
}

// AuditCommand describes a command without its text.
type AuditCommand struct {
	// Mode is "script" (run by bash -s), "argv", "commands" (a batch) or
	// "login-shell" (a terminal without argv).
	Mode string `json:"mode"`
	// SHA256 is the lowercase hex SHA-256 of the command (CommandDigest):
	// the script's bytes; for argv and commands, each element followed by
	// a NUL byte (printf '%s\0' ARGS... | sha256sum). Empty for a login
	// shell.
	SHA256 string `json:"sha256,omitempty"`
	// Program is argv[0] (or a terminal's argv[0]), clipped to
	// MaxAuditProgramLen bytes; empty for scripts and batches, whose text
	// may hold anything.
	Program string `json:"program,omitempty"`
	// Size is the number of bytes hashed; Count the number of argv
	// elements or batch commands.
	Size  int `json:"size"`
	Count int `json:"count,omitempty"`
	// EnvKeys are the keys of the environment the request added, sorted;
	// never their values.
	EnvKeys []string `json:"env_keys,omitempty"`
	// Cwd is the working directory the request named.
	Cwd string `json:"cwd,omitempty"`
	// Stdin says the command was given stdin (its bytes are counted in
	// AuditEvent.BytesIn, never kept); Detach that it ran as a detached
	// job.
	Stdin  bool `json:"stdin,omitempty"`
	Detach bool `json:"detach,omitempty"`
}

// Bounds of audit event fields, in bytes.
const (
	// MaxAuditErrorLen bounds AuditEvent.Error.
	MaxAuditErrorLen = 512
	// MaxAuditProgramLen bounds AuditCommand.Program.
	MaxAuditProgramLen = 128
	// MaxAuditNodes bounds AuditEvent.Nodes (a fan-out to more nodes
	// lists the first ones and NodesTotal), so that an event always fits
	// a NATS message.
	MaxAuditNodes = 1000
	// maxAuditEnvKeys bounds AuditCommand.EnvKeys (the rest are dropped).
	maxAuditEnvKeys = 64
)

// AuditSubject returns the subject an event of operation and result is
// published on: SubjectAuditPrefix + op + "." + result, each made one
// subject token ('.' and anything but [A-Za-z0-9_-] becomes '_', an empty
// one "unknown"): cp.read refused is tether.v1.audit.cp_read.refused, so
// tether.v1.audit.*.refused and tether.v1.audit.cp_read.* both work.
func AuditSubject(operation, result string) string {
	return SubjectAuditPrefix + AuditToken(operation) + "." + AuditToken(result)
}

// AuditToken is s as one subject token of AuditSubject.
func AuditToken(s string) string {
	if s == "" {
		return "unknown"
	}
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	return string(b)
}

// CommandDigest returns the lowercase hex SHA-256 of a command: of script
// when it is not empty, else of each element of argv followed by a NUL
// byte (no element may contain NUL: ExecParams.Validate refuses it), and
// the number of bytes hashed.
func CommandDigest(script string, argv []string) (string, int) {
	h := sha256.New()
	n := 0
	if script != "" {
		h.Write([]byte(script))
		n = len(script)
	} else {
		for _, a := range argv {
			h.Write([]byte(a))
			h.Write([]byte{0})
			n += len(a) + 1
		}
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

// AuditExecCommand describes exec params p for the audit log.
func AuditExecCommand(p *ExecParams) *AuditCommand {
	c := &AuditCommand{Cwd: ClipUTF8(p.Cwd, MaxAuditErrorLen), Stdin: p.Stdin, Detach: p.Detach, EnvKeys: envKeys(p.Env)}
	switch {
	case p.Script != "":
		c.Mode = "script"
		c.SHA256, c.Size = CommandDigest(p.Script, nil)
	case len(p.Commands) > 0:
		c.Mode = "commands"
		c.SHA256, c.Size = CommandDigest("", p.Commands)
		c.Count = len(p.Commands)
	default:
		c.Mode = "argv"
		c.SHA256, c.Size = CommandDigest("", p.Argv)
		c.Count = len(p.Argv)
		if len(p.Argv) > 0 {
			c.Program = ClipUTF8(p.Argv[0], MaxAuditProgramLen)
		}
	}
	return c
}

// AuditPTYCommand describes terminal params p for the audit log.
func AuditPTYCommand(p *PTYParams) *AuditCommand {
	c := &AuditCommand{Mode: "login-shell", Cwd: ClipUTF8(p.Cwd, MaxAuditErrorLen), EnvKeys: envKeys(p.Env)}
	if len(p.Argv) > 0 {
		c.Mode = "argv"
		c.SHA256, c.Size = CommandDigest("", p.Argv)
		c.Count = len(p.Argv)
		c.Program = ClipUTF8(p.Argv[0], MaxAuditProgramLen)
	}
	return c
}

func envKeys(env map[string]string) []string {
	if len(env) == 0 {
		return nil
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, ClipUTF8(k, MaxAuditProgramLen))
	}
	slices.Sort(keys)
	if len(keys) > maxAuditEnvKeys {
		keys = append(keys[:maxAuditEnvKeys], fmt.Sprintf("(%d more)", len(keys)-maxAuditEnvKeys))
	}
	return keys
}

// AuditPath is how an event records a copy path (AuditEvent.Paths):
// QuoteName's form, clipped to MaxAuditErrorLen bytes. p is as it is when
// strconv.Quote would change nothing inside its quotes, else quoted, so a
// path of bytes that are not UTF-8 keeps them ("/srv/caf\xe9" in Go's
// notation, where ClipUTF8 would write U+FFFD for each) and a reader
// strconv.Unquote's a recorded path that starts with a double quote; an
// unquoted one never does (a double quote in it is escaped).
func AuditPath(p string) string {
	return ClipUTF8(QuoteName(p), MaxAuditErrorLen)
}

// ClipUTF8 returns s cut to at most max bytes at a UTF-8 boundary, "…"
// marking a cut (within max), and invalid UTF-8 replaced.
func ClipUTF8(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= max {
		return s
	}
	const mark = "…"
	cut := max - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if cut < 0 {
		cut = 0
	}
	return s[:cut] + mark
}

// Limits of SubjectAuditQuery.
const (
	// DefaultAuditLimit is AuditQueryRequest.Limit when it is 0.
	DefaultAuditLimit = 100
	// MaxAuditLimit bounds AuditQueryRequest.Limit. A page also ends
	// before the reply would outgrow the server's max payload, and after
	// the coordinator scanned a bounded number of events (then Next lets
	// the client go on).
	MaxAuditLimit = 1000
)

// Orders of an audit query.
const (
	AuditNewestFirst = "newest"
	AuditOldestFirst = "oldest"
)

// AuditQueryRequest is the body of a SubjectAuditQuery request. Every
// filter that is set must match; an empty request asks for the newest
// DefaultAuditLimit events.
type AuditQueryRequest struct {
	// Since and Until bound the events' stream time (when the NATS server
	// stored them), inclusive; zero is unbounded.
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// Identity matches AuditEvent.Identity exactly, or a NATS caller's key
	// written KIND:KEY (nats:U...).
	Identity string `json:"identity,omitempty"`
	// Node matches events one of whose Nodes is it.
	Node string `json:"node,omitempty"`
	// Operation and Result match exactly (the stream is filtered by
	// subject on them).
	Operation string `json:"operation,omitempty"`
	Result    string `json:"result,omitempty"`
	// JobID matches AuditEvent.JobID.
	JobID string `json:"job_id,omitempty"`
	// Source matches AuditEvent.Source: an IP address matches every event
	// from it, whatever the port (a NATS request's source has none);
	// IP:PORT ("[IPv6]:PORT") matches that one connection's. An
	// IPv4-mapped IPv6 address is its IPv4 one. Anything else is refused
	// with 400 invalid_request; a coordinator older than this field
	// refuses it too (unknown field).
	Source string `json:"source,omitempty"`
	// Limit bounds the events returned, 1 to MaxAuditLimit; 0 means
	// DefaultAuditLimit.
	Limit int `json:"limit,omitempty"`
	// Order is AuditNewestFirst (the default when empty) or
	// AuditOldestFirst.
	Order string `json:"order,omitempty"`
	// Cursor continues a previous query: the Next of its response (with
	// the same filters and order). 0 starts at the newest event (newest
	// first) or at Since (oldest first).
	Cursor uint64 `json:"cursor,omitempty"`
}

// Validate reports every problem with r, joined in one 400 invalid_request.
func (r *AuditQueryRequest) Validate() *APIError {
	var errs []string
	if r.Limit < 0 || r.Limit > MaxAuditLimit {
		errs = append(errs, fmt.Sprintf("limit %d: want 0 to %d", r.Limit, MaxAuditLimit))
	}
	if r.Order != "" && r.Order != AuditNewestFirst && r.Order != AuditOldestFirst {
		errs = append(errs, fmt.Sprintf("order %s: want %q or %q", Clip(r.Order), AuditNewestFirst, AuditOldestFirst))
	}
	if !r.Since.IsZero() && !r.Until.IsZero() && r.Until.Before(r.Since) {
		errs = append(errs, fmt.Sprintf("until %s is before since %s", r.Until.Format(time.RFC3339), r.Since.Format(time.RFC3339)))
	}
	if r.Result != "" && !slices.Contains(AuditResults(), r.Result) {
		errs = append(errs, fmt.Sprintf("result %s: want one of %s", Clip(r.Result), strings.Join(AuditResults(), ", ")))
	}
	if r.Operation != "" && strings.Trim(r.Operation, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
		errs = append(errs, fmt.Sprintf("operation %s: want an operation name such as exec or cp.read", Clip(r.Operation)))
	}
	if r.JobID != "" {
		if err := ValidJobID(r.JobID); err != nil {
			errs = append(errs, "job_id: "+err.Error())
		}
	}
	if r.Node != "" {
		// As job.list's node: no event is on a node of another name.
		if err := ValidNodeID(r.Node); err != nil {
			errs = append(errs, "node: "+err.Error())
		}
	}
	if r.Source != "" && (len(r.Source) > 64 || strings.Trim(r.Source, "0123456789abcdefABCDEF.:[]") != "") {
		// The coordinator parses it (an address or not); here, its
		// characters only (protocol opens no sockets, so no net/netip).
		errs = append(errs, fmt.Sprintf("source %s: want an IP address, or IP:PORT ([IPv6]:PORT)", Clip(r.Source)))
	}
	for _, f := range []struct{ name, v string }{{"identity", r.Identity}, {"operation", r.Operation}} {
		if len(f.v) > 256 {
			errs = append(errs, fmt.Sprintf("%s is %d bytes, over 256", f.name, len(f.v)))
		}
	}
	if len(errs) > 0 {
		return NewAPIError(400, ErrCodeInvalid, "%s", strings.Join(errs, "; "))
	}
	return nil
}

// AuditQueryResponse is the reply to SubjectAuditQuery.
type AuditQueryResponse struct {
	// Events are the matching events in the request's order, each with
	// its Seq.
	Events []AuditEvent `json:"events"`
	// Next is the cursor of the next page. Newest first, it is 0 once the
	// page reached the oldest event. Oldest first, it is the sequence after
	// the last event scanned, even when the page reached the newest one:
	// a follower asks again with it later.
	Next uint64 `json:"next,omitempty"`
	// Scanned is how many events the coordinator read for this page.
	Scanned int `json:"scanned"`
	// Last is the sequence of the newest event in the stream when the page
	// was read: a follower of a newest-first page goes on from Last+1.
	Last uint64 `json:"last"`
}
