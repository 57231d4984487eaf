package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/protocol"
)

// `job logs --follow` rides through the outages a restart of the job's
// agent (or of the coordinator) causes, and stops on everything else.
func TestFollowRetryable(t *testing.T) {
	live := context.Background()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"node not connected", live, protocol.NewAPIError(404, protocol.ErrCodeUnknownNode, "node n is not connected"), true},
		{"node not answering", live, fmt.Errorf("job output: %w", protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "no answer")), true},
		{"no coordinator", live, fmt.Errorf("no Tether coordinator (%w)", nats.ErrNoResponders), true},
		{"request timed out", live, fmt.Errorf("request: %w", context.DeadlineExceeded), true},
		{"no such job", live, protocol.NewAPIError(404, protocol.ErrCodeNotFound, "no job"), false},
		{"refused", live, protocol.NewAPIError(403, protocol.ErrCodeForbidden, "no"), false},
		{"other", live, errors.New("boom"), false},
		{"interrupted", done, fmt.Errorf("x: %w", nats.ErrNoResponders), false},
	} {
		if got := followRetryable(tt.ctx, tt.err); got != tt.want {
			t.Errorf("%s: followRetryable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// Two job ids are refused as two, not as a missing one (it said "give
// the job id" when given two).
func TestJobTwoIDsSaysSo(t *testing.T) {
	for _, sub := range []string{"status", "wait", "logs", "cancel"} {
		r := runCLI(testCtx(t), nil, "", "job", sub, "a1", "b2")
		if r.code != 2 || !strings.Contains(r.stderr, `give one job id, not 2 arguments ("b2"`) {
			t.Errorf("job %s a1 b2: exit %d, stderr %q; want 2 and one job id, not 2", sub, r.code, r.stderr)
		}
	}
	if r := runCLI(testCtx(t), nil, "", "job", "status"); r.code != 2 || !strings.Contains(r.stderr, "give the job id") {
		t.Errorf("job status: exit %d, stderr %q; want 2 and give the job id", r.code, r.stderr)
	}
}

// TestJobWaitOutcomeOfAFailedStart: a detached job the node could not start
// ends `job wait` as `tether exec` ends for it (127 for a command not
// found), saying why, not with "no exit status recorded".
func TestJobWaitOutcomeOfAFailedStart(t *testing.T) {
	rec := &protocol.JobRecord{ID: "j1", State: protocol.JobFailed, Nodes: []string{"vm"}, Results: []protocol.NodeResult{{
		Node: "vm", ExitCode: -1, Error: "start /no/such/cmd: no such file or directory", ErrorCode: protocol.CodeCommandNotFound}}}
	var ee *exitError
	if err := jobRecordOutcome(rec); !errors.As(err, &ee) || ee.code != exitNotFound || !strings.Contains(ee.err.Error(), "/no/such/cmd") {
		t.Fatalf("outcome = %v, want exit %d naming the command", err, exitNotFound)
	}
	rec.Results[0] = protocol.NodeResult{Node: "vm", ExitCode: 3}
	if err := jobRecordOutcome(rec); !errors.As(err, &ee) || ee.code != 3 {
		t.Fatalf("outcome of exit 3 = %v", err)
	}
}
