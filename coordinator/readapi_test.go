package coordinator_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// TestJobOutputReadAPI: JobOutput reads a detached job's output through
// the node's tunnel from an offset, passes the agent's end (total, EOF),
// and names what failed: an unknown job, a node not connected here, bad
// parameters.
func TestJobOutputReadAPI(t *testing.T) {
	h := newHarness(t, nil)
	const out = "line one\nline two\n"
	h.dialAgent(t, agentOpts{id: "n1", stream: func(_ *fakeAgent, st *yamux.Stream, hd protocol.Header) {
		defer st.Close()
		var p protocol.JobParams
		if hd.Kind != protocol.KindJob || hd.DecodeParams(&p) != nil || p.Op != protocol.JobOpOutput {
			return
		}
		if p.ID != "j1" {
			protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: "job_not_found", Message: "no job " + p.ID})
			return
		}
		data := out[min(int(p.Offset), len(out)):]
		if int64(len(data)) > p.Limit {
			data = data[:p.Limit]
		}
		if len(data) > 0 {
			protocol.WriteFrame(st, protocol.FrameStdout, []byte(data))
		}
		protocol.WriteJSONFrame(st, protocol.FrameJob, &protocol.JobOutputEnd{Total: int64(len(out)), EOF: p.Stream == protocol.ReplyStderr})
	}})
	ctx := context.Background()
	data, end, err := h.c.JobOutput(ctx, "n1", "j1", protocol.ReplyStdout, 5, 3)
	if err != nil || string(data) != "one" || end.Total != int64(len(out)) || end.EOF {
		t.Errorf("offset 5 limit 3: %q %+v %v; want \"one\", total %d, not EOF", data, end, err, len(out))
	}
	data, end, err = h.c.JobOutput(ctx, "n1", "j1", protocol.ReplyStderr, int64(len(out)), 0)
	if err != nil || len(data) != 0 || !end.EOF {
		t.Errorf("at the end: %q %+v %v; want nothing and EOF", data, end, err)
	}
	if _, _, err := h.c.JobOutput(ctx, "n1", "nope", protocol.ReplyStdout, 0, 0); !errors.Is(err, jobstore.ErrNoSuchJob) {
		t.Errorf("unknown job: %v, want ErrNoSuchJob", err)
	}
	if _, _, err := h.c.JobOutput(ctx, "n2", "j1", protocol.ReplyStdout, 0, 0); !errors.Is(err, coordinator.ErrNotHere) {
		t.Errorf("a node not connected: %v, want ErrNotHere", err)
	}
	if _, _, err := h.c.JobOutput(ctx, "n1", "j1", "stdin", 0, 0); err == nil {
		t.Error("stream stdin: no error")
	}
}
