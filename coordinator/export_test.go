package coordinator

import (
	"context"
	"io"
	"maps"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
)

// SetTestHook makes c call f at named points, in the goroutine that reaches
// them: "nats <endpoint>" before a NATS request's handler (e.g. "nats
// nodes"), "exec node <id>" before a node run of an exec job. A panic in f
// is one in that goroutine. nil removes the hook.
func SetTestHook(c *Coordinator, f func(point string)) {
	if f == nil {
		c.testHook.Store(nil)
		return
	}
	c.testHook.Store(&f)
}

// AuthorizerForTest returns the Authorizer c's handlers ask.
func AuthorizerForTest(c *Coordinator) caller.Authorizer { return c.authorizer() }

// EndpointOps is the operation each endpoint subject is audited under.
func EndpointOps() map[string]string { return maps.Clone(endpointOps) }

// ForgetJobOwnersForTest empties c's memory of detached jobs' submitters,
// as a restart or a node's move to c leaves it.
func ForgetJobOwnersForTest(c *Coordinator) {
	c.owners.mu.Lock()
	defer c.owners.mu.Unlock()
	c.owners.m = nil
	c.owners.order = nil
	c.owners.next = 0
}

// InStormForTest reports whether c's pacer is spreading a storm of
// returning agents (admission.Pacer.InStorm).
func InStormForTest(c *Coordinator) bool { return c.pacer != nil && c.pacer.InStorm() }

// ExpireDirectTicketsForTest expires every direct stream ticket c issued
// and has not seen redeemed, as their TTL passing would.
func ExpireDirectTicketsForTest(c *Coordinator) {
	c.direct.mu.Lock()
	type pending struct {
		t [32]byte
		g *directGrant
	}
	var ps []pending
	for t, g := range c.direct.tickets {
		if g.state == grantIssued {
			g.timer.Stop()
			ps = append(ps, pending{t, g})
		}
	}
	c.direct.mu.Unlock()
	for _, p := range ps {
		c.expireTicket(p.t, p.g)
	}
}

// SetExecOnceBoundForTest makes c bound exec.once jobs (the whole job, and
// the longest timeout it takes) by d instead of
// protocol.ExecOnceMaxTimeout; zero restores it.
func SetExecOnceBoundForTest(c *Coordinator, d time.Duration) { c.onceBoundForTest.Store(int64(d)) }

// GoRequestForTest runs f as a request goroutine of c (goRequest), as the
// job.get and job-query handlers do, answering req if c is shutting down.
func GoRequestForTest(c *Coordinator, req micro.Request, f func(life context.Context)) {
	c.goRequest(req, "test request", f)
}

// SetClientWriteForTest makes every relay of c write the client's bytes
// through f (w is the client's end: the NATS pipe or the direct stream)
// instead of w.Write; nil removes it.
func SetClientWriteForTest(c *Coordinator, f func(w io.Writer, b []byte) (int, error)) {
	if f == nil {
		c.clientEndForTest.Store(nil)
		return
	}
	wrap := func(p clientEnd) clientEnd { return &writeHookEnd{clientEnd: p, write: f} }
	c.clientEndForTest.Store(&wrap)
}

// writeHookEnd is a clientEnd whose writes go through write.
type writeHookEnd struct {
	clientEnd
	write func(w io.Writer, b []byte) (int, error)
}

func (e *writeHookEnd) Write(b []byte) (int, error) { return e.write(e.clientEnd, b) }

// SetStrandedScanForTest sets when a coordinator first scans for lost
// idempotent jobs nobody claimed (and how old they must be), and the
// pause between scans (rerun.go), until restore is called. Call it
// before the coordinator starts, and restore once it stopped.
func SetStrandedScanForTest(after, every time.Duration) (restore func()) {
	a, e := strandedAfter, strandedScanInterval
	strandedAfter, strandedScanInterval = after, every
	return func() { strandedAfter, strandedScanInterval = a, e }
}
