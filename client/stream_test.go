package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
)

// fakeStreamService answers tether.v1.stream like the coordinator: a
// request for node "echo" gets a pipe that echoes its bytes back (and the
// request as the first bytes), any other node a 404 micro error.
func fakeStreamService(t *testing.T, nc *nats.Conn) {
	t.Helper()
	done := make(chan struct{})
	pipes := make(chan *natspipe.Pipe, 4)
	sub, err := nc.Subscribe(protocol.SubjectStream, func(m *nats.Msg) {
		if refuseDirect(m) {
			return
		}
		var req protocol.StreamRequest
		if err := json.Unmarshal(m.Data, &req); err != nil || req.Node != "echo" {
			r := nats.NewMsg(m.Reply)
			r.Header.Set(micro.ErrorCodeHeader, "404")
			r.Header.Set(micro.ErrorHeader, "node is not connected")
			r.Data, _ = json.Marshal(protocol.NewAPIError(404, protocol.ErrCodeUnknownNode, "node %q is not connected to coordinator fake", req.Node))
			m.RespondMsg(r)
			return
		}
		p, err := acceptPipe(nc, m)
		if err != nil {
			t.Error(err)
			return
		}
		pipes <- p
	})
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	go func() {
		defer close(done)
		for p := range pipes {
			p.Write(append([]byte(nil), "params="...))
			io.Copy(p, p)
			p.CloseWrite()
			p.Close()
		}
	}()
	t.Cleanup(func() {
		sub.Unsubscribe()
		close(pipes)
		<-done
	})
}

func TestOpenStream(t *testing.T) {
	s := runServer(t)
	fakeStreamService(t, serve(t, s))
	c := client.New(connect(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	st, err := c.OpenStream(ctx, "echo", protocol.KindExec, protocol.ExecParams{Argv: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(st)
	if err != nil || string(got) != "params=ping" {
		t.Fatalf("read %q, %v", got, err)
	}
	if err := st.Err(); err != nil {
		t.Errorf("Err = %v", err)
	}
	if err := st.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if _, err := st.Read(make([]byte, 1)); !errors.Is(err, natspipe.ErrClosed) || !strings.Contains(err.Error(), "exec stream on node echo") {
		t.Errorf("Read after Close = %v", err)
	}

	// A refusal is the coordinator's APIError.
	_, err = c.OpenStream(ctx, "node-x", protocol.KindExec, protocol.ExecParams{Argv: []string{"cat"}})
	var apiErr *protocol.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != protocol.ErrCodeUnknownNode || !strings.Contains(apiErr.Message, `"node-x"`) {
		t.Errorf("refused OpenStream = %v, want unknown_node APIError", err)
	}
}

func TestOpenStreamNoCoordinator(t *testing.T) {
	s := runServer(t)
	c := client.New(connect(t, s))
	_, err := c.OpenStream(context.Background(), "a", protocol.KindPTY, protocol.PTYParams{})
	if !errors.Is(err, nats.ErrNoResponders) || !strings.Contains(err.Error(), "no Tether coordinator is serving tether.v1.stream") {
		t.Errorf("OpenStream without coordinator = %v", err)
	}
}
