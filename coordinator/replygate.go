package coordinator

import (
	"encoding/json"
	"errors"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// replyGate lets a handler answer its request after it returned (job
// ops, stream relays and exec jobs answer from goroutines of their own).
// nats.go/micro's request records the outcome of Respond and Error in a
// field its service reads, without a lock, right after the handler
// returns (micro/service.go, for the endpoint's error stats): a reply
// sent through it later races with that read. So the gate passes replies
// to the micro request only while the handler runs, and publishes later
// ones itself, to the same reply subject with the same error headers
// (micro.ErrorHeader, micro.ErrorCodeHeader), on the coordinator's
// connection. mu orders each reply against the handler's return. Errors
// answered late are not counted in `nats micro stats`; they are in the
// coordinator's own metrics and the audit log.
type replyGate struct {
	micro.Request
	nc       *nats.Conn
	mu       sync.Mutex
	returned bool
}

// gateReplies wraps req, which must have a reply subject (see
// unanswered); call done when the handler returned.
func (c *Coordinator) gateReplies(req micro.Request) (micro.Request, func()) {
	if req.Reply() == "" {
		return req, func() {}
	}
	g := &replyGate{Request: req, nc: c.cfg.NATS}
	return g, func() {
		g.mu.Lock()
		g.returned = true
		g.mu.Unlock()
	}
}

func (g *replyGate) Respond(data []byte, opts ...micro.RespondOpt) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.returned {
		return g.Request.Respond(data, opts...)
	}
	m := &nats.Msg{Subject: g.Reply(), Data: data}
	for _, o := range opts {
		o(m)
	}
	return g.nc.PublishMsg(m)
}

func (g *replyGate) RespondJSON(v any, opts ...micro.RespondOpt) error {
	data, err := json.Marshal(v)
	if err != nil {
		return micro.ErrMarshalResponse
	}
	return g.Respond(data, opts...)
}

func (g *replyGate) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.returned {
		return g.Request.Error(code, description, data, opts...)
	}
	if code == "" || description == "" {
		return errors.Join(micro.ErrArgRequired, errors.New("error code and description"))
	}
	m := &nats.Msg{Subject: g.Reply(), Data: data, Header: nats.Header{
		micro.ErrorHeader:     []string{description},
		micro.ErrorCodeHeader: []string{code},
	}}
	for _, o := range opts {
		o(m)
	}
	return g.nc.PublishMsg(m)
}
