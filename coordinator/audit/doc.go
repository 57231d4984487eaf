// Package audit is the coordinator's audit log: every operation it serves
// for a caller, and every refusal, as one protocol.AuditEvent, published on
// tether.v1.audit.<operation>.<result> (protocol.AuditSubject), kept in a
// JetStream stream and written to the coordinator's log.
//
// # The stream
//
// New creates the stream (Config.Stream, default TETHER_AUDIT) or updates
// its limits: subjects tether.v1.audit.>, file storage, events older than
// MaxAge (default 90 days) or past MaxBytes (default 1 GiB) discarded
// oldest first, deletes and purges through the API refused. It lives in
// the coordinators' NATS account (natsauth.AccountTether): clients have no
// JetStream, and what a client publishes under tether.v1.audit. stays in
// its own account, where no stream listens (a test in natsauth checks it).
// So only coordinator credentials can write the log. Events carry a
// Nats-Msg-Id (their ID): one published twice is stored once.
//
// # Recording
//
// Record never blocks its caller on NATS: it logs the event (slog, level
// info, message "audit", the event's fields as attributes) and puts it on
// a bounded queue (Config.QueueSize, default 8192 events). When the queue
// is full the event is dropped from the stream (it is still in the log),
// counted in tether_audit_dropped_total and reported by a log line at
// most every 10 s with the count. One goroutine publishes the queue
// asynchronously to JetStream, at most 256 unacknowledged at once; a
// publish JetStream does not acknowledge is counted in
// tether_audit_publish_errors_total and logged, rate limited the same way,
// and not retried (the log keeps it). tether_audit_events_total{operation,
// result} counts every event recorded.
//
// What never reaches an event, hence neither the stream nor the log: an
// environment value (only the keys), stdin, the text of a script, an
// argument or a batch command (a SHA-256 digest instead, and argv[0]), the
// output, a node's failure text. See protocol.AuditEvent and
// protocol.AuditCommand.
//
// # Queries
//
// Query reads one page of events for SubjectAuditQuery (the coordinator
// authorizes the caller first): filtered by operation and result through
// the stream's subjects, by time through the stream's timestamps, by
// identity, node and job id by decoding. It reads with ordered consumers
// (no durable state), at most MaxScan events per page, in chunks of 256
// for newest-first pages.
//
// # Concurrency and imports
//
// A Recorder is safe for concurrent use. It runs one goroutine, the
// publisher, from New until Close. audit imports protocol, policy (the
// operation names), nats.go and prometheus; it must not import
// coordinator.
package audit
