package protocol_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

func TestDecodeJobExit(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		ok            bool
	}{
		{"exited", `{"id":"j1","node":"n1","state":"exited","exit_code":3,"started_at":"2026-12-02T10:00:00Z","finished_at":"2026-12-02T10:00:01Z","stdout_bytes":5,"stderr_bytes":0}`, true},
		{"lost", `{"id":"j1","node":"n1","state":"lost","started_at":"2026-12-02T10:00:00Z","stdout_bytes":0,"stderr_bytes":0}`, true},
		{"unknown fields skipped", `{"id":"j1","state":"lost","later":1}`, true},
		{"running is no exit", `{"id":"j1","state":"running"}`, false},
		{"unknown state", `{"id":"j1","state":"succeeded","exit_code":0}`, false},
		{"exited without code", `{"id":"j1","state":"exited"}`, false},
		{"bad id", `{"id":"../etc","state":"lost"}`, false},
		{"empty id", `{"id":"","state":"lost"}`, false},
		{"negative bytes", `{"id":"j1","state":"lost","stdout_bytes":-1}`, false},
		{"long signal", `{"id":"j1","state":"exited","exit_code":1,"signal":"` + strings.Repeat("S", 33) + `"}`, false},
		{"not json", `{"id":`, false},
		{"case-folded key", `{"ID":"j1","state":"lost"}`, false},
		{"duplicate key", `{"id":"j1","id":"j2","state":"lost"}`, false},
		{"too large", `{"id":"j1","state":"lost","x":"` + strings.Repeat("x", protocol.MaxJobExitSize) + `"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := protocol.DecodeJobExit([]byte(tc.payload))
			if tc.ok {
				if err != nil || st == nil || st.ID != "j1" {
					t.Fatalf("DecodeJobExit = %+v, %v; want the status", st, err)
				}
				return
			}
			if err == nil || !errors.Is(err, protocol.ErrBadJobExit) {
				t.Fatalf("DecodeJobExit = %+v, %v; want ErrBadJobExit", st, err)
			}
		})
	}
}

// TestJobExitNegotiated: the frame and feature are known, and a Welcome
// that lists the feature says so.
func TestJobExitNegotiated(t *testing.T) {
	if !protocol.FrameJobExit.Valid() || protocol.FrameJobExit != 27 || protocol.FrameJobExit.String() != "job-exit" {
		t.Fatalf("FrameJobExit = %d %q valid %v", protocol.FrameJobExit, protocol.FrameJobExit, protocol.FrameJobExit.Valid())
	}
	var w protocol.Welcome
	if err := protocol.DecodeJSON([]byte(`{"session_id":"s","features":["job_exit","later"]}`), &w); err != nil {
		t.Fatal(err)
	}
	if !w.HasFeature(protocol.FeatureJobExit) || (&protocol.Welcome{}).HasFeature(protocol.FeatureJobExit) {
		t.Errorf("Welcome.HasFeature wrong: %+v", w)
	}
}

// FuzzJobExit decodes arbitrary FrameJobExit payloads as the coordinator
// does: nothing panics, refusals are short and wrap ErrBadJobExit, and an
// accepted report names a valid job id and an end state, and is accepted
// again after a round trip.
func FuzzJobExit(f *testing.F) {
	for _, s := range []string{
		`{"id":"j1","node":"n1","state":"exited","exit_code":0,"started_at":"2026-12-02T10:00:00Z","finished_at":"2026-12-02T10:00:01Z","stdout_bytes":5,"stderr_bytes":0}`,
		`{"id":"j1","node":"n1","state":"exited","exit_code":137,"signal":"KILL","cancelled":true,"timed_out":true}`,
		`{"id":"j1","state":"lost"}`,
		`{"id":"j1","state":"running"}`,
		`{"id":"..","state":"lost"}`,
		`{"id":"j1","state":"exited","exit_code":1,"stdout_bytes":-4}`,
		`{"id":"j1","state":"lost","node":"` + strings.Repeat("n", 3000) + `"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := protocol.DecodeJobExit(data)
		if err != nil {
			if !errors.Is(err, protocol.ErrBadJobExit) {
				t.Fatalf("refusal %v does not wrap ErrBadJobExit", err)
			}
			checkProblems(t, fmt.Sprintf("job exit %.200q", data), err)
			return
		}
		if protocol.ValidJobID(st.ID) != nil || (st.State != protocol.JobExited && st.State != protocol.JobLost) {
			t.Fatalf("accepted %+v", st)
		}
		if st.State == protocol.JobExited && st.ExitCode == nil {
			t.Fatalf("accepted an exit without a code: %q", data)
		}
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > protocol.MaxJobExitSize {
			return // the node name alone may fill it; the agent's never does
		}
		again, err := protocol.DecodeJobExit(b)
		if err != nil || again.ID != st.ID || again.State != st.State {
			t.Fatalf("%q re-encoded as %q: %+v, %v", data, b, again, err)
		}
	})
}
