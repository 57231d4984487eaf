package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
)

const defaultTestTimeout = 10 * time.Second

// runServer starts an embedded nats-server on a random loopback port, with
// Tether's NATS layout.
func runServer(t testing.TB) *natsauthtest.Env {
	t.Helper()
	return natsauthtest.Run(t)
}

// connect connects as a client user, as the client package's callers do.
func connect(t testing.TB, s *natsauthtest.Env) *nats.Conn {
	t.Helper()
	return s.Client(t, "client")
}

// serve connects as the coordinator does, for fakes of its service.
func serve(t testing.TB, s *natsauthtest.Env) *nats.Conn {
	t.Helper()
	return s.Coordinator(t)
}

// acceptPipe accepts a pipe as the coordinator does: its end on a pipe
// subject the client may publish to.
func acceptPipe(nc *nats.Conn, m *nats.Msg) (*natspipe.Pipe, error) {
	local, err := natsauth.PipeSubject("fake", natsauth.NewPipeID())
	if err != nil {
		return nil, err
	}
	return natspipe.AcceptOn(nc, local, m.Reply, nil, natspipe.Config{})
}

// refuseDirect answers a stream request for the direct path as a
// coordinator without a direct listener does (501 direct_unavailable), and
// reports whether it did: the fakes relay over NATS only.
func refuseDirect(m *nats.Msg) bool {
	var req protocol.StreamRequest
	if json.Unmarshal(m.Data, &req) != nil || !req.Direct {
		return false
	}
	r := nats.NewMsg(m.Reply)
	r.Header.Set(micro.ErrorCodeHeader, "501")
	r.Header.Set(micro.ErrorHeader, "no direct listener")
	r.Data, _ = json.Marshal(protocol.NewAPIError(501, protocol.ErrCodeDirectUnavailable, "coordinator fake has no direct listener"))
	m.RespondMsg(r)
	return true
}

// fake is a scripted stand-in for the coordinator's micro service. Its
// handler fields run on the responder connection's callback goroutine.
type fake struct {
	nc *nats.Conn

	mu      sync.Mutex
	execs   []protocol.ExecRequest
	cancels chan string
}

// newFake serves tether.v1.exec with onExec (nil: no exec subscription) and
// tether.v1.nodes with onNodes (nil: none), and records cancel requests.
func newFake(t testing.TB, s *natsauthtest.Env, onExec func(f *fake, m *nats.Msg, req protocol.ExecRequest), onNodes func(m *nats.Msg)) *fake {
	t.Helper()
	f := &fake{nc: serve(t, s), cancels: make(chan string, 16)}
	if onExec != nil {
		if _, err := f.nc.Subscribe(protocol.SubjectExec, func(m *nats.Msg) {
			var req protocol.ExecRequest
			if err := json.Unmarshal(m.Data, &req); err != nil {
				t.Errorf("fake: decode exec request: %v", err)
				return
			}
			f.mu.Lock()
			f.execs = append(f.execs, req)
			f.mu.Unlock()
			onExec(f, m, req)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if onNodes != nil {
		if _, err := f.nc.Subscribe(protocol.SubjectNodes, onNodes); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.nc.Subscribe(protocol.SubjectCancel, func(m *nats.Msg) {
		var req protocol.CancelRequest
		json.Unmarshal(m.Data, &req)
		f.cancels <- req.ID
		if m.Reply != "" {
			b, _ := json.Marshal(protocol.CancelResponse{ID: req.ID, Cancelled: true})
			m.Respond(b)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

// reply publishes one exec reply to m's inbox.
func (f *fake) reply(m *nats.Msg, job, typ, node string, seq int, data []byte) {
	h := nats.Header{}
	h.Set(protocol.HeaderJob, job)
	h.Set(protocol.HeaderType, typ)
	if node != "" {
		h.Set(protocol.HeaderNode, node)
	}
	if seq >= 0 {
		h.Set(protocol.HeaderSeq, strconv.Itoa(seq))
	}
	f.nc.PublishMsg(&nats.Msg{Subject: m.Reply, Header: h, Data: data})
}

func (f *fake) result(m *nats.Msg, job string, seq int, res protocol.ExecResult) {
	b, _ := json.Marshal(res)
	f.reply(m, job, protocol.ReplyResult, "", seq, b)
}

// microError replies the way a NATS micro service reports an error.
func microError(m *nats.Msg, e *protocol.APIError) {
	b, _ := json.Marshal(e)
	h := nats.Header{}
	h.Set("Nats-Service-Error-Code", strconv.Itoa(e.Status))
	h.Set("Nats-Service-Error", e.Message)
	m.RespondMsg(&nats.Msg{Header: h, Data: b})
}

func (f *fake) waitCancel(t testing.TB, id string) {
	t.Helper()
	select {
	case got := <-f.cancels:
		if got != id {
			t.Errorf("cancel request for job %q, want %q", got, id)
		}
	case <-time.After(defaultTestTimeout):
		t.Fatalf("no cancel request for job %s", id)
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

type chunk struct{ Node, Stream, Data string }

func collect(dst *[]chunk) client.OutputHandler {
	return func(node, stream string, data []byte) {
		*dst = append(*dst, chunk{node, stream, string(data)})
	}
}

func echoReq() *protocol.ExecRequest {
	return &protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"echo", "hi"}}
}

func TestExecStreamsOutputInOrder(t *testing.T) {
	s := runServer(t)
	want := protocol.ExecResult{Results: []protocol.NodeResult{
		{Node: "a", ExitCode: 0, StdoutBytes: 6},
		{Node: "b", ExitCode: 3, StderrBytes: 4},
	}}
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		f.reply(m, req.ID, protocol.ReplyStdout, "a", 0, []byte("hello\n"))
		f.reply(m, req.ID, protocol.ReplyStderr, "b", 1, []byte("oops"))
		f.reply(m, req.ID, protocol.ReplyStdout, "a", 2, []byte("more"))
		// A reply type newer than the client is skipped, its seq counted.
		f.reply(m, req.ID, "progress", "", 3, []byte("{}"))
		res := want
		res.ID = req.ID
		f.result(m, req.ID, 4, res)
	}, nil)

	c := client.New(connect(t, s))
	req := echoReq()
	var got []chunk
	res, err := c.Exec(testCtx(t), req, collect(&got))
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if req.ID == "" {
		t.Error("Exec did not set req.ID")
	}
	want.ID = req.ID
	if diff := cmp.Diff(&want, res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	wantChunks := []chunk{{"a", "stdout", "hello\n"}, {"b", "stderr", "oops"}, {"a", "stdout", "more"}}
	if diff := cmp.Diff(wantChunks, got); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
}

func TestExecKeepsCallerJobID(t *testing.T) {
	s := runServer(t)
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		f.result(m, req.ID, 0, protocol.ExecResult{ID: req.ID})
	}, nil)
	req := echoReq()
	req.ID = "my-job.1"
	res, err := client.New(connect(t, s)).Exec(testCtx(t), req, nil)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if res.ID != "my-job.1" || len(f.execs) != 1 || f.execs[0].ID != "my-job.1" {
		t.Errorf("job id: result %q, requests %+v", res.ID, f.execs)
	}
}

func TestExecSequenceGap(t *testing.T) {
	s := runServer(t)
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		f.reply(m, req.ID, protocol.ReplyStdout, "a", 0, []byte("x"))
		f.reply(m, req.ID, protocol.ReplyStdout, "a", 2, []byte("z"))
		f.result(m, req.ID, 3, protocol.ExecResult{ID: req.ID})
	}, nil)
	req := echoReq()
	var got []chunk
	_, err := client.New(connect(t, s)).Exec(testCtx(t), req, collect(&got))
	if err == nil || !strings.Contains(err.Error(), "reply 1 is missing") {
		t.Fatalf("Exec error = %v, want one naming missing reply 1", err)
	}
	if len(got) != 1 {
		t.Errorf("output before the gap: %v", got)
	}
	f.waitCancel(t, req.ID) // the abandoned job is cancelled
}

func TestExecOutputWithoutSeq(t *testing.T) {
	s := runServer(t)
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		f.reply(m, req.ID, protocol.ReplyStdout, "a", -1, []byte("x"))
	}, nil)
	_, err := client.New(connect(t, s)).Exec(testCtx(t), echoReq(), nil)
	if err == nil || !strings.Contains(err.Error(), "no Tether-Seq header") {
		t.Fatalf("Exec error = %v", err)
	}
}

func TestExecAPIError(t *testing.T) {
	s := runServer(t)
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		microError(m, protocol.NewAPIError(404, protocol.ErrCodeUnknownNode, "node %q is not connected", req.Target.Node))
	}, nil)
	req := &protocol.ExecRequest{Target: protocol.Target{Node: "ghost"}, Script: "true"}
	_, err := client.New(connect(t, s)).Exec(testCtx(t), req, nil)
	var apiErr *protocol.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("Exec error = %v (%T), want *protocol.APIError", err, err)
	}
	want := &protocol.APIError{Status: 404, Code: protocol.ErrCodeUnknownNode, Message: `node "ghost" is not connected`}
	if diff := cmp.Diff(want, apiErr); diff != "" {
		t.Errorf("APIError (-want +got):\n%s", diff)
	}
	if !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeUnknownNode}) {
		t.Error("errors.Is by code failed")
	}
}

func TestExecPlainMicroError(t *testing.T) {
	s := runServer(t)
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		h := nats.Header{}
		h.Set("Nats-Service-Error-Code", "500")
		h.Set("Nats-Service-Error", "handler exploded")
		m.RespondMsg(&nats.Msg{Header: h})
	}, nil)
	_, err := client.New(connect(t, s)).Exec(testCtx(t), echoReq(), nil)
	var apiErr *protocol.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 500 || apiErr.Message != "handler exploded" {
		t.Fatalf("Exec error = %#v", err)
	}
}

func TestExecValidatesLocally(t *testing.T) {
	s := runServer(t)
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		t.Error("an invalid request reached the coordinator")
	}, nil)
	_, err := client.New(connect(t, s)).Exec(testCtx(t), &protocol.ExecRequest{Argv: []string{"true"}}, nil)
	if !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeNoTarget}) {
		t.Fatalf("Exec error = %v, want no_target", err)
	}
	f.nc.Flush()
}

func TestNoCoordinator(t *testing.T) {
	s := runServer(t)
	c := client.New(connect(t, s))
	checks := map[string]func() error{
		protocol.SubjectExec: func() error {
			_, err := c.Exec(testCtx(t), echoReq(), nil)
			return err
		},
		protocol.SubjectNodes: func() error {
			_, err := c.Nodes(testCtx(t), "")
			return err
		},
		protocol.SubjectCancel: func() error {
			_, err := c.Cancel(context.Background(), "x")
			return err
		},
	}
	for subject, call := range checks {
		t.Run(subject, func(t *testing.T) {
			start := time.Now()
			err := call()
			if !errors.Is(err, nats.ErrNoResponders) {
				t.Fatalf("error = %v, want nats.ErrNoResponders", err)
			}
			want := "no Tether coordinator is serving " + subject + " at nats://127.0.0.1:"
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not contain %q", err, want)
			}
			// At once, not when a timeout ends the wait (the error
			// says no responders; the bound is for a loaded machine).
			if d := time.Since(start); d > client.DefaultRequestTimeout {
				t.Errorf("took %v to notice", d)
			}
		})
	}
}

// A job that is silent for longer than RequestTimeout still succeeds: the
// timeout only covers the request's delivery.
func TestExecSilentJob(t *testing.T) {
	s := runServer(t)
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		time.AfterFunc(300*time.Millisecond, func() {
			f.result(m, req.ID, 0, protocol.ExecResult{ID: req.ID, Results: []protocol.NodeResult{{Node: "a"}}})
		})
	}, nil)
	c := &client.Client{NC: connect(t, s), RequestTimeout: 50 * time.Millisecond}
	res, err := c.Exec(testCtx(t), echoReq(), nil)
	if err != nil || len(res.Results) != 1 {
		t.Fatalf("Exec = %+v, %v", res, err)
	}
}

func TestExecCancel(t *testing.T) {
	s := runServer(t)
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		f.reply(m, req.ID, protocol.ReplyStdout, "a", 0, []byte("started\n"))
		go func() {
			// Answer the cancel the way the coordinator does: a final
			// result marking the node cancelled.
			id := <-f.cancels
			f.result(m, id, 1, protocol.ExecResult{ID: id, Results: []protocol.NodeResult{{Node: "a", ExitCode: 137, Signal: "killed", Cancelled: true}}})
		}()
	}, nil)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	req := echoReq()
	res, err := client.New(connect(t, s)).Exec(ctx, req, func(node, stream string, data []byte) { cancel() })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec error = %v, want context.Canceled", err)
	}
	if res == nil || res.ID != req.ID || len(res.Results) != 1 || !res.Results[0].Cancelled {
		t.Fatalf("Exec result = %+v, want the cancelled result", res)
	}
}

func TestExecCancelWithoutResult(t *testing.T) {
	s := runServer(t)
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {}, nil)
	req := echoReq()
	c := &client.Client{NC: connect(t, s), CancelGrace: 100 * time.Millisecond}
	// The deadline starts once connected: under load the connect alone can
	// outlast it, and Exec then refuses before sending anything.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	res, err := c.Exec(ctx, req, nil)
	if !errors.Is(err, context.DeadlineExceeded) || res != nil {
		t.Fatalf("Exec = %+v, %v; want nil, deadline exceeded", res, err)
	}
	if !strings.Contains(err.Error(), "no result within") {
		t.Errorf("error %q does not explain the missing result", err)
	}
	f.waitCancel(t, req.ID)
}

func TestNodes(t *testing.T) {
	s := runServer(t)
	connected := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	nodes := []protocol.NodeInfo{{ID: "a", Labels: map[string]string{"gpu": "true"}, ConnectedAt: connected, LastHeartbeat: connected}}
	var (
		mu          sync.Mutex
		gotSelector string
	)
	newFake(t, s, nil, func(m *nats.Msg) {
		var req protocol.NodesRequest
		json.Unmarshal(m.Data, &req)
		mu.Lock()
		gotSelector = req.Selector
		mu.Unlock()
		if req.Selector == "bad" {
			microError(m, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "bad selector"))
			return
		}
		b, _ := json.Marshal(protocol.NodesResponse{Nodes: nodes})
		m.Respond(b)
	})
	c := client.New(connect(t, s))
	got, err := c.Nodes(testCtx(t), "gpu=true")
	if err != nil {
		t.Fatalf("Nodes: %v", err)
	}
	if diff := cmp.Diff(nodes, got); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	mu.Lock()
	if gotSelector != "gpu=true" {
		t.Errorf("selector sent = %q", gotSelector)
	}
	mu.Unlock()
	if _, err := c.Nodes(testCtx(t), "bad"); !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeInvalid}) {
		t.Errorf("Nodes(bad) error = %v, want invalid_request", err)
	}
}

func TestCancel(t *testing.T) {
	s := runServer(t)
	f := newFake(t, s, nil, nil)
	resp, err := client.New(connect(t, s)).Cancel(testCtx(t), "job-1")
	if err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if diff := cmp.Diff(&protocol.CancelResponse{ID: "job-1", Cancelled: true}, resp); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}
	f.waitCancel(t, "job-1")
}

// Nodes pages through a long list transparently.
func TestNodesPages(t *testing.T) {
	s := runServer(t)
	var nodes []protocol.NodeInfo
	for i := range 1234 {
		nodes = append(nodes, protocol.NodeInfo{ID: fmt.Sprintf("n%04d", i), Labels: map[string]string{}})
	}
	var (
		mu    sync.Mutex
		pages []protocol.NodesRequest
	)
	newFake(t, s, nil, func(m *nats.Msg) {
		var req protocol.NodesRequest
		json.Unmarshal(m.Data, &req)
		mu.Lock()
		pages = append(pages, req)
		mu.Unlock()
		if req.Limit > 300 {
			// As if the page did not fit the server's max payload.
			microError(m, protocol.NewAPIError(413, protocol.ErrCodeTooLarge, "reply too large"))
			return
		}
		from := min(req.Offset, len(nodes))
		to := min(from+req.Limit, len(nodes))
		b, _ := json.Marshal(protocol.NodesResponse{Nodes: nodes[from:to], Total: len(nodes)})
		m.Respond(b)
	})
	c := client.New(connect(t, s))
	got, err := c.Nodes(testCtx(t), "")
	if err != nil {
		t.Fatalf("Nodes: %v", err)
	}
	if diff := cmp.Diff(nodes, got); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []protocol.NodesRequest{{Limit: 500}, {Limit: 250}, {Limit: 250, Offset: 250}, {Limit: 250, Offset: 500},
		{Limit: 250, Offset: 750}, {Limit: 250, Offset: 1000}, {Limit: 250, Offset: 1250}}
	want = want[:len(want)-1] // 1234 nodes: the page at 1000 holds the last 234
	if diff := cmp.Diff(want, pages); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}
