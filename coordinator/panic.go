package coordinator

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// Panics. Every goroutine the coordinator runs for one caller is guarded by
// c.guard (internal/panics): the NATS micro handlers (its own and those
// Config.Endpoints adds), each exec job and each node run of it, each
// stream relay and its copier, each job-stream request, each agent
// connection's handshake and session, and each node's inventory. A panic
// there fails that caller only (a 500 internal micro error, an internal
// node result, a pipe closed with an internal error, a closed agent
// connection), is counted in tether_panics_total{component="coordinator"}
// and logged once with its stack; the coordinator keeps serving. The
// goroutines that own shared state are not guarded (see the package doc).

// internalError is what a caller whose request hit a contained panic is
// told.
func (c *Coordinator) internalError(e *panics.Error) *protocol.APIError {
	return protocol.NewAPIError(500, protocol.ErrCodeInternal, "coordinator %s: %v", c.cfg.ID, e)
}

// guardHandler wraps h, the handler of endpoint name, so that a panic in
// it answers the request with a 500 internal micro error. Every endpoint
// goes through it, so it is also where a request published without a reply
// subject is made unanswerable (see unanswered) and where its audit event
// is prepared (audit.go).
func (c *Coordinator) guardHandler(name string, h micro.Handler) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		req = c.withAudit(unanswered(req), name)
		defer c.guard.Recover("nats "+name, func(e *panics.Error) { c.replyError(req, c.internalError(e)) })
		c.hook("nats " + name)
		id, err := c.cfg.Identify(nats.Header(req.Headers()))
		if err != nil {
			c.refuseUnidentified(req, name, err)
			return
		}
		cr := &caller.Request{Request: req, Identity: id}
		if a := auditOf(req); a != nil {
			a.identity, a.outer = &id, cr
		}
		h.Handle(cr)
	})
}

// refuseUnidentified answers a request whose sender Config.Identify could
// not name with 401 unauthenticated. The reason goes to the log, rate
// limited per endpoint, not to the caller: it says which check failed.
func (c *Coordinator) refuseUnidentified(req micro.Request, endpoint string, err error) {
	c.log.Warn("refused unidentified request", "endpoint", endpoint, "subject", req.Subject(), "err", err)
	c.replyError(req, protocol.NewAPIError(401, protocol.ErrCodeUnauthenticated,
		"coordinator %s: %s: the NATS server did not vouch for the caller; connect with Tether client credentials (--nats-creds or $TETHER_NATS_CREDS)", c.cfg.ID, endpoint))
}

// guardedService is the micro service as Config.Endpoints sees it: every
// endpoint added through it (or a group of it) is guarded.
type guardedService struct {
	micro.Service
	c *Coordinator
}

func (s guardedService) AddEndpoint(name string, h micro.Handler, opts ...micro.EndpointOpt) error {
	return s.Service.AddEndpoint(name, s.c.guardHandler(name, h), opts...)
}

func (s guardedService) AddGroup(name string, opts ...micro.GroupOpt) micro.Group {
	return guardedGroup{s.Service.AddGroup(name, opts...), s.c}
}

type guardedGroup struct {
	micro.Group
	c *Coordinator
}

func (g guardedGroup) AddEndpoint(name string, h micro.Handler, opts ...micro.EndpointOpt) error {
	return g.Group.AddEndpoint(name, g.c.guardHandler(name, h), opts...)
}

func (g guardedGroup) AddGroup(name string, opts ...micro.GroupOpt) micro.Group {
	return guardedGroup{g.Group.AddGroup(name, opts...), g.c}
}

// hook calls the test hook, if one is set, at point: "nats <endpoint>"
// before a NATS request's handler, "exec node <id>" before a node run of
// an exec job.
func (c *Coordinator) hook(point string) {
	if f := c.testHook.Load(); f != nil {
		(*f)(point)
	}
}

// containConn runs f, one agent connection's handshake or session, so
// that a panic in it closes that connection (the agent redials) and
// nothing else.
func (c *Coordinator) containConn(where string, ac *agentConn, f func()) {
	defer c.guard.Recover(where, func(*panics.Error) { ac.close() })
	f()
}
