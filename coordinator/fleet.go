package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/internal/jsreplicas"
	"github.com/tetherfleet/tether/protocol"
)

// Several coordinators on one NATS (DESIGN §4). Every coordinator serves
// the public API in the same queue group, so a request lands on any of
// them; only the one holding a node's tunnel can reach the node. NATS does
// the routing:
//
//   - The fleet registry is a JetStream KV bucket (BucketNodes): one record
//     per connected node, key = the node id, value = the node's NodeInfo as
//     its owning coordinator saw it at registration (labels, capacity,
//     targets, coordinator id, session id). The owner puts it when the
//     session registers and deletes it when the session ends, the delete
//     conditional on the revision of its own put (jetstream.LastRevision):
//     a coordinator whose session was superseded can never remove the
//     newer owner's record. Every coordinator watches the whole bucket into
//     memory (fleetState.recs), so resolving a node or a selector never
//     waits on NATS.
//   - Fencing: the newest put wins. A coordinator that holds a session of
//     node X and sees a record of X with another session id and a higher
//     revision than its own put closes its session (the agent reconnected
//     elsewhere; the old tunnel is half dead or about to be). A record of a
//     node it holds that disappeared (deleted by hand, bucket lost) is put
//     again by the reconcile every heartbeat interval, as is one whose put
//     failed.
//   - Node subjects: the owner subscribes to NodeSubjectPrefix+<node>+".>"
//     while it holds the node. A request for a node another coordinator
//     holds is forwarded there unchanged (body and headers, the server's
//     Nats-Request-Info included) with two headers added: HeaderForwardReply
//     (the client's reply subject) and HeaderForwardedBy (the forwarder's
//     id). The owner acknowledges on the forward's own reply subject, runs
//     the request through the same guard as a public one (Identify reads
//     the stamped caller; policy decides again on the owner) and answers
//     the client's reply subject itself, so streamed exec replies and
//     stream relays (whose pipe subject names the owner) go straight
//     between the client and the owner. No acknowledgement (no responders:
//     the record is stale) is answered 503 by the forwarder.
//   - Why the forwarded caller can be trusted: node and run subjects are
//     not exported to CLIENTS (natsauth.ServiceExports) and the client
//     permission template denies publishing to them
//     (natsauth.ClientPublishDeny): only TETHER users, that is
//     coordinators, can publish there, and they are trusted to pass on
//     what the server stamped.
//   - Running jobs: a coordinator subscribes to RunSubjectPrefix+<job>+".*"
//     for each exec job it runs. A cancel or a heartbeat for a job it does
//     not run is forwarded there (a heartbeat without acknowledgement; a
//     cancel nobody answers gets the same 404 as before).
//   - Fan-out: a selector or all resolves against the whole registry. The
//     receiving coordinator runs the job; a target another coordinator
//     holds is run as a single-node exec forwarded to its owner with the
//     coordinator's own inbox as the reply subject, whose output chunks
//     are republished in the job's own sequence and whose node result is
//     the node's result. Cancelling the job aborts those runs
//     (RunSubjectPrefix+<run>+".abort", coordinators only).
//
//   - Node lists: nodes.list, ssh.info, selectors and the facades' views
//     (FleetNodes) take the registry's records for the nodes other
//     coordinators hold; nodes.list asks each owner once for their live
//     state (CoordSubjectPrefix+<coordinator>+".nodes").
//   - Streams the coordinator itself opens to a node: a facade's dial
//     (DialTarget) and the SSH jump host's ssh stream go to the owner's
//     node subject "dial" or "ssh" as a natspipe request; the owner opens
//     the tunnel stream and splices it to the pipe (fleet_dial.go). The
//     reaper's deletes go to "sandbox.delete" (fleet_delete.go), and
//     Reachable reads the owner's inventory state from the registry.
//
//   - Membership is the micro service's: every heartbeat interval each
//     coordinator gathers the instances answering $SRV.PING.tether. The
//     records of a coordinator missing twice in a row (killed without
//     draining) are deleted, each conditional on its revision
//     (sweepStale). A coordinator cut off from NATS for two intervals
//     while the last sweep saw another one hands its agents to the others
//     and refuses new ones until NATS is back (shed): it could neither
//     receive their requests nor record them.
//
// Forwarded requests are never forwarded again: a coordinator that no
// longer holds the node answers 503 (the client retries; the registry
// catches up within a watch delivery).
//
// Why this shape. The alternative that the first design sketch allowed,
// running every job on the coordinator that received it and opening node
// streams remotely through a pipe, would have put every exec byte through
// two NATS hops and a flow-controlled pipe, and would have needed the
// out-of-band cancel (control stream) carried across as well; forwarding
// the request leaves the data path of a single-node request exactly as it
// is on the owner (one NATS hop to the client), and only a fan-out's
// remote nodes pay a relay through the fan-out's coordinator, which must
// renumber them into its one sequence anyway. Per-job run subjects,
// rather than a job → coordinator map in KV, keep the exec path free of
// JetStream writes: NATS interest is the map, and "no responders" is the
// answer for a job nobody runs.
//
// A fan-out's remote run gets no client heartbeats; its keeper cancels it
// when the fan-out's coordinator is gone (holders.go).
//
// Known gaps: detached jobs' owners are remembered in memory by the
// coordinator that started them (job.* refuse scoped callers after the
// node re-homed); two live agents with one node id on two coordinators
// replace each other (each new put supersedes the other's session).

// BucketNodes is the fleet registry's KV bucket.
const BucketNodes = "tether_nodes"

// Internal subjects between coordinators (TETHER account only).
const (
	// NodeSubjectPrefix + <node> + "." + <endpoint>: requests for a node,
	// served by the coordinator holding its tunnel. Endpoints: exec, stream,
	// job.status, job.output, job.cancel.
	NodeSubjectPrefix = "tether.v1.node."
	// RunSubjectPrefix + <job> + "." + (cancel|alive|abort): messages for a
	// running exec job, served by the coordinator running it.
	RunSubjectPrefix = "tether.v1.run."
	// CoordSubjectPrefix + <coordinator> + ".nodes": the live state
	// (heartbeat, RTT, running execs) of the nodes a coordinator holds,
	// which the registry does not keep; nodes.list asks each owner.
	// ... + ".sync": take an inventory of its nodes now (Sync, fleet-wide).
	// ... + ".ping": an empty answer; "no responders" means the
	// coordinator is gone (holders.go).
	CoordSubjectPrefix = "tether.v1.coord."
)

// Headers of forwarded requests.
const (
	// HeaderForwardReply is the client's reply subject of a forwarded
	// request.
	HeaderForwardReply = "Tether-Forward-Reply"
	// HeaderForwardedBy names the coordinator that forwarded it.
	HeaderForwardedBy = "Tether-Forwarded-By"
)

// headerFanoutRun marks a forwarded exec as one node's run of a fan-out
// the forwarder runs (its value is the fan-out's job id): the caller's
// job was counted there (policy's max_concurrent_jobs), not again here.
// A detached fan-out's run carries the fan-out's id as its own (runRemote):
// it is part of the forwarder's job, whose record the forwarder writes
// (fanoutPartOf).
const headerFanoutRun = "Tether-Fanout-Run"

// fanoutPartOf reports whether req, an exec request for job id, is one
// node's run of a detached fan-out another coordinator runs and records
// under the same id (runRemote): then this coordinator writes no record
// of its own for it, and the node's exit report, landing here, settles
// the node's result into the fan-out's record (settleJobReport). Only a
// request that came over a node subject counts: clients may not publish
// there (natsauth.ClientPublishDeny), so a client cannot mark its own
// request as such a part to run a job unrecorded.
func fanoutPartOf(req micro.Request, id string, detached bool) bool {
	return detached && id != "" && isForwarded(req) &&
		strings.HasPrefix(req.Subject(), NodeSubjectPrefix) &&
		req.Headers().Get(headerFanoutRun) == id
}

// forwardAckTimeout bounds the wait for the owner's acknowledgement;
// runAckTimeout that of a job's runner (a cancel for a job nobody runs
// waits that long for its 404 when the server cannot say "no responders").
const (
	forwardAckTimeout = 5 * time.Second
	runAckTimeout     = time.Second
)

// OpenFleetBucket creates (or binds to) the fleet registry bucket on nc's
// JetStream. replicas 0 means min(3, cluster size) (package jsreplicas:
// tried from 3 down while the servers cannot place that many); 1 to 5
// forces that count. An existing bucket is updated to the count. Pass it
// as Config.Fleet to every coordinator of the fleet. Errors name the
// bucket.
func OpenFleetBucket(ctx context.Context, nc *nats.Conn, replicas int, log *slog.Logger) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("coordinator: fleet bucket %s: jetstream: %w", BucketNodes, err)
	}
	var kv jetstream.KeyValue
	_, err = jsreplicas.Create(ctx, jsreplicas.Store{Name: "fleet bucket " + BucketNodes, Replicas: replicas, Log: log, Exists: jsreplicas.BucketExists(js, BucketNodes, &kv)}, func(ctx context.Context, r int) error {
		var err error
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketNodes,
			Description: "Tether fleet registry: node id → the coordinator holding its tunnel",
			History:     1,
			Replicas:    r,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator: fleet bucket %s: %w", BucketNodes, err)
	}
	return kv, nil
}

// subjectPart encodes a node or job id ([A-Za-z0-9-_.]) as one subject
// token: dots become '~', which ids never contain, so the encoding is
// injective (two ids never share a subject).
func subjectPart(id string) string { return strings.ReplaceAll(id, ".", "~") }

func nodeSubject(nodeID, endpoint string) string {
	return NodeSubjectPrefix + subjectPart(nodeID) + "." + endpoint
}

func runSubject(jobID, op string) string {
	return RunSubjectPrefix + subjectPart(jobID) + "." + op
}

// fleetRec is one registry record as watched.
type fleetRec struct {
	info protocol.NodeInfo
	// ssh and sshHostKey: the node's agent serves SSH with that host key
	// (Hello.Features, Hello.SSHHostKey), for the jump host.
	ssh        bool
	sshHostKey []byte
	// inventoried: the owner reconciled an inventory of this session into
	// the ledger (Reachable).
	inventoried bool
	rev         uint64
}

// fleetValue is a registry record's value: the node as its owner saw it
// at registration, and whether the owner has inventoried it since.
type fleetValue struct {
	protocol.NodeInfo
	Inventoried bool   `json:"inventoried,omitempty"`
	SSH         bool   `json:"ssh,omitempty"`
	SSHHostKey  []byte `json:"ssh_host_key,omitempty"`
}

// fleetState is the coordinator's view of the fleet registry and its node
// and run subscriptions. mu is a leaf lock; it is never held with
// Coordinator.mu.
type fleetState struct {
	kv jetstream.KeyValue
	// in receives every message of the node and run subscriptions; the
	// dispatcher (runDispatch) is its only reader.
	in chan *nats.Msg

	mu     sync.Mutex
	recs   map[string]fleetRec           // node id → record, every coordinator's
	left   map[string]time.Time          // node id → when its record was removed (registered)
	subs   map[string]*nats.Subscription // node id → its node subscription (held nodes)
	loaded bool                          // the watch delivered the initial values
	// othersLive: the last sweep saw another coordinator's instance;
	// shedding: NATS has been unreachable long enough that this
	// coordinator hands its agents to the others and refuses new ones
	// (partitioned).
	othersLive, shedding bool
	// lastLive: the coordinators the last sweep saw (sweepStale).
	lastLive map[string]bool
	wg       sync.WaitGroup // the watch, dispatch and reconcile goroutines
	stop     context.CancelFunc
}

// newFleetState returns the fleet state for Config.Fleet kv, or nil.
func newFleetState(kv jetstream.KeyValue) *fleetState {
	if kv == nil {
		return nil
	}
	return &fleetState{
		kv:   kv,
		in:   make(chan *nats.Msg, fleetInbound),
		recs: map[string]fleetRec{},
		left: map[string]time.Time{},
		subs: map[string]*nats.Subscription{},
		stop: func() {},
	}
}

// fleetInbound is the buffer of forwarded requests waiting for the
// dispatcher; past it the NATS client drops them (slow consumer) and their
// forwarders answer 503 after forwardAckTimeout.
const fleetInbound = 4096

// startFleet starts watching the registry and dispatching node and run
// messages, when Config.Fleet is set. Serve calls it before it accepts
// agents; stopFleet stops it.
func (c *Coordinator) startFleet(life context.Context) error {
	fl := c.fl
	if fl == nil {
		return nil
	}
	ctx, stop := context.WithCancel(life)
	fl.stop = stop
	w, err := fl.kv.WatchAll(ctx)
	if err != nil {
		stop()
		return fmt.Errorf("coordinator: watch fleet bucket %s: %w", fl.kv.Bucket(), err)
	}
	loaded := make(chan struct{})
	cs, err := c.cfg.NATS.ChanSubscribe(CoordSubjectPrefix+subjectPart(c.cfg.ID)+".*", fl.in)
	if err != nil {
		stop()
		w.Stop()
		return fmt.Errorf("coordinator: subscribe to its coordinator subject: %w", err)
	}
	fl.mu.Lock()
	fl.subs[""] = cs // unsubscribed by stopFleet with the node subscriptions
	fl.mu.Unlock()
	fl.wg.Add(3)
	go func() {
		defer fl.wg.Done()
		defer w.Stop()
		c.watchFleet(ctx, w, loaded)
	}()
	go func() {
		defer fl.wg.Done()
		c.runDispatch(ctx)
	}()
	go func() {
		defer fl.wg.Done()
		c.reconcileFleet(ctx)
	}()
	// Resolve nothing before the registry is known; bounded, since a slow
	// JetStream must not keep the coordinator from serving its own nodes.
	t := time.NewTimer(c.cfg.HandshakeTimeout)
	defer t.Stop()
	select {
	case <-loaded:
	case <-t.C:
		c.log.Warn("fleet registry not loaded yet; serving while it loads", "bucket", fl.kv.Bucket())
	}
	return nil
}

// stopFleet stops the goroutines startFleet started and waits for them.
// The drain calls it after every session ended (so their records are
// deleted).
func (c *Coordinator) stopFleet() {
	fl := c.fl
	if fl == nil {
		return
	}
	fl.stop()
	fl.wg.Wait()
	fl.mu.Lock()
	for id, s := range fl.subs {
		s.Unsubscribe()
		delete(fl.subs, id)
	}
	fl.mu.Unlock()
}

// watchFleet applies the registry's entries to fl.recs until ctx ends.
func (c *Coordinator) watchFleet(ctx context.Context, w jetstream.KeyWatcher, loaded chan struct{}) {
	fl := c.fl
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() == nil {
					c.log.Error("fleet registry watcher stopped; remote nodes are no longer followed", "bucket", fl.kv.Bucket())
				}
				return
			}
			if e == nil {
				fl.mu.Lock()
				first := !fl.loaded
				fl.loaded = true
				n := len(fl.recs)
				fl.mu.Unlock()
				if first {
					// Before Serve accepts: the first agents back are
					// already part of the storm.
					c.expectReturning()
					close(loaded)
					c.log.Info("fleet registry loaded", "nodes", n)
				}
				continue
			}
			id := e.Key()
			if e.Operation() != jetstream.KeyValuePut {
				fl.mu.Lock()
				delete(fl.recs, id)
				fl.noteLeft(id)
				fl.mu.Unlock()
				continue
			}
			var v fleetValue
			if err := json.Unmarshal(e.Value(), &v); err != nil || v.ID != id {
				c.log.Warn("fleet registry: ignoring a malformed record", "key", id, "err", err)
				continue
			}
			fl.mu.Lock()
			fl.recs[id] = fleetRec{info: v.NodeInfo, inventoried: v.Inventoried, ssh: v.SSH, sshHostKey: v.SSHHostKey, rev: e.Revision()}
			fl.mu.Unlock()
			c.mu.Lock()
			n := c.nodes[id]
			c.mu.Unlock()
			if n != nil {
				c.checkSuperseded(n)
			}
		}
	}
}

// checkSuperseded closes n's session when the registry names a newer
// session of its node (a higher revision than n's own put, another
// session id): the agent reconnected to another coordinator (or here).
func (c *Coordinator) checkSuperseded(n *node) {
	mine := n.fleetRev.Load()
	if mine == 0 {
		return // our put is in flight; it checks again when done
	}
	c.fl.mu.Lock()
	r, ok := c.fl.recs[n.id]
	c.fl.mu.Unlock()
	if !ok || r.rev <= mine || r.info.SessionID == n.sessionID {
		return
	}
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	if closing {
		// A drain sent the agent on: its streams in flight here finish
		// (up to DrainTimeout) before the drain closes the session.
		c.log.Debug("node registered elsewhere while this coordinator drains; its session ends with the drain",
			"node_id", n.id, "new_coordinator", r.info.Coordinator)
		return
	}
	c.log.Warn("node reconnected elsewhere: closing the superseded session",
		"node_id", n.id, "session_id", n.sessionID, "new_coordinator", r.info.Coordinator, "new_session_id", r.info.SessionID)
	n.sess.Close()
}

// fleetUp records n, just registered, in the registry and subscribes to its
// node subjects (once per node id: a replaced session's subscription
// carries on). A failed put is retried by the reconcile.
func (c *Coordinator) fleetUp(n *node) {
	fl := c.fl
	if fl == nil {
		return
	}
	fl.mu.Lock()
	if fl.subs[n.id] == nil {
		s, err := c.cfg.NATS.ChanSubscribe(NodeSubjectPrefix+subjectPart(n.id)+".>", fl.in)
		if err != nil {
			c.log.Warn("subscribe to node subjects", "node_id", n.id, "err", err)
		} else {
			s.SetPendingLimits(-1, -1) // bounded by fl.in
			fl.subs[n.id] = s
		}
	}
	fl.mu.Unlock()
	c.putRecord(n)
}

// putRecord puts n's record and remembers its revision.
func (c *Coordinator) putRecord(n *node) {
	info := n.info(c.cfg.ID)
	info.LastHeartbeat = time.Time{}
	info.RTTMicros, info.RunningExecs = 0, 0
	info.WindowStalls, info.WindowStallSeconds, info.SendQueuedBytes = 0, 0, 0
	info.AgentWindowStalls, info.AgentWindowStallSeconds, info.AgentSendQueuedBytes = 0, 0, 0
	b, err := json.Marshal(fleetValue{NodeInfo: info, Inventoried: n.inventoried.Load(),
		SSH: n.hello.HasFeature(protocol.FeatureSSH), SSHHostKey: n.hello.SSHHostKey})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.HandshakeTimeout)
	defer cancel()
	rev, err := c.fl.kv.Put(ctx, n.id, b)
	if err != nil {
		c.log.Warn("fleet registry: record node", "node_id", n.id, "err", err)
		return
	}
	n.fleetRev.Store(rev)
	// A newer session may have been recorded (and delivered) meanwhile.
	c.checkSuperseded(n)
}

// fleetDown removes n's record (unless a newer put replaced it) and its
// node subscription. deregister calls it when n left the registry.
func (c *Coordinator) fleetDown(n *node) {
	fl := c.fl
	if fl == nil {
		return
	}
	fl.mu.Lock()
	if s := fl.subs[n.id]; s != nil {
		s.Unsubscribe()
		delete(fl.subs, n.id)
	}
	fl.mu.Unlock()
	rev := n.fleetRev.Load()
	if rev == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.HandshakeTimeout)
	defer cancel()
	err := fl.kv.Delete(ctx, n.id, jetstream.LastRevision(rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
			c.log.Warn("fleet registry: remove node", "node_id", n.id, "err", err)
		}
	}
}

// reconcileFleet puts again, every heartbeat interval, the record of each
// held node whose put failed or whose record disappeared, and removes the
// records of coordinators that are gone (sweepStale).
func (c *Coordinator) reconcileFleet(ctx context.Context) {
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	missed := map[string]int{}
	var down time.Time // since when NATS is unreachable; zero while connected
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !c.cfg.NATS.IsConnected() {
			if down.IsZero() {
				down = time.Now()
			}
			if time.Since(down) >= partitionAfter*c.cfg.HeartbeatInterval {
				c.shed()
			}
			continue
		}
		if !down.IsZero() {
			down = time.Time{}
			c.fl.mu.Lock()
			was := c.fl.shedding
			c.fl.shedding = false
			c.fl.mu.Unlock()
			if was {
				c.log.Info("NATS reachable again: taking agents again")
			}
		}
		c.sweepStale(ctx, missed)
		c.mu.Lock()
		held := slices.Collect(maps.Values(c.nodes))
		c.mu.Unlock()
		for _, n := range held {
			c.fl.mu.Lock()
			_, ok := c.fl.recs[n.id]
			loaded := c.fl.loaded
			c.fl.mu.Unlock()
			if n.fleetRev.Load() == 0 || (loaded && !ok) {
				c.putRecord(n)
			}
		}
	}
}

// partitionAfter is how many heartbeat intervals without NATS make a
// coordinator that knows of other coordinators hand its agents to them.
const partitionAfter = 2

// shed hands every agent to the other coordinators (GoAway, then the
// session closed: the agents redial the next address) and refuses new
// sessions until NATS is back (shedding), when the last sweep saw another
// coordinator: cut off from NATS this one can neither receive requests
// for its nodes nor record them, while the others can serve them. A lone
// coordinator keeps its agents (its facades and jump host still reach
// them).
func (c *Coordinator) shed() {
	c.fl.mu.Lock()
	if !c.fl.othersLive || c.fl.shedding {
		c.fl.mu.Unlock()
		return
	}
	c.fl.shedding = true
	c.fl.mu.Unlock()
	c.mu.Lock()
	held := slices.Collect(maps.Values(c.nodes))
	c.mu.Unlock()
	c.log.Warn("NATS unreachable: handing agents to the other coordinators", "agents", len(held), "after", partitionAfter*c.cfg.HeartbeatInterval)
	for _, n := range held {
		n.sess.GoAway()
		n.sess.Close()
	}
}

// partitioned reports whether the coordinator refuses agents because it
// is cut off from NATS while other coordinators serve (shed).
func (c *Coordinator) partitioned() bool {
	if c.fl == nil {
		return false
	}
	c.fl.mu.Lock()
	defer c.fl.mu.Unlock()
	return c.fl.shedding
}

// staleAfter is how many sweeps in a row a coordinator must be missing from
// the service's instances before its records are removed.
const staleAfter = 2

// sweepStale removes the records of nodes whose coordinator is gone: one
// killed without draining leaves its records behind, and until its agents
// re-register elsewhere (or forever, for a node that died with it) they
// would send requests to nobody. Membership is NATS's: the micro
// service's instances answering $SRV.PING.tether, gathered for a short
// window; a coordinator missing from staleAfter sweeps in a row, while
// this one's own instance answered (so the ping went out), is gone. Each
// delete is conditional on the record's revision, so a put that came
// meanwhile survives. A coordinator wrongly taken for gone (slow to
// answer) puts its records again at its next reconcile.
func (c *Coordinator) sweepStale(ctx context.Context, missed map[string]int) {
	owners := map[string][]fleetRec{}
	c.fl.mu.Lock()
	for _, r := range c.fl.recs {
		if r.info.Coordinator != c.cfg.ID {
			owners[r.info.Coordinator] = append(owners[r.info.Coordinator], r)
		}
	}
	c.fl.mu.Unlock()
	live, ok := c.liveCoordinators(min(c.cfg.HeartbeatInterval/2, 500*time.Millisecond))
	if !ok {
		return
	}
	c.fl.mu.Lock()
	c.fl.othersLive = len(live) > 1
	last := c.fl.lastLive
	c.fl.lastLive = live
	c.fl.mu.Unlock()
	for id := range last {
		if !live[id] {
			// It may have held jobs: the reconcile loop asks (holderGone).
			c.wakeReconcile()
			break
		}
	}
	for owner, recs := range owners {
		if live[owner] {
			delete(missed, owner)
			continue
		}
		missed[owner]++
		if missed[owner] < staleAfter {
			continue
		}
		c.log.Warn("fleet registry: coordinator gone; removing its node records", "coordinator", owner, "nodes", len(recs))
		for _, r := range recs {
			dctx, cancel := context.WithTimeout(ctx, c.cfg.HandshakeTimeout)
			err := c.fl.kv.Delete(dctx, r.info.ID, jetstream.LastRevision(r.rev))
			cancel()
			if err != nil {
				c.log.Debug("fleet registry: remove a gone coordinator's record", "node_id", r.info.ID, "err", err)
			}
		}
		delete(missed, owner)
	}
}

// liveCoordinators gathers, for window, the coordinator ids of the micro
// service's instances answering $SRV.PING; ok is false when this
// coordinator's own instance did not answer (the ping did not go round).
func (c *Coordinator) liveCoordinators(window time.Duration) (map[string]bool, bool) {
	nc := c.cfg.NATS
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, false
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.PING."+protocol.ServiceName, inbox, nil); err != nil {
		return nil, false
	}
	live := map[string]bool{}
	deadline := time.Now().Add(window)
	for {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		var ping struct {
			Metadata map[string]string `json:"metadata"`
		}
		if json.Unmarshal(m.Data, &ping) == nil && ping.Metadata["coordinator_id"] != "" {
			live[ping.Metadata["coordinator_id"]] = true
		}
	}
	return live, live[c.cfg.ID]
}

// remoteOwner returns the id of the coordinator that holds node id when it
// is another one, per the registry; "" when the node is unknown, held here
// or the coordinator runs alone.
func (c *Coordinator) remoteOwner(id string) string {
	if c.fl == nil {
		return ""
	}
	c.fl.mu.Lock()
	r, ok := c.fl.recs[id]
	c.fl.mu.Unlock()
	if !ok || r.info.Coordinator == c.cfg.ID {
		return ""
	}
	return r.info.Coordinator
}

// remoteRecord is remoteOwner with the owner's record of the node.
func (c *Coordinator) remoteRecord(id string) (string, protocol.NodeInfo) {
	if c.fl == nil {
		return "", protocol.NodeInfo{}
	}
	c.fl.mu.Lock()
	r, ok := c.fl.recs[id]
	c.fl.mu.Unlock()
	if !ok || r.info.Coordinator == c.cfg.ID {
		return "", protocol.NodeInfo{}
	}
	return r.info.Coordinator, r.info
}

// remoteSSH returns the owner of node id when another coordinator holds it
// and its agent serves SSH, with the node's record and SSH host key.
func (c *Coordinator) remoteSSH(id string) (string, protocol.NodeInfo, []byte) {
	if c.fl == nil {
		return "", protocol.NodeInfo{}, nil
	}
	c.fl.mu.Lock()
	r, ok := c.fl.recs[id]
	c.fl.mu.Unlock()
	if !ok || r.info.Coordinator == c.cfg.ID || !r.ssh {
		return "", protocol.NodeInfo{}, nil
	}
	return r.info.Coordinator, r.info, r.sshHostKey
}

// remoteInventoried is remoteRecord with whether the owner inventoried
// the node's current session.
func (c *Coordinator) remoteInventoried(id string) (string, protocol.NodeInfo, bool) {
	if c.fl == nil {
		return "", protocol.NodeInfo{}, false
	}
	c.fl.mu.Lock()
	r, ok := c.fl.recs[id]
	c.fl.mu.Unlock()
	if !ok || r.info.Coordinator == c.cfg.ID {
		return "", protocol.NodeInfo{}, false
	}
	return r.info.Coordinator, r.info, r.inventoried
}

// registered reports whether the fleet registry has a record of node id
// (held by any coordinator, this one included), or had one until less
// than nodeMovingGrace ago.
func (c *Coordinator) registered(id string) bool {
	_, _, ok := c.whereabouts(id)
	return ok
}

// notConnected is the error for a request for node id, which this
// coordinator does not hold and cannot forward: 503 (retry) for a node
// the fleet knows (registered), 404 unknown_node for any other.
//
// The 503's message says which case it is: a record naming a holder (the
// node is moving, or this coordinator's view lags), or a record removed
// some time ago (the node left the fleet: an agent moving between
// coordinators is back within seconds, so one gone for longer is down,
// and the caller can tell from the age; it used to be told the node was
// moving for the whole grace).
func (c *Coordinator) notConnected(id string) *protocol.APIError {
	if holder, ago, ok := c.whereabouts(id); ok {
		if holder == c.cfg.ID {
			return protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "node %s is registered to coordinator %s, which holds no tunnel of it (its record lags a reconnect or a partition); retry", protocol.Clip(id), holder)
		}
		if holder != "" {
			return protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "node %s is registered to coordinator %s but not connected to coordinator %s (it is moving between coordinators, or this coordinator's view of the fleet is catching up); retry", protocol.Clip(id), holder, c.cfg.ID)
		}
		return protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "node %s left the fleet %s ago and has not come back to any coordinator (an agent moving between coordinators is back within seconds; one away longer is down or cut off); retry", protocol.Clip(id), ago.Round(time.Second))
	}
	return protocol.NewAPIError(404, protocol.ErrCodeUnknownNode, "node %s is not connected to coordinator %s", protocol.Clip(id), c.cfg.ID)
}

// whereabouts is registered with what it found: the coordinator the
// node's record names (holder, possibly empty in a malformed record), or
// how long ago the record was removed (holder "").
func (c *Coordinator) whereabouts(id string) (holder string, ago time.Duration, ok bool) {
	if c.fl == nil {
		return "", 0, false
	}
	c.fl.mu.Lock()
	defer c.fl.mu.Unlock()
	if r, ok := c.fl.recs[id]; ok {
		holder = r.info.Coordinator
		if holder == "" {
			holder = "(none named)"
		}
		return holder, 0, true
	}
	left, ok := c.fl.left[id]
	if !ok || time.Since(left) >= nodeMovingGrace {
		return "", 0, false
	}
	return "", time.Since(left), true
}

// nodeMovingGrace is how long a node whose record was removed counts as
// registered (registered): an agent whose coordinator went away is on
// its way to another one, and a request for it meanwhile is 503 (retry),
// not 404 (no such node).
const nodeMovingGrace = time.Minute

// noteLeft remembers that node id's record was removed (fl.mu held), and
// forgets nodes that left longer than nodeMovingGrace ago.
func (fl *fleetState) noteLeft(id string) {
	now := time.Now()
	if len(fl.left) >= 1024 {
		for k, t := range fl.left {
			if now.Sub(t) >= nodeMovingGrace {
				delete(fl.left, k)
			}
		}
	}
	fl.left[id] = now
}

// remoteNodes returns the registry's records of nodes other coordinators
// hold whose labels match sel, leaving out the node ids in local.
func (c *Coordinator) remoteNodes(sel protocol.Selector, local map[string]bool) []protocol.NodeInfo {
	if c.fl == nil {
		return nil
	}
	c.fl.mu.Lock()
	defer c.fl.mu.Unlock()
	var out []protocol.NodeInfo
	for id, r := range c.fl.recs {
		if local[id] || r.info.Coordinator == c.cfg.ID || !sel.Matches(r.info.Labels) {
			continue
		}
		info := r.info
		info.Labels = maps.Clone(info.Labels)
		info.Targets = slices.Clone(info.Targets)
		out = append(out, info)
	}
	return out
}

// remoteNode returns a stand-in for a node another coordinator holds, for
// resolution and policy (its id, labels and targets; no session).
func remoteNode(info protocol.NodeInfo) *node {
	return &node{
		id:        info.ID,
		hello:     protocol.Hello{NodeID: info.ID, Labels: info.Labels, Targets: info.Targets, Capacity: info.Capacity, AgentVersion: info.AgentVersion},
		sessionID: info.SessionID,
		owner:     info.Coordinator,
	}
}

// takesForNode reports whether this coordinator answers requests
// forwarded for node id: it holds a session of the node and is not
// draining.
func (c *Coordinator) takesForNode(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id] != nil && !c.closing
}

// holds reports whether this coordinator holds a session of node id.
func (c *Coordinator) holds(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id] != nil
}

// forwardForNode forwards req to the coordinator holding node id over the
// node subject of endpoint, and reports true, when req came from a client
// (not forwarded already), this coordinator does not hold the node and
// another one does.
func (c *Coordinator) forwardForNode(req micro.Request, id, endpoint string) bool {
	if c.fl == nil || isForwarded(req) || c.holds(id) {
		return false
	}
	owner := c.remoteOwner(id)
	if owner == "" {
		return false
	}
	c.forward(req, nodeSubject(id, endpoint), owner, "node "+protocol.Clip(id), nil)
	return true
}

// dropCoordinatorHeaders removes the headers only coordinators may set
// (HeaderForwardedBy, HeaderForwardReply, headerFanoutRun) from req when
// it did not come over a node subject, which clients may not publish to:
// a client setting them on tether.v1.exec would otherwise have its job
// taken for a fan-out's forwarded part (no record of its own once
// forwarded, no job slot taken; review).
func dropCoordinatorHeaders(req micro.Request) {
	if strings.HasPrefix(req.Subject(), NodeSubjectPrefix) {
		return
	}
	h := req.Headers()
	for _, k := range []string{HeaderForwardedBy, HeaderForwardReply, headerFanoutRun} {
		delete(h, k)
		delete(h, http.CanonicalHeaderKey(k))
	}
}

// isForwarded reports whether req came over a node or run subject from
// another coordinator: such a request is never forwarded again.
func isForwarded(req micro.Request) bool {
	return req.Headers().Get(HeaderForwardedBy) != ""
}

// forward hands req, a request for node nodeID that coordinator owner
// holds, to owner over the node subject of endpoint, and returns at once.
// A goroutine (counted with the jobs) waits for the owner's
// acknowledgement and answers 503 unavailable if none comes. The owner
// records the request's audit event; this coordinator records none.
func (c *Coordinator) forward(req micro.Request, subject, owner, what string, missing *protocol.APIError) {
	if a := auditOf(req); a != nil {
		a.takeOver()
	}
	h := nats.Header{}
	for k, v := range req.Headers() {
		h[k] = slices.Clone(v)
	}
	h.Set(HeaderForwardReply, req.Reply())
	h.Set(HeaderForwardedBy, c.cfg.ID)
	m := &nats.Msg{Subject: subject, Header: h, Data: req.Data()}
	if _, ok := c.enter(&c.jobWG); !ok {
		c.replyError(req, c.unavailable())
		return
	}
	c.m.forwarded.Inc()
	wait := forwardAckTimeout
	if missing != nil {
		wait = runAckTimeout
	}
	go func() {
		defer c.jobWG.Done()
		_, err := c.cfg.NATS.RequestMsg(m, wait)
		if err == nil {
			return
		}
		if req.Reply() == "" {
			return
		}
		// Nobody took it: for a job's run subject that is the answer (no
		// coordinator runs the job). A timeout counts too: a subscriber
		// that is not a coordinator (an operator's `nats sub '>'` in
		// TETHER) keeps the server from answering "no responders".
		if missing != nil && (errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout)) {
			c.replyError(req, missing)
			return
		}
		c.log.Warn("forward request", "subject", subject, "owner", owner, "err", err)
		c.replyError(req, protocol.NewAPIError(503, protocol.ErrCodeUnavailable,
			"%s is held by coordinator %s, which did not take the request (%v); retry", what, owner, err))
	}()
}

// runDispatch serves the messages of the node and run subscriptions, one at
// a time (as micro serves an endpoint), until ctx ends.
func (c *Coordinator) runDispatch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-c.fl.in:
			c.dispatch(m)
		}
	}
}

// nodeEndpoints maps a node subject's endpoint to its handler's name.
var nodeEndpoints = map[string]string{
	"exec":       "exec",
	"stream":     "stream",
	"job.status": "job-status",
	"job.output": "job-output",
	"job.cancel": "job-cancel",
}

// dispatch serves one forwarded message.
func (c *Coordinator) dispatch(m *nats.Msg) {
	var rest string
	var handlers map[string]micro.HandlerFunc
	switch {
	case strings.HasPrefix(m.Subject, NodeSubjectPrefix):
		rest = m.Subject[len(NodeSubjectPrefix):]
		handlers = map[string]micro.HandlerFunc{
			"exec":       c.handleExec,
			"stream":     c.handleStream,
			"job-status": c.jobOpHandler(protocol.JobOpStatus),
			"job-output": c.handleJobOutput,
			"job-cancel": c.jobOpHandler(protocol.JobOpCancel),
		}
	case strings.HasPrefix(m.Subject, RunSubjectPrefix):
		rest = m.Subject[len(RunSubjectPrefix):]
	case strings.HasPrefix(m.Subject, CoordSubjectPrefix):
		if m.Header.Get(HeaderForwardedBy) == "" || m.Reply == "" {
			return
		}
		switch {
		case strings.HasSuffix(m.Subject, ".nodes"):
			c.serveLive(m)
		case strings.HasSuffix(m.Subject, ".sync"):
			c.serveSync(m)
		case strings.HasSuffix(m.Subject, ".ping"):
			c.servePing(m)
		}
		return
	default:
		return
	}
	dot := strings.IndexByte(rest, '.')
	if dot < 0 {
		return
	}
	part, op := rest[:dot], rest[dot+1:]
	if m.Header.Get(HeaderForwardedBy) == "" {
		return // not from a coordinator's forward
	}
	if handlers != nil && nodeEndpoints[op] != "" && !c.takesForNode(strings.ReplaceAll(part, "~", ".")) {
		// A node subject is not a queue group: every coordinator
		// subscribed to it gets the request. One that does not hold
		// the node now (its subscription outlived the session: restored
		// by nats.go after a partition, or the agent just moved on) or
		// is draining stays silent, neither acknowledging nor
		// answering: its 503 or 404 would race the holder's answer, and
		// a client told to retry ran the job twice (e2e TestCluster).
		// The holder answers; if none does, the forwarder's
		// acknowledgement timeout answers 503.
		return
	}
	if m.Reply != "" && op != "dial" && op != "sandbox.delete" && op != "ssh" && op != "job.query" {
		// The acknowledgement: the forwarder stops waiting.
		ack := &nats.Msg{Subject: m.Reply, Header: nats.Header{"Tether-Forward-Ack": []string{c.cfg.ID}}}
		if err := c.cfg.NATS.PublishMsg(ack); err != nil {
			c.log.Debug("acknowledge forwarded request", "subject", m.Subject, "err", err)
		}
	}
	req := &forwardedRequest{msg: m, reply: m.Header.Get(HeaderForwardReply), nc: c.cfg.NATS}
	if handlers == nil { // a run subject
		switch op {
		case "cancel":
			c.guardHandler("cancel", micro.HandlerFunc(c.handleCancel)).Handle(req)
		case "alive":
			c.guardHandler("exec-alive", micro.HandlerFunc(c.handleExecAlive)).Handle(req)
		case "abort":
			c.abortRun(strings.ReplaceAll(part, "~", "."), m.Header.Get(protocol.HeaderNode))
		}
		return
	}
	switch op {
	case "dial":
		c.serveDial(m, strings.ReplaceAll(part, "~", "."))
		return
	case "sandbox.delete":
		c.serveDelete(m, strings.ReplaceAll(part, "~", "."))
		return
	case "ssh":
		c.serveSSH(m, strings.ReplaceAll(part, "~", "."))
		return
	case "job.query":
		c.serveJobQuery(m, strings.ReplaceAll(part, "~", "."))
		return
	}
	name, ok := nodeEndpoints[op]
	if !ok {
		return
	}
	c.guardHandler(name, handlers[name]).Handle(req)
}

// abortRun cancels the exec job id's node runs that another coordinator's
// fan-out forwarded here and now gives up on: node's (the abort's
// protocol.HeaderNode, runRemote sets it), or all of them when node is "".
// Only forwarded runs (runKey with a node): a detached fan-out's remote
// runs have the fan-out's id, and the fan-out's coordinator hears its own
// abort.
func (c *Coordinator) abortRun(id, node string) {
	c.mu.Lock()
	parts := c.jobs.parts(id, node)
	c.mu.Unlock()
	for _, j := range parts {
		j.cancel(errRunAborted)
	}
}

// errRunAborted: the coordinator that forwarded a fan-out's node run gave
// up on it (its own job was cancelled).
var errRunAborted = errors.New("the forwarding coordinator cancelled its job")

// forwardedRequest is a request that came over a node or run subject: its
// answers go to the client's reply subject (HeaderForwardReply).
type forwardedRequest struct {
	msg   *nats.Msg
	reply string
	nc    *nats.Conn
}

var _ micro.Request = (*forwardedRequest)(nil)

func (r *forwardedRequest) Respond(data []byte, opts ...micro.RespondOpt) error {
	if r.reply == "" {
		return nil
	}
	m := &nats.Msg{Subject: r.reply, Data: data}
	for _, o := range opts {
		o(m)
	}
	return r.nc.PublishMsg(m)
}

func (r *forwardedRequest) RespondJSON(v any, opts ...micro.RespondOpt) error {
	b, err := json.Marshal(v)
	if err != nil {
		return micro.ErrMarshalResponse
	}
	return r.Respond(b, opts...)
}

func (r *forwardedRequest) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	if code == "" || description == "" {
		return errors.Join(micro.ErrArgRequired, errors.New("error code and description"))
	}
	if r.reply == "" {
		return nil
	}
	m := &nats.Msg{Subject: r.reply, Data: data, Header: nats.Header{
		micro.ErrorHeader:     []string{description},
		micro.ErrorCodeHeader: []string{code},
	}}
	for _, o := range opts {
		o(m)
	}
	return r.nc.PublishMsg(m)
}

func (r *forwardedRequest) Data() []byte           { return r.msg.Data }
func (r *forwardedRequest) Headers() micro.Headers { return micro.Headers(r.msg.Header) }
func (r *forwardedRequest) Subject() string        { return r.msg.Subject }
func (r *forwardedRequest) Reply() string          { return r.reply }

// FleetNodes lists the nodes whose labels match sel across the fleet,
// sorted by id: the held ones as Nodes does, and, with Config.Fleet, the
// ones other coordinators hold as their registry records say (labels,
// capacity, targets, coordinator, session, connected at; LastHeartbeat,
// RTTMicros and RunningExecs are only known to the owner and are zero).
func (c *Coordinator) FleetNodes(sel protocol.Selector) []protocol.NodeInfo {
	out := c.Nodes(sel)
	if c.fl == nil {
		return out
	}
	local := make(map[string]bool, len(out))
	c.mu.Lock()
	for id := range c.nodes {
		local[id] = true
	}
	c.mu.Unlock()
	out = append(out, c.remoteNodes(sel, local)...)
	slices.SortFunc(out, func(a, b protocol.NodeInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// liveNode is the live state of a held node, as nodes.list shows it.
type liveNode struct {
	ID            string    `json:"id"`
	SessionID     string    `json:"session_id"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	RTTMicros     int64     `json:"rtt_us,omitempty"`
	RunningExecs  int       `json:"running_execs,omitempty"`
	// The session's flow telemetry (protocol.NodeInfo).
	WindowStalls       uint64   `json:"window_stalls,omitempty"`
	WindowStallSeconds float64  `json:"window_stall_seconds,omitempty"`
	SendQueuedBytes    int64    `json:"send_queued_bytes,omitempty"`
	AgentFlow          flowPart `json:"agent_flow,omitzero"`
}

// flowPart is one direction's flow telemetry in a liveNode.
type flowPart struct {
	Stalls       uint64  `json:"stalls,omitempty"`
	StallSeconds float64 `json:"stall_seconds,omitempty"`
	QueuedBytes  int64   `json:"queued_bytes,omitempty"`
}

// serveLive answers a coordinator subject's nodes request with the live
// state of every node held here.
func (c *Coordinator) serveLive(m *nats.Msg) {
	ns := c.Nodes(protocol.Selector{})
	out := make([]liveNode, len(ns))
	for i, n := range ns {
		out[i] = liveNode{ID: n.ID, SessionID: n.SessionID, LastHeartbeat: n.LastHeartbeat, RTTMicros: n.RTTMicros, RunningExecs: n.RunningExecs,
			WindowStalls: n.WindowStalls, WindowStallSeconds: n.WindowStallSeconds, SendQueuedBytes: n.SendQueuedBytes,
			AgentFlow: flowPart{n.AgentWindowStalls, n.AgentWindowStallSeconds, n.AgentSendQueuedBytes}}
	}
	b, _ := json.Marshal(out)
	if err := c.cfg.NATS.Publish(m.Reply, b); err != nil {
		c.log.Debug("answer live nodes request", "err", err)
	}
}

// liveTimeout bounds the wait for another coordinator's live node state;
// past it nodes.list shows that coordinator's nodes as the registry has
// them (no heartbeat, RTT or running execs).
const liveTimeout = time.Second

// withLive fills the live fields of the nodes in ns that other
// coordinators hold by asking each owner once, in parallel.
func (c *Coordinator) withLive(ns []protocol.NodeInfo) {
	if c.fl == nil {
		return
	}
	idx := map[string]int{}
	owners := map[string]bool{}
	for i, n := range ns {
		if n.Coordinator != c.cfg.ID {
			idx[n.ID] = i
			owners[n.Coordinator] = true
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for owner := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := c.cfg.NATS.RequestMsg(&nats.Msg{Subject: CoordSubjectPrefix + subjectPart(owner) + ".nodes",
				Header: nats.Header{HeaderForwardedBy: []string{c.cfg.ID}}}, liveTimeout)
			if err != nil {
				c.log.Debug("live node state", "coordinator", owner, "err", err)
				return
			}
			var live []liveNode
			if json.Unmarshal(m.Data, &live) != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, l := range live {
				if i, ok := idx[l.ID]; ok && ns[i].SessionID == l.SessionID {
					ns[i].LastHeartbeat, ns[i].RTTMicros, ns[i].RunningExecs = l.LastHeartbeat, l.RTTMicros, l.RunningExecs
					ns[i].WindowStalls, ns[i].WindowStallSeconds, ns[i].SendQueuedBytes = l.WindowStalls, l.WindowStallSeconds, l.SendQueuedBytes
					ns[i].AgentWindowStalls, ns[i].AgentWindowStallSeconds, ns[i].AgentSendQueuedBytes = l.AgentFlow.Stalls, l.AgentFlow.StallSeconds, l.AgentFlow.QueuedBytes
				}
			}
		}()
	}
	wg.Wait()
}

// enter takes a slot in wg for work that outlives the caller while the
// coordinator is serving: it returns the serving context (c.life) and
// true, or false when the coordinator is shutting down (or not started),
// with no slot taken. The caller runs the work and then calls wg.Done.
func (c *Coordinator) enter(wg *sync.WaitGroup) (context.Context, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.life == nil {
		return nil, false
	}
	wg.Add(1)
	return c.life, true
}
