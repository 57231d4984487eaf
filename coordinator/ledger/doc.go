// Package ledger is Tether's sandbox ledger, run leases and reaper
// (DESIGN §5, issue 4 items 6–8).
//
// # Ledger
//
// The ledger keeps one record per sandbox in the JetStream KV bucket
// tether_sandboxes (history 1), keyed <provider>.<node>.<id> with node and
// id encoded so that any string makes a valid key (kept when made of
// [A-Za-z0-9_-], else "=" and lowercase base32hex). The value is a
// protocol.SandboxInfo in JSON, decoded with plain encoding/json, not
// protocol's strict decoders: only coordinators write these buckets (with
// json.Marshal, which never repeats a key, changes a field name's case or
// writes invalid UTF-8), a newer coordinator may add fields during a
// rolling upgrade, and whoever can write a bucket can write any record
// anyway, so strictness would guard against nothing. Open binds or creates the buckets and
// watches them: one goroutine applies every change to an in-memory index
// (by key, by provider and id, by provider, workspace and name, by run, by
// owner lease and by node), so several coordinators on one NATS share one
// view, and lookups (ByID, ByName, List, LiveOn) never touch the network.
// Ready is false until the initial load of every bucket finished.
//
// Every write is compare-and-set (kv.Create, or kv.Update with the
// revision it read) and retried on a conflict with the bucket's fresh
// state, so concurrent writers never lose each other's changes. A writer
// applies its own result to the index at once unless the watcher has gone
// past that revision.
//
// Records come from three sources that converge: facades (Created,
// Deleting, Deleted, SetExpiry), agents' inventories (Reconcile) and
// explicit registration (Register, and the NATS API). Attribution (team,
// user, workload, run) is read from labels under configurable keys, bare or
// prefixed (wire-facts §4.2, §8.2); a sandbox is managed (reaped as
// unowned past the grace period when no lease owns it) when it carries NeMo
// Gym's marker label nemo-gym.sandbox=1, has an owning run (a facade's
// Tether-Run, a registration's run, or a run attribution label), or was
// registered; a plain sandbox created through a facade is recorded but not
// managed. Labels are stored bounded (protocol.BoundLabels: the marker and
// attribution keys first, then others in key order, up to 64 labels and
// 8 KiB, values clipped to 256 bytes; LabelsTruncated says so), so no
// record nears NATS's payload limit. An inventory creates or refreshes what it lists and, for
// each provider the node listed completely, marks deleted what it lacks,
// except records seen or changed after the listing started; an incomplete
// listing changes nothing it lacks. The node's inventory status goes to the
// bucket tether_inventory. Deleted records are purged after
// Config.Retention.
//
// # Leases
//
// A run's lease (bucket tether_leases, key = run id) is opened, renewed and
// closed over NATS. A sandbox is owned by the lease named by its Owner, or
// else by its run attribution (also matched in the sanitised form NeMo
// Gym's OpenSandbox provider gives long run ids).
//
// # Reaper
//
// The reaper deletes a sandbox when its owner lease expired or was closed,
// its TTL or gateway expiry passed, or, managed and with no lease, it
// outlived the grace period. It deletes only while it holds the lock (key
// "reaper" in tether_locks, an expiry field renewed by compare-and-set);
// the lock's revision is its fencing token, checked (by a renewal) before
// each batch of deletes. It never acts on partial knowledge: not while the
// ledger loads, and not on a node that is unreachable, lost, or whose last
// inventory is missing, incomplete or older than its last outage. Deletes
// go through a Deleter (not found = done), rate-limited, retried with
// exponential backoff; after MaxAttempts failures a record is leaked.
// Events go to tether.v1.events.sandbox.<event>. A node with no
// inventory at all (named only by registrations) is lost once LostAfter
// passed since its newest record was first seen.
//
// # API
//
// AddEndpoints serves leases, list (pages end early rather than pass the
// server's max payload), register and reap. With WithKnownNode, register
// refuses (404 unknown_node) a node that is not connected and was never
// inventoried. A reap dry run with a run previews closing it (run_closed
// for each of its sandboxes, Blocked as the reaper would be); reaping a run
// with no lease and no records is 404 not_found and closes nothing.
// With WithAuthorizer every endpoint asks policy first, by the run's owner
// (owner.go: the identity that opened its lease, else the one that created
// or registered its sandboxes): another identity may not renew, close,
// reap or register into a run, nor list its sandboxes, without scope any.
//
// Goroutines: the ledger runs one (the watcher loop) until Close; Reaper.Run
// runs in its caller's goroutine and starts at most Concurrency short-lived
// delete workers per batch; Reconcile starts at most WriteConcurrency
// writers and waits for them. Lock order: Reaper.passMu, then Reaper.mu,
// then Ledger.mu; no lock is held across a network call.
//
// This package imports protocol and gateway (for gateway.ErrNotFound) and
// must not import the coordinator package or agent.
package ledger
