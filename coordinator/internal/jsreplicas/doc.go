// Package jsreplicas chooses the replica count of the coordinator's
// JetStream streams and KV buckets: min(3, cluster size), found by trial,
// since a client cannot ask a NATS server how many JetStream peers it has
// room on. Create tries 3, then 2, then 1 while the server answers that it
// cannot place that many replicas (a server that is not clustered, or a
// cluster with fewer peers up), and stops at the first success or at any
// other error.
//
// Every durable store of the coordinator goes through it: the job store
// (coordinator/jobstore), the fleet registry (coordinator.OpenFleetBucket),
// the sandbox ledger (coordinator/ledger), the audit stream
// (coordinator/audit) and the enrollment buckets (coordinator/enroll), so
// that stopping one NATS server of three loses none of them.
//
// Because the stores use CreateOrUpdate, a stream or bucket created with
// fewer replicas (by an older release, or while the cluster was smaller)
// is scaled up the next time a coordinator opens it on a cluster that has
// room: nats-server moves a stream between replica counts in place.
//
// Each create call is bounded (1 s, then 2 s, then 4 s) and, when it runs
// out of time, followed by a look at the store (Store.Exists: one that
// exists with the replica count asked for counts as created) and made
// again: coordinators starting together on a fresh cluster create the
// same replicated buckets at once, and nats-server can leave all of those
// concurrent requests unanswered although it creates the store (see
// attemptTimeout). Each call left unanswered or refused as unavailable is
// logged as a warning naming the store and the attempt (Store.Log), so a
// coordinator waiting for JetStream at start-up says what for.
//
// It runs no goroutines and imports only the standard library and
// nats.go's jetstream package.
package jsreplicas
