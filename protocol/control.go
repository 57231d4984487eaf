package protocol

import (
	"fmt"
	"time"
)

// ControlParams are the params of the control stream's header. The control
// stream is the first stream the agent opens on a new session.
type ControlParams struct{}

// Capacity describes a node's resources as the agent measured them at start.
type Capacity struct {
	CPUs        int    `json:"cpus"`                // logical CPUs (runtime.NumCPU)
	MemoryBytes uint64 `json:"memory_bytes"`        // MemTotal from /proc/meminfo, bytes; 0 if unknown
	GPUs        int    `json:"gpus"`                // GPUs listed by nvidia-smi; 0 if none or no nvidia-smi
	GPUModel    string `json:"gpu_model,omitempty"` // name of the first GPU, e.g. "NVIDIA H100 80GB HBM3"
}

// Hello is the agent's first message on the control stream.
type Hello struct {
	// ProtocolVersion is the agent's Version.
	ProtocolVersion int `json:"protocol_version"`
	// Token is the join token. It is never logged.
	Token string `json:"token"`
	// NodeID names the node; unique in the fleet. See ValidNodeID.
	NodeID string `json:"node_id"`
	// Labels are the node's labels, matched by selectors.
	Labels map[string]string `json:"labels,omitempty"`
	// Capacity is what the node has.
	Capacity Capacity `json:"capacity"`
	// AgentVersion is the agent binary's version string.
	AgentVersion string `json:"agent_version"`
	// Targets names the local targets the agent will dial (reserved for the
	// dial stream kind).
	Targets []string `json:"targets,omitempty"`
	// Reconnects counts the sessions this agent process had before this
	// one (0 on the first). The coordinator counts a Hello with Reconnects
	// above 0 as a tunnel reconnect.
	Reconnects int `json:"reconnects,omitempty"`
	// Instance identifies the agent process: random, fixed for the life of
	// the process. A session for a node id that is already connected
	// replaces the old one only when it comes from the same instance (a
	// reconnect) or when the old one stopped heartbeating; otherwise it is
	// refused with CodeDuplicate, so two agents misconfigured with one node
	// id cannot keep knocking each other off.
	Instance string `json:"instance,omitempty"`
	// Features lists the optional parts of this protocol Version the agent
	// speaks (Feature* constants). A coordinator uses a feature only with an
	// agent that listed it, and ignores names it does not know, so agents
	// and coordinators of different releases keep working together.
	Features []string `json:"features,omitempty"`
	// SSHHostKey is the agent's SSH host public key in SSH wire form
	// (ssh.PublicKey.Marshal), at most MaxSSHKeySize bytes; set when
	// Features lists FeatureSSH. The coordinator certifies it for the node
	// the session proved (SSHParams.HostCertificate).
	SSHHostKey []byte `json:"ssh_host_key,omitempty"`
}

// Validate reports the first problem with h's identity fields. It does not
// check the token.
func (h *Hello) Validate() error {
	if h.ProtocolVersion != Version {
		return fmt.Errorf("hello: %w: agent speaks %d, coordinator %d", ErrVersion, h.ProtocolVersion, Version)
	}
	if err := ValidNodeID(h.NodeID); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	if err := ValidateLabels(h.Labels); err != nil {
		return fmt.Errorf("hello: node %q: %w", h.NodeID, err)
	}
	if len(h.SSHHostKey) > MaxSSHKeySize {
		return fmt.Errorf("hello: node %q: ssh_host_key: %d bytes, over %d: %w", h.NodeID, len(h.SSHHostKey), MaxSSHKeySize, ErrTooLarge)
	}
	return nil
}

// Limits are the coordinator's limits the agent must respect.
type Limits struct {
	// MaxFrameSize is the largest frame payload the coordinator accepts,
	// in bytes.
	MaxFrameSize int `json:"max_frame_size"`
}

// Welcome accepts a Hello.
type Welcome struct {
	// SessionID names this session (random text); it appears in the node
	// listing and in both sides' logs.
	SessionID string `json:"session_id"`
	// CoordinatorID is the welcoming coordinator's id.
	CoordinatorID string `json:"coordinator_id"`
	// HeartbeatIntervalMS is how often the agent sends Heartbeat frames, in
	// milliseconds. The coordinator drops a session from which nothing at
	// all (heartbeat, ping, stream data) arrives for three intervals.
	HeartbeatIntervalMS int64 `json:"heartbeat_interval_ms"`
	// Limits are the coordinator's limits the agent must respect.
	Limits Limits `json:"limits"`
	// Features lists the optional parts of this protocol Version the
	// coordinator takes from the agent (Feature* constants that name an
	// agent → coordinator frame, FeatureJobExit today). An agent sends
	// such a frame only to a coordinator that listed it: an older one
	// ends the session on a frame type it does not know. Names the
	// agent does not know are ignored.
	Features []string `json:"features,omitempty"`
}

// HeartbeatInterval returns HeartbeatIntervalMS as a duration.
func (w *Welcome) HeartbeatInterval() time.Duration {
	return time.Duration(w.HeartbeatIntervalMS) * time.Millisecond
}

// Heartbeat is sent by the agent on the control stream every heartbeat
// interval.
type Heartbeat struct {
	// RTTMicros is the last measured tunnel round trip (a yamux ping), in
	// microseconds; 0 if not measured yet.
	RTTMicros int64 `json:"rtt_us"`
	// RunningExecs counts exec operations in flight on the agent.
	RunningExecs int `json:"running_execs"`
	// WindowStalls, WindowStallMicros and SendQueuedBytes are the flow
	// telemetry of the agent's side of the session (tunnel.FlowStats): how
	// often and how long, in microseconds, the agent's streams waited for
	// the coordinator's window, and the bytes of the frame the agent is
	// writing that its connection has not taken yet. Absent from agents
	// that predate them.
	WindowStalls      uint64 `json:"window_stalls,omitempty"`
	WindowStallMicros int64  `json:"window_stall_us,omitempty"`
	SendQueuedBytes   int64  `json:"send_queued_bytes,omitempty"`
}

// ErrorInfo is the payload of FrameError and FrameReject.
type ErrorInfo struct {
	// Code is a stable machine-readable code (the Code* constants).
	Code string `json:"code"`
	// Message says what failed and where, for humans.
	Message string `json:"message"`
}

// Error returns "code: message", so an ErrorInfo can be returned and
// wrapped as an error.
func (e *ErrorInfo) Error() string { return e.Code + ": " + e.Message }

// Error codes carried in ErrorInfo on the tunnel. They are stable.
const (
	CodeAuth        = "auth_failed"      // bad or missing join token
	CodeVersion     = "version_mismatch" // protocol versions differ
	CodeBadHello    = "bad_hello"        // hello failed validation
	CodeBadRequest  = "bad_request"      // stream params invalid
	CodeUnsupported = "unsupported_kind" // the agent does not serve this kind
	CodeStartFailed = "start_failed"     // the process could not be started (bad cwd, no resources); see also the two below
	// CodeCommandNotFound: the program to start does not exist (not in
	// PATH, or no file at its path); a shell's exit code 127.
	CodeCommandNotFound = "command_not_found"
	// CodeNotExecutable: the program exists but cannot be executed (no
	// execute permission, a directory, not a format the kernel runs, a
	// missing interpreter); a shell's exit code 126.
	CodeNotExecutable = "not_executable"
	CodeDuplicate     = "duplicate_node" // the node id is connected from another agent
	CodeBusy          = "busy"           // the agent is at its limit of concurrent operations
	CodeShutdown      = "shutting_down"  // the peer is draining
	CodeInternal      = "internal"       // a bug or an unexpected failure
	// CodeCopyFailed: a copy failed on a path of its own (missing, not
	// permitted, not a directory, a full disk): the copy's failure, not
	// Tether's (protocol/copy.go).
	CodeCopyFailed = "copy_failed"
	// CodeForbidden: the agent's local policy refuses the operation (the
	// account it would run as, exec, shell, a dial target, a copy path);
	// the message names the node, the policy file and the rule missing.
	CodeForbidden = "forbidden"
	// CodeUnknownUser: the account the operation would run as (the
	// params' user) does not exist on the node.
	CodeUnknownUser = "unknown_user"
)
