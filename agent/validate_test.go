package agent

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// An exec whose params name nothing the agent can run (an empty command, in
// every mode) is answered with a bad_request error frame naming it, and the
// agent keeps serving the session: the next exec runs.
func TestExecEmptyCommandIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	for _, params := range []string{
		`{"commands":[""]}`,
		`{"commands":[""],"fail_fast":true}`,
		`{"commands":["true",""],"fail_fast":true}`,
		`{"commands":[""],"detach":true,"job_id":"empty-1"}`,
	} {
		t.Run(params, func(t *testing.T) {
			e := h.open(t, protocol.KindExec, json.RawMessage(params))
			e.finish(t)
			if e.errInfo == nil || e.errInfo.Code != protocol.CodeBadRequest || !strings.Contains(e.errInfo.Message, "] is empty") {
				t.Fatalf("got exit %+v, error %+v; want a bad_request naming the empty command", e.exit, e.errInfo)
			}
		})
	}
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Commands: []string{"echo still here"}})
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 || e.stdout.String() != "still here\n" {
		t.Fatalf("exec after the refusals: exit %+v, error %+v, stdout %q", e.exit, e.errInfo, e.stdout.String())
	}
}
