package agent

import (
	"context"
	"crypto/x509"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// The enrollment session ends by design once the certificate is stored:
// the agent dials again with it. That hand-over is no redial to report:
// nothing at info level or above says the session ended or that it is
// redialing (tether dev printed "tunnel session ended; redialing" at every
// first start), and it is not counted as a reconnect.
func TestEnrollHandoverIsQuiet(t *testing.T) {
	ca, err := tunnel.NewTestCA("fake-coordinator")
	if err != nil {
		t.Fatal(err)
	}
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
			return
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
		protocol.WriteJSONFrame(st, protocol.FrameEnrolled, &protocol.Enrolled{Certificate: cert.Raw, NotAfter: cert.NotAfter})
		st.Close()
	}
	var logs syncBuffer
	cfg := testConfig(t)
	cfg.SharedToken = false
	cfg.Logger = testLogger(t, &logs)
	var (
		a       *Agent
		dials   atomic.Int32
		atFirst atomic.Pointer[string] // the logs when the first session's dial began
		redials atomic.Int64
	)
	second := make(chan struct{})
	cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		if dials.Add(1) == 2 {
			s := logs.String()
			atFirst.Store(&s)
			redials.Store(int64(testutil.ToFloat64(a.m.reconnects)))
			close(second)
		}
		agentSide, coordSide := net.Pipe()
		go fake(coordSide)
		return agentSide, nil
	}
	a, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	select {
	case <-second:
	case <-time.After(testWait):
		t.Fatal("the agent did not dial again after its enrollment")
	}
	cancel()
	<-errc
	got := *atFirst.Load()
	if !strings.Contains(got, "enrolled: node certificate stored") {
		t.Fatalf("no enrollment logged before the second dial:\n%s", got)
	}
	for _, line := range strings.Split(got, "\n") {
		if (strings.Contains(line, "level=INFO") || strings.Contains(line, "level=WARN")) && strings.Contains(line, "redialing") {
			t.Errorf("the enrollment's hand-over to the first session is logged as a redial: %s", line)
		}
	}
	if redials.Load() != 0 {
		t.Errorf("tether_agent_tunnel_reconnects_total = %d after the enrollment's hand-over, want 0", redials.Load())
	}
}
