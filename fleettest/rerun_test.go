package fleettest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestFleetLostIdempotentJobRunsAgain, end to end with a real agent: a
// detached idempotent job whose first run kills its supervisor (the job
// shim: the agent reports the job lost) is run again by the coordinator
// on its own, and the second attempt succeeds.
func TestFleetLostIdempotentJobRunsAgain(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Jobs: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	marker := filepath.Join(t.TempDir(), "ran-once")
	script := "if [ ! -e " + marker + " ]; then touch " + marker + "; kill -9 $PPID; sleep 30; fi\necho done"
	if _, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: "again", Target: protocol.Target{Node: "node-0"}, Detach: true, Idempotent: true, Script: script}, nil); err != nil {
		t.Fatal(err)
	}
	rec, err := f.Client.JobWait(ctx, "again", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != protocol.JobStateLost {
		t.Fatalf("first attempt %s (%s), want lost", rec.State, rec.Error)
	}
	for rec.RerunAs == "" && rec.NoRerun == "" && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		if rec, err = f.Client.JobGet(ctx, "again"); err != nil {
			t.Fatal(err)
		}
	}
	if rec.RerunAs != "again.2" {
		t.Fatalf("lost record %+v, want re-run as again.2", rec)
	}
	next, err := f.Client.JobWait(ctx, "again.2", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if next.State != protocol.JobSucceeded || next.Attempt != 2 || next.RerunOf != "again" {
		t.Fatalf("re-run %+v, want attempt 2 succeeded", next)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal(err)
	}
}
