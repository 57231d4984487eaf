// Package jobstore is the durable record of exec jobs (DESIGN §4 durable
// path, issue 11 item 2): a job accepted by the API is written to JetStream
// before it runs, and its state lives in a KV bucket that every coordinator
// on the NATS system reads, so a job can be found, waited for and
// reconciled by id from any coordinator.
//
// # Layout
//
// The work-queue stream TETHER_JOBS (subjects tether_jobs.<id>, outside
// tether.v1. so that no client can publish into it; file storage;
// duplicate window Config.DedupeWindow; max age Config.Retention) holds one
// message per job submitted queued (not dispatched at once) until it is
// acknowledged when the job ends (Finish, Lose, Observe). The ack is a
// purge of the job's subject, sent without waiting for the answer. The KV
// bucket tether_jobs (history 1, TTL Config.Retention) holds a Record per
// job under job.<id> and, for idempotent jobs, the job id under
// idem.<hash of owner and key>, and for detached idempotent jobs the
// spec a re-run needs under spec.<id> (rerun.go). Both have replicas min(3, cluster size): Open tries 3, then 2, then 1, while
// the server answers that it cannot place that many.
//
// # Accept
//
// A job is accepted once its record is stored (Submit returned): the
// caller starts it only then. A job started or dispatched at once
// (Submission.StartNow, DispatchNow: every exec today) is accepted by its
// record alone, one write: a queue message would wait for no dispatcher
// and only cost a purge when the job ends. Nothing is lost by it:
// reconciliation works from the records (it settles every non-terminal
// record of a dead holder, whatever its queue holds), and the idempotency
// key goes with the record write as Nats-Msg-Id instead, so the bucket's
// stream drops a repeat as the queue would. A job submitted queued gets
// its queue message too, written concurrently with its record, under a
// Nats-Msg-Id of that submission's own (its idempotency key's generation
// for an idempotent job): a message whose PubAck was lost is sent again
// and the stream's duplicate window (at least 2 minutes) drops the
// resend, so the job is accepted with one message.
//
// The server's sync setting (sync_interval: always, which the embedded
// coordinator server sets) decides whether an accepted record survives a
// power loss; JetStream has no per-stream fsync knob.
//
// # States and fencing
//
// A record moves only forward: queued → dispatched → running → one of
// succeeded, failed, cancelled, lost (terminal; queued and dispatched may
// go straight to a terminal state). Every write is compare-and-set on the
// KV revision the writer last saw. A Job handle carries the holder
// (Record.Coordinator, with the process it runs in, Record.Boot) and
// epoch it was written with; Claim (reconciliation
// by another coordinator, or a restarted one) raises the epoch, after which
// the old handle's writes and its dispatch fail with ErrFenced: a stale
// coordinator can neither ack nor finish a job it lost.
//
// A detached job on several nodes gathers one node result per node in
// Record.Results as each node's run ends (Observe, RecordResults,
// SettleNodes; nodes.go) and ends when every node has one. Those writes
// are compare-and-set too, but merged: a writer that lost a race applies
// its node's result to the record it reads again, so reports of several
// nodes at once all land. Every node runs the job under the job's own id,
// also a node another coordinator holds (which writes no record of its
// own for it): whichever coordinator a node's exit report reaches settles
// it into this one record.
//
// # Idempotency
//
// A submission is at most once unless Submission.IdempotencyKey is set:
// then a second submission by the same owner with the same key (within the
// record's retention) returns the first job (ErrDuplicate with the job),
// and the record write carries the key as Nats-Msg-Id. A repeat of a job
// whose attempt ended lost runs (at least once): the key is moved to it
// (compare-and-set, so of two repeats one runs) and its record write gets
// a Nats-Msg-Id of that generation. A key whose write was stored but not
// acknowledged (timed out, or cut by a reconnect) names a job that was
// refused and has no record: the submission reads it back, and so does
// its repeat, which runs the job in its place, once (Store.claimKey).
//
// A detached idempotent job whose run is lost is run again by the
// coordinators (rerun.go): ClaimRerun marks the lost record, compare-and-
// set, with the id of the next attempt (Record.RerunAs; the new record
// has RerunOf and Attempt), so that of several coordinators that saw the
// loss one runs it, at most MaxAttempts runs in all; Store.OnEnd tells the
// coordinator of each record its writes end.
//
// # Owners
//
// A job id is the owner's of its record (Record.Owner, the submitter's
// identity) for as long as the record is kept: the owner may submit a new
// job under it once the job ended, which replaces the record; another
// owner's submission under it is refused (ErrNotOwner, also ErrExists),
// live or ended, and writes nothing. Idempotency keys are per owner (the
// key's KV key hashes owner and key), and a key never answers with a job
// of another owner.
//
// The package runs no goroutine that outlives the call that started it
// (Active and SettleNodes read or ask concurrently); its methods are safe
// for concurrent use.
// It must not import the coordinator package or the agent.
package jobstore
