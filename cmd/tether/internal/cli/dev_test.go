package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/sockdiag/sockdiagtest"
	"github.com/tetherfleet/tether/protocol"
)

// checkFor polls f until it returns nil or d passes.
func checkFor(t testing.TB, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDevSmoke runs `tether dev` on random ports and drives it with the
// client commands, all through run, then stops it with ctx.
func TestDevSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a full dev stack")
	}
	dir := t.TempDir()
	// The user's config home, shared by dev and the client commands, as
	// one shell's is: dev writes its user's credentials there, and the
	// client commands find them with no flag or variable.
	devVars := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	dev := runDevT(t, dir, testGetenv(devVars), "--openshell-listen", "127.0.0.1:0", "--opensandbox-listen", "127.0.0.1:0")
	url := dev.URL
	creds := filepath.Join(devVars["XDG_CONFIG_HOME"], "tether", "dev.creds")
	for _, w := range []string{"tether exec", "--all -- uname -a", "export TETHER_NATS_CREDS=" + creds + "\n",
		"nats -s " + url + " --creds " + creds + " --inbox-prefix _INBOX_U", "req tether.v1.exec.once '{", "Ctrl-C"} {
		if !strings.Contains(dev.Banner(), w) {
			t.Errorf("banner lacks %q:\n%s", w, dev.Banner())
		}
	}
	for _, p := range []string{creds, filepath.Join(dir, "dev.creds")} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("dev credentials %s: %v, %v; want mode 0600", p, fi, err)
		}
	}
	// Without them NATS refuses the client.
	if r := runCLI(testCtx(t), nil, "", "nodes", "--nats-url", url); r.code != exitTether || !strings.Contains(r.stderr, "no credentials found") {
		t.Errorf("nodes without credentials: exit %d, stderr %q", r.code, r.stderr)
	}

	// The admin endpoint serves the dev agent's metrics beside the
	// coordinator's: one registry.
	m := regexp.MustCompile(`admin: +(http://\S+/metrics)`).FindStringSubmatch(dev.Banner())
	if m == nil {
		t.Fatalf("banner lacks the admin URL:\n%s", dev.Banner())
	}
	checkFor(t, defaultTestTimeout, func() error {
		body, err := httpGet(m[1])
		if err != nil {
			return err
		}
		for _, want := range []string{"\ntether_agent_tunnel_connected 1\n", "\ntether_coordinator_agents_connected 1\n", `tether_panics_total{component="agent"} 0`} {
			if !strings.Contains(body, want) {
				return errorString(fmt.Sprintf("%s lacks %q", m[1], strings.TrimSpace(want)))
			}
		}
		return nil
	})

	node := devNodeID()
	r := runCLI(testCtx(t), devVars, "", "nodes", "--json", "--nats-url", url)
	if r.code != 0 {
		t.Fatalf("nodes: exit %d, stderr %q", r.code, r.stderr)
	}
	var nodes protocol.NodesResponse
	if err := json.Unmarshal([]byte(r.stdout), &nodes); err != nil {
		t.Fatalf("nodes --json: %v\n%s", err, r.stdout)
	}
	if len(nodes.Nodes) != 1 || nodes.Nodes[0].ID != node || nodes.Nodes[0].Labels["dev"] != "true" {
		t.Fatalf("nodes = %+v, want the dev node %s", nodes.Nodes, node)
	}
	// The session's link telemetry, for an operator looking for a slow
	// link: RTT and last heartbeat, window stalls, bytes queued.
	for _, k := range []string{`"rtt_us"`, `"last_heartbeat"`, `"window_stalls"`, `"window_stall_seconds"`, `"send_queued_bytes"`,
		`"agent_window_stalls"`, `"agent_window_stall_seconds"`, `"agent_send_queued_bytes"`} {
		if !strings.Contains(r.stdout, k) {
			t.Errorf("nodes --json lacks %s:\n%s", k, r.stdout)
		}
	}
	r = runCLI(testCtx(t), devVars, "", "nodes", "--nats-url", url)
	if r.code != 0 {
		t.Fatalf("nodes: exit %d, stderr %q", r.code, r.stderr)
	}
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !strings.Contains(lines[0], "RTT") || !strings.Contains(lines[0], "STALLS") ||
		!strings.Contains(lines[0], "QUEUED") || !strings.Contains(lines[0], "LAST SEEN") || !strings.HasPrefix(lines[1], node+" ") {
		t.Errorf("nodes table:\n%s", r.stdout)
	}

	// The loopback facades: the dev user's own calls pass; another local
	// user's (the fresh-user finding: uid 1000 listed and deleted as the
	// dev user) are refused, naming who they are.
	osbURL := regexp.MustCompile(`opensandbox: +(http://\S+) `).FindStringSubmatch(dev.Banner())
	if osbURL == nil {
		t.Fatalf("banner lacks the opensandbox facade:\n%s", dev.Banner())
	}
	if body, err := httpGet(osbURL[1] + "/v1/sandboxes"); err != nil || !strings.Contains(body, `"items"`) {
		t.Errorf("dev user lists sandboxes: %v %s", err, body)
	}
	if os.Geteuid() == 0 {
		dial := sockdiagtest.Dialer(t, sockdiagtest.Nobody)
		other := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) }}}
		defer other.CloseIdleConnections()
		for _, m := range []string{"GET", "DELETE"} {
			req, _ := http.NewRequestWithContext(testCtx(t), m, osbURL[1]+"/v1/sandboxes/some-id", nil)
			resp, err := other.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "token:loopback-uid-65534") {
				t.Errorf("nobody %s on the dev facade: %d %s; want 403 naming token:loopback-uid-65534", m, resp.StatusCode, b)
			}
		}
	}

	// TETHER_NATS_URL is honoured too.
	r = runCLI(testCtx(t), map[string]string{natsURLEnv: url, "XDG_CONFIG_HOME": devVars["XDG_CONFIG_HOME"]}, "", "exec", "--all", "--", "echo", "hi")
	if r.code != 0 || r.stdout != node+" | hi\n" {
		t.Errorf("exec --all: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(testCtx(t), devVars, "", "exec", "--nats-url", url, "--node", node, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	wantErr := "err\nCommand failed (exec on " + node + ") with exit code 7:\n  sh -c echo out; echo err >&2; exit 7\n"
	if r.code != 7 || r.stdout != "out\n" || r.stderr != wantErr {
		t.Errorf("exec --node: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(testCtx(t), devVars, "", "exec", "--nats-url", url, "--node", "no-such-node", "--", "true")
	if r.code != 255 || !strings.Contains(r.stderr, "unknown_node") {
		t.Errorf("exec unknown node: exit %d, stderr %q", r.code, r.stderr)
	}

	r = runCLI(testCtx(t), devVars, "", "exec", "--nats-url", url, "--node", node, "--timeout", "200ms", "--", "sleep", "10")
	if r.code != exitTimedOut || !strings.Contains(r.stderr, "tether: node "+node+": timed out after 200ms") {
		t.Errorf("exec timeout: exit %d, stderr %q", r.code, r.stderr)
	}

	// Interrupting exec cancels the remote job and exits 130.
	ictx, interrupt := context.WithCancel(testCtx(t))
	defer interrupt()
	var iout, ierr syncBuffer
	ie := &env{stdin: strings.NewReader(""), stdout: &iout, stderr: &ierr, getenv: testGetenv(devVars), now: time.Now}
	icode := make(chan int, 1)
	go func() {
		icode <- run(ictx, []string{"exec", "--nats-url", url, "--all", "--", "sh", "-c", "echo started; sleep 30"}, ie)
	}()
	checkFor(t, defaultTestTimeout, func() error {
		if !strings.Contains(iout.String(), "started") {
			return errorString("job not started yet")
		}
		return nil
	})
	interrupt()
	select {
	case c := <-icode:
		if c != exitInterrupted || !regexp.MustCompile(`(?m)^`+node+` +\d+ +\S+ +cancelled$`).MatchString(ierr.String()) {
			t.Errorf("interrupted exec: exit %d, stderr %q", c, ierr.String())
		}
	case <-time.After(defaultTestTimeout):
		t.Fatal("interrupted exec did not return")
	}

	dev.Stop() // a non-zero exit after ctx cancel is an error
}

// httpGet returns the body of a GET of url.
func httpGet(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestDevSideBySideKeepsCreds: a second `tether dev` started beside the
// first (its own --data-dir and ports, the same config home) leaves the
// config home's credentials, which are the first one's, alone: the
// first's shell keeps working, and the second's banner names its own file.
func TestDevSideBySideKeepsCreds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two dev stacks")
	}
	vars := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	shared := filepath.Join(vars["XDG_CONFIG_HOME"], "tether", "dev.creds")
	startOne := func(dir string) (url string, banner func() string) {
		ctx, cancel := context.WithCancel(context.Background())
		var stdout, stderr syncBuffer
		e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: testGetenv(vars), now: time.Now}
		done := make(chan struct{})
		go func() {
			defer close(done)
			run(ctx, []string{"dev", "--data-dir", dir, "--nats-port", "0",
				"--listen", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--ssh-addr", "127.0.0.1:0", "--log-level", "warn",
				"--openshell-listen", "", "--opensandbox-listen", ""}, e)
		}()
		t.Cleanup(func() { cancel(); <-done })
		re := regexp.MustCompile(`NATS URL: +(nats://\S+)`)
		checkFor(t, defaultTestTimeout, func() error {
			m := re.FindStringSubmatch(stdout.String())
			if m == nil {
				return errorString("no ready banner yet; stderr:\n" + stderr.String())
			}
			url = m[1]
			return nil
		})
		return url, stdout.String
	}
	url1, _ := startOne(t.TempDir())
	first, err := os.ReadFile(shared)
	if err != nil {
		t.Fatal(err)
	}
	dir2 := t.TempDir()
	_, banner2 := startOne(dir2)
	if b, _ := os.ReadFile(shared); string(b) != string(first) {
		t.Error("the second dev replaced the first one's credentials in the config home")
	}
	if own := filepath.Join(dir2, "dev.creds"); !strings.Contains(banner2(), "export TETHER_NATS_CREDS="+own+"\n") {
		t.Errorf("the second dev's banner does not name its own credentials %s:\n%s", own, banner2())
	}
	if r := runCLI(testCtx(t), vars, "", "nodes", "--nats-url", url1); r.code != 0 {
		t.Errorf("the first dev's shell after the second started: exit %d, stderr %q", r.code, r.stderr)
	}
	// The second's banner's commands work as printed (they name its
	// credentials: the config home's are the first one's).
	var try []string
	for _, line := range strings.Split(banner2(), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "tether" && f[1] == "nodes" {
			try = f[1:]
		}
	}
	if try == nil {
		t.Fatalf("no tether nodes line in the second dev's banner:\n%s", banner2())
	}
	if r := runCLI(testCtx(t), vars, "", try...); r.code != 0 {
		t.Errorf("the second dev's banner's %q: exit %d, stderr %q", strings.Join(try, " "), r.code, r.stderr)
	}
}

// TestDevRunAsRefusalHint: with the dev policy's run_as edited to another
// user, the dev agent refuses the job, and its message tells the dev user
// what works in dev (the dev policy's run_as, then SIGHUP), not to pass
// --local-policy, a flag tether dev does not have.
func TestDevRunAsRefusalHint(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a full dev stack")
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	dir := t.TempDir()
	devVars := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	getenv := testGetenv(devVars)
	// The policy as a user who edited run_as would leave it.
	data, err := devPolicy("nats:"+devUserName(getenv), "nobody")
	if err != nil {
		t.Fatal(err)
	}
	polPath := filepath.Join(dir, devPolicyFile)
	if err := os.WriteFile(polPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	dev := runDevT(t, dir, getenv)
	url := dev.URL
	r := runCLI(testCtx(t), devVars, "", "exec", "--nats-url", url, "--all", "--", "true")
	if r.code == 0 {
		t.Fatalf("exec as nobody succeeded: stdout %q", r.stdout)
	}
	for _, want := range []string{"run as", "nobody", "refused", "set run_as back to your user name in " + polPath, "SIGHUP"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the refusal lacks %q: %s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "--local-policy") {
		t.Errorf("the refusal tells a dev user to pass --local-policy, which tether dev does not take: %s", r.stderr)
	}
}
