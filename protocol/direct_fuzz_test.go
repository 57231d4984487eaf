package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// FuzzDirectFrames decodes a payload as each direct frame's: the open
// (strictly, as the coordinator reads it), its ticket, and the control
// frames (as both sides read them). A refused open is an APIError of
// status 400 or 413; an accepted ticket formats back to the same text.
func FuzzDirectFrames(f *testing.F) {
	var t [protocol.DirectTicketSize]byte
	for i := range t {
		t[i] = byte(i)
	}
	f.Add([]byte(`{"ticket":"` + protocol.FormatDirectTicket(t) + `"}`))
	f.Add([]byte(`{"ticket":"x","node":"n"}`))
	f.Add([]byte(`{"stream":3,"error":"tunnel lost"}`))
	f.Add([]byte(`{"error":{"status":401,"code":"bad_ticket","message":"m"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var o protocol.DirectOpen
		if e := protocol.DecodeRequest(b, &o); e != nil {
			if e.Status != 400 && e.Status != 413 || e.Code == "" {
				t.Fatalf("open refused with %+v", e)
			}
		} else if tk, err := protocol.ParseDirectTicket(o.Ticket); err == nil {
			if protocol.FormatDirectTicket(tk) != o.Ticket {
				t.Fatalf("ticket %q formats back as %q", o.Ticket, protocol.FormatDirectTicket(tk))
			}
		}
		var a protocol.DirectAnswer
		if protocol.DecodeJSON(b, &a) == nil && a.Error != nil {
			if _, err := json.Marshal(a.Error); err != nil {
				t.Fatal(err)
			}
		}
		var ref protocol.DirectRef
		_ = protocol.DecodeJSON(b, &ref)
		var end protocol.DirectEnd
		_ = protocol.DecodeJSON(b, &end)
	})
}
