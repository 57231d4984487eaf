package client_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// Node results stream to the handler; a result that omits them (too large
// for one message) is rebuilt from them. Probes and keepalives are skipped.
func TestExecWithNodeResults(t *testing.T) {
	s := runServer(t)
	nodes := []protocol.NodeResult{{Node: "b", ExitCode: 1, Failure: "Command failed (exec on b) with exit code 1:\n  bash -s\n"}, {Node: "a"}}
	newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		f.reply(m, req.ID, protocol.ReplyProbe, "", -1, nil)
		for i, r := range nodes {
			b, _ := json.Marshal(r)
			f.reply(m, req.ID, protocol.ReplyNodeResult, r.Node, 2*i, b)
			f.reply(m, req.ID, protocol.ReplyKeepAlive, "", 2*i+1, nil)
		}
		f.result(m, req.ID, 4, protocol.ExecResult{ID: req.ID, ResultsOmitted: true, Nodes: 2, Succeeded: 1, Failed: 1})
	}, nil)
	c := client.New(connect(t, s))
	var got []string
	res, err := c.ExecWith(testCtx(t), echoReq(), client.ExecOptions{NodeResult: func(r *protocol.NodeResult) { got = append(got, r.Node) }})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"b", "a"}, got); diff != "" {
		t.Errorf("node result calls (-want +got):\n%s", diff)
	}
	want := []protocol.NodeResult{nodes[1], nodes[0]}
	if diff := cmp.Diff(want, res.Results); diff != "" || res.ResultsOmitted || res.Failed != 1 {
		t.Errorf("rebuilt results (-want +got):\n%s (%+v)", diff, res)
	}
}

// A coordinator that falls silent (no keepalives) fails Exec with a clear
// error, and the job is cancelled.
func TestExecCoordinatorSilent(t *testing.T) {
	s := runServer(t)
	f := newFake(t, s, func(f *fake, m *nats.Msg, req protocol.ExecRequest) {
		f.reply(m, req.ID, protocol.ReplyKeepAlive, "", 0, nil) // then nothing
	}, nil)
	c := client.New(connect(t, s))
	c.KeepAliveTimeout = 200 * time.Millisecond
	req := echoReq()
	req.ID = "quiet"
	start := time.Now()
	_, err := c.Exec(testCtx(t), req, nil)
	if !errors.Is(err, client.ErrCoordinatorSilent) ||
		err.Error() != "coordinator stopped answering for job quiet; it may have restarted — the job was cancelled or is lost" {
		t.Fatalf("Exec = %v, want the coordinator-silent error", err)
	}
	// After the KeepAliveTimeout set, not the default (the upper bound is
	// generous for a loaded machine).
	if d := time.Since(start); d < 200*time.Millisecond || d > client.DefaultKeepAliveTimeout/2 {
		t.Errorf("gave up after %v", d)
	}
	f.waitCancel(t, "quiet")
}
