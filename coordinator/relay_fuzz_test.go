package coordinator

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// FuzzRelayDefaultTimeout: the stream relay adds the coordinator's
// default timeout to exec params that a client sent without one
// (withDefaultTimeout), after checking them as the agent will
// (protocol.CheckStreamParams). Params the check accepts stay accepted
// with the timeout added, keep a timeout they had, and get one of at least
// the default when they had none (or are passed on unchanged when the
// timeout would not fit the header).
func FuzzRelayDefaultTimeout(f *testing.F) {
	for _, s := range []string{`{"argv":["true"]}`, `{"argv":["true"],"timeout_ms":0}`, `{"argv":["true"],"timeout_ms":5}`, `{"script":"echo <&>"}`,
		`{"argv":["x"], "env":{"A":"\u2028"}}`, `{"path":"/x","direction":"push"}`} {
		f.Add([]byte(s), int64(time.Minute))
	}
	f.Fuzz(func(t *testing.T, params []byte, d int64) {
		if protocol.CheckStreamParams(protocol.KindExec, params) != nil {
			return
		}
		def := time.Duration(d)
		if def > time.Duration(protocol.MaxTimeoutMS)*time.Millisecond {
			return // Config.Validate bounds the default
		}
		out := withDefaultTimeout(params, def)
		if err := protocol.CheckStreamParams(protocol.KindExec, out); err != nil {
			t.Fatalf("%q with default %v → %q: refused: %v", params, def, out, err)
		}
		var before, after protocol.ExecParams
		h := protocol.Header{Kind: protocol.KindExec}
		h.Params = params
		h.DecodeParams(&before)
		h.Params = out
		h.DecodeParams(&after)
		switch {
		case before.TimeoutMS != 0 && after.TimeoutMS != before.TimeoutMS:
			t.Fatalf("%q: timeout %d ms replaced by %d", params, before.TimeoutMS, after.TimeoutMS)
		case before.TimeoutMS == 0 && def > 0 && after.TimeoutMS != 0 && time.Duration(after.TimeoutMS)*time.Millisecond < def:
			t.Fatalf("%q: default %v sent as %d ms", params, def, after.TimeoutMS)
		case before.TimeoutMS == 0 && def > 0 && after.TimeoutMS == 0 && len(out) != len(params):
			t.Fatalf("%q: changed to %q without a timeout", params, out)
		}
		after.TimeoutMS = before.TimeoutMS
		if before.Script != after.Script || len(before.Argv) != len(after.Argv) || len(before.Env) != len(after.Env) {
			t.Fatalf("%q → %q: more than the timeout changed", params, out)
		}
	})
}
