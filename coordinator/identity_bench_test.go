package coordinator_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/enroll"
	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// benchAgents is how many agents one iteration of BenchmarkEnroll brings
// up, and benchWorkers how many do so at once (a fleet coming up after a
// rollout, paced by the agents' own backoff).
const (
	benchAgents  = 1000
	benchWorkers = 32
)

// BenchmarkEnroll measures, in one run, how fast benchAgents agents get
// their first session: by enrolling (key generation, CSR, join token use
// in KV, signing, identity record in KV, then an mTLS dial with the new
// certificate, Hello and Welcome), and, as the baseline, by today's
// shared-token Hello over TLS. It reports both rates and their ratio
// (enroll_time/token_time: how many times longer enrollment takes).
func BenchmarkEnroll(b *testing.B) {
	env := natstest.Run(b)
	nc := env.Coordinator(b, nats.Name("coordinator"))
	pki, err := tunnel.EnsureDevPKI(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	srvTLS, err := tunnel.LoadServerTLS(pki.ServerCert, pki.ServerKey)
	if err != nil {
		b.Fatal(err)
	}
	cliTLS, err := tunnel.LoadClientTLS(pki.CACert)
	if err != nil {
		b.Fatal(err)
	}
	ca, err := tunnel.NewTestCA("bench node CA")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, err := enroll.Open(ctx, enroll.Config{NATS: nc})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	cfg := coordinator.DefaultConfig()
	cfg.ID = "bench"
	cfg.NATS = nc
	cfg.Identify = caller.FromNATS(env.Layout.Verifier())
	cfg.Token = testToken // the baseline's shared token
	cfg.NodeCA, cfg.Identities = ca, store
	cfg.Registerer = prometheus.NewRegistry()
	cfg.MaxHandshakesPerSource = 4 * benchWorkers
	c, err := coordinator.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- c.Serve(ctx, tls.NewListener(ln, tunnel.RequestClientCert(srvTLS))) }()
	defer func() { cancel(); <-done }()
	for !c.Ready() {
		time.Sleep(time.Millisecond)
	}
	tok, _, err := store.CreateToken(ctx, time.Hour, -1, nil, "bench")
	if err != nil {
		b.Fatal(err)
	}

	// run brings benchAgents agents up with one(i) each, benchWorkers at
	// a time, and returns the wall time.
	run := func(one func(i int) error) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		next := make(chan int)
		errs := make(chan error, benchWorkers)
		for range benchWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if err := one(i); err != nil {
						select {
						case errs <- err:
						default:
						}
					}
				}
			}()
		}
		for i := range benchAgents {
			next <- i
		}
		close(next)
		wg.Wait()
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
		return time.Since(start)
	}
	var tokenTime, enrollTime, tokenCPU, enrollCPU time.Duration
	b.ResetTimer()
	for it := range b.N {
		c0 := cpuTime()
		tokenTime += run(func(i int) error {
			return helloRaw(addr, cliTLS, nil, fmt.Sprintf("t%d-%d", it, i), testToken)
		})
		c1 := cpuTime()
		tokenCPU += c1 - c0
		enrollTime += run(func(i int) error {
			node := fmt.Sprintf("e%d-%d", it, i)
			cert, rej, err := enrollRaw(addr, cliTLS, node, tok)
			if err != nil {
				return err
			}
			if rej != nil {
				return rej
			}
			return helloRaw(addr, cliTLS, cert, node, "")
		})
		enrollCPU += cpuTime() - c1
	}
	b.StopTimer()
	n := float64(b.N * benchAgents)
	b.ReportMetric(n/enrollTime.Seconds(), "enroll_agents/s")
	b.ReportMetric(n/tokenTime.Seconds(), "token_agents/s")
	b.ReportMetric(enrollTime.Seconds()/tokenTime.Seconds(), "enroll/token")
	// CPU time of this process (agents and coordinator both run in it)
	// per agent: what the other load on the machine does not change.
	b.ReportMetric(float64(enrollCPU.Microseconds())/n/1000, "enroll_cpu_ms/agent")
	b.ReportMetric(float64(tokenCPU.Microseconds())/n/1000, "token_cpu_ms/agent")
	b.ReportMetric(enrollCPU.Seconds()/tokenCPU.Seconds(), "enroll/token_cpu")
}

// cpuTime is the user plus system CPU time this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// helloRaw dials addr (with cert, if not nil), sends a Hello for node
// (with token, if not empty), waits for the Welcome and hangs up.
func helloRaw(addr string, clientTLS *tls.Config, cert *tls.Certificate, node, token string) error {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	cfg := clientTLS
	if cert != nil {
		cfg = clientTLS.Clone()
		cfg.Certificates = []tls.Certificate{*cert}
	}
	conn, err := tunnel.DialTLS(ctx, addr, cfg)
	if err != nil {
		return err
	}
	sess, err := tunnel.Client(conn, tunnel.DefaultConfig())
	if err != nil {
		return err
	}
	defer sess.Close()
	ctl, err := sess.Open(ctx, protocol.KindControl, protocol.ControlParams{})
	if err != nil {
		return err
	}
	hello := protocol.Hello{ProtocolVersion: protocol.Version, Token: token, NodeID: node, Instance: node, Capacity: protocol.Capacity{CPUs: 1}}
	if err := protocol.WriteJSONFrame(ctl, protocol.FrameHello, &hello); err != nil {
		return err
	}
	ctl.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	f, err := protocol.NewFrameReader(ctl).Next()
	if err != nil {
		return fmt.Errorf("node %s: read welcome: %w", node, err)
	}
	if f.Type != protocol.FrameWelcome {
		var info protocol.ErrorInfo
		json.Unmarshal(f.Payload, &info)
		return fmt.Errorf("node %s: got %s %v, want welcome", node, f.Type, &info)
	}
	return nil
}
