package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/protocol"
)

// semver is the version syntax micro accepts (semver.org's suggested
// expression, without build metadata subtleties we never produce).
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$`)

// serviceVersion returns v if micro accepts it, else "0.1.0".
func serviceVersion(v string) string {
	if semver.MatchString(v) {
		return v
	}
	return "0.1.0"
}

// startService registers the micro service "tether" and its endpoints.
// micro runs each endpoint's handler on one goroutine of the NATS
// connection, one request at a time, so handlers only validate and then
// hand long work to goroutines the coordinator owns.
func (c *Coordinator) startService() (micro.Service, error) {
	svc, err := micro.AddService(c.cfg.NATS, micro.Config{
		Name:        protocol.ServiceName,
		Version:     serviceVersion(c.cfg.Version),
		Description: protocol.ServiceDescription,
		Metadata: map[string]string{
			"coordinator_id": c.cfg.ID,
			"version":        c.cfg.Version,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator: add micro service %q: %w", protocol.ServiceName, err)
	}
	endpoints := []struct {
		name, subject string
		h             micro.HandlerFunc
	}{
		{"exec", protocol.SubjectExec, c.handleExec},
		{"nodes", protocol.SubjectNodes, c.handleNodes},
		{"cancel", protocol.SubjectCancel, c.handleCancel},
	}
	for _, e := range endpoints {
		if err := svc.AddEndpoint(e.name, e.h, micro.WithEndpointSubject(e.subject)); err != nil {
			svc.Stop()
			return nil, fmt.Errorf("coordinator: add endpoint %s on %s: %w", e.name, e.subject, err)
		}
	}
	return svc, nil
}

// replyError sends e as a micro error: the status as the error code header,
// the message as the description and e as the JSON body.
func (c *Coordinator) replyError(req micro.Request, e *protocol.APIError) {
	body, _ := json.Marshal(e)
	if err := req.Error(strconv.Itoa(e.Status), e.Message, body); err != nil {
		c.log.Debug("send error reply", "subject", req.Subject(), "code", e.Code, "err", err)
	}
}

func (c *Coordinator) replyJSON(req micro.Request, v any) {
	if err := req.RespondJSON(v); err != nil {
		c.log.Debug("send reply", "subject", req.Subject(), "err", err)
	}
}

func (c *Coordinator) unavailable() *protocol.APIError {
	return protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator %s is shutting down", c.cfg.ID)
}

// handleExec validates an exec request and starts its job. Everything that
// can make the request invalid is checked here, before anything runs.
func (c *Coordinator) handleExec(req micro.Request) {
	if req.Reply() == "" {
		c.log.Debug("exec request without a reply subject ignored")
		return
	}
	r, apiErr := protocol.DecodeExecRequest(req.Data())
	if apiErr != nil {
		c.replyError(req, apiErr)
		return
	}
	targets, apiErr := c.resolve(r.Target)
	if apiErr != nil {
		c.replyError(req, apiErr)
		return
	}
	id := r.ID
	if id == "" {
		id = rand.Text()
	}
	maxParallel := r.MaxParallel
	if maxParallel == 0 {
		maxParallel = c.cfg.MaxParallel
	}
	j := &job{
		c:           c,
		id:          id,
		reply:       req.Reply(),
		targets:     targets,
		params:      r.Params(c.cfg.DefaultTimeout),
		stdin:       r.Stdin,
		maxParallel: maxParallel,
	}

	c.mu.Lock()
	if c.closing || c.life == nil {
		c.mu.Unlock()
		c.replyError(req, c.unavailable())
		return
	}
	if _, dup := c.jobs[id]; dup {
		c.mu.Unlock()
		c.replyError(req, protocol.NewAPIError(409, protocol.ErrCodeDuplicateJob, "job %q is already running", id))
		return
	}
	j.ctx, j.cancel = context.WithCancel(c.life)
	c.jobs[id] = j
	c.jobWG.Add(1)
	c.mu.Unlock()

	go func() {
		defer c.jobWG.Done()
		j.run()
	}()
}

// resolve turns a validated target into registered nodes, sorted by id.
func (c *Coordinator) resolve(t protocol.Target) ([]*node, *protocol.APIError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case t.Node != "":
		n, ok := c.nodes[t.Node]
		if !ok {
			return nil, protocol.NewAPIError(404, protocol.ErrCodeUnknownNode, "node %q is not connected to coordinator %s", t.Node, c.cfg.ID)
		}
		return []*node{n}, nil
	case t.Selector != "":
		sel, err := protocol.ParseSelector(t.Selector)
		if err != nil { // Validate parsed it already
			return nil, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "target: %v", err)
		}
		ns := c.sortedNodesLocked(sel)
		if len(ns) == 0 {
			return nil, protocol.NewAPIError(404, protocol.ErrCodeNoMatch, "selector %q matches no node connected to coordinator %s", t.Selector, c.cfg.ID)
		}
		return ns, nil
	case t.All:
		ns := c.sortedNodesLocked(protocol.Selector{})
		if len(ns) == 0 {
			return nil, protocol.NewAPIError(404, protocol.ErrCodeNoMatch, "no node is connected to coordinator %s", c.cfg.ID)
		}
		return ns, nil
	}
	return nil, protocol.NewAPIError(400, protocol.ErrCodeNoTarget, "request has no target: set target.node, target.selector or target.all")
}

// sortedNodesLocked returns the registered nodes matching sel, sorted by id.
// c.mu must be held.
func (c *Coordinator) sortedNodesLocked(sel protocol.Selector) []*node {
	var ns []*node
	for _, n := range c.nodes {
		if sel.Matches(n.hello.Labels) {
			ns = append(ns, n)
		}
	}
	sortNodes(ns)
	return ns
}

// handleNodes lists the connected nodes matching the request's selector.
func (c *Coordinator) handleNodes(req micro.Request) {
	var r protocol.NodesRequest
	if e := protocol.DecodeRequest(req.Data(), &r); e != nil {
		c.replyError(req, e)
		return
	}
	sel, err := protocol.ParseSelector(r.Selector)
	if err != nil {
		c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "selector: %v", err))
		return
	}
	c.replyJSON(req, protocol.NodesResponse{Nodes: c.Nodes(sel)})
}

// handleCancel cancels a running job: each of its nodes is sent a cancel and
// reports its exit status in the job's final result.
func (c *Coordinator) handleCancel(req micro.Request) {
	var r protocol.CancelRequest
	if e := protocol.DecodeRequest(req.Data(), &r); e != nil {
		c.replyError(req, e)
		return
	}
	if r.ID == "" {
		c.replyError(req, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "id is required"))
		return
	}
	c.mu.Lock()
	j, ok := c.jobs[r.ID]
	c.mu.Unlock()
	if !ok {
		c.replyError(req, protocol.NewAPIError(404, protocol.ErrCodeNotFound, "no job %q is running on coordinator %s", r.ID, c.cfg.ID))
		return
	}
	j.cancel()
	c.log.Info("job cancelled by request", "job_id", r.ID)
	c.replyJSON(req, protocol.CancelResponse{ID: r.ID, Cancelled: true})
}
