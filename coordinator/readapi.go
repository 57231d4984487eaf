package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Read access for in-process consumers that decide policy themselves (the
// web console, coordinator/console): the same reads the NATS API's job
// handlers make, without a micro.Request.

// JobPolicyNodes returns ids as policy sees them: the labels of the nodes
// connected here, the bare id of the others (a rule's selector then
// matches only "*"). The job.* handlers decide on the same.
func (c *Coordinator) JobPolicyNodes(ids []string) []policy.Node { return c.jobPolicyNodes(ids) }

// ErrNotHere is JobOutput's error (wrapped) for a node that is not
// connected to this coordinator: its tunnel, and the job's output file on
// the node, are reached through the coordinator that holds it.
var ErrNotHere = errors.New("coordinator: the node is not connected to this coordinator")

// JobOutput reads stream ("stdout" or "stderr") of detached job id on
// nodeID from offset (bytes), at most limit bytes (0 or more than
// protocol.MaxJobOutputLimit: that limit), through the node's tunnel. It
// returns the bytes and the answer's end (the size of the output so far,
// and whether no more will come). Errors: ErrNotHere for a node held
// elsewhere or not at all; jobstore.ErrNoSuchJob when the agent does not
// know the job; otherwise one naming the node, the job and what failed.
// It blocks for at most the job stream's answer timeout (30 s) or until
// ctx ends. The caller decides policy (job.logs) first.
func (c *Coordinator) JobOutput(ctx context.Context, nodeID, id, stream string, offset, limit int64) ([]byte, protocol.JobOutputEnd, error) {
	var end protocol.JobOutputEnd
	if limit <= 0 || limit > protocol.MaxJobOutputLimit {
		limit = protocol.MaxJobOutputLimit
	}
	p := &protocol.JobParams{Op: protocol.JobOpOutput, ID: id, Stream: stream, Offset: offset, Limit: limit}
	if err := p.Validate(); err != nil {
		return nil, end, fmt.Errorf("node %s: job output: %w", protocol.Clip(nodeID), err)
	}
	c.mu.Lock()
	n := c.nodes[nodeID]
	c.mu.Unlock()
	if n == nil {
		return nil, end, fmt.Errorf("node %s: %w (%s)", protocol.Clip(nodeID), ErrNotHere, c.cfg.ID)
	}
	a, err := c.readJobStream(ctx, n, p, limit)
	if err != nil {
		return nil, end, fmt.Errorf("node %s: job %s: %w", nodeID, id, err)
	}
	if ei := a.agentErr; ei != nil {
		if ei.Code == "job_not_found" {
			return nil, end, fmt.Errorf("node %s: job %s: %w", nodeID, id, jobstore.ErrNoSuchJob)
		}
		return nil, end, fmt.Errorf("node %s: job %s output: %s", nodeID, id, truncateAgentString(ei.Message))
	}
	if err := protocol.DecodeJSON(a.answer, &end); err != nil {
		return nil, end, fmt.Errorf("node %s: job %s output: %w", nodeID, id, err)
	}
	return a.data, end, nil
}
