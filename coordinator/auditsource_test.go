package coordinator_test

import (
	"net"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/protocol"
)

// TestAuditSourceOfNATSRequest: a NATS request's event names the client's
// IP as the NATS server saw its connection (the host of the
// Nats-Request-Info header the server stamps crossing the import), not
// one the client wrote in that header itself; the server gives no port.
// The request is answered with an error (no such job), as a burst of bad
// requests would be.
func TestAuditSourceOfNATSRequest(t *testing.T) {
	f, _ := auditFleet(t, nil)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.7")}, Timeout: defaultTestTimeout}
	nc := natsauthtest.Connect(t, f.NATS.ClientURL(), natsauthtest.ClientCreds(t, f.Layout, "from7"), nats.SetCustomDialer(d))
	hdr := nats.Header{"Nats-Request-Info": {`{"acc":"CLIENTS","user":"UFORGED","host":"203.0.113.9"}`}}
	m, err := nc.RequestMsg(&nats.Msg{Subject: protocol.SubjectCancel, Data: []byte(`{"id":"source-job"}`), Header: hdr}, defaultTestTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("Nats-Service-Error-Code") == "" {
		t.Fatalf("cancel of no job answered %s, want an error", m.Data)
	}
	ev := auditEvents(t, f.NC, nil, protocol.AuditQueryRequest{JobID: "source-job"}, func(*protocol.AuditEvent) bool { return true })
	if ev.Source != "127.0.0.7" || ev.Identity != "nats:from7" {
		t.Errorf("event of a request from 127.0.0.7: source %q, identity %q; want 127.0.0.7, nats:from7 (%+v)", ev.Source, ev.Identity, ev)
	}
}
