//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/protocol"
)

var tetherBin = flag.String("tether-bin", "", "prebuilt tether binary (default: build one with -race)")

const defaultTestTimeout = 60 * time.Second

// bulkTimeout bounds a step that moves a GiB: a race-built CLI and
// coordinator take minutes for it on a machine at load 30 (a 1 GiB copy
// outlasted defaultTestTimeout at load 16). Only a hang should reach it.
const bulkTimeout = 10 * time.Minute

// heartbeat is the coordinators' --heartbeat in these tests. The
// coordinator drops an agent after three intervals of silence; 2 s makes
// that 6 s, short enough for the partition tests and long enough that an
// agent starved of CPU on a loaded machine (a race build at load 30 can
// stall a process for seconds) is not dropped mid-copy.
const heartbeat = "2s"

func TestMain(m *testing.M) {
	flag.Parse()
	// Every process here is built with -race, whose runtime sleeps 1 s
	// before exiting by default: seconds of teardown per test.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=100"))
	if *tetherBin == "" {
		dir, err := os.MkdirTemp("", "tether-e2e-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		*tetherBin = filepath.Join(dir, "tether")
		build := exec.Command("go", "build", "-race", "-o", *tetherBin, "../cmd/tether")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build tether:", err)
			os.Exit(1)
		}
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// proc is a running tether process whose output goes to a log file that is
// printed when the test fails.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startBin(t, *tetherBin, name, args...)
}

// startBin starts bin (a tether binary) as a process named name.
func startBin(t *testing.T, bin, name string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		var ee *exec.ExitError
		if err := p.stop(t); errors.As(err, &ee) && ee.ExitCode() == raceExit {
			t.Errorf("%s: the race detector reported a data race (exit code %d); see its log", name, raceExit)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- %s log ---\n%s", name, b)
		}
	})
	return p
}

// raceExit is the exit code of a -race binary that detected a data race.
// (A SIGKILLed process proves nothing either way.)
const raceExit = 66

// stop sends SIGTERM and waits for a clean exit, killing after 20 s.
func (p *proc) stop(t *testing.T) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		// SIGQUIT first: a Go process prints every goroutine's stack to
		// its stderr (which the test logs), so a hang in the drain is
		// found in the log, not guessed at.
		t.Errorf("%s did not stop within 20s of SIGTERM; SIGQUIT for its goroutines, then killing", p.name)
		p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	return p.err
}

// freePort returns a loopback TCP port that was free a moment ago, for a
// process the test starts later (or restarts on the same port). It is
// taken below the kernel's ephemeral range (ip_local_port_range), where
// the kernel never puts an outgoing connection's local port: a port from
// the ephemeral range (what listening on port 0 gives) can be taken by
// any connection made meanwhile, and CI saw a nats-server of TestCluster
// die on "address already in use". Ports handed out in this process are
// not handed out again.
func freePort(t testing.TB) int {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const floor = 10000 // above the well-known and most registered services' ports
	if low <= floor+1000 {
		return ephemeralPort(t) // an unusual range: no room below it
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := floor + rand.IntN(low-floor)
		if portsGiven[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		portsGiven[port] = true
		return port
	}
	return ephemeralPort(t)
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralPort is a port the kernel chose, free a moment ago.
func ephemeralPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// checkFor polls cond every 50 ms until it returns nil or d passes.
func checkFor(t *testing.T, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type fleet struct {
	dataDir, tokenFile            string
	tunnelAddr, httpAddr, natsURL string
	coordArgs                     []string
	coord                         *proc
	nc                            *nats.Conn
	cl                            *client.Client
}

// e2ePolicy writes a policy granting the e2e client (nats:e2e) and the
// loopback facades' callers of this uid every operation, running as the test's own
// user, and returns its path.
func e2ePolicy(t *testing.T) string { return e2ePolicyWith(t, "") }

// e2ePolicyWith is e2ePolicy with extra rules first (YAML list items at
// the rules' indentation), which then win over the defaults.
func e2ePolicyWith(t *testing.T, extra string) string {
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	rules := `    rules:
` + extra + `
      - nodes: "*"
        operations: [exec, shell, cp.read, cp.write]
        paths: [/]
        run_as: ` + u.Username + `
      - nodes: "*"
        operations: [forward]
        targets: [openshell, opensandbox, execd]
      - nodes: "*"
        operations: [nodes.list]
      - nodes: "*"
        operations: [job.status, job.logs, job.cancel, sandboxes.register]
        scope: any
      - operations: [sandboxes.list, sandboxes.lease, sandboxes.reap]
        scope: any
      - operations: [admin]
`
	path := filepath.Join(t.TempDir(), "policy.yaml")
	pol := "version: 1\nidentities:\n  nats:e2e:\n" + rules + fmt.Sprintf("  token:loopback-uid-%d:\n", os.Geteuid()) + rules
	if err := os.WriteFile(path, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func startFleet(t *testing.T) *fleet { return startFleetPolicy(t, e2ePolicy(t)) }

// startFleetPolicy is startFleet with the coordinator's policy file.
func startFleetPolicy(t *testing.T, policy string) *fleet { return startFleetArgs(t, policy) }

// startFleetArgs is startFleetPolicy with extra coordinator flags after the
// usual ones (a flag given again there wins).
func startFleetArgs(t *testing.T, policy string, extra ...string) *fleet {
	f := &fleet{dataDir: t.TempDir()}
	f.tokenFile = filepath.Join(t.TempDir(), "token")
	os.WriteFile(f.tokenFile, []byte("e2e-secret-token\n"), 0o600)
	f.tunnelAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f.httpAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	natsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f.natsURL = "nats://" + natsAddr
	f.coordArgs = []string{"coordinator", "--data-dir", f.dataDir, "--listen", f.tunnelAddr, "--policy", policy,
		"--http-addr", f.httpAddr, "--nats-listen", natsAddr, "--allow-shared-token", "--token-file", f.tokenFile, "--heartbeat", heartbeat,
		"--openshell-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--opensandbox-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	f.coordArgs = append(f.coordArgs, extra...)
	f.coord = start(t, "coordinator", f.coordArgs...)
	f.waitReady(t)
	f.nc = f.connect(t)
	f.cl = client.New(f.nc)
	return f
}

// fleetCreds maps each running fleet's NATS URL to a client user's
// credentials file (natsEnv).
var fleetCreds sync.Map

// natsEnv is the environment that points a tether client command at the
// fleet on natsURL: the URL, and the credentials of the fleet's client user.
func natsEnv(natsURL string) []string {
	env := []string{"TETHER_NATS_URL=" + natsURL}
	if p, ok := fleetCreds.Load(natsURL); ok {
		env = append(env, "TETHER_NATS_CREDS="+p.(string))
	}
	return env
}

// credsFile is the fleet's client credentials file (see connect).
func (f *fleet) credsFile(t *testing.T) string {
	t.Helper()
	p, ok := fleetCreds.Load(f.natsURL)
	if !ok {
		t.Fatal("the fleet has no client credentials yet")
	}
	return p.(string)
}

// layout loads the coordinator's NATS layout from its data dir (the same
// keys, so credentials minted here are valid on its server).
func (f *fleet) layout(t *testing.T) *natsauth.Layout {
	t.Helper()
	l, err := natsauth.Load(filepath.Join(f.dataDir, "nats-auth"), natsauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// connect mints a client user "e2e" of the coordinator's layout, writes its
// credentials for the CLI (natsEnv) and connects as it.
func (f *fleet) connect(t *testing.T) *nats.Conn {
	t.Helper()
	creds, err := f.layout(t).MintClient("e2e", 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "e2e.creds")
	if err := natsauth.WriteCreds(path, creds); err != nil {
		t.Fatal(err)
	}
	fleetCreds.Store(f.natsURL, path)
	t.Cleanup(func() { fleetCreds.Delete(f.natsURL) })
	nc, err := nats.Connect(f.natsURL, append(creds.Options(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (f *fleet) waitReady(t *testing.T) {
	checkFor(t, defaultTestTimeout, func() error {
		resp, err := http.Get("http://" + f.httpAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
}

func (f *fleet) startAgent(t *testing.T, id, labels, tokenFile string) *proc {
	return start(t, "agent-"+id, "agent", "--coordinator", f.tunnelAddr, "--shared-token", "--token-file", tokenFile,
		"--ca-file", filepath.Join(f.dataDir, "pki", "ca.crt"), "--node-id", id, "--labels", labels,
		"--data-dir", t.TempDir())
}

func (f *fleet) waitNodes(t *testing.T, want ...string) []protocol.NodeInfo {
	t.Helper()
	var nodes []protocol.NodeInfo
	checkFor(t, defaultTestTimeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var err error
		nodes, err = f.cl.Nodes(ctx, "")
		if err != nil {
			return err
		}
		var got []string
		for _, n := range nodes {
			got = append(got, n.ID)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("nodes %v, want %v", got, want)
		}
		return nil
	})
	return nodes
}

// rawExec sends an exec request with plain nats.go and collects the streamed
// replies until the result, or returns the first reply if it is an error.
func rawExec(t *testing.T, nc *nats.Conn, body string) (stdout, stderr map[string]string, res *protocol.ExecResult, errMsg *nats.Msg) {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(protocol.SubjectExec, inbox, []byte(body)); err != nil {
		t.Fatal(err)
	}
	stdout, stderr = map[string]string{}, map[string]string{}
	wantSeq := 0
	for {
		m, err := sub.NextMsg(defaultTestTimeout)
		if err != nil {
			t.Fatalf("waiting for exec replies: %v", err)
		}
		if m.Header.Get("Nats-Service-Error-Code") != "" {
			return nil, nil, nil, m
		}
		if m.Header.Get(protocol.HeaderType) == protocol.ReplyProbe {
			continue // a liveness probe: unsequenced, nothing to read
		}
		if seq := m.Header.Get(protocol.HeaderSeq); seq != strconv.Itoa(wantSeq) {
			t.Fatalf("reply seq %q, want %d", seq, wantSeq)
		}
		wantSeq++
		node := m.Header.Get(protocol.HeaderNode)
		switch m.Header.Get(protocol.HeaderType) {
		case protocol.ReplyStdout:
			stdout[node] += string(m.Data)
		case protocol.ReplyStderr:
			stderr[node] += string(m.Data)
		case protocol.ReplyNodeResult, protocol.ReplyKeepAlive:
			// Each node's result as it finishes; the final result
			// repeats them (it fits here).
		case protocol.ReplyResult:
			res = new(protocol.ExecResult)
			if err := json.Unmarshal(m.Data, res); err != nil {
				t.Fatalf("result %q: %v", m.Data, err)
			}
			return stdout, stderr, res, nil
		default:
			t.Fatalf("reply with unknown type %q", m.Header.Get(protocol.HeaderType))
		}
	}
}

// processesWith lists pids whose command line contains every arg, to prove
// that a killed job left nothing behind.
func processesWith(args ...string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if i := bytes.LastIndexByte(st, ')'); i > 0 && len(st) > i+2 && st[i+2] == 'Z' {
			continue // a zombie is already dead
		}
		parts := strings.Split(string(b), "\x00")
		all := true
		for _, a := range args {
			found := false
			for _, p := range parts {
				if p == a {
					found = true
				}
			}
			all = all && found
		}
		if all {
			pids = append(pids, pid)
		}
	}
	return pids
}

func metric(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	t.Fatalf("metric %s not exposed", name)
	return 0
}

func runCLI(t *testing.T, natsURL string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runCLIWithin(t, defaultTestTimeout, natsURL, stdin, args...)
}

// runCLIWithin is runCLI with the CLI killed after d (code -1) rather than
// defaultTestTimeout.
func runCLIWithin(t *testing.T, d time.Duration, natsURL string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, *tetherBin, args...)
	cmd.Env = append(os.Environ(), natsEnv(natsURL)...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run tether %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

func TestFleetEndToEnd(t *testing.T) {
	f := startFleet(t)
	f.startAgent(t, "e2e-a", "role=a,zone=z1", f.tokenFile)
	f.startAgent(t, "e2e-b", "role=b,zone=z1", f.tokenFile)
	nodes := f.waitNodes(t, "e2e-a", "e2e-b")
	if nodes[0].Labels["role"] != "a" || nodes[0].Capacity.CPUs == 0 || nodes[0].Coordinator == "" || nodes[0].ConnectedAt.IsZero() {
		t.Fatalf("node info incomplete: %+v", nodes[0])
	}

	t.Run("raw nats: output, stderr and exit code", func(t *testing.T) {
		out, errOut, res, em := rawExec(t, f.nc, `{"target":{"node":"e2e-a"},"script":"echo out\necho err >&2\nprintf 'no newline'\nexit 3"}`)
		if em != nil {
			t.Fatalf("error reply: %v", em.Header)
		}
		if out["e2e-a"] != "out\nno newline" || errOut["e2e-a"] != "err\n" {
			t.Fatalf("stdout %q stderr %q", out["e2e-a"], errOut["e2e-a"])
		}
		if len(res.Results) != 1 || res.Results[0].ExitCode != 3 || res.Results[0].Node != "e2e-a" {
			t.Fatalf("result %+v", res)
		}
	})

	t.Run("bash -s semantics", func(t *testing.T) {
		// NeMo Gym's run(commands): only the last status counts (NG-1, NG-2).
		out, _, res, _ := rawExec(t, f.nc, `{"target":{"node":"e2e-b"},"script":"false\necho a"}`)
		if out["e2e-b"] != "a\n" || res.Results[0].ExitCode != 0 {
			t.Fatalf("false;echo a: %q %+v", out["e2e-b"], res.Results[0])
		}
		_, _, res, _ = rawExec(t, f.nc, `{"target":{"node":"e2e-b"},"script":"echo a\nfalse"}`)
		if res.Results[0].ExitCode != 1 {
			t.Fatalf("echo a;false: %+v", res.Results[0])
		}
	})

	t.Run("selector and all", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		res, err := f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Selector: "role=b"}, Argv: []string{"hostname"}}, nil)
		if err != nil || len(res.Results) != 1 || res.Results[0].Node != "e2e-b" {
			t.Fatalf("selector role=b: %+v, %v", res, err)
		}
		res, err = f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Selector: "zone in (z1), role!=c"}, Argv: []string{"true"}}, nil)
		if err != nil || len(res.Results) != 2 {
			t.Fatalf("set selector: %+v, %v", res, err)
		}
		res, err = f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"true"}}, nil)
		if err != nil || len(res.Results) != 2 || !res.Results[0].OK() || !res.Results[1].OK() {
			t.Fatalf("all: %+v, %v", res, err)
		}
	})

	t.Run("timeout kills the process tree", func(t *testing.T) {
		_, _, res, _ := rawExec(t, f.nc, `{"target":{"node":"e2e-a"},"script":"sleep 3131 &\nsleep 3131 &\nwait","timeout":"1s"}`)
		r := res.Results[0]
		if !r.TimedOut || r.ExitCode != 124 {
			t.Fatalf("result %+v, want timed out with 124", r)
		}
		checkFor(t, 10*time.Second, func() error {
			if p := processesWith("sleep", "3131"); len(p) > 0 {
				return fmt.Errorf("sleep 3131 still running: pids %v", p)
			}
			return nil
		})
	})

	t.Run("cancelled request kills the job", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		started := make(chan struct{})
		var once sync.Once
		go func() {
			<-started
			cancel()
		}()
		res, err := f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "e2e-b"}, Script: "echo started\nexec sleep 3132"},
			func(node, stream string, data []byte) { once.Do(func() { close(started) }) })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Exec = %v, want context.Canceled", err)
		}
		if res == nil || len(res.Results) != 1 || !res.Results[0].Cancelled {
			t.Fatalf("result %+v, want the node's run marked cancelled", res)
		}
		checkFor(t, 10*time.Second, func() error {
			if p := processesWith("sleep", "3132"); len(p) > 0 {
				return fmt.Errorf("sleep 3132 still running: pids %v", p)
			}
			return nil
		})
	})

	t.Run("bad requests run nothing", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "ran")
		touch := fmt.Sprintf(`"script":"touch %s"`, marker)
		for _, tt := range []struct {
			name, body, status, code string
		}{
			{"malformed", `{"target":{"node":"e2e-a"},` + touch, "400", protocol.ErrCodeMalformed},
			{"unknown field", `{"target":{"node":"e2e-a"},"sudo":true,` + touch + `}`, "400", protocol.ErrCodeUnknownField},
			{"no target", `{` + touch + `}`, "400", protocol.ErrCodeNoTarget},
			{"unknown node", `{"target":{"node":"nope"},` + touch + `}`, "404", protocol.ErrCodeUnknownNode},
			{"no match", `{"target":{"selector":"role=zzz"},` + touch + `}`, "404", protocol.ErrCodeNoMatch},
			{"oversized script", `{"target":{"node":"e2e-a"},"script":"` + strings.Repeat("#", protocol.MaxScriptSize+1) + `"}`, "413", protocol.ErrCodeTooLarge},
			{"stdin with script", `{"target":{"node":"e2e-a"},"stdin":"eA==",` + touch + `}`, "400", protocol.ErrCodeInvalid},
		} {
			t.Run(tt.name, func(t *testing.T) {
				_, _, _, em := rawExec(t, f.nc, tt.body)
				if em == nil {
					t.Fatal("request accepted, want a micro error")
				}
				if got := em.Header.Get("Nats-Service-Error-Code"); got != tt.status {
					t.Errorf("status %q, want %q", got, tt.status)
				}
				var apiErr protocol.APIError
				if err := json.Unmarshal(em.Data, &apiErr); err != nil || apiErr.Code != tt.code || em.Header.Get("Nats-Service-Error") == "" {
					t.Errorf("error body %q (%v), want code %q and a message", em.Data, err, tt.code)
				}
			})
		}
		if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a rejected request ran: %v", err)
		}
	})

	t.Run("cli", func(t *testing.T) {
		out, errOut, code := runCLI(t, f.natsURL, "", "exec", "--node", "e2e-a", "--", "sh", "-c", "echo hi; echo oops >&2; exit 7")
		if code != 7 || out != "hi\n" || !strings.Contains(errOut, "oops") {
			t.Fatalf("exec --node: code %d stdout %q stderr %q", code, out, errOut)
		}
		out, _, code = runCLI(t, f.natsURL, "", "exec", "--all", "--", "echo", "x")
		if code != 0 || !strings.Contains(out, "e2e-a") || !strings.Contains(out, "e2e-b") || strings.Count(out, "x\n") != 2 {
			t.Fatalf("exec --all: code %d stdout %q", code, out)
		}
		_, _, code = runCLI(t, f.natsURL, "", "exec", "--all", "--", "sh", "-c", `test "$(hostname)" = never`)
		if code != 1 {
			t.Fatalf("exec --all with failures: code %d, want 1", code)
		}
		script := filepath.Join(t.TempDir(), "job.sh")
		os.WriteFile(script, []byte("echo from-script\nexit 5\n"), 0o644)
		out, _, code = runCLI(t, f.natsURL, "", "exec", "--node", "e2e-b", "--script", script)
		if code != 5 || out != "from-script\n" {
			t.Fatalf("exec --script: code %d stdout %q", code, out)
		}
		// A selector may match many nodes: output is prefixed and any
		// failure exits 1, whatever the count.
		out, _, code = runCLI(t, f.natsURL, "", "exec", "--selector", "role=b", "--script", script)
		if code != 1 || out != "e2e-b | from-script\n" {
			t.Fatalf("exec --script: code %d stdout %q", code, out)
		}
		out, _, code = runCLI(t, f.natsURL, "", "exec", "--node", "e2e-a", "--timeout", "500ms", "--", "sleep", "3133")
		if code != 124 {
			t.Fatalf("exec --timeout: code %d, want 124", code)
		}
		out, _, code = runCLI(t, f.natsURL, "", "nodes", "--json")
		var nr protocol.NodesResponse
		if code != 0 || json.Unmarshal([]byte(out), &nr) != nil || len(nr.Nodes) != 2 {
			t.Fatalf("nodes --json: code %d out %q", code, out)
		}
		_, errOut, code = runCLI(t, f.natsURL, "", "exec", "--node", "nope", "--", "true")
		if code == 0 || !strings.Contains(errOut, "nope") {
			t.Fatalf("exec on unknown node: code %d stderr %q", code, errOut)
		}
	})

	t.Run("wrong token is rejected and counted", func(t *testing.T) {
		before := metric(t, f.httpAddr, `tether_coordinator_auth_failures_total{reason="bad_token"}`)
		bad := filepath.Join(t.TempDir(), "bad-token")
		os.WriteFile(bad, []byte("not-the-token"), 0o600)
		p := f.startAgent(t, "e2e-intruder", "role=x", bad)
		checkFor(t, defaultTestTimeout, func() error {
			if v := metric(t, f.httpAddr, `tether_coordinator_auth_failures_total{reason="bad_token"}`); v <= before {
				return fmt.Errorf("auth failures %v, want > %v", v, before)
			}
			return nil
		})
		p.stop(t)
		f.waitNodes(t, "e2e-a", "e2e-b")
	})

	t.Run("agents re-register after a coordinator restart", func(t *testing.T) {
		before := f.waitNodes(t, "e2e-a", "e2e-b")
		if err := f.coord.stop(t); err != nil {
			t.Fatalf("coordinator exit after SIGTERM: %v", err)
		}
		f.coord = start(t, "coordinator-restarted", f.coordArgs...)
		f.waitReady(t)
		after := f.waitNodes(t, "e2e-a", "e2e-b")
		for i := range after {
			if after[i].SessionID == before[i].SessionID {
				t.Fatalf("node %s kept session %s across the restart", after[i].ID, after[i].SessionID)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		res, err := f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"true"}}, nil)
		if err != nil || len(res.Results) != 2 {
			t.Fatalf("exec after restart: %+v, %v", res, err)
		}
	})
}
