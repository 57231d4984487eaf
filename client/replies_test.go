package client_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// Concurrent exec requests of one Client share one reply subscription (not
// one each), and each still gets exactly its own replies.
func TestExecRequestsShareOneReplySubscription(t *testing.T) {
	s := runServer(t)
	const n = 8
	nc := connect(t, s)
	c := client.New(nc)
	arrived := make(chan *nats.Msg, n)
	release := make(chan struct{})
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		arrived <- m
		go func() {
			<-release
			f.reply(m, req.ID, protocol.ReplyStdout, "a", 0, []byte(req.Argv[1]))
			f.result(m, req.ID, 1, protocol.ExecResult{Results: []protocol.NodeResult{{Node: "a", StdoutBytes: int64(len(req.Argv[1]))}}})
		}()
	}, nil)

	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			word := fmt.Sprintf("job-%d", i)
			var got []chunk
			req := &protocol.ExecRequest{Target: protocol.Target{Node: "a"}, Argv: []string{"echo", word}}
			res, err := c.Exec(testCtx(t), req, collect(&got))
			switch {
			case err != nil:
				errs[i] = err
			case len(got) != 1 || got[0].Data != word || len(res.Results) != 1:
				errs[i] = fmt.Errorf("request %d got output %+v, result %+v; want only %q", i, got, res, word)
			}
		})
	}
	subjects := map[string]bool{}
	var prefix string
	for range n {
		m := <-arrived
		subjects[m.Reply] = true
		p := m.Reply[:strings.LastIndexByte(m.Reply, '.')+1]
		if prefix == "" {
			prefix = p
		} else if p != prefix {
			t.Errorf("reply subjects %q and %q are not under one wildcard", prefix+"*", m.Reply)
		}
	}
	// Every request is waiting for its replies now.
	if got := nc.NumSubscriptions(); got != 1 {
		t.Errorf("%d requests in flight hold %d subscriptions, want 1", n, got)
	}
	if len(subjects) != n {
		t.Errorf("%d requests used %d distinct reply subjects", n, len(subjects))
	}
	close(release)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := nc.NumSubscriptions(); got != 1 {
		t.Errorf("after the requests: %d subscriptions, want the shared 1", got)
	}
}

// A reply that arrives after its request ended is dropped, and the next
// request (on the same shared subscription) sees only its own.
func TestLateReplyToEndedRequestIsDropped(t *testing.T) {
	s := runServer(t)
	c := client.New(connect(t, s))
	var mu sync.Mutex
	var first *nats.Msg
	var firstID string
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first, firstID = m, req.ID
			f.result(m, req.ID, 0, protocol.ExecResult{Results: []protocol.NodeResult{{Node: "a"}}})
			return
		}
		// The first job's stray output, then the second job's own.
		f.reply(first, firstID, protocol.ReplyStdout, "a", 1, []byte("stray"))
		f.reply(m, req.ID, protocol.ReplyStdout, "a", 0, []byte("mine"))
		f.result(m, req.ID, 1, protocol.ExecResult{Results: []protocol.NodeResult{{Node: "a", StdoutBytes: 4}}})
	}, nil)
	if _, err := c.Exec(testCtx(t), echoReq(), nil); err != nil {
		t.Fatal(err)
	}
	var got []chunk
	if _, err := c.Exec(testCtx(t), echoReq(), collect(&got)); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Data != "mine" {
		t.Errorf("second request got %+v, want only its own \"mine\"", got)
	}
}

// With no coordinator, a request on the shared subscription still ends
// with no responders, at once.
func TestSharedRepliesNoResponders(t *testing.T) {
	s := runServer(t)
	c := client.New(connect(t, s))
	for range 2 { // the first subscribes, the second reuses
		_, err := c.Exec(testCtx(t), echoReq(), nil)
		if !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("exec with no coordinator: %v, want nats.ErrNoResponders", err)
		}
	}
}
