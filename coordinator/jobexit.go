package coordinator

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// Exit reports of detached jobs (protocol.FrameJobExit, see
// protocol/jobexit.go). An agent whose Hello listed FeatureJobExit, welcomed
// by a coordinator with a job store (whose Welcome lists it), reports each
// detached job of its node that ended; the control stream's reader decodes
// the report and queues it, and a few worker goroutines settle the job's
// record with jobstore.Store.Observe, as job.get would after asking the
// node. The reader never waits for the store: heartbeats come on the same
// stream. Refusals an agent can cause at will (malformed or foreign
// reports, a full queue) are logged through the rate-limited log
// (c.preauth) and counted.

// Bounds of the report queue.
const (
	// maxJobReportWorkers bounds the reports settled at once (each is a
	// KV read and a compare-and-set write).
	maxJobReportWorkers = 4
	// maxQueuedJobReports bounds the reports waiting for a worker; one
	// more is dropped (counted; job.get and reconciliation still settle
	// its record). An agent sends at most a few hundred at the start of a
	// session (agent/jobreport.go), so a few agents reconnecting at once
	// fit.
	maxQueuedJobReports = 2048
)

// Results of tether_coordinator_job_exit_reports_total.
const (
	jobReportSettled   = "settled"   // the record moved to a terminal state
	jobReportUnchanged = "unchanged" // the record was already terminal (a repeat), or queued
	jobReportMalformed = "malformed" // the payload failed protocol.DecodeJobExit
	jobReportForeign   = "foreign"   // the record is not a detached job of the reporting node
	jobReportUnknown   = "unknown"   // no record of that id (expired, or never submitted here)
	jobReportDropped   = "dropped"   // the queue was full, or the coordinator drains
	jobReportError     = "error"     // the store failed
)

var jobReportResults = []string{jobReportSettled, jobReportUnchanged, jobReportMalformed, jobReportForeign, jobReportUnknown, jobReportDropped, jobReportError}

// jobReport is one decoded report: node is the session's node, never a
// field of the payload.
type jobReport struct {
	node string
	st   *protocol.JobStatus
}

// jobReports is the queue of reports not yet settled. mu is a leaf lock.
type jobReports struct {
	mu      sync.Mutex
	queue   []jobReport
	workers int // goroutines draining queue (each counted in jobWG)
}

// welcomeFeatures are the agent → coordinator features this coordinator
// takes (protocol.Welcome.Features): job exit reports when it has a job
// store to settle them in.
func (c *Coordinator) welcomeFeatures() []string {
	if c.cfg.Jobs == nil {
		return nil
	}
	return []string{protocol.FeatureJobExit}
}

// jobExitReport handles a FrameJobExit from n's control stream (the
// reader's goroutine; payload is valid only during the call). It decodes
// and checks the report and queues it for a worker; it never blocks on
// the store.
func (c *Coordinator) jobExitReport(n *node, payload []byte) {
	st, err := protocol.DecodeJobExit(payload)
	if err != nil {
		c.m.jobReports.WithLabelValues(jobReportMalformed).Inc()
		c.preauth.Warn("job exit report dropped: malformed", "node_id", n.id, "err", err)
		return
	}
	st.Node = n.id // the node the session proved, whatever the payload says
	if c.cfg.Jobs == nil {
		// Not advertised, so a conforming agent did not send it.
		c.m.jobReports.WithLabelValues(jobReportDropped).Inc()
		return
	}
	r := jobReport{node: n.id, st: st}
	c.reports.mu.Lock()
	if len(c.reports.queue) >= maxQueuedJobReports {
		c.reports.mu.Unlock()
		c.m.jobReports.WithLabelValues(jobReportDropped).Inc()
		c.preauth.Warn("job exit report dropped: too many waiting", "node_id", n.id, "job_id", st.ID, "queued", maxQueuedJobReports)
		return
	}
	c.reports.queue = append(c.reports.queue, r)
	start := c.reports.workers < maxJobReportWorkers
	if start {
		c.reports.workers++
	}
	c.reports.mu.Unlock()
	if !start {
		return
	}
	life, ok := c.enter(&c.jobWG)
	if !ok {
		c.reports.mu.Lock()
		c.reports.workers--
		c.reports.mu.Unlock()
		c.dropJobReports()
		return
	}
	go func() {
		defer c.jobWG.Done()
		c.settleJobReports(life)
	}()
}

// settleJobReports is a worker: it settles queued reports until the queue
// is empty, or drops them all once the coordinator drains (the drain waits
// for jobWG, and a store that does not answer would hold it up for
// minutes).
func (c *Coordinator) settleJobReports(life context.Context) {
	for {
		c.reports.mu.Lock()
		if len(c.reports.queue) == 0 {
			c.reports.workers--
			c.reports.mu.Unlock()
			return
		}
		r := c.reports.queue[0]
		c.reports.queue[0] = jobReport{}
		c.reports.queue = c.reports.queue[1:]
		c.reports.mu.Unlock()
		if !c.serving.Load() {
			c.m.jobReports.WithLabelValues(jobReportDropped).Inc()
			continue
		}
		var result string
		func() {
			defer c.guard.Recover("job exit report", func(*panics.Error) { result = jobReportError })
			ctx, cancel := context.WithTimeout(life, durableWriteTimeout)
			defer cancel()
			result = c.settleJobReport(ctx, c.cfg.Jobs, r)
		}()
		c.m.jobReports.WithLabelValues(result).Inc()
	}
}

// dropJobReports empties the queue, counting its reports as dropped.
func (c *Coordinator) dropJobReports() {
	c.reports.mu.Lock()
	n := len(c.reports.queue)
	if c.reports.workers == 0 {
		c.reports.queue = nil
	} else {
		n = 0 // a worker drops them
	}
	c.reports.mu.Unlock()
	c.m.jobReports.WithLabelValues(jobReportDropped).Add(float64(n))
}

// settleJobReport applies r to its job's record and returns the result
// (a jobReport* value). Only a detached job whose record names r.node is
// settled: a job of several nodes records r.node's result, and ends once
// every node has one (jobstore.Store.Observe). A write that lost a race (another writer of the
// record: the job's own coordinator recording it running, a job.get) is
// retried once on a fresh read.
func (c *Coordinator) settleJobReport(ctx context.Context, s *jobstore.Store, r jobReport) string {
	log := c.log.With("node_id", r.node, "job_id", r.st.ID)
	for attempt := 0; ; attempt++ {
		j, err := s.Get(ctx, r.st.ID)
		if errors.Is(err, jobstore.ErrNotFound) {
			log.Debug("job exit report of a job with no record")
			return jobReportUnknown
		}
		if err != nil {
			log.Warn("job exit report: read the job's record", "err", err)
			return jobReportError
		}
		if !j.Detached || !slices.Contains(j.Nodes, r.node) {
			// An agent may settle its own node's detached jobs only (on
			// a job of several nodes, its node's result).
			c.preauth.Warn("job exit report dropped: the job is not a detached job of the reporting node",
				"node_id", r.node, "job_id", r.st.ID, "job_nodes", j.Nodes, "detached", j.Detached)
			return jobReportForeign
		}
		if j.State.Terminal() || j.State == jobstore.Queued {
			return jobReportUnchanged
		}
		done, err := s.Observe(ctx, j, r.st)
		switch {
		case err == nil && done:
			log.Debug("detached job settled from its node's exit report", "state", j.State)
			return jobReportSettled
		case err == nil:
			return jobReportUnchanged // running, or one node of several recorded
		case errors.Is(err, jobstore.ErrBackward):
			return jobReportUnchanged
		case attempt == 0 && ctx.Err() == nil:
			continue // a concurrent write: read again
		}
		log.Warn("job exit report: settle the job's record", "err", err)
		return jobReportError
	}
}
