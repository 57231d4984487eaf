package coordinator

import (
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Job holders' liveness (issue 11: a dead coordinator's jobs are taken
// over within seconds, and their clients learn their fate).
//
// A durable job names its holder, the coordinator running it. Whether
// that coordinator is still there is NATS's to say: every coordinator
// with a fleet subscribes to CoordSubjectPrefix+<id>+".*", and a request
// to its ".ping" gets "no responders" from the server at once when no
// connection holds that subscription anywhere in the cluster. A holder is
// gone when two probes holderConfirm apart both say so: one probe could
// catch the holder between its NATS servers (it resubscribes on
// reconnect, which takes a round trip or two). A probe that times out
// counts as live (the holder may be slow; taking its jobs would fence a
// coordinator that still runs them) unless the last fleet sweep missed it
// too (probeHolder).
//
// Who asks: the reconcile loop (durable.go), woken when the fleet sweep
// sees a coordinator vanish from the micro service's instances, when
// job.get meets a job whose holder is gone, and every
// reconcileSafetyInterval; and job.get itself, which settles the job it
// was asked about before it answers, so that a client waiting on a dead
// coordinator's job learns the job's fate from whichever coordinator
// answers (client.ExecWith asks after FateCheckAfter of silence).

// Timings of holder probes.
const (
	// holderConfirm separates the two probes of a "gone" verdict.
	holderConfirm = time.Second
	// holderProbeTimeout bounds one probe.
	holderProbeTimeout = time.Second
	// holderLiveFor is how long a "live" verdict is reused; holderGoneFor
	// that of a "gone" one (a coordinator id that comes back starts a new
	// boot: its old boot's jobs stay orphaned).
	holderLiveFor = time.Second
	holderGoneFor = 30 * time.Second
)

// holderState caches verdicts. mu is a leaf lock.
type holderState struct {
	mu sync.Mutex
	// verdicts: holder id → its last verdict.
	verdicts map[string]holderVerdict
	// wake: a pass of the reconcile loop is wanted (buffered 1).
	wake chan struct{}
}

type holderVerdict struct {
	gone bool
	at   time.Time
}

func newHolderState() *holderState {
	return &holderState{verdicts: map[string]holderVerdict{}, wake: make(chan struct{}, 1)}
}

// holderGone reports whether coordinator id is gone (see above). It
// blocks up to holderConfirm plus two probes. Without a fleet there is no
// coordinator subject to probe, and only Config.JobHolderDead decides.
// This coordinator is never gone to itself (its own predecessors, same id
// and another boot, are the store's to recognise).
func (c *Coordinator) holderGone(id string) bool {
	if c.cfg.JobHolderDead != nil && c.cfg.JobHolderDead(id) {
		return true
	}
	if c.fl == nil || id == c.cfg.ID || id == "" {
		return false
	}
	h := c.holders
	h.mu.Lock()
	v, ok := h.verdicts[id]
	h.mu.Unlock()
	keep := holderLiveFor
	if v.gone {
		keep = holderGoneFor
	}
	if ok && time.Since(v.at) < keep {
		return v.gone
	}
	gone := !c.probeHolder(id)
	if gone {
		time.Sleep(holderConfirm)
		gone = !c.probeHolder(id)
	}
	h.mu.Lock()
	h.verdicts[id] = holderVerdict{gone: gone, at: time.Now()}
	h.mu.Unlock()
	if gone {
		c.log.Warn("job holder gone: taking its jobs over", "holder", id)
		c.wakeReconcile()
	}
	return gone
}

// probeHolder asks coordinator id's ping endpoint: false on "no
// responders", and on no answer at all when the last fleet sweep did not
// see the coordinator among the service's instances either (a subscriber
// that is not a coordinator, such as an operator's `nats sub '>'` in the
// TETHER account, keeps the server from saying "no responders").
func (c *Coordinator) probeHolder(id string) bool {
	m := &nats.Msg{Subject: CoordSubjectPrefix + subjectPart(id) + ".ping", Header: nats.Header{HeaderForwardedBy: []string{c.cfg.ID}}}
	_, err := c.cfg.NATS.RequestMsg(m, holderProbeTimeout)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return false
	case errors.Is(err, nats.ErrTimeout):
		c.fl.mu.Lock()
		defer c.fl.mu.Unlock()
		return c.fl.lastLive == nil || c.fl.lastLive[id]
	}
	return true
}

// servePing answers a coordinator's probe (holderGone).
func (c *Coordinator) servePing(m *nats.Msg) {
	if err := m.Respond(nil); err != nil {
		c.log.Debug("answer a holder probe", "err", err)
	}
}

// wakeReconcile asks the reconcile loop for a pass soon.
func (c *Coordinator) wakeReconcile() {
	select {
	case c.holders.wake <- struct{}{}:
	default:
	}
}
