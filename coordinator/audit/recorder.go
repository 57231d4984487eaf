package audit

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator/internal/jsreplicas"
	"github.com/tetherfleet/tether/protocol"
)

// Defaults of Config.
const (
	DefaultStream    = "TETHER_AUDIT"
	DefaultMaxAge    = 90 * 24 * time.Hour
	DefaultMaxBytes  = 1 << 30
	DefaultQueueSize = 8192
	// MaxScan bounds the events one query page reads.
	MaxScan = 10000
)

// maxPending bounds the publishes awaiting JetStream's acknowledgement.
const maxPending = 256

// stallWait bounds the publisher's wait for acknowledgements when
// maxPending publishes await one; past it the event counts as not stored.
const stallWait = 5 * time.Second

// reportEvery is the least time between two log lines about dropped or
// unacknowledged events.
const reportEvery = 10 * time.Second

// Config configures a Recorder.
type Config struct {
	// NATS is the coordinator's connection (coordinator credentials: the
	// account that has JetStream). Required; the caller owns it and closes
	// it after Close.
	NATS *nats.Conn
	// Coordinator is the coordinator's id, stamped on every event.
	// Required.
	Coordinator string
	// Stream is the JetStream stream's name. Default DefaultStream.
	Stream string
	// MaxAge discards events older than this. Default DefaultMaxAge (90
	// days).
	MaxAge time.Duration
	// MaxBytes bounds the stream's size, in bytes; the oldest events are
	// discarded past it. Default DefaultMaxBytes (1 GiB).
	MaxBytes int64
	// Replicas is the stream's replica count, 1 to 5. Zero (default)
	// means min(3, cluster size), tried from 3 down (package jsreplicas).
	Replicas int
	// QueueSize bounds the events waiting to be published; past it Record
	// drops them (from the stream, not from the log). Default
	// DefaultQueueSize.
	QueueSize int
	// Logger receives the events (level info, message "audit") and the
	// recorder's own problems. Nil discards them.
	Logger *slog.Logger
	// Registerer receives the metrics. Nil registers them in a private
	// registry.
	Registerer prometheus.Registerer
}

// Validate reports every problem with c, joined. Zero values take their
// defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.NATS == nil {
		errs = append(errs, errors.New("audit config: NATS connection is required"))
	}
	if c.Coordinator == "" {
		errs = append(errs, errors.New("audit config: Coordinator id is required"))
	}
	if c.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("audit config: MaxAge %v is negative", c.MaxAge))
	} else if c.MaxAge > 0 && c.MaxAge < time.Minute {
		errs = append(errs, fmt.Errorf("audit config: MaxAge %v is under a minute", c.MaxAge))
	}
	if c.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("audit config: MaxBytes %d is negative", c.MaxBytes))
	} else if c.MaxBytes > 0 && c.MaxBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("audit config: MaxBytes %d is under 1 MiB", c.MaxBytes))
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("audit config: Replicas %d: want 0 (auto) to 5", c.Replicas))
	}
	if c.QueueSize < 0 {
		errs = append(errs, fmt.Errorf("audit config: QueueSize %d is negative", c.QueueSize))
	}
	if c.Stream != "" && strings.ContainsAny(c.Stream, ". *>\t\r\n/\\") {
		errs = append(errs, fmt.Errorf("audit config: Stream %q: a stream name has no '.', '*', '>', '/', '\\' or whitespace", c.Stream))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return c
}

// Recorder records audit events. Create it with New; Close it before
// closing its NATS connection.
type Recorder struct {
	cfg    Config
	log    *slog.Logger
	js     jetstream.JetStream
	stream jetstream.Stream
	m      *metrics

	// mu guards closed and the sends on queue (so Close never closes it
	// under a sender). Record holds it shared.
	mu     sync.RWMutex
	closed bool
	queue  chan *protocol.AuditEvent
	done   chan struct{} // closed when the publisher returned

	dropped  atomic.Int64 // dropped since the last report
	failed   atomic.Int64 // unacknowledged since the last report
	reported atomic.Int64 // unix nanoseconds of the last report
	lastErr  atomic.Pointer[publishError]

	// pubHook, set by tests only, runs in the publisher before each
	// publish.
	pubHook func()
}

// New creates or updates the audit stream and starts the publisher. ctx
// bounds the stream's creation.
func New(ctx context.Context, cfg Config) (*Recorder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r := &Recorder{
		cfg:   cfg,
		log:   cfg.Logger.With("component", "audit"),
		m:     m,
		queue: make(chan *protocol.AuditEvent, cfg.QueueSize),
		done:  make(chan struct{}),
	}
	r.js, err = jetstream.New(cfg.NATS,
		jetstream.WithPublishAsyncMaxPending(maxPending),
		jetstream.WithPublishAsyncTimeout(30*time.Second),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, msg *nats.Msg, err error) {
			r.publishFailed(msg, err)
		}))
	if err != nil {
		return nil, fmt.Errorf("audit: JetStream: %w", err)
	}
	_, err = jsreplicas.Create(ctx, jsreplicas.Store{Name: "audit stream " + cfg.Stream, Replicas: cfg.Replicas, Log: cfg.Logger, Exists: jsreplicas.StreamExists(r.js, cfg.Stream, &r.stream)}, func(ctx context.Context, replicas int) error {
		var err error
		r.stream, err = r.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:        cfg.Stream,
			Description: "Tether audit log: one event per operation and refusal (written by coordinators only)",
			Subjects:    []string{protocol.SubjectAuditPrefix + ">"},
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardOld,
			MaxAge:      cfg.MaxAge,
			MaxBytes:    cfg.MaxBytes,
			Replicas:    replicas,
			Duplicates:  2 * time.Minute,
			DenyDelete:  true,
			DenyPurge:   true,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("audit: create or update stream %s: %w", cfg.Stream, err)
	}
	go r.publisher()
	return r, nil
}

// Stream returns the name of the audit stream.
func (r *Recorder) Stream() string { return r.cfg.Stream }

// Record logs ev and queues it for the stream, filling Version, ID, Time
// (now) and Coordinator when they are zero. It never blocks on NATS: with
// the queue full, or after Close, the event is logged only and counted as
// dropped. ev must not be changed afterwards.
func (r *Recorder) Record(ev *protocol.AuditEvent) {
	ev.Version = protocol.AuditVersion
	if ev.ID == "" {
		ev.ID = rand.Text()
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	if ev.Coordinator == "" {
		ev.Coordinator = r.cfg.Coordinator
	}
	r.m.events.WithLabelValues(ev.Operation, ev.Result).Inc()
	r.log.LogAttrs(context.Background(), slog.LevelInfo, "audit", attrs(ev)...)

	r.mu.RLock()
	queued := false
	if !r.closed {
		select {
		case r.queue <- ev:
			queued = true
		default:
		}
	}
	r.mu.RUnlock()
	if !queued {
		r.m.dropped.Inc()
		r.dropped.Add(1)
		r.report()
	}
}

// Close stops recording (later events are logged and counted as dropped),
// publishes what is queued and waits for JetStream's acknowledgements
// until ctx is done. It returns ctx's error if it gave up. It may be
// called more than once.
func (r *Recorder) Close(ctx context.Context) error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-r.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// publisher publishes the queue until Close closed it.
func (r *Recorder) publisher() {
	defer close(r.done)
	for ev := range r.queue {
		if r.pubHook != nil {
			r.pubHook()
		}
		body, err := json.Marshal(ev)
		if err != nil { // cannot happen: plain data
			r.log.Error("encode audit event", "event_id", ev.ID, "err", err)
			continue
		}
		msg := &nats.Msg{Subject: protocol.AuditSubject(ev.Operation, ev.Result), Data: body, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, ev.ID)
		// At maxPending unacknowledged publishes this waits (up to the
		// stall wait) for acknowledgements: the queue absorbs bursts.
		if _, err := r.js.PublishMsgAsync(msg, jetstream.WithExpectStream(r.cfg.Stream), jetstream.WithStallWait(stallWait)); err != nil {
			r.publishFailed(msg, err)
		}
	}
}

// publishFailed counts and reports an event the stream did not take.
func (r *Recorder) publishFailed(msg *nats.Msg, err error) {
	r.m.publishErrors.Inc()
	r.failed.Add(1)
	r.lastErr.Store(&publishError{id: msg.Header.Get(jetstream.MsgIDHeader), err: err})
	r.report()
}

// publishError is the last event the stream did not take, for the report.
type publishError struct {
	id  string
	err error
}

// report logs the events dropped and not stored since the last report, at
// most every reportEvery.
func (r *Recorder) report() {
	now := time.Now().UnixNano()
	last := r.reported.Load()
	if now-last < int64(reportEvery) || !r.reported.CompareAndSwap(last, now) {
		return
	}
	d, f := r.dropped.Swap(0), r.failed.Swap(0)
	if d > 0 {
		r.log.Warn("audit queue full: events dropped from the stream (they are in this log)", "dropped", d, "queue_size", r.cfg.QueueSize)
	}
	if f > 0 {
		pe := r.lastErr.Load()
		r.log.Warn("audit events not stored in the stream (they are in this log)", "stream", r.cfg.Stream, "count", f, "last_event_id", pe.id, "err", pe.err)
	}
}

// attrs are ev's fields as log attributes, empty ones left out.
func attrs(ev *protocol.AuditEvent) []slog.Attr {
	a := make([]slog.Attr, 0, 24)
	str := func(k, v string) {
		if v != "" {
			a = append(a, slog.String(k, v))
		}
	}
	num := func(k string, v int64) {
		if v != 0 {
			a = append(a, slog.Int64(k, v))
		}
	}
	str("event_id", ev.ID)
	str("identity", ev.Identity)
	str("identity_key", ev.IdentityKey)
	str("source", ev.Source)
	str("operation", ev.Operation)
	str("result", ev.Result)
	str("subject", ev.Subject)
	str("job_id", ev.JobID)
	str("run", ev.Run)
	str("facade", ev.Facade)
	str("method", ev.Method)
	str("sandbox", ev.Sandbox)
	str("nodes", strings.Join(ev.Nodes, ","))
	num("nodes_total", int64(ev.NodesTotal))
	str("target", ev.Target)
	if c := ev.Command; c != nil {
		str("command_mode", c.Mode)
		str("command_sha256", c.SHA256)
		str("command_program", c.Program)
		str("env_keys", strings.Join(c.EnvKeys, ","))
		str("cwd", c.Cwd)
		if c.Detach {
			a = append(a, slog.Bool("detach", true))
		}
	}
	str("paths", strings.Join(ev.Paths, ","))
	str("run_as", ev.RunAs)
	str("rule", ev.Rule)
	if ev.ExitCode != nil {
		a = append(a, slog.Int("exit_code", *ev.ExitCode))
	}
	num("nodes_ok", int64(ev.NodesOK))
	num("nodes_failed", int64(ev.NodesFailed))
	str("error_code", ev.ErrorCode)
	if ev.Status != 0 {
		str("status", strconv.Itoa(ev.Status))
	}
	str("reason", ev.Reason)
	str("error", ev.Error)
	a = append(a, slog.Float64("duration_ms", ev.DurationMS))
	num("bytes_in", ev.BytesIn)
	num("bytes_out", ev.BytesOut)
	str("session", ev.Session)
	str("exit_signal", ev.ExitSignal)
	return a
}
