//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// TestNodeIdentityEndToEnd runs the README's enrollment with the built
// binaries: a coordinator without the shared token, a join token from
// `tether token create`, an agent enrolling with it, reconnecting by its
// certificate alone after a restart with the token file gone, renewing its
// short-lived certificate, and cut off by `tether node revoke`.
func TestNodeIdentityEndToEnd(t *testing.T) {
	f := &fleet{dataDir: t.TempDir()}
	f.tunnelAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f.httpAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	natsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f.natsURL = "nats://" + natsAddr
	f.coordArgs = []string{"coordinator", "--data-dir", f.dataDir, "--listen", f.tunnelAddr, "--policy", e2ePolicy(t),
		"--http-addr", f.httpAddr, "--nats-listen", natsAddr, "--heartbeat", heartbeat, "--cert-ttl", "12s",
		"--openshell-listen", "", "--opensandbox-listen", ""}
	f.coord = start(t, "coordinator", f.coordArgs...)
	f.waitReady(t)
	f.nc = f.connect(t)
	f.cl = client.New(f.nc)

	out, errOut, code := runCLI(t, f.natsURL, "", "token", "create", "--uses", "1", "--labels", "rack=r1")
	if code != 0 || !strings.HasPrefix(out, "tjt_") {
		t.Fatalf("token create: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	tokenFile := filepath.Join(t.TempDir(), "join-token")
	os.WriteFile(tokenFile, []byte(out), 0o600)
	agentDir := t.TempDir()
	agentArgs := []string{"agent", "--coordinator", f.tunnelAddr, "--token-file", tokenFile,
		"--ca-file", filepath.Join(f.dataDir, "pki", "ca.crt"), "--node-id", "e2e-id", "--labels", "rack=own,role=id",
		"--data-dir", agentDir}
	a := start(t, "agent", agentArgs...)
	nodes := f.waitNodes(t, "e2e-id")
	if nodes[0].Labels["rack"] != "r1" || nodes[0].Labels["role"] != "id" {
		t.Errorf("labels %v, want the token's rack=r1 and the agent's role=id", nodes[0].Labels)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	res, err := f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "e2e-id"}, Argv: []string{"true"}}, nil)
	if err != nil || len(res.Results) != 1 || !res.Results[0].OK() {
		t.Fatalf("exec on the enrolled node: %+v, %v", res, err)
	}

	// Restarted with the (one-use, spent) token file gone: the
	// certificate is its identity.
	if err := a.stop(t); err != nil {
		t.Fatalf("agent exit: %v", err)
	}
	f.waitNodes(t)
	os.Remove(tokenFile)
	a = start(t, "agent-restarted", agentArgs...)
	f.waitNodes(t, "e2e-id")

	// Certificates of 12 s are renewed at 8 s, on the live session.
	session := f.waitNodes(t, "e2e-id")[0].SessionID
	checkFor(t, 3*defaultTestTimeout, func() error {
		if v := metric(t, f.httpAddr, `tether_coordinator_enrollments_total{result="renewed"}`); v < 1 {
			return fmt.Errorf("renewals %v", v)
		}
		return nil
	})
	if got := f.waitNodes(t, "e2e-id")[0].SessionID; got != session {
		t.Errorf("session %s after the renewal, want %s", got, session)
	}

	out, errOut, code = runCLI(t, f.natsURL, "", "node", "revoke", "e2e-id")
	if code != 0 || !strings.Contains(out, "node e2e-id revoked") {
		t.Fatalf("node revoke: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	f.waitNodes(t)
	checkFor(t, defaultTestTimeout, func() error {
		if v := metric(t, f.httpAddr, `tether_coordinator_auth_failures_total{reason="revoked"}`); v < 1 {
			return fmt.Errorf("revoked refusals %v: the agent has not retried yet", v)
		}
		return nil
	})
	f.waitNodes(t)
}
