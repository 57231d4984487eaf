package cli

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// devInstance is a `tether dev` a test started (runDevT): its banner's
// NATS URL, tunnel address and CA file, its output so far, and Stop.
type devInstance struct {
	URL, TunnelAddr, CAFile string
	stdout, stderr          *syncBuffer
	// Stop ends it (also at the test's end) and reports a non-zero exit.
	Stop func()
}

// Banner is what the dev printed on stdout so far.
func (d *devInstance) Banner() string { return d.stdout.String() }

// runDevT runs `tether dev --data-dir dir` with free loopback ports, the
// facades off, the SSH jump host on a free port and the environment
// getenv, plus extra flags (a flag given again takes the later value:
// "--openshell-listen", "127.0.0.1:0" turns a facade on), until the test
// ends or Stop; it returns once the ready banner is printed.
func runDevT(t *testing.T, dir string, getenv func(string) string, extra ...string) *devInstance {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &devInstance{stdout: &syncBuffer{}, stderr: &syncBuffer{}}
	e := &env{stdin: strings.NewReader(""), stdout: d.stdout, stderr: d.stderr, getenv: getenv, now: time.Now}
	var code int
	done := make(chan struct{})
	args := append([]string{"dev", "--data-dir", dir, "--nats-port", "0",
		"--listen", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--ssh-addr", "127.0.0.1:0", "--log-level", "warn",
		"--openshell-listen", "", "--opensandbox-listen", ""}, extra...)
	go func() {
		defer close(done)
		code = run(ctx, args, e)
	}()
	stopped := false
	d.Stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
			if code != 0 {
				t.Errorf("dev exit code %d; stderr:\n%s", code, d.stderr.String())
			}
		case <-time.After(defaultTestTimeout):
			t.Error("dev did not stop")
		}
	}
	t.Cleanup(d.Stop)
	re := regexp.MustCompile(`NATS URL: +(nats://\S+)[\s\S]*tunnel: +(\S+) \(CA (\S+)\)`)
	checkFor(t, defaultTestTimeout, func() error {
		select {
		case <-done:
			t.Fatalf("dev exited early with %d; stderr:\n%s", code, d.stderr.String())
		default:
		}
		m := re.FindStringSubmatch(d.stdout.String())
		if m == nil {
			return errorString("no ready banner yet; stderr:\n" + d.stderr.String())
		}
		d.URL, d.TunnelAddr, d.CAFile = m[1], m[2], m[3]
		return nil
	})
	return d
}

// startDev runs `tether dev` on dir (runDevT) with the environment vars
// and returns its NATS URL, tunnel address and CA file. Dev has no config
// home here, so it wrote its user's credentials in the data dir; the
// test's client commands use them.
func startDev(t *testing.T, dir string, vars map[string]string) (url, tunnelAddr, caFile string, stop func()) {
	t.Helper()
	d := runDevT(t, dir, testGetenv(vars))
	creds := filepath.Join(dir, "dev.creds")
	fleetCreds.Store(&creds)
	t.Cleanup(func() { fleetCreds.Store(nil) })
	return d.URL, d.TunnelAddr, d.CAFile, d.Stop
}

// nodeLabels lists the nodes through the CLI: id → labels.
func nodeLabels(t *testing.T, vars map[string]string, url string) map[string]map[string]string {
	t.Helper()
	r := runCLI(testCtx(t), vars, "", "nodes", "--json", "--nats-url", url)
	if r.code != 0 {
		t.Fatalf("nodes: exit %d, stderr %q", r.code, r.stderr)
	}
	var resp protocol.NodesResponse
	if err := json.Unmarshal([]byte(r.stdout), &resp); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, n := range resp.Nodes {
		out[n.ID] = n.Labels
	}
	return out
}

// TestTokenCreateAgentEnrollRevoke walks the README's enrollment: a join
// token from `tether token create`, an agent enrolling with it (the
// token's labels bound), `tether node revoke` cutting it off; and dev's
// own agent coming back after a restart of dev, with no configuration.
func TestTokenCreateAgentEnrollRevoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a full dev stack")
	}
	dir := t.TempDir()
	// The user's config home, shared by dev and the client commands, as
	// one shell's is (dev writes its user's NATS credentials there).
	vars := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	url, tunnelAddr, caFile, stopDev := startDev(t, dir, vars)

	tokenFile := filepath.Join(t.TempDir(), "join-token")
	r := runCLI(testCtx(t), vars, "", "token", "create", "--nats-url", url, "--labels", "rack=r1", "--ttl", "10m", "-o", tokenFile)
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "1 use(s), labels rack=r1; written to "+tokenFile) {
		t.Fatalf("token create -o: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if b, err := os.ReadFile(tokenFile); err != nil || !strings.HasPrefix(string(b), "tjt_") {
		t.Fatalf("token file: %q, %v; want the token", b, err)
	}
	if fi, err := os.Stat(tokenFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("token file: %v, want mode 0600", err)
	}
	agentDir := t.TempDir()
	actx, stopAgent := context.WithCancel(context.Background())
	defer stopAgent()
	agentDone := make(chan result, 1)
	go func() {
		agentDone <- runCLI(actx, nil, "", "agent", "--coordinator", tunnelAddr, "--ca-file", caFile, "--token-file", tokenFile,
			"--node-id", "second", "--labels", "rack=mine,role=web", "--data-dir", agentDir, "--log-level", "warn")
	}()
	checkFor(t, defaultTestTimeout, func() error {
		l, ok := nodeLabels(t, vars, url)["second"]
		if !ok {
			return errorString("second not registered yet")
		}
		if l["rack"] != "r1" || l["role"] != "web" {
			t.Fatalf("second's labels %v, want the token's rack=r1 over the agent's, and role=web", l)
		}
		return nil
	})
	if fi, err := os.Stat(filepath.Join(agentDir, "identity", "node.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("identity file: %v, want mode 0600", err)
	}
	// The token was for one use.
	r = runCLI(testCtx(t), vars, "", "node", "revoke", "--nats-url", url, "second")
	if r.code != 0 || r.stdout != "node second revoked: 1 certificate(s) refused from now on; its session was closed\n" {
		t.Fatalf("node revoke: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if _, ok := nodeLabels(t, vars, url)["second"]; ok {
			return errorString("second still registered")
		}
		return nil
	})
	r = runCLI(testCtx(t), vars, "", "node", "revoke", "--nats-url", url, "never-enrolled")
	if r.code != exitTether || !strings.Contains(r.stderr, "tether: node never-enrolled was never enrolled (or its enrollment record expired)") || strings.Contains(r.stderr, "not enrolled") {
		t.Errorf("revoke unknown node: exit %d, stderr %q", r.code, r.stderr)
	}
	stopAgent()
	<-agentDone

	// Dev restarted on the same data directory: its agent connects with
	// the certificate it has, no step needed.
	stopDev()
	url, _, _, _ = startDev(t, dir, vars)
	if _, ok := nodeLabels(t, vars, url)[devNodeID()]; !ok {
		t.Errorf("dev's agent not registered after a restart: %v", nodeLabels(t, vars, url))
	}
}

func TestIdentityUsageErrors(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("secret\n"), 0o600)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"coordinator", "--token-file", tokenFile}, "--token-file names the deprecated shared token and needs --allow-shared-token"},
		{[]string{"coordinator", "--cert-ttl", "1s"}, "--cert-ttl 1s"},
		{[]string{"token", "create", "--uses", "-1"}, "--uses -1"},
		{[]string{"token", "create", "--ttl", "0s"}, "--ttl 0s"},
		{[]string{"token", "create", "--labels", "x"}, "--labels"},
		{[]string{"token"}, "a subcommand is required"},
		{[]string{"node", "revoke"}, "accepts 1 arg"},
		{[]string{"node", "revoke", "a b"}, "node id"},
		{[]string{"agent", "--coordinator", "c:7443", "--shared-token", "--data-dir", t.TempDir()}, "--shared-token needs the token"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runCLI(testCtx(t), nil, "", tt.args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want %d saying %q", r.code, r.stderr, exitUsage, tt.want)
			}
		})
	}
}

// TestTokenCreateOutputNotWrittenOnFailure: `tether token create -o FILE`
// that the coordinator does not answer leaves no FILE, where the README's
// old '> join-token' left an empty one.
func TestTokenCreateOutputNotWrittenOnFailure(t *testing.T) {
	out := filepath.Join(t.TempDir(), "join-token")
	r := runCLI(testCtx(t), map[string]string{"XDG_CONFIG_HOME": t.TempDir()}, "", "token", "create", "--nats-url", "nats://127.0.0.1:1", "-o", out)
	if r.code != exitTether {
		t.Fatalf("token create -o against no NATS: exit %d, stderr %q; want %d", r.code, r.stderr, exitTether)
	}
	if _, err := os.Lstat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("token create failed but %s exists (%v); want no file", out, err)
	}
}

// TestDevURLBesideCreds: a dev on a random NATS port writes its URL beside
// DATA-DIR/dev.creds, so a client command given only those credentials
// reaches it (not nats://127.0.0.1:4222, another dev's or none), saying
// where the URL came from when it cannot connect.
func TestDevURLBesideCreds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a full dev stack")
	}
	dir := t.TempDir()
	vars := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	url, _, _, stop := startDev(t, dir, vars)
	defer stop()
	creds := filepath.Join(dir, "dev.creds")
	if b, err := os.ReadFile(filepath.Join(dir, "dev.url")); err != nil || strings.TrimSpace(string(b)) != url {
		t.Fatalf("%s/dev.url: %q, %v; want %s", dir, b, err, url)
	}
	r := runCLI(testCtx(t), vars, "", "nodes", "--nats-creds", creds)
	if r.code != 0 || !strings.Contains(r.stdout, devNodeID()) {
		t.Fatalf("nodes --nats-creds %s (no URL): exit %d, stdout %q, stderr %q", creds, r.code, r.stdout, r.stderr)
	}
	stop()
	r = runCLI(testCtx(t), vars, "", "nodes", "--nats-creds", creds)
	if r.code != exitTether || !strings.Contains(r.stderr, "connect to NATS at "+url+" (from "+filepath.Join(dir, "dev.url")+")") {
		t.Errorf("nodes after dev stopped: exit %d, stderr %q; want the URL from dev.url named", r.code, r.stderr)
	}
}
