package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// A detached job's status, asked of its node through the coordinator
// holding the node (NodeSubjectPrefix+<node>+".job.query", coordinators
// only, like dial and sandbox.delete): reconciliation and job.get settle
// a job whichever coordinator its node re-homed to. Without it a
// coordinator that took over a dead one's detached jobs could ask only
// the nodes connected to itself, and would record the others lost while
// they ran.

// jobQuery is the request of a job query; jobQueryAnswer its answer.
type jobQuery struct {
	ID string `json:"id"`
}

type jobQueryAnswer struct {
	Status *protocol.JobStatus `json:"status,omitempty"`
	// NoSuchJob: the node answered that it does not know the job;
	// Unreachable: the owner could not ask it (Error says why).
	NoSuchJob   bool   `json:"no_such_job,omitempty"`
	Unreachable bool   `json:"unreachable,omitempty"`
	Error       string `json:"error,omitempty"`
}

// serveJobQuery answers a forwarded job query for nodeID from this
// coordinator's own tunnel; never forwarded again.
func (c *Coordinator) serveJobQuery(m *nats.Msg, nodeID string) {
	if m.Reply == "" {
		return
	}
	answer := func(a jobQueryAnswer) {
		b, _ := json.Marshal(a)
		if err := c.cfg.NATS.Publish(m.Reply, b); err != nil {
			c.log.Debug("answer job query", "node_id", nodeID, "err", err)
		}
	}
	var q jobQuery
	if err := json.Unmarshal(m.Data, &q); err != nil || protocol.ValidJobID(q.ID) != nil {
		answer(jobQueryAnswer{Error: fmt.Sprintf("coordinator %s: bad job query for node %s", c.cfg.ID, nodeID)})
		return
	}
	life, ok := c.enterRequest()
	if !ok {
		answer(jobQueryAnswer{Unreachable: true, Error: fmt.Sprintf("coordinator %s is shutting down", c.cfg.ID)})
		return
	}
	go func() {
		defer c.jobWG.Done()
		defer c.guard.Recover("job query", nil)
		st, err := c.localJobStatus(life, nodeID, q.ID)
		switch {
		case err == nil:
			answer(jobQueryAnswer{Status: st})
		case errors.Is(err, jobstore.ErrNoSuchJob):
			answer(jobQueryAnswer{NoSuchJob: true, Error: err.Error()})
		default:
			answer(jobQueryAnswer{Unreachable: errors.Is(err, jobstore.ErrNodeUnreachable), Error: err.Error()})
		}
	}()
}

// remoteJobStatus asks owner, the coordinator holding nodeID, for job id's
// status on it (jobstore.Querier's errors).
func (c *Coordinator) remoteJobStatus(ctx context.Context, owner, nodeID, id string) (*protocol.JobStatus, error) {
	body, _ := json.Marshal(jobQuery{ID: id})
	ctx, cancel := context.WithTimeout(ctx, jobAnswerTimeout)
	defer cancel()
	m, err := c.cfg.NATS.RequestMsgWithContext(ctx, &nats.Msg{
		Subject: NodeSubjectPrefix + subjectPart(nodeID) + ".job.query",
		Header:  nats.Header{HeaderForwardedBy: []string{c.cfg.ID}},
		Data:    body,
	})
	if err != nil {
		return nil, fmt.Errorf("node %s: ask coordinator %s for job %s: %v: %w", nodeID, owner, id, err, jobstore.ErrNodeUnreachable)
	}
	var a jobQueryAnswer
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return nil, fmt.Errorf("node %s: job %s: coordinator %s's answer: %v: %w", nodeID, id, owner, err, jobstore.ErrNodeUnreachable)
	}
	switch {
	case a.Status != nil:
		a.Status.Node = nodeID
		return a.Status, nil
	case a.NoSuchJob:
		return nil, fmt.Errorf("node %s: job %s: %w", nodeID, id, jobstore.ErrNoSuchJob)
	case a.Unreachable:
		return nil, fmt.Errorf("node %s via coordinator %s: %s: %w", nodeID, owner, a.Error, jobstore.ErrNodeUnreachable)
	}
	return nil, fmt.Errorf("node %s via coordinator %s: job %s: %s", nodeID, owner, id, a.Error)
}
