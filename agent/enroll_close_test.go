package agent

import (
	"context"
	"crypto/x509"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// After the certificate arrived, the agent keeps the enrollment session
// open until the coordinator has ended the control stream: the
// coordinator's write of FrameEnrolled only completes once the session
// is still there to report it, and an agent that closed the session at
// once made a delivered certificate log "enrollment: the certificate could
// not be sent ... session shutdown" on the coordinator at every first start.
func TestEnrollWaitsForCoordinatorToEndStream(t *testing.T) {
	ca, err := tunnel.NewTestCA("fake-coordinator")
	if err != nil {
		t.Fatal(err)
	}
	var closedEarly, served atomic.Bool
	fake := func(conn net.Conn) {
		defer conn.Close()
		sess, err := tunnel.Server(conn, tunnel.DefaultConfig())
		if err != nil {
			return
		}
		defer sess.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		st, _, err := sess.Accept(ctx)
		if err != nil {
			return
		}
		f, err := protocol.NewFrameReader(st).Next()
		if err != nil || f.Type != protocol.FrameEnroll {
			return // the agent redialing with its certificate
		}
		var e protocol.Enroll
		if err := protocol.DecodeJSON(f.Payload, &e); err != nil {
			t.Errorf("fake coordinator: enroll: %v", err)
			return
		}
		csr, err := x509.ParseCertificateRequest(e.CSR)
		if err != nil {
			t.Errorf("fake coordinator: csr: %v", err)
			return
		}
		cert, err := ca.Sign(csr, e.NodeID, time.Now(), time.Hour)
		if err != nil {
			t.Errorf("fake coordinator: sign: %v", err)
			return
		}
		if err := protocol.WriteJSONFrame(st, protocol.FrameEnrolled, &protocol.Enrolled{Certificate: cert.Raw, NotAfter: cert.NotAfter}); err != nil {
			// What the coordinator logged: the agent's close won the race.
			t.Logf("fake coordinator: write: %v", err)
			closedEarly.Store(true)
			served.Store(true)
			return
		}
		// A coordinator finishing its side (its Write returning, then the
		// stream's close) after the agent read the frame.
		time.Sleep(300 * time.Millisecond)
		closedEarly.Store(sess.IsClosed())
		st.Close()
		served.Store(true)
	}
	cfg := testConfig(t)
	cfg.SharedToken = false
	cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		agentSide, coordSide := net.Pipe()
		go fake(coordSide)
		return agentSide, nil
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	waitFor(t, testWait, "the enrollment served", served.Load)
	cancel()
	<-errc
	if closedEarly.Load() {
		t.Fatal("the agent closed the enrollment session before the coordinator ended the control stream")
	}
	if a.ident.Load() == nil {
		t.Fatal("no identity stored")
	}
}
