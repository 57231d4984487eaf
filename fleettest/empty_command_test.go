package fleettest_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// An empty command, sent every way a client can (the exec API to one node
// and to all, detached, and raw through the stream relay), is refused with
// an error naming it, and the
// in-process fleet (embedded NATS, coordinator and agents in one process,
// as `tether dev` runs them) keeps serving: a job on every node runs
// afterwards.
func TestEmptyCommandEndToEnd(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Agents: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for _, req := range []protocol.ExecRequest{
		{Target: protocol.Target{Node: "node-0"}, Commands: []string{""}},
		{Target: protocol.Target{All: true}, Commands: []string{""}},
		{Target: protocol.Target{All: true}, Commands: []string{""}, Detach: true},
		{Target: protocol.Target{Node: "node-1"}, Commands: []string{"true", ""}, FailFast: true},
	} {
		_, err := f.Client.Exec(ctx, &req, nil)
		var ae *protocol.APIError
		if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Message, "] is empty") {
			t.Errorf("exec %+v: err = %v, want a 400 naming the empty command", req, err)
		}
	}

	// The stream relay checks params with the agent's own rules: refused
	// on the request, before any stream opens (the agent's refusal of
	// the same params on a stream is tested in the agent package).
	for _, params := range []string{
		`{"commands":[""]}`,
		`{"commands":[""],"detach":true,"job_id":"j-empty"}`,
	} {
		st, err := f.Client.OpenStream(ctx, "node-0", protocol.KindExec, json.RawMessage(params))
		if err == nil {
			st.Close()
		}
		var ae *protocol.APIError
		if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Message, "commands[0] is empty") {
			t.Errorf("open stream %s: err = %v, want a 400 naming commands[0]", params, err)
		}
	}

	var out strings.Builder
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{All: true}, Commands: []string{"echo alive"}},
		func(_, stream string, data []byte) { out.Write(data) })
	if err != nil {
		t.Fatal(err)
	}
	if res.Nodes != 2 || res.Succeeded != 2 || out.String() != "alive\nalive\n" {
		t.Fatalf("after the empty commands: %+v, output %q; want both nodes alive", res, out.String())
	}
}
