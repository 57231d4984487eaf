package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
)

// fakeExecAgent answers tether.v1.stream with a pipe on which agent plays
// the node's side of an exec stream. It returns the params it was sent.
func fakeExecAgent(t *testing.T, nc *nats.Conn, agent func(p *natspipe.Pipe, params protocol.ExecParams)) <-chan protocol.ExecParams {
	t.Helper()
	got := make(chan protocol.ExecParams, 4)
	var wg sync.WaitGroup
	sub, err := nc.Subscribe(protocol.SubjectStream, func(m *nats.Msg) {
		if refuseDirect(m) {
			return
		}
		var req protocol.StreamRequest
		var params protocol.ExecParams
		if err := json.Unmarshal(m.Data, &req); err != nil || json.Unmarshal(req.Params, &params) != nil {
			t.Errorf("fake: bad stream request %s", m.Data)
			return
		}
		p, err := acceptPipe(nc, m)
		if err != nil {
			t.Error(err)
			return
		}
		got <- params
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.Close()
			agent(p, params)
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	t.Cleanup(func() {
		sub.Unsubscribe()
		wg.Wait()
	})
	return got
}

// readStdin reads the client's frames until stdin close or cancel and
// returns the stdin bytes and the frame that ended them.
func readStdin(p io.Reader) ([]byte, protocol.FrameType, error) {
	var in bytes.Buffer
	fr := protocol.NewFrameReader(p)
	for {
		f, err := fr.Next()
		if err != nil {
			return in.Bytes(), 0, err
		}
		switch f.Type {
		case protocol.FrameStdin:
			in.Write(f.Payload)
		case protocol.FrameStdinClose, protocol.FrameCancel:
			return in.Bytes(), f.Type, nil
		}
	}
}

func TestExecStream(t *testing.T) {
	s := runServer(t)
	params := fakeExecAgent(t, serve(t, s), func(p *natspipe.Pipe, _ protocol.ExecParams) {
		in, end, err := readStdin(p)
		if err != nil || end != protocol.FrameStdinClose {
			t.Errorf("fake agent: stdin ended with %v, %v", end, err)
			return
		}
		protocol.WriteFrame(p, protocol.FrameStdout, in)
		protocol.WriteFrame(p, protocol.FrameStderr, []byte("oops\n"))
		protocol.WriteJSONFrame(p, protocol.FrameExit, protocol.ExitStatus{ExitCode: 3, StdoutBytes: int64(len(in)), StderrBytes: 5, StdoutTruncated: true})
		p.CloseWrite()
	})
	c := client.New(connect(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	var out bytes.Buffer
	var results []*protocol.NodeResult
	req := &protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"cat", "-"}}
	data := bytes.Repeat([]byte("0123456789"), 100_000) // 1 MB: over one pipe window
	res, err := c.ExecStream(ctx, req, bytes.NewReader(data), client.ExecOptions{
		Output:     func(node, stream string, b []byte) { out.Write(b) },
		NodeResult: func(r *protocol.NodeResult) { results = append(results, r) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if p := <-params; !p.Stdin || strings.Join(p.Argv, " ") != "cat -" {
		t.Errorf("params = %+v", p)
	}
	if !bytes.Equal(out.Bytes(), append(data, "oops\n"...)) {
		t.Errorf("output is %d bytes, want %d", out.Len(), len(data)+5)
	}
	r := res.Results[0]
	if res.ID != req.ID || res.Nodes != 1 || res.Failed != 1 || !res.Truncated || len(results) != 1 ||
		r.Node != "n1" || r.ExitCode != 3 || !r.Truncated || r.Failure != "Command failed (exec on n1) with exit code 3:\n  cat -\noops" {
		t.Errorf("result = %+v, node result %+v", res, r)
	}

	// Only one node, and stdin as a reader.
	for _, bad := range []*protocol.ExecRequest{
		{Target: protocol.Target{All: true}, Argv: []string{"cat"}},
		{Target: protocol.Target{Node: "n1"}, Argv: []string{"cat"}, Stdin: []byte("x")},
	} {
		if _, err := c.ExecStream(ctx, bad, nil, client.ExecOptions{}); !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeInvalid}) {
			t.Errorf("ExecStream(%+v) = %v, want invalid_request", bad.Target, err)
		}
	}
}

// errReader returns its data, then err.
type errReader struct {
	data []byte
	err  error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// A stdin that fails is not passed off as a complete one: the command is
// cancelled and the error returned.
func TestExecStreamStdinError(t *testing.T) {
	s := runServer(t)
	ended := make(chan error, 1)
	fakeExecAgent(t, serve(t, s), func(p *natspipe.Pipe, _ protocol.ExecParams) {
		_, _, err := readStdin(p)
		ended <- err
		protocol.WriteJSONFrame(p, protocol.FrameExit, protocol.ExitStatus{ExitCode: 143, Cancelled: true})
		p.CloseWrite()
	})
	c := client.New(connect(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	broken := errors.New("disk on fire")
	res, err := c.ExecStream(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"cat"}}, &errReader{data: []byte("partial"), err: broken}, client.ExecOptions{})
	if !errors.Is(err, broken) || !strings.Contains(err.Error(), "read standard input") {
		t.Errorf("err = %v, want the read error", err)
	}
	// The cancel is the pipe's reset (out of band; the coordinator then
	// cancels the command), not a stdin close.
	if err := <-ended; !errors.Is(err, natspipe.ErrPeerReset) {
		t.Errorf("the agent's side saw stdin end with %v, want the client's reset (a cancel)", err)
	}
	if res == nil || !res.Results[0].Cancelled {
		t.Errorf("result = %+v, want the cancelled exit", res)
	}
}

// Ending ctx cancels the command and returns its exit with ctx's error.
func TestExecStreamCancel(t *testing.T) {
	s := runServer(t)
	fakeExecAgent(t, serve(t, s), func(p *natspipe.Pipe, _ protocol.ExecParams) {
		protocol.WriteFrame(p, protocol.FrameStdout, []byte("started\n"))
		if _, _, err := readStdin(p); !errors.Is(err, natspipe.ErrPeerReset) {
			t.Errorf("fake agent: stdin ended with %v, want the client's reset (a cancel)", err)
		}
		protocol.WriteJSONFrame(p, protocol.FrameExit, protocol.ExitStatus{ExitCode: 143, Cancelled: true})
		p.CloseWrite()
	})
	c := client.New(connect(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	pr, pw := io.Pipe() // a stdin that never ends
	defer pw.Close()
	res, err := c.ExecStream(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"cat"}}, pr, client.ExecOptions{
		Output: func(string, string, []byte) { cancel() },
	})
	if !errors.Is(err, context.Canceled) || res == nil || !res.Results[0].Cancelled {
		t.Errorf("ExecStream = %+v, %v; want the cancelled result and context.Canceled", res, err)
	}
}
