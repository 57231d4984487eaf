package cli

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// reloadFleet is the fixture of the SIGHUP tests, which check that a
// reload keeps an agent's session and a running stream: a coordinator
// serving, a real agent (as tether dev runs one) joined to it with the
// shared token "tok", a client as nats:tester, and a cat stream through
// the agent.
type reloadFleet struct {
	cs      *coordinatorServer
	cl      *client.Client
	session string // the agent's session when the fleet started
	st      *client.Stream
	fr      *protocol.FrameReader
}

// startReloadFleet starts the coordinator of o (with cs.config = src when
// src is not nil: the file SIGHUP re-reads), an agent named node and the
// stream, logging to log; all of it stops at t's cleanup. o must allow
// the shared token and give nats:tester exec and nodes.list.
func startReloadFleet(t *testing.T, o coordinatorOptions, src *configSource, log *slog.Logger, node string) *reloadFleet {
	t.Helper()
	cs, err := startCoordinator(o, "tok", log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if src != nil {
		cs.config = src
	}
	serveCoordinator(t, cs)

	acfg := testAgentConfig(t, cs, node, "tok", log)
	acfg.SharedToken = true
	runTestAgent(t, acfg)

	f := &reloadFleet{cs: cs}
	nc := natsauthtest.Connect(t, cs.info.NATSURL, natsauthtest.ClientCreds(t, cs.layout, "tester"))
	f.cl = client.New(nc)
	waitFor(t, func() error {
		ns, err := f.cl.Nodes(testCtx(t), "")
		if err != nil || len(ns) != 1 {
			return errors.New("agent not registered yet")
		}
		f.session = ns[0].SessionID
		return nil
	})
	f.st, err = f.cl.OpenStream(testCtx(t), node, protocol.KindExec, protocol.ExecParams{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.st.Close() })
	f.fr = protocol.NewFrameReader(f.st)
	return f
}

// testAgentConfig is the config of an agent named node that joins cs
// (trusting its CA) with token, logging to log, its data in a fresh
// directory.
func testAgentConfig(t *testing.T, cs *coordinatorServer, node, token string, log *slog.Logger) agent.Config {
	t.Helper()
	acfg := agent.DefaultConfig()
	tlsCfg, err := tunnel.LoadClientTLS(cs.info.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	acfg.NodeID, acfg.Token, acfg.TLS = node, token, tlsCfg
	acfg.Coordinators = []string{dialAddr(cs.info.TunnelAddr)}
	acfg.DataDir = t.TempDir()
	acfg.Logger = log
	return acfg
}

// runTestAgent runs the agent of acfg until the test ends.
func runTestAgent(t *testing.T, acfg agent.Config) {
	t.Helper()
	a, err := agent.New(acfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// echo sends s on the stream and fails t unless cat sends it back.
func (f *reloadFleet) echo(t *testing.T, s string) {
	t.Helper()
	if err := protocol.WriteFrame(f.st, protocol.FrameStdin, []byte(s)); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len(s) {
		fr, err := f.fr.Next()
		if err != nil {
			t.Fatalf("stream after %q: %v", got, err)
		}
		if fr.Type == protocol.FrameStdout {
			got = append(got, fr.Payload...)
		}
	}
	if string(got) != s {
		t.Fatalf("echo %q, got %q", s, got)
	}
}

// sameSession fails t unless the agent is still the one node, in the
// session it had when the fleet started.
func (f *reloadFleet) sameSession(t *testing.T) {
	t.Helper()
	if ns, err := f.cl.Nodes(testCtx(t), ""); err != nil || len(ns) != 1 || ns[0].SessionID != f.session {
		t.Fatalf("nodes after the reload: %v %+v; want the same session %s", err, ns, f.session)
	}
}

// loadAgentConfig parses `tether agent --config path` in the environment
// vars and loads the file as the daemon does: the options (their Log is
// the one the returned source re-reads into) and the source.
func loadAgentConfig(t *testing.T, path string, vars map[string]string) (*agentOptions, *configSource) {
	t.Helper()
	o := new(agentOptions)
	*o = defaultAgentOptions()
	e := testEnv(vars)
	cmd := agentCommand(e, o)
	if err := cmd.ParseFlags([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	src, err := loadDaemonConfig(cmd, e, agentConfigRole, &o.Log)
	if err != nil {
		t.Fatal(err)
	}
	return o, src
}
