package agent

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// TestHelloTargetsFollowLocalPolicy: hello announces only the dial targets
// the node's local policy allows (every configured one without a policy),
// so that the coordinator never routes a facade call to a node that would
// refuse it; a reloaded policy applies from the next session's hello.
func TestHelloTargetsFollowLocalPolicy(t *testing.T) {
	parse := func(doc string) *localpolicy.Policy {
		t.Helper()
		p, err := localpolicy.Parse("/etc/tether/test-policy.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	hellos := make(chan []string)
	release := make(chan struct{}) // one receive per session: end it
	cfg := testConfig(t)
	cfg.OpenShell = &OpenShellTarget{Addr: "127.0.0.1:8080"}
	cfg.Targets = map[string]string{"web": "127.0.0.1:80", "db": "127.0.0.1:5432"}
	cfg.LocalPolicy = parse("version: 1\nforward: true\ntargets: [openshell, web]\n")
	stop := make(chan struct{}) // closed when the test ends
	defer close(stop)
	// The fake coordinator runs past Dial's return, so it does not use
	// Dial's context (the redialer's, cancelled once the dial is done).
	cfg.Dial = func(context.Context, string) (net.Conn, error) {
		agentSide, coordSide := net.Pipe()
		go func() {
			defer coordSide.Close()
			sess, err := tunnel.Server(coordSide, tunnel.DefaultConfig())
			if err != nil {
				return
			}
			defer sess.Close()
			actx, cancel := context.WithTimeout(context.Background(), testWait)
			defer cancel()
			st, _, err := sess.Accept(actx)
			if err != nil {
				return
			}
			f, err := protocol.NewFrameReader(st).Next()
			if err != nil || f.Type != protocol.FrameHello {
				t.Errorf("fake coordinator: %v %v, want a hello", f.Type, err)
				return
			}
			var h protocol.Hello
			if err := protocol.DecodeJSON(f.Payload, &h); err != nil {
				t.Errorf("decode hello: %v", err)
				return
			}
			select {
			case hellos <- h.Targets:
			case <-stop:
				return
			}
			select {
			case <-release:
			case <-stop:
			}
		}()
		return agentSide, nil
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	next := func(what string, want []string) {
		t.Helper()
		select {
		case got := <-hellos:
			if !slices.Equal(got, want) {
				t.Errorf("%s: hello targets %q, want %q", what, got, want)
			}
		case <-time.After(testWait):
			t.Fatalf("%s: no hello", what)
		}
	}
	next("policy allowing openshell and web", []string{"openshell", "web"})
	a.SetLocalPolicy(parse("version: 1\nforward: false\n"))
	release <- struct{}{}
	next("policy allowing no forward", []string{})
	a.SetLocalPolicy(nil)
	release <- struct{}{}
	next("no policy", []string{"db", "openshell", "web"})
	release <- struct{}{}
}
