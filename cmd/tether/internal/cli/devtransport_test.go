package cli

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// dev's --direct-addr, --transport and --websocket-ping are checked as the
// coordinator's and the agent's are, before anything starts: a usage error
// naming the flag and the value.
func TestDevTransportFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--direct-addr", "coord:0"}, `--direct-addr: "coord:0"`},
		{[]string{"--transport", "tls,quic"}, `--transport "quic": want tls or wss`},
		{[]string{"--transport", ""}, "--transport is empty"},
		{[]string{"--transport", "wss,wss"}, `--transport "wss" is listed twice`},
		{[]string{"--websocket-ping", "5s"}, "--websocket-ping applies to the wss transport only"},
		{[]string{"--transport", "wss", "--websocket-ping", "10ms"}, "--websocket-ping 10ms: want at least 1s"},
	} {
		args := append([]string{"dev", "--data-dir", t.TempDir()}, tc.args...)
		r := runCLI(testCtx(t), nil, "", args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("tether %s: exit %d, stderr %q; want %d and %q", strings.Join(args, " "), r.code, r.stderr, exitUsage, tc.want)
		}
	}
}

// `tether dev --transport wss` connects the local agent over WebSocket
// (the coordinator serves it on --listen), and the node record says
// so; jobs run through it. --direct-addr off starts dev with streams
// relayed over NATS.
func TestDevTransportWebSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a full dev stack")
	}
	dir := t.TempDir()
	d := runDevT(t, dir, testGetenv(nil), "--transport", "wss", "--websocket-ping", "2s", "--direct-addr", "off")
	creds := filepath.Join(dir, "dev.creds")
	vars := map[string]string{"TETHER_NATS_CREDS": creds}
	var nodes protocol.NodesResponse
	checkFor(t, defaultTestTimeout, func() error {
		r := runCLI(testCtx(t), vars, "", "nodes", "--json", "--nats-url", d.URL)
		if r.code != 0 {
			return errorString(r.stderr)
		}
		if err := json.Unmarshal([]byte(r.stdout), &nodes); err != nil {
			return err
		}
		if len(nodes.Nodes) != 1 {
			return errorString("no node yet: " + r.stdout)
		}
		return nil
	})
	if got := nodes.Nodes[0].Transport; got != "wss" {
		t.Errorf("dev node's transport %q, want wss", got)
	}
	r := runCLI(testCtx(t), vars, "", "exec", "--nats-url", d.URL, "--node", nodes.Nodes[0].ID, "--", "echo", "over-wss")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "over-wss" {
		t.Errorf("exec over wss: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
