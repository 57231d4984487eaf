package protocol_test

import (
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// FuzzJobRequests feeds arbitrary bodies to the job endpoints' decoders and
// the job stream's params: they must never panic, and whatever validates
// must name a stream and an id that are safe as file names.
func FuzzJobRequests(f *testing.F) {
	f.Add([]byte(`{"node":"a","id":"j1","stream":"stdout","offset":3,"limit":10}`))
	f.Add([]byte(`{"node":"a","id":"../x"}`))
	f.Add([]byte(`{"op":"output","id":"j","stream":"stderr"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var o protocol.JobOutputRequest
		if protocol.DecodeRequest(b, &o) == nil && o.Validate() == nil {
			if o.Stream != "stdout" && o.Stream != "stderr" {
				t.Fatalf("stream %q validated", o.Stream)
			}
			if o.ID == "." || o.ID == ".." || len(o.ID) == 0 {
				t.Fatalf("id %q validated", o.ID)
			}
		}
		var r protocol.JobRequest
		if protocol.DecodeRequest(b, &r) == nil {
			r.Validate()
		}
		h := protocol.Header{Version: protocol.Version, Kind: protocol.KindJob, Params: b}
		var p protocol.JobParams
		if h.DecodeParams(&p) == nil {
			p.Validate()
		}
	})
}
