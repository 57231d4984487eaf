package protocol_test

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// CopyParams has its own UnmarshalJSON (for the *_b64 name twins); the
// strict rules must still hold inside it.
func TestCopyParamsStrict(t *testing.T) {
	for _, body := range []string{
		`{"Direction":"push","path":"/tmp/x"}`,
		`{"direction":"push","path":"/tmp/x","path":"/etc"}`,
		"{\"direction\":\"push\",\"path\":\"/tmp/\xff\"}",
	} {
		h := protocol.Header{Version: protocol.Version, Kind: protocol.KindCopy, Params: []byte(body)}
		var p protocol.CopyParams
		err := h.DecodeParams(&p)
		if err == nil || !strings.Contains(err.Error(), "malformed") {
			t.Errorf("DecodeParams(%q) = %v (%+v), want a malformed-JSON error", body, err, p)
		}
	}
	h := protocol.Header{Version: protocol.Version, Kind: protocol.KindCopy, Params: []byte(`{"direction":"push","path":"/tmp/x"}`)}
	var p protocol.CopyParams
	if err := h.DecodeParams(&p); err != nil || p.Path != "/tmp/x" {
		t.Errorf("DecodeParams(exact) = %v, %+v", err, p)
	}
}
