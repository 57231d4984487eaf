package client

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
)

// replyMux is a Client's one reply subscription, shared by all its exec
// requests: a wildcard on INBOX.* (INBOX from nc.NewInbox, so under the
// connection's inbox prefix and its permissions), each request's replies
// going to INBOX.<n>. A subscription of its own per request would cost a
// SUB and an UNSUB on the wire and a subscription on the server for every
// exec (issue 12). nats.go delivers the wildcard's messages on one
// goroutine of its own, which hands each to its request's queue and never
// blocks; a queue over its byte limit fails its request (as a per-request
// subscription's pending limit did), not the others.
//
// The subscription is made on first use and lives as long as the
// connection (nats.go re-subscribes it after a reconnect).
type replyMux struct {
	nc     *nats.Conn
	once   sync.Once
	err    error  // from the subscribe, for every request after it
	prefix string // "INBOX." (with the trailing dot)

	// closed is closed when the subscription ended: the connection was
	// closed (nats.go closes every subscription then, and does not
	// reconnect). Each queue's wait ends with closedErr.
	closed chan struct{}

	mu     sync.Mutex
	next   uint64
	queues map[string]*replyQueue // by the token after prefix
}

// closedErr is the error of a request whose replies can no longer come
// (closed): nats.ErrConnectionClosed when the connection was closed.
func (m *replyMux) closedErr() error {
	if m.nc.IsClosed() {
		return nats.ErrConnectionClosed
	}
	return nats.ErrBadSubscription
}

// open subscribes on first use and returns a new request's queue, whose
// Subject is the reply subject to send with the request. maxBytes bounds
// the replies the queue holds unread (<= 0: no bound). Close the queue
// when the request ends.
func (m *replyMux) open(maxBytes int) (*replyQueue, error) {
	m.once.Do(func() {
		nc := m.nc
		inbox := nc.NewInbox()
		m.prefix = inbox + "."
		m.queues = map[string]*replyQueue{}
		m.closed = make(chan struct{})
		sub, err := nc.Subscribe(m.prefix+"*", m.deliver)
		if err == nil {
			sub.SetClosedHandler(func(string) { close(m.closed) })
			// deliver never blocks, and each queue has its own
			// bound: nats.go's default bound (64 MiB) would instead
			// drop replies of every request when one has a lot.
			err = sub.SetPendingLimits(-1, -1)
		}
		if err != nil {
			m.err = fmt.Errorf("subscribe to replies on %s.*: %w", inbox, err)
		}
	})
	if m.err != nil {
		return nil, m.err
	}
	select {
	case <-m.closed:
		return nil, fmt.Errorf("replies on %s*: %w", m.prefix, m.closedErr())
	default:
	}
	m.mu.Lock()
	m.next++
	token := strconv.FormatUint(m.next, 36)
	q := &replyQueue{mux: m, token: token, Subject: m.prefix + token, maxBytes: maxBytes, ready: make(chan struct{}, 1)}
	m.queues[token] = q
	m.mu.Unlock()
	return q, nil
}

// deliver is the subscription's handler (nats.go's delivery goroutine).
// A reply for a request that already ended is dropped, as the request's
// own subscription, unsubscribed, would have.
func (m *replyMux) deliver(msg *nats.Msg) {
	m.mu.Lock()
	q := m.queues[msg.Subject[min(len(m.prefix), len(msg.Subject)):]]
	m.mu.Unlock()
	if q != nil {
		q.push(msg)
	}
}

// replySource is where an exec request reads its replies.
type replySource interface {
	// Subject is the reply subject to send the request with.
	subject() string
	NextMsgWithContext(ctx context.Context) (*nats.Msg, error)
	// Close drops later replies.
	Close()
}

// ownReplies is a subscription of the request's own (Client.perRequest).
type ownReplies struct{ *nats.Subscription }

func (o ownReplies) subject() string { return o.Subscription.Subject }
func (o ownReplies) Close()          { o.Unsubscribe() }

func (q *replyQueue) subject() string { return q.Subject }

// replyQueue is one request's replies, in arrival order.
type replyQueue struct {
	// Subject is the request's reply subject.
	Subject string

	mux      *replyMux
	token    string
	maxBytes int
	ready    chan struct{} // a token while msgs may be non-empty

	mu      sync.Mutex
	msgs    []*nats.Msg
	bytes   int
	overrun bool // over maxBytes: the next read fails
}

func (q *replyQueue) push(msg *nats.Msg) {
	q.mu.Lock()
	if q.overrun {
		q.mu.Unlock()
		return
	}
	q.bytes += len(msg.Data)
	if q.maxBytes > 0 && q.bytes > q.maxBytes {
		q.overrun, q.msgs = true, nil
	} else {
		q.msgs = append(q.msgs, msg)
	}
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// NextMsgWithContext returns the next reply, waiting until ctx ends. Like
// a subscription's, it returns nats.ErrNoResponders for the server's
// "no responders" status, nats.ErrSlowConsumer once replies beyond the
// byte limit were dropped, and nats.ErrConnectionClosed, once the replies
// that came are read, when the connection was closed.
func (q *replyQueue) NextMsgWithContext(ctx context.Context) (*nats.Msg, error) {
	for {
		q.mu.Lock()
		if q.overrun {
			q.mu.Unlock()
			return nil, fmt.Errorf("replies on %s over %d unread bytes: %w", q.Subject, q.maxBytes, nats.ErrSlowConsumer)
		}
		if len(q.msgs) > 0 {
			msg := q.msgs[0]
			q.msgs[0] = nil
			q.msgs = q.msgs[1:]
			q.bytes -= len(msg.Data)
			more := len(q.msgs) > 0
			q.mu.Unlock()
			if more {
				select {
				case q.ready <- struct{}{}:
				default:
				}
			}
			if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
				return nil, nats.ErrNoResponders
			}
			return msg, nil
		}
		q.mu.Unlock()
		select {
		case <-q.ready:
		case <-q.mux.closed:
			q.mu.Lock()
			more := len(q.msgs) > 0 || q.overrun
			q.mu.Unlock()
			if !more {
				return nil, q.mux.closedErr()
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close ends the request: later replies to Subject are dropped.
func (q *replyQueue) Close() {
	q.mux.mu.Lock()
	delete(q.mux.queues, q.token)
	q.mux.mu.Unlock()
}
