package jobstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/coordinator/internal/jsreplicas"
	"github.com/tetherfleet/tether/protocol"
)

// Names of the stream and the bucket.
const (
	StreamName    = "TETHER_JOBS"
	SubjectPrefix = "tether_jobs."
	BucketName    = "tether_jobs"
)

// Defaults of Config.
const (
	DefaultRetention    = 7 * 24 * time.Hour
	DefaultDedupeWindow = 10 * time.Minute
)

// minDedupeWindow is the shortest duplicate window Open configures: well
// past the span of one submission's writes and resends (its caller's
// deadline plus settleConfirmTimeout, seconds), so the server drops a
// resend of a queue message or record whose acknowledgement was lost.
const minDedupeWindow = 2 * time.Minute

// maxResultsBytes bounds the encoded node results a record keeps; past it
// only the counts are kept (Record.ResultsOmitted), so a record of a wide
// fan-out stays well under NATS's payload limit. It is the bound of
// protocol.AddJobResult's, which ends the jobs of several nodes.
const maxResultsBytes = protocol.MaxJobResultsBytes

// Errors callers branch on (errors.Is).
var (
	// ErrNotFound: no record with that id (never submitted, or expired).
	ErrNotFound = errors.New("jobstore: job not found")
	// ErrExists: a job with that id is queued, dispatched or running.
	ErrExists = errors.New("jobstore: job id in use")
	// ErrNotOwner: the id's record, live or ended, is another owner's
	// (Record.Owner); an error wrapping it wraps ErrExists too.
	ErrNotOwner = errors.New("jobstore: job id in use by another owner")
	// ErrDuplicate: an idempotent submission repeated one already
	// accepted; Submit returns the first job with it.
	ErrDuplicate = errors.New("jobstore: duplicate idempotent submission")
	// ErrFenced: another coordinator (or a newer epoch) holds the job;
	// the handle may no longer write it.
	ErrFenced = errors.New("jobstore: job is held by another coordinator")
	// ErrBackward: the transition would move the job's state backward or
	// out of a terminal state.
	ErrBackward = errors.New("jobstore: state cannot move backward")
)

// State is a job's durable state (protocol.JobState).
type State = protocol.JobState

// States, in their order.
const (
	Queued     = protocol.JobQueued
	Dispatched = protocol.JobDispatched
	Running    = protocol.JobStateRunning
	Succeeded  = protocol.JobSucceeded
	Failed     = protocol.JobFailed
	Cancelled  = protocol.JobCancelled
	Lost       = protocol.JobStateLost
)

// Record is a job's state in the bucket (protocol.JobRecord as JSON).
type Record = protocol.JobRecord

// Config configures a Store.
type Config struct {
	// NATS is the coordinator's connection, in the account holding the
	// stream and bucket. Required; the Store does not close it.
	NATS *nats.Conn
	// Coordinator is this coordinator's id, recorded as a job's holder.
	// Required.
	Coordinator string
	// Retention is how long records and queue messages are kept, after
	// which they expire. Zero means DefaultRetention.
	Retention time.Duration
	// DedupeWindow is the stream's Nats-Msg-Id duplicate window. Zero
	// means DefaultDedupeWindow; at least 2 minutes (the span of a
	// submission's resends after a lost acknowledgement), at most
	// Retention.
	DedupeWindow time.Duration
	// Replicas forces the replica count (1 to 5); zero means min(3,
	// cluster size).
	Replicas int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives the warnings of a slow start (a stream or bucket
	// JetStream has not created yet). Nil discards them.
	Logger *slog.Logger
}

// Store reads and writes job records. Its methods are safe for
// concurrent use.
type Store struct {
	cfg      Config
	boot     string // this process's Record.Boot
	js       jetstream.JetStream
	stream   jetstream.Stream
	kv       jetstream.KeyValue
	kvStream jetstream.Stream // the bucket's stream, KV_tether_jobs
	replicas int

	mu      sync.Mutex
	onEnd   func(*Record)        // OnEnd's hook (guarded by mu)
	pending map[string]time.Time // jobs Reconcile claimed and left running → since when (guarded by mu)
}

// Open creates or binds the stream and the bucket. Errors name what failed.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.NATS == nil || cfg.Coordinator == "" {
		return nil, errors.New("jobstore: config: NATS and Coordinator are required")
	}
	if cfg.Replicas < 0 || cfg.Replicas > 5 {
		return nil, fmt.Errorf("jobstore: config: replicas %d: want 0 (auto) to 5", cfg.Replicas)
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.DedupeWindow <= 0 {
		cfg.DedupeWindow = DefaultDedupeWindow
	}
	// The window must outlast a submission's resends (minDedupeWindow);
	// the server refuses one longer than the max age.
	cfg.DedupeWindow = min(max(cfg.DedupeWindow, minDedupeWindow), cfg.Retention)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("jobstore: jetstream: %w", err)
	}
	s := &Store{cfg: cfg, js: js, boot: rand.Text()[:12], pending: map[string]time.Time{}}
	s.replicas, err = jsreplicas.Create(ctx, jsreplicas.Store{Name: "job store stream " + StreamName, Replicas: cfg.Replicas, Log: cfg.Logger, Exists: jsreplicas.StreamExists(js, StreamName, &s.stream)}, func(ctx context.Context, r int) error {
		var err error
		s.stream, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:        StreamName,
			Description: "Tether jobs accepted and not yet acknowledged (dispatched or ended)",
			Subjects:    []string{SubjectPrefix + ">"},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     jetstream.FileStorage,
			Replicas:    r,
			MaxAge:      cfg.Retention,
			Duplicates:  cfg.DedupeWindow,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("jobstore: stream %s: %w", StreamName, err)
	}
	_, err = jsreplicas.Create(ctx, jsreplicas.Store{Name: "job store bucket " + BucketName, Replicas: s.replicas, Log: cfg.Logger, Exists: jsreplicas.BucketExists(js, BucketName, &s.kv)}, func(ctx context.Context, r int) error {
		var err error
		s.kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketName,
			Description: "Tether job states",
			History:     1,
			TTL:         cfg.Retention,
			Storage:     jetstream.FileStorage,
			Replicas:    r,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("jobstore: bucket %s (replicas %d): %w", BucketName, s.replicas, err)
	}
	if s.kvStream, err = js.Stream(ctx, "KV_"+BucketName); err != nil {
		return nil, fmt.Errorf("jobstore: bucket %s: its stream: %w", BucketName, err)
	}
	return s, nil
}

// Replicas is the replica count of the stream and bucket.
func (s *Store) Replicas() int { return s.replicas }

// Coordinator is the holder id this store writes.
func (s *Store) Coordinator() string { return s.cfg.Coordinator }

// Boot is the holder process this store writes (Record.Boot): a record of
// this coordinator's id with another boot is a predecessor's.
func (s *Store) Boot() string { return s.boot }

// Job is a holder's handle on one record: the record as last written and
// its revision. It is not safe for concurrent use; a job's transitions are
// made by the one goroutine running it.
type Job struct {
	Record
	rev uint64
	// queued: the job may have a queue message to ack. Submit knows (a
	// job started or dispatched at once has none); a handle read by Get
	// does not, so it acks when it dispatches or ends (a purge of an
	// empty subject is harmless).
	queued bool
}

// Revision is the KV revision the handle last wrote or read.
func (j *Job) Revision() uint64 { return j.rev }

// Submission is a job accepted by the API.
type Submission struct {
	ID         string
	Owner      string
	Nodes      []string
	Target     string
	Detached   bool
	Script     string
	Idempotent bool
	// IdempotencyKey identifies repeats of one idempotent submission
	// (per owner); empty with Idempotent means the job id.
	IdempotencyKey string
	// StartNow records the job as running at once (dispatched and
	// started): an attached job, whose exec streams open right away.
	StartNow bool
	// Attempt is which run of an idempotent job this is (0 means 1);
	// RerunOf the lost record it runs again (Store.ClaimRerun).
	Attempt int
	RerunOf string
	// DispatchNow records the job as dispatched at once: a detached job
	// its coordinator starts on its nodes right away (one write on its
	// path instead of two). Ignored with StartNow.
	DispatchNow bool
}

func jobKey(id string) string { return "job." + id }

func idemKey(owner, key string) string {
	h := sha256.Sum256([]byte(owner + "\x00" + key))
	return "idem." + hex.EncodeToString(h[:16])
}

// maxCommand bounds a record's Command, in bytes.
const maxCommand = 120

// command is a record's Command: the first line of script (blank lines
// and space around it trimmed), at most maxCommand bytes, saying what it
// leaves out: "…" where the line was cut (protocol.ClipUTF8), and when
// more lines follow, the script's count of them ("make … (3 lines)").
func command(script string) string {
	script = strings.TrimSpace(script)
	first, rest, more := strings.Cut(script, "\n")
	first = strings.TrimSpace(first)
	if !more {
		return protocol.ClipUTF8(first, maxCommand)
	}
	tail := fmt.Sprintf(" (%d lines)", 2+strings.Count(rest, "\n"))
	if clipped := protocol.ClipUTF8(first, maxCommand-len(tail)-len(" …")); clipped != first {
		return clipped + tail // cut: ClipUTF8's "…" marks it
	}
	return first + " …" + tail
}

// Submit records sub as queued (running, when sub.StartNow; dispatched,
// when sub.DispatchNow), held by this coordinator. The record fails with
// an error wrapping ErrNotOwner and ErrExists if the id's record, live or
// ended, is another owner's, and with ErrExists if the owner's own job of
// that id is not terminal; a terminal record of the same id and owner is
// replaced (an owner may reuse its id once its job ended). A job
// recorded queued also gets its queue message, written concurrently with
// the record; a job started or dispatched at once gets none (see
// "Accept" in the package doc). An idempotent submission seen before
// returns the first job's handle and ErrDuplicate.
//
// Submit returns only once the record is stored (acknowledged by the
// server, on disk under sync_interval: always); the caller must not start
// the job before, and must not start it at all on an error.
func (s *Store) Submit(ctx context.Context, sub Submission) (*Job, error) {
	if err := protocol.ValidJobID(sub.ID); err != nil {
		return nil, fmt.Errorf("jobstore: submit: %w", err)
	}
	key := sub.IdempotencyKey
	if sub.Idempotent && key == "" {
		key = sub.ID
	}
	msgID, idemRev := "", uint64(0)
	recordMsgID := "" // the record write's Nats-Msg-Id
	if sub.Idempotent {
		msgID = idemKey(sub.Owner, key)
		var first *Job
		var err error
		if idemRev, recordMsgID, first, err = s.claimKey(ctx, sub, msgID); err != nil {
			return first, err
		}
	}
	j := s.newJob(sub)
	if j.State != Queued {
		// The record alone is the accept: one write on the job's path,
		// carrying the idempotency key as Nats-Msg-Id (the bucket's stream
		// drops a repeat within its duplicate window, as the queue would).
		if err := s.create(ctx, j, recordMsgID); err != nil {
			if de := (*duplicateError)(nil); errors.As(err, &de) {
				return s.repeatOf(ctx, sub.ID, msgID, idemRev, de.seq)
			}
			return nil, err
		}
		return j, nil
	}
	// The queue message and the record are written at once: one round
	// trip, not two.
	j.queued = true
	m := nats.NewMsg(SubjectPrefix + sub.ID)
	m.Data, _ = json.Marshal(&j.Record)
	// Every submission's message has a Nats-Msg-Id of its own (an
	// idempotent one's: its key's generation, as its record write), so
	// the stream drops a resend of it (below) as a duplicate.
	qmsgID := recordMsgID
	if qmsgID == "" {
		qmsgID = "job." + sub.ID + "/" + rand.Text()
	}
	m.Header.Set(jetstream.MsgIDHeader, qmsgID)
	paf, perr := s.js.PublishMsgAsync(m)
	cerr := s.create(ctx, j, "")
	var seq uint64
	if perr == nil {
		select {
		case ack := <-paf.Ok():
			if !ack.Duplicate { // never take back another submission's message
				seq = ack.Sequence
			}
		case perr = <-paf.Err():
		case <-ctx.Done():
			perr = ctx.Err()
		}
	}
	if isUnconfirmed(perr) {
		// The message may be stored with its PubAck lost (timed out, or
		// cut by a reconnect): send it again under the same Nats-Msg-Id.
		// The stream stores it (the first never came) or drops it as
		// the first's duplicate and answers with the first's sequence:
		// one message either way.
		sctx, cancel := settleContext(ctx)
		ack, err := s.js.PublishMsg(sctx, m)
		cancel()
		if err != nil {
			perr = fmt.Errorf("%w (sent again: %v)", perr, err)
		} else {
			perr = nil
			if !ack.Duplicate || !sub.Idempotent { // a plain one's id is this submission's alone
				seq = ack.Sequence
			}
		}
	}
	switch {
	case cerr != nil:
		if seq != 0 {
			// Not accepted: take its queue message back.
			s.stream.DeleteMsg(context.WithoutCancel(ctx), seq)
		}
		return nil, cerr
	case perr != nil:
		// Recorded but not queued: the job is refused, so end its record.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		s.Lose(lctx, j, fmt.Sprintf("its queue message could not be written: %v", perr))
		return nil, fmt.Errorf("jobstore: submit job %s: queue: %w", sub.ID, perr)
	}
	return j, nil
}

// newJob is sub's handle before its first write: held by this store,
// queued, running (sub.StartNow) or dispatched (sub.DispatchNow).
func (s *Store) newJob(sub Submission) *Job {
	nodes := slices.Clone(sub.Nodes)
	slices.Sort(nodes)
	now := s.now()
	j := &Job{Record: Record{
		ID: sub.ID, State: Queued, Owner: sub.Owner, Coordinator: s.cfg.Coordinator, Boot: s.boot,
		Nodes: nodes, Target: sub.Target, Detached: sub.Detached, Idempotent: sub.Idempotent,
		Command: command(sub.Script), SubmittedAt: now,
		Attempt: max(sub.Attempt, 1), RerunOf: sub.RerunOf,
	}}
	switch {
	case sub.StartNow:
		j.State, j.DispatchedAt, j.StartedAt = Running, now, now
	case sub.DispatchNow:
		j.State, j.DispatchedAt = Dispatched, now
	}
	return j
}

// Begin starts Submit(sub) and returns the function that waits for its
// outcome (what Submit returns; it must be called once). The point is
// the time between: for the common submission, started or dispatched at
// once and not idempotent, the record's one write is sent before Begin
// returns (an asynchronous publish, compare-and-set on the key having no
// revision, as KV Create does), so the caller overlaps the write's round
// trip with its own work, such as opening the job's streams. Any other
// submission (idempotent: its key is checked first; queued) runs whole in
// wait. As with Submit, the caller must not start the job before wait
// returned nil, nor at all on an error: until then nothing is stored, or
// nothing is known to be.
func (s *Store) Begin(sub Submission) (wait func(context.Context) (*Job, error)) {
	if sub.Idempotent || !(sub.StartNow || sub.DispatchNow) || protocol.ValidJobID(sub.ID) != nil {
		return func(ctx context.Context) (*Job, error) { return s.Submit(ctx, sub) }
	}
	j := s.newJob(sub)
	m := nats.NewMsg(recordSubject(jobKey(j.ID)))
	m.Data, _ = json.Marshal(&j.Record)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	paf, err := s.js.PublishMsgAsync(m)
	return func(ctx context.Context) (*Job, error) {
		if err != nil {
			return nil, fmt.Errorf("jobstore: submit job %s: %w", j.ID, err)
		}
		select {
		case ack := <-paf.Ok():
			// No Nats-Msg-Id: the server cannot take it for a duplicate.
			j.rev = ack.Sequence
			return j, nil
		case err = <-paf.Err():
		case <-ctx.Done():
			err = ctx.Err()
		}
		if isUnconfirmed(err) {
			sctx, cancel := settleContext(ctx)
			defer cancel()
			rev, serr := s.settleUnconfirmed(sctx, j, 0, err)
			if serr == nil {
				j.rev = rev
				return j, nil
			}
			if !isConflict(serr) {
				return nil, serr
			}
			// The key held another record when the first write came,
			// so it was refused: go on as below, in time of our own.
			ctx = sctx
		} else if !isWrongLastSeq(err) {
			return nil, fmt.Errorf("jobstore: submit job %s: %w", j.ID, err)
		}
		// The id has a record: create replaces it if it is terminal and
		// sub.Owner's (ids are reused by their owner), else refuses with
		// ErrExists (ErrNotOwner: another owner's).
		if err := s.create(ctx, j, ""); err != nil {
			return nil, err
		}
		return j, nil
	}
}

// settleConfirmTimeout bounds settleUnconfirmed's own write and read.
const settleConfirmTimeout = 5 * time.Second

// settleContext is ctx's values with a time of settleConfirmTimeout of
// its own: the caller's may be what ran out.
func settleContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), settleConfirmTimeout)
}

// isUnconfirmed reports whether err leaves a record write's fate unknown:
// its acknowledgement did not come in time, or the connection dropped
// before it came (nats.go then fails a pending publish with
// ErrDisconnected, and may send one still buffered after the reconnect),
// so it may be stored.
func isUnconfirmed(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// settleUnconfirmed decides the fate of j's record write, compare-and-set
// on key revision last (0: none), whose acknowledgement did not come
// (cause): under load, or across a NATS reconnect, it may be stored after
// the caller gave up, leaving a record that says running for a job that
// was refused and never runs (a retry of its id then got 409; TestCluster
// saw it at load 40). ctx must have time of its own (settleContext). It
// writes j's record again, now lost, compare-and-set on the same revision:
//   - stored: the first write will never be (it expected the same
//     revision), so the job is refused (an error wrapping cause) with a
//     terminal record that a retry of the id replaces;
//   - the key moved on: if to j's own first write (this holder and boot,
//     the same submission time and state), the write landed late and j is
//     accepted after all: its revision, nil; else the first write cannot
//     land either, and the conflict (isConflict) is returned: the caller
//     goes on as for a refused write (an ended job's record is replaced,
//     a live one is ErrExists);
//   - this write fails too: the fate stays unknown (an error wrapping
//     cause).
func (s *Store) settleUnconfirmed(ctx context.Context, j *Job, last uint64, cause error) (uint64, error) {
	lost := j.Record
	lost.State, lost.FinishedAt = Lost, s.now()
	lost.Error = fmt.Sprintf("coordinator %s could not confirm the record in time (%v); the job did not run", s.cfg.Coordinator, cause)
	b, _ := json.Marshal(&lost)
	_, err := s.put(ctx, jobKey(j.ID), b, last, "")
	if err == nil {
		return 0, fmt.Errorf("jobstore: submit job %s: record not confirmed in time (%w); recorded lost, not run", j.ID, cause)
	}
	if !isConflict(err) {
		return 0, fmt.Errorf("jobstore: submit job %s: record not confirmed in time (%w), and its fate is unknown: %v", j.ID, cause, err)
	}
	old, gerr := s.Get(ctx, j.ID)
	if errors.Is(gerr, ErrNotFound) {
		return 0, err // a delete marker: not j's write
	}
	if gerr != nil {
		return 0, fmt.Errorf("jobstore: submit job %s: record not confirmed in time (%w), and its fate is unknown: %v", j.ID, cause, gerr)
	}
	if old.Coordinator == j.Coordinator && old.Boot == j.Boot && old.State == j.State && old.SubmittedAt.Equal(j.SubmittedAt) {
		return old.rev, nil
	}
	return 0, err
}

// isWrongLastSeq reports whether err is the server's answer to a write
// whose Nats-Expected-Last-Subject-Sequence did not match.
func isWrongLastSeq(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && (ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// claimKeyTries bounds claimKey's rereads after losing a race for the key.
const claimKeyTries = 3

// claimKey takes the idempotency key idem (of sub's owner and key) for
// sub's job and returns the key's revision and the Nats-Msg-Id the job's
// record write carries: the key itself for the key's first submission;
// idem/REV for a repeat that runs in place of an earlier attempt: REV is
// the key revision this repeat writes when that attempt was lost, and the
// one that attempt wrote when it is half made (below: the Nats-Msg-Id its
// own record write would carry, were it a rerun itself). When the key
// names an earlier submission's job that is not lost, it returns that job
// and ErrDuplicate.
//
// A repeat runs in place of
//   - an attempt that ended lost (its coordinator died): at least once;
//   - an attempt that stored the key but never its record (half made):
//     the key's write was stored but its acknowledgement was lost (timed
//     out, or cut by a reconnect), so that submission was refused. Its
//     repeat (the client's, typically with the same job id) reads the
//     key back and runs the job, once, instead of failing on a key that
//     names no record. A repeat with another job id first writes the
//     attempt's record lost (compare-and-set on none, under the attempt's
//     Nats-Msg-Id), so that the attempt's record write, should it still
//     come, cannot land as a second job.
//   - an attempt refused because its id's record is another owner's
//     (ErrNotOwner), which left the key naming that id: the key is this
//     owner's, so it never answers with the other owner's job.
//
// The key is moved compare-and-set on the revision read, so of two
// repeats at once one runs and the other gets the first's job. A half-made
// attempt is taken for refused only after firstOf's wait for its record;
// one still writing it after that, with the repeat's job id, is refused by
// the record's compare-and-set (ErrExists) while the repeat's job runs.
//
// A create whose acknowledgement is lost is settled by the same read
// back (a create of its own that landed is a half-made key naming sub's
// id); while the key cannot be read the submission is refused with an
// error wrapping the cause, and its repeat settles it.
func (s *Store) claimKey(ctx context.Context, sub Submission, idem string) (uint64, string, *Job, error) {
	rev, err := s.kv.Create(ctx, idem, []byte(sub.ID))
	if err == nil {
		return rev, idem, nil, nil
	}
	if isUnconfirmed(err) {
		var cancel context.CancelFunc
		ctx, cancel = settleContext(ctx)
		defer cancel()
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return 0, "", nil, fmt.Errorf("jobstore: submit job %s: idempotency key: %w", sub.ID, err)
	}
	for range claimKeyTries {
		first, krev, err := s.firstOf(ctx, sub, idem)
		var half *halfMadeError
		lost := errors.Is(err, ErrDuplicate)
		switch {
		case lost && first.State != Lost:
			return 0, "", first, err
		case lost:
			// At least once: the first attempt was lost (its coordinator
			// died), so this repeat runs, once.
		case errors.As(err, &half):
			// A key naming another owner's record was left by a
			// submission refused for that (ErrNotOwner), whose record
			// write can never land there: nothing to fence.
			if half.id != sub.ID && !half.foreign {
				if err := s.fenceHalfMade(ctx, sub, half.id, idem); isConflict(err) {
					continue // its record came: read again
				} else if err != nil {
					return 0, "", nil, err
				}
			}
		default:
			return 0, "", nil, err
		}
		// The key names this job from now on (compare-and-set: of two
		// repeats one wins), and its record write is deduplicated under
		// a Nats-Msg-Id of the attempt it replaces.
		rev, err := s.kv.Update(ctx, idem, []byte(sub.ID), krev)
		if isConflict(err) {
			continue // another repeat moved it: read again
		}
		if err != nil {
			return 0, "", nil, fmt.Errorf("jobstore: submit job %s: idempotency key: %w", sub.ID, err)
		}
		if lost {
			krev = rev // the generation this write starts
		}
		return rev, fmt.Sprintf("%s/%d", idem, krev), nil, nil
	}
	return 0, "", nil, fmt.Errorf("jobstore: submit job %s: idempotency key: %w (moved by %d concurrent submissions)", sub.ID, jetstream.ErrKeyRevisionMismatch, claimKeyTries)
}

// fenceHalfMade writes the record of job id, whose submission stored the
// idempotency key idem and not its record, as lost, compare-and-set on
// none and under the Nats-Msg-Id that submission's record write carries
// (the key's first), so that write, should it still come, is refused or
// dropped: sub runs in its place. A conflict (isConflict) means id's
// record came meanwhile.
func (s *Store) fenceHalfMade(ctx context.Context, sub Submission, id, idem string) error {
	now := s.now()
	rec := Record{
		ID: id, State: Lost, Owner: sub.Owner, Coordinator: s.cfg.Coordinator, Boot: s.boot,
		Idempotent: true, SubmittedAt: now, FinishedAt: now,
		Error: fmt.Sprintf("its idempotency key was stored but not its record; not run (job %s, a repeat, runs in its place)", sub.ID),
	}
	b, _ := json.Marshal(&rec)
	_, err := s.put(ctx, jobKey(id), b, 0, idem)
	if de := (*duplicateError)(nil); errors.As(err, &de) {
		// An earlier record write with the key's Nats-Msg-Id (the key's
		// first job, when id is a rerun): id's own may have come.
		if _, gerr := s.Get(ctx, id); gerr == nil {
			return fmt.Errorf("jobstore: submit job %s: %w (job %s was recorded meanwhile)", sub.ID, jetstream.ErrKeyExists, id)
		} else if !errors.Is(gerr, ErrNotFound) {
			return fmt.Errorf("jobstore: submit job %s: read job %s: %w", sub.ID, id, gerr)
		}
		return nil
	}
	if err != nil && !isConflict(err) {
		return fmt.Errorf("jobstore: submit job %s: end job %s, never recorded: %w", sub.ID, id, err)
	}
	return err
}

// halfMadeError: the idempotency key names job id (at key revision rev),
// which has no record, even after firstOf's wait, or (foreign) whose
// record is another owner's.
type halfMadeError struct {
	id      string
	rev     uint64
	foreign bool
}

func (e *halfMadeError) Error() string {
	if e.foreign {
		return fmt.Sprintf("its idempotency key names job %s, which has no record of this owner", e.id)
	}
	return fmt.Sprintf("its idempotency key names job %s, which has no record", e.id)
}

// firstOf returns the handle of the job the idempotency key idem (of
// sub's owner and key, written by an earlier submission) names, the key's
// revision and ErrDuplicate; an error wrapping ErrNotFound and a
// *halfMadeError when that job has no record, and a foreign
// *halfMadeError when its record is another owner's (a submission under
// the key was refused, ErrNotOwner): sub is never answered with another
// owner's job.
func (s *Store) firstOf(ctx context.Context, sub Submission, idem string) (*Job, uint64, error) {
	id := sub.ID
	e, err := s.kv.Get(ctx, idem)
	if err != nil {
		return nil, 0, fmt.Errorf("jobstore: submit job %s: read idempotency key: %w", id, err)
	}
	// The first submitter writes its record just after the key: give it
	// a moment.
	first, err := s.Get(ctx, string(e.Value()))
	for wait := time.Millisecond; errors.Is(err, ErrNotFound) && wait < time.Second; wait *= 2 {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		first, err = s.Get(ctx, string(e.Value()))
	}
	if errors.Is(err, ErrNotFound) {
		return nil, e.Revision(), fmt.Errorf("jobstore: submit job %s: first submission %s: %w (%w)", id, e.Value(), err, &halfMadeError{id: string(e.Value()), rev: e.Revision()})
	}
	if err != nil {
		return nil, 0, fmt.Errorf("jobstore: submit job %s: first submission %s: %w", id, e.Value(), err)
	}
	if first.Owner != sub.Owner {
		return nil, e.Revision(), fmt.Errorf("jobstore: submit job %s: first submission %s: %w", id, e.Value(), &halfMadeError{id: first.ID, rev: e.Revision(), foreign: true})
	}
	return first, e.Revision(), ErrDuplicate
}

// duplicateError: the bucket's stream dropped a record write as a repeat
// of its message seq, which had the same Nats-Msg-Id.
type duplicateError struct{ seq uint64 }

func (e *duplicateError) Error() string {
	return fmt.Sprintf("jobstore: record write dropped as a repeat of message %d of the bucket's stream (same Nats-Msg-Id)", e.seq)
}

// repeatOf answers a submission (job id, idempotency key idem, which it
// wrote at revision idemRev) whose record write the server dropped as a
// repeat of the bucket's message seq: the first job's record, whose id
// the key is set back to, and ErrDuplicate. When that message is gone
// (the first record moved on since: the bucket keeps one revision) the
// key is deleted and the submission refused with ErrExists.
func (s *Store) repeatOf(ctx context.Context, id, idem string, idemRev, seq uint64) (*Job, error) {
	m, err := s.kvStream.GetMsg(ctx, seq)
	if err != nil {
		s.kv.Delete(ctx, idem, jetstream.LastRevision(idemRev))
		return nil, fmt.Errorf("jobstore: submit job %s: %w: it repeats an idempotent submission whose record moved on (%v)", id, ErrExists, err)
	}
	firstID := strings.TrimPrefix(m.Subject, recordSubject(jobKey("")))
	if _, err := s.kv.Update(ctx, idem, []byte(firstID), idemRev); err != nil {
		return nil, fmt.Errorf("jobstore: submit job %s: repeat of job %s: restore idempotency key: %w", id, firstID, err)
	}
	first, err := s.Get(ctx, firstID)
	if err != nil {
		return nil, fmt.Errorf("jobstore: submit job %s: first submission %s: %w", id, firstID, err)
	}
	return first, ErrDuplicate
}

// recordSubject is the subject a write of key goes to: the bucket's
// stream subject (Open creates the bucket in this account, with no mirror
// or domain prefix).
func recordSubject(key string) string { return "$KV." + BucketName + "." + key }

// put writes b as key's value, compare-and-set: last is the revision it
// replaces (0: the key has none), sent as Nats-Expected-Last-Subject-Sequence,
// as KV Update does; msgID, if set, as Nats-Msg-Id. It returns the new
// revision once the server stored it, an error wrapping
// jetstream.ErrKeyRevisionMismatch when key has another revision, and a
// *duplicateError when the server dropped it as a repeat of msgID.
func (s *Store) put(ctx context.Context, key string, b []byte, last uint64, msgID string) (uint64, error) {
	m := nats.NewMsg(recordSubject(key))
	m.Data = b
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last, 10))
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	ack, err := s.js.PublishMsg(ctx, m)
	if err != nil {
		if isWrongLastSeq(err) {
			return 0, fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
		}
		return 0, err
	}
	if ack.Duplicate {
		return 0, &duplicateError{seq: ack.Sequence}
	}
	return ack.Sequence, nil
}

// create writes j's record as new, replacing a terminal record of the same
// id and owner; msgID, if set, goes with the write as Nats-Msg-Id. A
// record of the id with another owner, live or ended, refuses it with an
// error wrapping ErrNotOwner (and ErrExists); a live one of the same owner
// with ErrExists.
func (s *Store) create(ctx context.Context, j *Job, msgID string) error {
	b, _ := json.Marshal(&j.Record)
	rev, err := s.put(ctx, jobKey(j.ID), b, 0, msgID)
	if isUnconfirmed(err) {
		var cancel context.CancelFunc
		ctx, cancel = settleContext(ctx)
		defer cancel()
		rev, err = s.settleUnconfirmed(ctx, j, 0, err)
		if err != nil && !isConflict(err) {
			return err
		}
	}
	if err == nil {
		j.rev = rev
		return nil
	}
	if de := (*duplicateError)(nil); errors.As(err, &de) {
		return err
	}
	if !isConflict(err) {
		return fmt.Errorf("jobstore: submit job %s: %w", j.ID, err)
	}
	old, err := s.Get(ctx, j.ID)
	if errors.Is(err, ErrNotFound) {
		// The key's last revision is a delete marker (a record deleted by
		// hand): KV Create writes over it.
		rev, err = s.kv.Create(ctx, jobKey(j.ID), b)
		if err != nil {
			if isConflict(err) {
				return fmt.Errorf("jobstore: submit job %s: %w (submitted concurrently)", j.ID, ErrExists)
			}
			return fmt.Errorf("jobstore: submit job %s: %w", j.ID, err)
		}
		j.rev = rev
		return nil
	}
	if err != nil {
		return fmt.Errorf("jobstore: submit job %s: %w", j.ID, err)
	}
	if old.Owner != j.Owner {
		// The id is the record's owner's until the record expires: a
		// terminal record is replaced only by its owner's submission,
		// else another caller could take its results (or be taken for
		// its owner). The refusal tells nothing of the record, not even
		// whether its job still runs.
		return &notOwnerError{id: j.ID}
	}
	if !old.State.Terminal() {
		return fmt.Errorf("jobstore: submit job %s: %w (%s on coordinator %s)", j.ID, ErrExists, old.State, old.Coordinator)
	}
	rev, err = s.put(ctx, jobKey(j.ID), b, old.rev, msgID)
	if isUnconfirmed(err) {
		sctx, cancel := settleContext(ctx)
		defer cancel()
		rev, err = s.settleUnconfirmed(sctx, j, old.rev, err)
		if err != nil && !isConflict(err) {
			return err
		}
	}
	if err != nil {
		if isConflict(err) {
			return fmt.Errorf("jobstore: submit job %s: %w (submitted concurrently)", j.ID, ErrExists)
		}
		if de := (*duplicateError)(nil); errors.As(err, &de) {
			return err
		}
		return fmt.Errorf("jobstore: submit job %s: %w", j.ID, err)
	}
	j.rev = rev
	return nil
}

// notOwnerError: the record of job id is another owner's (ErrNotOwner,
// ErrExists).
type notOwnerError struct{ id string }

func (e *notOwnerError) Error() string {
	return fmt.Sprintf("jobstore: submit job %s: job id in use by another owner", protocol.Clip(e.id))
}

func (e *notOwnerError) Is(target error) bool { return target == ErrNotOwner || target == ErrExists }

func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

func (s *Store) now() time.Time { return s.cfg.Now().UTC() }

// Get reads the record of job id, as a handle of its current revision
// (which only Claim may make this coordinator's own). ErrNotFound if
// there is none.
func (s *Store) Get(ctx context.Context, id string) (*Job, error) {
	e, err := s.kv.Get(ctx, jobKey(id))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return nil, fmt.Errorf("jobstore: job %s: %w", protocol.Clip(id), ErrNotFound)
		}
		return nil, fmt.Errorf("jobstore: get job %s: %w", protocol.Clip(id), err)
	}
	j := &Job{rev: e.Revision(), queued: true}
	if err := json.Unmarshal(e.Value(), &j.Record); err != nil {
		return nil, fmt.Errorf("jobstore: job %s: decode record: %w", protocol.Clip(id), err)
	}
	return j, nil
}

// write stores rec as j's next record, compare-and-set on j's revision.
// On a conflict it rereads: if the job still has j's holder and epoch, and
// rec is still a forward move from the fresh state, it retries once on
// the fresh revision (another writer of this coordinator, e.g. a cancel);
// else ErrFenced or ErrBackward.
func (s *Store) write(ctx context.Context, j *Job, rec Record) error {
	for attempt := 0; ; attempt++ {
		b, _ := json.Marshal(&rec)
		rev, err := s.kv.Update(ctx, jobKey(j.ID), b, j.rev)
		if err == nil {
			j.Record, j.rev = rec, rev
			s.ended(&rec)
			return nil
		}
		if !isConflict(err) || attempt > 0 {
			return fmt.Errorf("jobstore: write job %s (%s): %w", j.ID, rec.State, err)
		}
		cur, gerr := s.Get(ctx, j.ID)
		if gerr != nil {
			return fmt.Errorf("jobstore: write job %s (%s): %w", j.ID, rec.State, gerr)
		}
		if cur.Coordinator != j.Coordinator || cur.Epoch != j.Epoch || cur.Boot != j.Boot {
			return fmt.Errorf("jobstore: write job %s (%s) as coordinator %s epoch %d: %w (coordinator %s epoch %d)", j.ID, rec.State, j.Coordinator, j.Epoch, ErrFenced, cur.Coordinator, cur.Epoch)
		}
		if !forward(cur.State, rec.State) {
			j.Record, j.rev = cur.Record, cur.rev
			return fmt.Errorf("jobstore: job %s: %s → %s: %w", j.ID, cur.State, rec.State, ErrBackward)
		}
		j.rev = cur.rev
	}
}

// forward reports whether from → to is allowed.
func forward(from, to State) bool {
	return to.Valid() && !from.Terminal() && to.Rank() > from.Rank()
}

// transition moves j to state to with change applied, checking the move
// is forward and that this store is j's holder.
func (s *Store) transition(ctx context.Context, j *Job, to State, change func(*Record)) error {
	if j.Coordinator != s.cfg.Coordinator || j.Boot != s.boot {
		return fmt.Errorf("jobstore: job %s held by coordinator %s (boot %s), not %s (boot %s): %w", j.ID, j.Coordinator, j.Boot, s.cfg.Coordinator, s.boot, ErrFenced)
	}
	if !forward(j.State, to) {
		return fmt.Errorf("jobstore: job %s: %s → %s: %w", j.ID, j.State, to, ErrBackward)
	}
	rec := j.Record
	rec.State = to
	if change != nil {
		change(&rec)
	}
	return s.write(ctx, j, rec)
}

// Dispatch moves j from queued to dispatched (to running, with both
// times, when started: an attached job starts as its exec streams open).
// A fenced holder gets ErrFenced. The queue message stays until the job
// ends.
func (s *Store) Dispatch(ctx context.Context, j *Job, started bool) error {
	to := Dispatched
	if started {
		to = Running
	}
	return s.transition(ctx, j, to, func(r *Record) {
		r.DispatchedAt = s.now()
		if started {
			r.StartedAt = r.DispatchedAt
		}
	})
}

// ack removes a job's queue message, if it is still there, without
// waiting for the server's answer (a purge of the job's subject, sent as
// a JetStream API request whose reply nobody reads): it is off the path
// of every job, and a message left behind (the request lost) only makes
// reconciliation look at a record that is past queued already. Callers
// ack only after a write of theirs succeeded: a fenced holder acks
// nothing. The error is the publish's.
func (s *Store) ack(_ context.Context, id string) error {
	body, _ := json.Marshal(struct {
		Filter string `json:"filter"`
	}{SubjectPrefix + id})
	nc := s.cfg.NATS
	if err := nc.PublishRequest(purgeAPI, nc.NewInbox(), body); err != nil {
		return fmt.Errorf("jobstore: ack job %s (stream %s): %w", id, StreamName, err)
	}
	return nil
}

// ackJob acks j's queue message if it may have one (Job.queued), once: a
// job started or dispatched at once has none, and its end costs no purge
// (a purge emptying the stream replaces its message block, files and
// all: the most expensive step of a job's record when it was taken).
func (s *Store) ackJob(ctx context.Context, j *Job) error {
	if !j.queued {
		return nil
	}
	if err := s.ack(ctx, j.ID); err != nil {
		return err
	}
	j.queued = false
	return nil
}

// purgeAPI is the JetStream API subject purging the stream.
const purgeAPI = "$JS.API.STREAM.PURGE." + StreamName

// Start moves j to running.
func (s *Store) Start(ctx context.Context, j *Job) error {
	return s.StartAsync(j)(ctx)
}

// StartAsync is Start begun: its write is sent before it returns, and
// wait (to be called once, before j is used again) returns what Start
// would. Several begun at once share their round trips (the coordinator
// writes the end records of the jobs that ended together this way).
func (s *Store) StartAsync(j *Job) (wait func(context.Context) error) {
	return s.transitionAsync(j, Running, func(r *Record) { r.StartedAt = s.now() })
}

// transitionAsync is transition begun: the checks are made and the write
// sent (compare-and-set on j's revision, as write's first try) before it
// returns; wait returns transition's outcome. On a conflict wait falls
// back to write, which rereads and retries as write does.
func (s *Store) transitionAsync(j *Job, to State, change func(*Record)) (wait func(context.Context) error) {
	if j.Coordinator != s.cfg.Coordinator || j.Boot != s.boot {
		err := fmt.Errorf("jobstore: job %s held by coordinator %s (boot %s), not %s (boot %s): %w", j.ID, j.Coordinator, j.Boot, s.cfg.Coordinator, s.boot, ErrFenced)
		return func(context.Context) error { return err }
	}
	if !forward(j.State, to) {
		err := fmt.Errorf("jobstore: job %s: %s → %s: %w", j.ID, j.State, to, ErrBackward)
		return func(context.Context) error { return err }
	}
	rec := j.Record
	rec.State = to
	if change != nil {
		change(&rec)
	}
	m := nats.NewMsg(recordSubject(jobKey(j.ID)))
	m.Data, _ = json.Marshal(&rec)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(j.rev, 10))
	paf, perr := s.js.PublishMsgAsync(m)
	return func(ctx context.Context) error {
		if perr == nil {
			select {
			case ack := <-paf.Ok():
				j.Record, j.rev = rec, ack.Sequence
				s.ended(&rec)
				return nil
			case perr = <-paf.Err():
			case <-ctx.Done():
				return fmt.Errorf("jobstore: write job %s (%s): %w", j.ID, rec.State, ctx.Err())
			}
			if !isWrongLastSeq(perr) {
				return fmt.Errorf("jobstore: write job %s (%s): %w", j.ID, rec.State, perr)
			}
		}
		// Not sent, or another writer moved the record: the synchronous
		// path, with its reread.
		return s.write(ctx, j, rec)
	}
}

// Finish moves j to its terminal state: cancelled if the job was
// cancelled (cancelled true), else succeeded when every result is OK,
// else failed. results are stored unless too large (counts only then).
// errMsg, if set, is kept as Record.Error.
func (s *Store) Finish(ctx context.Context, j *Job, results []protocol.NodeResult, cancelled bool, errMsg string) error {
	return s.FinishAsync(j, results, cancelled, errMsg)(ctx)
}

// FinishAsync is Finish begun: its record write is sent before it returns,
// and wait (to be called once, before j is used again) returns what Finish
// would, having acked the job's queue message (if any) after the write.
// Several begun at once share their round trips.
func (s *Store) FinishAsync(j *Job, results []protocol.NodeResult, cancelled bool, errMsg string) (wait func(context.Context) error) {
	to := Succeeded
	ok, bad := 0, 0
	for i := range results {
		if results[i].OK() {
			ok++
		} else {
			bad++
		}
	}
	switch {
	case cancelled:
		to = Cancelled
	case bad > 0 || errMsg != "":
		to = Failed
	}
	write := s.transitionAsync(j, to, func(r *Record) {
		r.FinishedAt = s.now()
		r.Succeeded, r.Failed, r.Error = ok, bad, errMsg
		r.Results, r.ResultsOmitted = results, false
		if b, _ := json.Marshal(results); len(b) > maxResultsBytes {
			r.Results, r.ResultsOmitted = nil, true
		}
	})
	return func(ctx context.Context) error {
		if err := write(ctx); err != nil {
			return err
		}
		return s.ackJob(ctx, j)
	}
}

// Lose ends j as lost with why.
func (s *Store) Lose(ctx context.Context, j *Job, why string) error {
	if err := s.transition(ctx, j, Lost, func(r *Record) { r.FinishedAt = s.now(); r.Error = why }); err != nil {
		return err
	}
	return s.ackJob(ctx, j)
}

// Claim makes this coordinator the holder of a non-terminal job read by
// Get (or found by Orphans), raising its epoch: the previous holder's
// handle is fenced from then on. It fails with ErrFenced if the record
// changed since it was read (someone else claimed or wrote it first).
func (s *Store) Claim(ctx context.Context, j *Job) error {
	if j.State.Terminal() {
		return fmt.Errorf("jobstore: claim job %s: already %s: %w", j.ID, j.State, ErrBackward)
	}
	rec := j.Record
	rec.Coordinator, rec.Boot = s.cfg.Coordinator, s.boot
	rec.Epoch++
	b, _ := json.Marshal(&rec)
	rev, err := s.kv.Update(ctx, jobKey(j.ID), b, j.rev)
	if err != nil {
		if isConflict(err) {
			return fmt.Errorf("jobstore: claim job %s: %w (changed since read)", j.ID, ErrFenced)
		}
		return fmt.Errorf("jobstore: claim job %s: %w", j.ID, err)
	}
	j.Record, j.rev = rec, rev
	return nil
}

// Filter selects records for List; zero fields match all.
type Filter struct {
	State State
	Node  string
	Owner string
	// Coordinator selects the holder.
	Coordinator string
	// Active selects non-terminal records only.
	Active bool
}

func (f *Filter) match(r *Record) bool {
	return (f.State == "" || r.State == f.State) &&
		(f.Node == "" || slices.Contains(r.Nodes, f.Node)) &&
		(f.Owner == "" || r.Owner == f.Owner) &&
		(f.Coordinator == "" || r.Coordinator == f.Coordinator) &&
		(!f.Active || !r.State.Terminal())
}

// List returns the records matching f (and keep, if not nil), newest
// submission first, at most limit (0: all). It reads every record: its cost
// grows with the bucket.
func (s *Store) List(ctx context.Context, f Filter, keep func(*Record) bool, limit int) ([]*Job, error) {
	kl, err := s.kv.ListKeysFiltered(ctx, "job.>")
	if err != nil {
		return nil, fmt.Errorf("jobstore: list: %w", err)
	}
	var out []*Job
	for k := range kl.Keys() {
		j, err := s.Get(ctx, strings.TrimPrefix(k, "job."))
		if errors.Is(err, ErrNotFound) {
			continue // expired or deleted since listed
		}
		if err != nil {
			kl.Stop()
			return nil, err
		}
		if f.match(&j.Record) && (keep == nil || keep(&j.Record)) {
			out = append(out, j)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("jobstore: list: %w", err)
	}
	slices.SortFunc(out, func(a, b *Job) int {
		if c := b.SubmittedAt.Compare(a.SubmittedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Queued reports how many queue messages the stream holds: jobs accepted
// and not ended (and, rarely, ended ones whose ack was lost).
func (s *Store) Queued(ctx context.Context) (uint64, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("jobstore: stream %s info: %w", StreamName, err)
	}
	return info.State.Msgs, nil
}

// activeReadConcurrency bounds the record reads of one Active call.
const activeReadConcurrency = 16

// Active returns the jobs not ended that keep passes (nil: all), in no
// particular order. It lists the bucket's job keys and reads their
// records concurrently: its cost grows with the bucket (Config.Retention),
// so reconciliation calls it on events (a holder gone, a restart) and
// once a minute, never on a job's path.
func (s *Store) Active(ctx context.Context, keep func(*Record) bool) ([]*Job, error) {
	kl, err := s.kv.ListKeysFiltered(ctx, "job.>")
	if err != nil {
		return nil, fmt.Errorf("jobstore: active jobs: %w", err)
	}
	defer kl.Stop()
	ids := make(chan string)
	var (
		mu   sync.Mutex
		out  []*Job
		errs []error
		wg   sync.WaitGroup
	)
	for range activeReadConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				j, err := s.Get(ctx, id)
				switch {
				case errors.Is(err, ErrNotFound):
					continue // expired or deleted since listed
				case err != nil:
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					continue
				case j.State.Terminal(), keep != nil && !keep(&j.Record):
					continue
				}
				mu.Lock()
				out = append(out, j)
				mu.Unlock()
			}
		}()
	}
	for k := range kl.Keys() {
		select {
		case ids <- strings.TrimPrefix(k, "job."):
			continue
		case <-ctx.Done():
		}
		break
	}
	close(ids)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("jobstore: active jobs: %w", err)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("jobstore: active jobs: %w", errors.Join(errs...))
	}
	return out, nil
}
