// Package agent owns the node daemon: it dials out to a coordinator through
// the tunnel package, enrolls once with its join token for a node
// certificate and then authenticates by it (identity.go), introduces itself
// on the control stream (hello with the node's id, labels and capacity;
// welcome or reject), keeps the session alive
// with heartbeats, and serves the streams the coordinator opens: exec
// (exec.go), pty, copy, job, dial (dial.go), inventory (inventory.go) and
// sandbox (sandbox.go); any other kind is answered with an
// unsupported_kind error frame.
//
// Dial streams reach only the targets the operator configured (the node's
// OpenShell gateway, its OpenSandbox server and Config.Targets, listed in
// Hello.Targets): a name is looked up in that table and nothing else is
// ever dialled. Inventory and sandbox streams use the gateway package's
// clients over loopback with the agent's own gateway credentials, which
// never go into dial streams.
//
// Accounts and the local policy (runas.go, localpolicy.go). Exec, pty and
// copy streams run as the local account their params name (the agent's
// own when none): its uid, gid and groups, its passwd environment and
// home. The node's local policy (package localpolicy, Config.LocalPolicy,
// Agent.SetLocalPolicy on SIGHUP) is checked before anything runs: the
// account, exec/shell/forward, dial targets and copy roots; a refusal is a
// forbidden error frame naming the file and the missing rule. Without a
// local policy only the agent's own account is allowed. A copy as another
// account runs in a helper process of the agent's own binary with that
// account's credentials (copyas.go), so the kernel checks each of its file
// operations against the account.
//
// Goroutines. Agent.Run runs the session loop in the caller's goroutine
// (tunnel.Redialer: dial, serve one session, back off, redial). Each
// welcomed session runs in a goroutine of its own, which the loop waits
// for, except after a drain (FrameDrain: the coordinator is going away):
// then the loop dials the next coordinator at once while the drained
// session goes on until its streams ended and the coordinator closed it,
// and Run waits for it before it returns. For each session it starts:
//
//   - the heartbeat loop, which writes a Heartbeat frame on the control
//     stream every Welcome.HeartbeatInterval, and its pinger, which measures
//     the RTT once per interval (a ping may wait up to the tunnel's write
//     timeout; heartbeats never wait for it, they carry the last RTT, and
//     the session's flow telemetry, tunnel.Session.FlowStats; each answered
//     ping is a sample of tether_agent_tunnel_rtt_seconds);
//   - the control reader (cancel.go), which reads the coordinator's frames
//     on the control stream until the session ends, hands a FrameDrain to
//     the session loop, and cancels, out of
//     band, the exec, pty or copy a FrameCancelStream names (an in-band
//     FrameCancel can be stuck behind stdin the command does not read);
//   - on a session authenticated by its certificate, the renewal loop
//     (identity.go), which sends a Renew at two thirds of the
//     certificate's lifetime and waits for the answer the control reader
//     hands it;
//   - the accept loop (in the session goroutine), which accepts streams and
//     starts one goroutine per stream, plus one watcher that cancels the
//     session's context when the tunnel dies;
//   - per stream: a goroutine that reads the stream's header (so a slow
//     opener holds up only its own stream) and serves it by kind; an exec
//     past Config.MaxExecs is refused with a busy error frame;
//   - per dial stream, in that goroutine: the handler, which copies from
//     the target to the stream, and one copier from the stream to the
//     target; both end when their direction ends (half-closes pass
//     through), and a failure or the session's end ends both;
//   - per copy stream as another account (copyas.go), in that goroutine:
//     the handler, which waits for the helper process; a feeder (stream
//     to the helper's stdin) and a relay (its stdout to the stream); and
//     os/exec's copier of the helper's stderr. The helper gets SIGTERM
//     when the session ends or the copy is cancelled, SIGKILL
//     Config.KillGrace later;
//   - per inventory or sandbox stream: the handler, one reader watching
//     for FrameCancel or the stream's end, and (inventory) one lister per
//     gateway; the gRPC connection and HTTP transport they share belong to
//     the session and are closed when its handlers returned;
//   - per exec stream, in that goroutine: the handler, which starts the process and
//     drives it to its end (timeout, cancel, kill escalation, pipe drain); a
//     waiter (cmd.Wait); a frame reader (stdin and cancel from the
//     coordinator); one copier per output pipe (stdout, stderr); and, when
//     the process has a stdin pipe, one stdin feeder (script text for
//     bash -s, or stdin frames in argv mode).
//
// Run also closes the session from a context.AfterFunc callback when its
// context ends, so that no read or write on the tunnel outlives it.
//
// A fail-fast batch runs its commands one after the other in the same
// handler, each with its own waiter and copiers. Every exec leader is
// started with a parent-death signal (SIGKILL), so an agent killed with
// SIGKILL does not leave leaders running; the rest of their process groups
// are recorded in DataDir/execs while they run, and the next agent to start
// kills the groups it finds recorded (orphans.go), unless the service
// manager reaped the cgroup first.
//
// Detached execs (jobs.go) are the exception to the rules below: each runs
// under a job shim (jobshim.go), a process of the agent's binary in its
// own session (under systemd, in its own transient scope) that supervises
// it, writes its output and status to files and outlives the stream, the
// session and the agent process itself. The agent reads those files and
// signals the shim; its only goroutine per job is the one that reaps a
// shim it started (the job table's WaitGroup). Run does not wait for them.
// One more goroutine, the job reporter (jobreport.go, started by Run and
// waited for before it returns), reports each job's end to a coordinator
// that takes reports (protocol.FrameJobExit), watching the jobs found
// running at start, whose shims are not its children. With Config.Notify,
// one more, the systemd notifier (notify.go, started by Run and waited
// for), sends READY=1, STATUS= and STOPPING=1, and pets the watchdog after
// each successful ping probe of the current session; each probe's ping
// runs in a goroutine of its own that the notifier waits for when it ends.
// Job streams (KindJob) query, read and cancel them, also when a previous
// agent process started them.
//
// Every goroutine is owned: a session does not end until its execs ended, and
// an exec does not end until its process group was killed or exited and its
// copiers returned. When the session ends (coordinator gone, Run's context
// done) every exec of that session is killed (SIGTERM to its process group,
// SIGKILL after Config.KillGrace), because its result can no longer be
// reported. A killed group is over once it has no live member: the grace
// is not waited out for zombies that their new parent (init, slow to reap
// in some containers) has not reaped yet (procs.go). A background child that
// redirected its output away from the exec's pipes is left running when its
// parent exits normally.
//
// Panics (panic.go). Every per-stream goroutine above (handler, waiter,
// copiers, frame reader, stdin feeder, listers, cancel watcher), each
// session (the
// redialer's callback: handshake and accept loop), its heartbeat loop, its
// pinger and its control reader defer internal/panics' Recover: a panic fails that stream with
// a CodeInternal error frame (a session is closed and redialled), is counted in
// tether_panics_total{component="agent"} and logged once with its stack,
// and the agent keeps serving everything else. A helper's panic makes its
// handler kill the process group and answer with the internal error. Left
// unguarded: Agent.Run's redial loop (it owns the agent's lifetime), the
// session watcher in serveStreams and context.AfterFunc callbacks (no logic
// of their own), and the goroutines of the tunnel and mirror packages.
//
// SSH (ssh.go, package sshd). Ssh streams (KindSSH) carry an SSH
// connection to the agent's own SSH server, which listens on no socket.
// Its host key is Config.SSHHostKeyFile (created on first start, listed in
// Hello.SSHHostKey with FeatureSSH). The coordinator vouches for the caller
// in protocol.SSHParams; a login must be one of its Logins and pass runAs
// ("exec" for commands and sftp, "shell" for shells), and each channel runs
// as that account exactly as an exec does (credential, reduced
// environment, home directory, its own process group, killed when the
// channel or connection closes). Each channel's end is reported as a
// FrameSSHChannel on the control stream, whose writers (heartbeats,
// renewals, these events, job exit reports) share one lock (writeControl). The sftp
// subsystem runs in a helper process of the agent's binary with the
// login's credentials, as copies do (copyas.go).
//
// The agent must not import the coordinator package, nats.go or nats-server:
// it speaks to the fleet only through the tunnel.
//
// Processes the agent starts get its environment without TETHER_TOKEN,
// TETHER_OPENSHELL_TOKEN and TETHER_OPENSANDBOX_API_KEY (Agent.childEnv). An output frame write that fails or stalls closes the
// stream and kills the exec, since no valid frame can follow a partial one.
//
// The mutexes are each exec's frame-write lock (one writer at a time on
// the stream) and the session's gateway-client lock (creating and closing
// the clients); neither is held while taking another lock.
package agent
