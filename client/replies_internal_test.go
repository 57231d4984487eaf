package client

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
)

// A request whose unread replies pass its byte bound fails with
// nats.ErrSlowConsumer (as its own subscription's pending limit made it),
// and keeps failing: replies after the gap would be out of sequence.
func TestReplyQueueByteBound(t *testing.T) {
	m := &replyMux{queues: map[string]*replyQueue{}}
	q := &replyQueue{mux: m, token: "1", Subject: "_INBOX.x.1", maxBytes: 10, ready: make(chan struct{}, 1)}
	m.queues["1"] = q
	q.push(&nats.Msg{Data: []byte("123456")})
	if msg, err := q.NextMsgWithContext(context.Background()); err != nil || string(msg.Data) != "123456" {
		t.Fatalf("first reply: %v, %v", msg, err)
	}
	q.push(&nats.Msg{Data: []byte("123456")})
	q.push(&nats.Msg{Data: []byte("123456")}) // 12 bytes unread
	q.push(&nats.Msg{Data: []byte("1")})
	for range 2 {
		if _, err := q.NextMsgWithContext(context.Background()); !errors.Is(err, nats.ErrSlowConsumer) {
			t.Fatalf("after 12 unread bytes over a bound of 10: %v, want nats.ErrSlowConsumer", err)
		}
	}
	q.Close()
	if len(m.queues) != 0 {
		t.Errorf("closed queue still registered")
	}
}

// A wait ends with ctx, and a status 503 reads as nats.ErrNoResponders.
func TestReplyQueueWaitAndStatus(t *testing.T) {
	q := &replyQueue{mux: &replyMux{queues: map[string]*replyQueue{}}, ready: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := q.NextMsgWithContext(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("empty queue, ended ctx: %v", err)
	}
	q.push(&nats.Msg{Header: nats.Header{"Status": {"503"}}})
	if _, err := q.NextMsgWithContext(context.Background()); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("status 503: %v, want nats.ErrNoResponders", err)
	}
}
