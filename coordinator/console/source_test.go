package console

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// TestAuditSourceIsTheTCPPeer: a console login refused for a wrong token
// is recorded with where it came from, the client's IP and port as the
// console's listener saw them; an X-Forwarded-For the client wrote is not
// it.
func TestAuditSourceIsTheTCPPeer(t *testing.T) {
	e := newEnv(t)
	local := ""
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.7")}}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			local = c.LocalAddr().String()
		}
		return c, err
	}}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", e.server.URL+"/console/login?token=wrong-token-0123456789", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong token's login: %d, want 401", resp.StatusCode)
	}
	if !strings.HasPrefix(local, "127.0.0.7:") {
		t.Fatalf("the client's local address is %q, want 127.0.0.7:PORT", local)
	}
	// The event is recorded after the answer was written: wait for it.
	var evs []protocol.AuditEvent
	for deadline := time.Now().Add(time.Minute); len(evs) == 0 && time.Now().Before(deadline); {
		evs = append(evs, e.audit.take()...)
		time.Sleep(time.Millisecond)
	}
	if len(evs) != 1 || evs[0].Operation != opLogin || evs[0].Reason != "unauthenticated" || evs[0].Source != local {
		t.Fatalf("recorded %+v, want one refused console.login from %s", evs, local)
	}
}
