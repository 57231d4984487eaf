package protocol

import "time"

// SubjectExecOnce takes an ExecRequest, like SubjectExec, and answers with
// ONE reply: a JSON ExecOnceResult carrying every node's result together
// with its stdout and stderr, sent once the job ended (an invalid or
// refused request gets one micro error reply, as on SubjectExec). It is
// for small jobs and for request/reply clients that take the first reply
// as the answer (`nats req tether.v1.exec.once '{"target":{"all":true},
// "argv":["uname","-a"]}'`, any NATS library's Request); SubjectExec,
// which streams, is for everything else.
//
// It is authorized exactly as SubjectExec (policy operation exec, on every
// target node) and runs the same job: the same record, the same run-as
// user, the same limits. Bounds: each node's stdout and stderr are kept
// up to ExecOnceStreamLimit bytes, and all of them together up to
// ExecOnceTotalLimit; what is past them is dropped (the stream's
// *_clipped and the result's Clipped flag say so), while the node's
// stdout_bytes and stderr_bytes still count all it wrote. The job's
// timeout must be at most ExecOnceMaxTimeout; none given means
// ExecOnceMaxTimeout (a reply that long in coming is not "once" any more,
// and NATS forgets the reply mapping of a silent request). The bound is
// the whole job's, not each node's: a fan-out still running when
// ExecOnceMaxTimeout has passed since it started (max_parallel below its
// nodes, slow commands) is cancelled then and answered with what ran;
// the nodes it cut or never reached are Cancelled with ErrorCode
// ResultCodeExecOnceBound, and TimedOut is set.
const SubjectExecOnce = "tether.v1.exec.once"

// Bounds of SubjectExecOnce.
const (
	// ExecOnceStreamLimit bounds one node's stdout, and its stderr, in an
	// ExecOnceResult, in bytes.
	ExecOnceStreamLimit = 64 << 10
	// ExecOnceTotalLimit bounds all the output in an ExecOnceResult, in
	// bytes, so that the reply fits NATS's default max payload (1 MiB)
	// even with JSON's escapes.
	ExecOnceTotalLimit = 128 << 10
	// ExecOnceMaxTimeout is the longest timeout, and the default one, of
	// a SubjectExecOnce job.
	ExecOnceMaxTimeout = 5 * time.Minute
)

// ResultCodeExecOnceBound is the ErrorCode of a node result that
// SubjectExecOnce's whole-job bound cut short or never started.
const ResultCodeExecOnceBound = "exec_once_bound"

// ExecOnceResult is the one reply of a SubjectExecOnce request.
type ExecOnceResult struct {
	// ID is the job id (tether job status ID works on it).
	ID string `json:"id"`
	// Results are the nodes' outcomes and output, sorted by node id.
	Results []ExecOnceNodeResult `json:"results"`
	// Nodes, Succeeded and Failed count the job's nodes and those whose
	// result is and is not OK.
	Nodes     int `json:"nodes"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	// Truncated is set when a node's output was truncated on the node
	// (its output limit) or cut (NodeResult.Truncated).
	Truncated bool `json:"truncated,omitempty"`
	// Clipped is set when this reply dropped output to stay within
	// ExecOnceStreamLimit and ExecOnceTotalLimit.
	Clipped bool `json:"clipped,omitempty"`
	// TimedOut is set when the job reached ExecOnceMaxTimeout and was
	// cancelled: the results hold what ran until then.
	TimedOut bool `json:"timed_out,omitempty"`
}

// ExecOnceNodeResult is one node's NodeResult with its output. Stdout and
// Stderr are JSON strings: bytes that are not UTF-8 arrive as U+FFFD (use
// SubjectExec for raw bytes).
type ExecOnceNodeResult struct {
	NodeResult
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// StdoutClipped and StderrClipped: this reply holds only the first
	// bytes of the stream (see SubjectExecOnce's bounds).
	StdoutClipped bool `json:"stdout_clipped,omitempty"`
	StderrClipped bool `json:"stderr_clipped,omitempty"`
}
