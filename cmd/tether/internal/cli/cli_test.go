package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/protocol"
)

const defaultTestTimeout = 30 * time.Second

// syncBuffer is a bytes.Buffer safe for a command writing while the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// result is one run of the command line.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs the command line with the environment vars (nil: empty). An
// empty stdin is /dev/null, as for a command run with `</dev/null` (or by
// CI); any other is a reader, as a pipe is.
func runCLI(ctx context.Context, vars map[string]string, stdin string, args ...string) result {
	if stdin == "" {
		null, err := os.Open(os.DevNull)
		if err != nil {
			panic(err)
		}
		defer null.Close()
		return runCLIWith(ctx, vars, null, args...)
	}
	return runCLIWith(ctx, vars, strings.NewReader(stdin), args...)
}

// runCLIWith runs the command line with stdin.
func runCLIWith(ctx context.Context, vars map[string]string, stdin io.Reader, args ...string) result {
	var stdout, stderr syncBuffer
	e := &env{
		stdin:  stdin,
		stdout: &stdout,
		stderr: &stderr,
		getenv: testGetenv(vars),
		now:    time.Now,
	}
	code := run(ctx, args, e)
	return result{code, stdout.String(), stderr.String()}
}

// startDetached runs argv detached on node-0 of the fleet at url and
// returns the job id exec printed alone on stdout.
func startDetached(ctx context.Context, t testing.TB, url string, argv ...string) string {
	t.Helper()
	r := runCLI(ctx, nil, "", append([]string{"exec", "--nats-url", url, "--node", "node-0", "--detach", "--"}, argv...)...)
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("exec --detach: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	return id
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

func TestVersion(t *testing.T) {
	r := runCLI(testCtx(t), nil, "", "version")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	want := "tether dev (" + runtime.Version()
	if !strings.HasPrefix(r.stdout, want) {
		t.Errorf("version = %q, want prefix %q", r.stdout, want)
	}
}

func TestUsageErrors(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("secret\n"), 0o600)
	tests := []struct {
		name string
		args []string
		want []string // substrings of stderr
	}{
		{"no command", nil, []string{"a command is required"}},
		{"unknown command", []string{"frobnicate"}, []string{`unknown command "frobnicate"`}},
		{"unknown flag", []string{"nodes", "--frob"}, []string{"unknown flag: --frob", "Run 'tether nodes --help'"}},
		{"exec no target", []string{"exec", "--", "true"}, []string{"no target: give --node, --selector or --all"}},
		{"exec node and all", []string{"exec", "--node", "a", "--all", "--", "true"}, []string{"give only one of --node, --selector and --all"}},
		{"exec nothing to run", []string{"exec", "--all"}, []string{"nothing to run"}},
		{"exec argv and script", []string{"exec", "--all", "--script", "x.sh", "--", "true"}, []string{"give only one of a command after --, -c and --script"}},
		{"exec stdin with script", []string{"exec", "--all", "--stdin", "--script", "x.sh"}, []string{"--stdin works with a command after -- only"}},
		{"exec bad env", []string{"exec", "--all", "--env", "NOEQUALS", "--", "true"}, []string{`--env "NOEQUALS": want KEY=VALUE`}},
		{"exec bad selector", []string{"exec", "--selector", "a in (", "--", "true"}, []string{"--selector"}},
		{"exec several problems", []string{"exec", "--timeout", "-1s"}, []string{"no target", "nothing to run", "--timeout -1s is negative"}},
		{"exec --node twice", []string{"exec", "--node", "vm", "--node", "vm2", "--", "true"}, []string{`--node given 2 times ("vm", "vm2"): one node a command; --selector or --all run on several`}},
		{"coordinator public facade without TLS", []string{"coordinator", "--openshell-listen", "0.0.0.0:7081"}, []string{"is not a loopback address", "--facade-tls-cert"}},
		{"coordinator token file without TLS", []string{"coordinator", "--facade-token-file", tokenFile}, []string{"--facade-token-file needs --facade-tls-cert"}},
		{"coordinator nats-url without creds", []string{"coordinator", "--nats-url", "nats://127.0.0.1:4222"}, []string{"--nats-url needs --nats-creds"}},
		{"coordinator insecure-nats without nats-url", []string{"coordinator", "--insecure-nats"}, []string{"go with --nats-url"}},
		{"coordinator ssh-addr without keys", []string{"coordinator", "--ssh-addr", ":7022"}, []string{"--ssh-addr needs --ssh-authorized-keys FILE or --ssh-user-ca FILE"}},
		{"coordinator ssh keys without ssh-addr", []string{"coordinator", "--ssh-authorized-keys", "/etc/keys"}, []string{"go with --ssh-addr"}},
		{"coordinator bad ssh-addr", []string{"coordinator", "--ssh-addr", "nope", "--ssh-user-ca", "/ca"}, []string{"--ssh-addr: \"nope\" is not host:port"}},
		{"dev bad ssh-addr", []string{"dev", "--ssh-addr", "x"}, []string{"--ssh-addr: \"x\" is not host:port"}},
		{"ssh-proxy bad node", []string{"ssh-proxy", "a/b"}, []string{`NODE "a/b": must be`}},
		{"ssh-proxy no node", []string{"ssh-proxy"}, []string{"accepts 1 arg"}},
		{"forward stdio with local addr", []string{"forward", "--stdio", "n", "t", "8080"}, []string{"--stdio takes no LOCAL_ADDR"}},
		{"nats user create bad ttl", []string{"nats", "user", "create", "x", "--ttl", "-1s"}, []string{"--ttl -1s is negative"}},
		{"coordinator NaN reap rate", []string{"coordinator", "--reap-rate", "NaN"}, []string{"--reap-rate NaN must be a positive number"}},
		{"exec NaN timeout", []string{"exec", "--node", "n", "--timeout", "NaN", "--", "true"}, []string{"NaN is not a number of seconds"}},
		{"job wait huge poll", []string{"job", "wait", "--poll", "1000000h", "j1"}, []string{`"--poll" flag: 1000000h is over the limit of 1m`}},
		{"job logs huge poll", []string{"job", "logs", "--follow", "--poll", "2m", "j1"}, []string{`"--poll" flag: 2m is over the limit of 1m`}},
		{"sandboxes bad state", []string{"sandboxes", "--state", "bogus"}, []string{`--state "bogus"`}},
		{"reap without run", []string{"sandboxes", "reap"}, []string{"--run is required unless --dry-run is given"}},
		{"run-lease empty run", []string{"run-lease", "--run", "", "--", "true"}, []string{"--run is empty"}},
		{"run-lease no dash", []string{"run-lease", "true"}, []string{"put the command after --"}},
		{"run-lease bad ttl", []string{"run-lease", "--ttl", "10ms", "--", "true"}, []string{`"--ttl" flag: 10ms is under the minimum of 1s (the range is 1s to 24h)`}},
		{"forward public address", []string{"forward", "n1", "openshell", "0.0.0.0:8080"}, []string{"loopback only"}},
		{"agent without coordinator", []string{"agent", "--token-file", tokenFile}, []string{"--coordinator is required"}},
		{"agent without token", []string{"agent", "--coordinator", "c:7443"}, []string{"a join token is required"}},
		{"agent bad coordinator", []string{"agent", "--coordinator", "nohostport", "--token-file", tokenFile}, []string{`"nohostport" is not host:port`}},
		{"agent bad labels", []string{"agent", "--coordinator", "c:7443", "--token-file", tokenFile, "--labels", "gpu"}, []string{"--labels", `label "gpu": want key=value`}},
		{"agent bad node id", []string{"agent", "--coordinator", "c:7443", "--token-file", tokenFile, "--node-id", "a b"}, []string{"--node-id"}},
		{"agent empty transport", []string{"agent", "--coordinator", "c:7443", "--token-file", tokenFile, "--transport", ""}, []string{"--transport is empty"}},
		{"agent transport stray comma", []string{"agent", "--coordinator", "c:7443", "--token-file", tokenFile, "--transport", "wss,"}, []string{`--transport "wss," has an empty entry`}},
		{"agent tiny websocket ping", []string{"agent", "--coordinator", "c:7443", "--token-file", tokenFile, "--transport", "wss", "--websocket-ping", "1ms"}, []string{"--websocket-ping 1ms: want at least 1s"}},
		{"agent websocket ping without wss", []string{"agent", "--coordinator", "c:7443", "--token-file", tokenFile, "--websocket-ping", "30s"}, []string{"--websocket-ping applies to the wss transport only", "--transport is tls (the default)"}},
		{"agent websocket ping 0 without wss", []string{"agent", "--coordinator", "c:7443", "--token-file", tokenFile, "--transport", "tls", "--websocket-ping", "0"}, []string{"--websocket-ping applies to the wss transport only", "--transport is tls:"}},
		{"agent bad log format", []string{"agent", "--coordinator", "c:7443", "--token-file", tokenFile, "--log-format", "xml"}, []string{`--log-format "xml"`}},
		{"coordinator half TLS", []string{"coordinator", "--tls-cert", "a.pem"}, []string{"--tls-cert and --tls-key go together"}},
		{"coordinator bad listen", []string{"coordinator", "--listen", "7443"}, []string{"--listen"}},
		{"dev bad port", []string{"dev", "--nats-port", "70000"}, []string{"--nats-port 70000"}},
		{"dev bad listen", []string{"dev", "--listen", "7443"}, []string{"--listen: \"7443\" is not host:port"}},
		{"dev bad tunnel-addr (old name of --listen)", []string{"dev", "--tunnel-addr", "7443"}, []string{"tether: --tunnel-addr is deprecated: use --listen", "--listen: \"7443\" is not host:port"}},
		{"dev both listen names", []string{"dev", "--tunnel-addr", "127.0.0.1:1", "--listen", "127.0.0.1:2"}, []string{"--tunnel-addr is --listen's old name: give only --listen"}},
		{"nodes bad selector", []string{"nodes", "--selector", "!"}, []string{"--selector"}},
		{"version with args", []string{"version", "extra"}, []string{"unknown command"}},
		{"int flag not a number", []string{"exec", "--all", "--max-parallel", "abc", "--", "true"}, []string{`tether: --max-parallel "abc": want a whole number` + "\n"}},
		{"int flag a float", []string{"job", "list", "--limit", "1e3"}, []string{`--limit "1e3": want a whole number`}},
		{"int flag out of range", []string{"token", "create", "--uses", "99999999999999999999"}, []string{`--uses "99999999999999999999": want a whole number from -9223372036854775808 to 9223372036854775807`}},
		{"bool flag not a boolean", []string{"exec", "--all", "--summary=maybe", "--", "true"}, []string{`--summary "maybe": want a boolean (true or false)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(testCtx(t), nil, "", tt.args...)
			if r.code != exitUsage {
				t.Errorf("exit code %d, want %d; stderr:\n%s", r.code, exitUsage, r.stderr)
			}
			if !strings.HasPrefix(r.stderr, "tether: ") {
				t.Errorf("stderr does not start with \"tether: \": %q", r.stderr)
			}
			if strings.Contains(r.stderr, "strconv.") {
				t.Errorf("stderr names Go's strconv: %q", r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}

func TestAgentEmptyTokenFile(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte(" \n\t"), 0o600)
	r := runCLI(testCtx(t), nil, "", "agent", "--coordinator", "127.0.0.1:1", "--token-file", tokenFile, "--data-dir", t.TempDir())
	if r.code != exitFailure || !strings.Contains(r.stderr, "token file "+tokenFile+" is empty") {
		t.Errorf("exit %d, stderr %q; want 1 naming the empty file", r.code, r.stderr)
	}
}

func TestNATSURLPrecedence(t *testing.T) {
	tests := []struct {
		name string
		flag string
		env  string
		want string
	}{
		{"default", "", "", "nats://127.0.0.1:4222"},
		{"env", "", "nats://env:4222", "nats://env:4222"},
		{"flag wins", "nats://flag:4222", "nats://env:4222", "nats://flag:4222"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := natsOptions{URL: tt.flag}
			nt, err := o.resolve(func(k string) string {
				if k == natsURLEnv {
					return tt.env
				}
				return ""
			})
			if got := nt.url; err != nil || got != tt.want {
				t.Errorf("resolveURL = %q, want %q", got, tt.want)
			}
		})
	}
	// Through the command line: the error names the URL it tried.
	r := runCLI(testCtx(t), map[string]string{natsURLEnv: "nats://127.0.0.1:1"}, "", "nodes")
	if r.code != exitTether || !strings.Contains(r.stderr, "connect to NATS at nats://127.0.0.1:1") {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestAgentMissingTokenFile: a join token file not copied yet is named
// with its setting (--token-file, token-file in a config file) and what to
// do, once.
func TestAgentMissingTokenFile(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "join-token")
	r := runCLI(testCtx(t), nil, "", "agent", "--coordinator", "127.0.0.1:1", "--token-file", tokenFile, "--data-dir", t.TempDir())
	want := "tether: --token-file " + tokenFile + ": file does not exist: copy the join token there (tether token create -o FILE writes one)\n"
	if r.code != exitFailure || r.stderr != want {
		t.Errorf("exit %d, stderr %q; want 1, %q", r.code, r.stderr, want)
	}
}

func TestResolveToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "given")
	os.WriteFile(file, []byte("  from-file \n"), 0o600)

	tok, src, err := resolveToken(file, "from-env", dir)
	if err != nil || tok != "from-file" || src != file {
		t.Errorf("file: got %q, %q, %v", tok, src, err)
	}
	tok, src, err = resolveToken("", "from-env", dir)
	if err != nil || tok != "from-env" || src != "$TETHER_TOKEN" {
		t.Errorf("env: got %q, %q, %v", tok, src, err)
	}
	gen, src, err := resolveToken("", "", dir)
	if err != nil || len(gen) != 64 || src != filepath.Join(dir, joinTokenFile) {
		t.Fatalf("generate: got %q, %q, %v", gen, src, err)
	}
	if fi, err := os.Stat(src); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("generated token file: %v, mode %v", err, fi.Mode())
	}
	again, _, err := resolveToken("", "", dir)
	if err != nil || again != gen {
		t.Errorf("second start: got %q, %v; want the same token", again, err)
	}
	if _, _, err := resolveToken("", "", ""); err == nil {
		t.Error("no source and no directory: want an error")
	}
}

func TestExecOutcome(t *testing.T) {
	ok := protocol.NodeResult{Node: "a", ExitCode: 0}
	tests := []struct {
		name      string
		single    bool
		timeout   time.Duration
		results   []protocol.NodeResult
		wantCode  int
		wantLines []string
	}{
		{"single ok", true, 0, []protocol.NodeResult{ok}, 0, nil},
		{"single exit code", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: 3}}, 3, nil},
		{"single signal", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: 137, Signal: "SIGKILL"}}, 137,
			[]string{"node a: killed by signal SIGKILL (exit code 137)"}},
		{"single timeout", true, 5 * time.Second, []protocol.NodeResult{{Node: "a", ExitCode: 137, TimedOut: true}}, 124,
			[]string{"node a: timed out after 5s"}},
		{"single timeout default", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: 137, TimedOut: true, DurationMS: 1500.2}}, 124,
			[]string{"node a: timed out after 1.5s"}},
		{"single unreachable", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: -1, Error: "tunnel lost", ErrorCode: "unavailable"}}, 255,
			[]string{"node a: tunnel lost (unavailable)"}},
		{"single tunnel lost", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: -1, Error: "tunnel lost during exec: unexpected EOF"}}, 255,
			[]string{"node a: tunnel lost during exec: unexpected EOF"}},
		{"single internal error", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: -1, Error: "node a: panic in exec handler", ErrorCode: protocol.CodeInternal}}, 255,
			[]string{"node a: node a: panic in exec handler (internal)"}},
		{"single busy", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: -1, Error: "node a is running 64 execs, its limit", ErrorCode: protocol.CodeBusy}}, 255,
			[]string{"node a: node a is running 64 execs, its limit (busy)"}},
		{"single bad cwd", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: -1, Error: "cwd /x: no such file or directory", ErrorCode: protocol.CodeStartFailed}}, 255,
			[]string{"node a: cwd /x: no such file or directory (start_failed)"}},
		// A message from an agent that did not quote a name shows its
		// control bytes escaped: it cannot forge lines on the terminal.
		{"single bad cwd with a newline", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: -1, Error: "cwd /tmp\nx\x1b[2J: no such file or directory", ErrorCode: protocol.CodeStartFailed}}, 255,
			[]string{`node a: cwd /tmp\nx\x1b[2J: no such file or directory (start_failed)`}},
		{"single not found", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: -1, Error: "start x: not found", ErrorCode: protocol.CodeCommandNotFound}}, 127,
			[]string{"node a: start x: not found (command_not_found)"}},
		{"single not executable", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: -1, Error: "start x: permission denied", ErrorCode: protocol.CodeNotExecutable}}, 126,
			[]string{"node a: start x: permission denied (not_executable)"}},
		{"single cancelled", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: 143, Cancelled: true}}, 130,
			[]string{"node a: cancelled"}},
		{"single missing result", true, 0, nil, 255, []string{"job j: expected one node's result, got 0"}},
		{"single truncated", true, 0, []protocol.NodeResult{{Node: "a", StdoutTruncated: true, StdoutBytes: 99}}, 254,
			[]string{"node a: stdout was truncated at the output limit in force, the agent's (99 bytes produced); raise --output-limit (1GiB, unlimited) to get it all"}},
		{"single truncated and failed", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: 3, StderrTruncated: true, StderrBytes: 9}}, 3,
			[]string{"node a: stderr was truncated at the output limit in force, the agent's (9 bytes produced); raise --output-limit (1GiB, unlimited) to get it all"}},
		{"multi truncated", false, 0, []protocol.NodeResult{ok, {Node: "b", Truncated: true, StdoutTruncated: true, StdoutBytes: 5}}, 254,
			[]string{"node b: stdout was truncated at the output limit in force, the agent's (5 bytes produced); raise --output-limit (1GiB, unlimited) to get it all"}},
		{"multi ok", false, 0, []protocol.NodeResult{ok, {Node: "b"}}, 0, nil},
		{"multi failures", false, time.Second, []protocol.NodeResult{
			ok,
			{Node: "b", ExitCode: 2},
			{Node: "c", ExitCode: -1, Error: "unreachable"},
			{Node: "d", ExitCode: 137, TimedOut: true},
			{Node: "e", ExitCode: 143, Cancelled: true},
			{Node: "f", StderrTruncated: true, StderrBytes: 7},
		}, 1, []string{
			// The other failures are in the summary table.
			"node f: stderr was truncated at the output limit in force, the agent's (7 bytes produced); raise --output-limit (1GiB, unlimited) to get it all",
		}},
		{"single shutdown", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: -1, Cancelled: true,
			Error: "coordinator c1 is shutting down; job cancelled", ErrorCode: protocol.ResultCodeShutdown}}, 255,
			[]string{"node a: coordinator c1 is shutting down; job cancelled"}},
		{"single revoked", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: 143, Cancelled: true,
			Error: "access revoked: the policy no longer grants exec on a: no rule; job cancelled", ErrorCode: protocol.ResultCodeRevoked}}, 255,
			[]string{"node a: access revoked: the policy no longer grants exec on a: no rule; job cancelled"}},
		{"single output cut", true, 0, []protocol.NodeResult{{Node: "a", OutputCut: true}}, 254,
			[]string{"node a: output cut: the command exited but a process it left behind kept its output open past the agent's --pipe-wait, so its process group was killed and output after that was lost"}},
		{"single output cut and failed", true, 0, []protocol.NodeResult{{Node: "a", ExitCode: 1, OutputCut: true}}, 1,
			[]string{"node a: output cut: the command exited but a process it left behind kept its output open past the agent's --pipe-wait, so its process group was killed and output after that was lost"}},
		{"multi output cut", false, 0, []protocol.NodeResult{ok, {Node: "b", OutputCut: true}}, 254,
			[]string{"node b: output cut: the command exited but a process it left behind kept its output open past the agent's --pipe-wait, so its process group was killed and output after that was lost"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, lines := execOutcome(tt.single, tt.timeout, 0, &protocol.ExecResult{ID: "j", Results: tt.results})
			if code != tt.wantCode {
				t.Errorf("code = %d, want %d", code, tt.wantCode)
			}
			if diff := cmp.Diff(tt.wantLines, lines); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExecRequest(t *testing.T) {
	script := filepath.Join(t.TempDir(), "s.sh")
	os.WriteFile(script, []byte("echo from file\n"), 0o644)
	tests := []struct {
		name  string
		opts  execOptions
		argv  []string
		stdin string
		want  protocol.ExecRequest
	}{
		{"argv", execOptions{All: true, Env: []string{"A=1", "B=x=y"}, Cwd: "/tmp", Timeout: time.Minute, MaxParallel: 4},
			[]string{"echo", "hi"}, "",
			protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"echo", "hi"}, Env: map[string]string{"A": "1", "B": "x=y"},
				Cwd: "/tmp", Timeout: protocol.Duration(time.Minute), MaxParallel: 4}},
		{"stdin to several nodes", execOptions{All: true, Stdin: true}, []string{"wc", "-c"}, "data",
			protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"wc", "-c"}, Stdin: []byte("data")}},
		// One node's stdin is streamed (ExecStream), not in the request.
		{"stdin to one node", execOptions{Node: "n1", Stdin: true}, []string{"wc", "-c"}, "data",
			protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"wc", "-c"}}},
		{"script file", execOptions{Selector: "gpu=true", Script: script}, nil, "",
			protocol.ExecRequest{Target: protocol.Target{Selector: "gpu=true"}, Script: "echo from file\n"}},
		{"script stdin", execOptions{All: true, Script: "-"}, nil, "echo from stdin",
			protocol.ExecRequest{Target: protocol.Target{All: true}, Script: "echo from stdin"}},
		{"idempotent", execOptions{Node: "n1", Idempotent: true}, []string{"true"}, "",
			protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"true"}, Idempotent: true}},
		{"an idempotency key implies idempotent", execOptions{Node: "n1", IdempotencyKey: "k1"}, []string{"true"}, "",
			protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"true"}, Idempotent: true, IdempotencyKey: "k1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.opts.Validate(tt.argv); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			got, err := tt.opts.request(context.Background(), tt.argv, strings.NewReader(tt.stdin))
			if err != nil {
				t.Fatalf("request: %v", err)
			}
			if diff := cmp.Diff(&tt.want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("built request is invalid: %v", err)
			}
		})
	}
}

func TestNodesTable(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	nodes := []protocol.NodeInfo{
		{ID: "gpu-1", Labels: map[string]string{"zone": "a", "gpu": "true"}, Capacity: protocol.Capacity{CPUs: 64, MemoryBytes: 512 << 30, GPUs: 8, GPUModel: "H100"},
			Coordinator: "c1", ConnectedAt: now.Add(-3 * time.Hour), LastHeartbeat: now.Add(-2 * time.Second), RTTMicros: 1530,
			WindowStalls: 2, WindowStallSeconds: 1.2, SendQueuedBytes: 64 << 10, AgentWindowStalls: 1, AgentWindowStallSeconds: 0.0534},
		{ID: "small", Capacity: protocol.Capacity{CPUs: 2}, Coordinator: "c1", ConnectedAt: now.Add(-90 * time.Second), LastHeartbeat: now, RTTMicros: 250},
	}
	var b bytes.Buffer
	if err := writeNodesTable(&b, nodes, now); err != nil {
		t.Fatal(err)
	}
	want := `ID     LABELS           CPUS  MEMORY  GPUS    RTT    STALLS    QUEUED  CONNECTED  LAST SEEN  COORDINATOR
gpu-1  gpu=true,zone=a  64    512.0Gi  8×H100  1.53ms  3/1.25s  64.0Ki  3h         2s         c1
small  -                2     -       0       250µs  0         0       1m         0s         c1
`
	// tabwriter counts bytes, so the multi-byte × and µ shift columns;
	// compare fields instead of exact spacing.
	if diff := cmp.Diff(fields(want), fields(b.String())); diff != "" {
		t.Errorf("table (-want +got):\n%s\ngot:\n%s", diff, b.String())
	}
}

func fields(s string) [][]string {
	var out [][]string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		out = append(out, strings.Fields(l))
	}
	return out
}

func TestFormatAge(t *testing.T) {
	now := time.Unix(1e9, 0)
	for d, want := range map[time.Duration]string{
		0: "0s", 59 * time.Second: "59s", 61 * time.Second: "1m", 2 * time.Hour: "2h", 47 * time.Hour: "47h", 72 * time.Hour: "3d", -time.Second: "0s",
	} {
		if got := formatAge(now, now.Add(-d)); got != want {
			t.Errorf("formatAge(%v) = %q, want %q", d, got, want)
		}
	}
	if got := formatAge(now, time.Time{}); got != "-" {
		t.Errorf("formatAge(zero) = %q", got)
	}
}

func TestDialAddr(t *testing.T) {
	for in, want := range map[string]string{
		":7443":          "127.0.0.1:7443",
		"[::]:7443":      "127.0.0.1:7443",
		"0.0.0.0:1":      "127.0.0.1:1",
		"10.0.0.1:7443":  "10.0.0.1:7443",
		"localhost:7443": "localhost:7443",
	} {
		if got := dialAddr(in); got != want {
			t.Errorf("dialAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

// The agent command removes TETHER_TOKEN from its environment once read, so
// that no process it starts inherits the secret.
func TestAgentUnsetsTokenEnv(t *testing.T) {
	t.Setenv(tokenEnv, "from-env")
	r := runCLI(testCtx(t), map[string]string{tokenEnv: "from-env"}, "", "agent", "--coordinator", "127.0.0.1:1",
		"--ca-file", filepath.Join(t.TempDir(), "missing.crt"), "--data-dir", t.TempDir())
	if r.code == exitOK {
		t.Fatalf("agent with a missing CA file exited 0")
	}
	if v, ok := os.LookupEnv(tokenEnv); ok {
		t.Errorf("%s = %q still set after the agent command read it", tokenEnv, v)
	}
}

// fleetCreds is the client credentials file of the fleet the running test
// started (startFleet), and fleetLayout its NATS layout; nil between
// fleets. The tests of this package run one at a time.
var (
	fleetCreds  atomic.Pointer[string]
	fleetLayout atomic.Pointer[natsauth.Layout]
)

// startFleet is fleettest.Start, remembering the fleet's client
// credentials: commands run by runCLI (and testGetenv) find them as
// $TETHER_NATS_CREDS unless the test sets that variable itself.
func startFleet(tb testing.TB, opts fleettest.Options) *fleettest.Fleet {
	tb.Helper()
	f := fleettest.Start(tb, opts)
	fleetCreds.Store(&f.CredsFile)
	fleetLayout.Store(f.Layout)
	tb.Cleanup(func() {
		fleetCreds.Store(nil)
		fleetLayout.Store(nil)
	})
	return f
}

// testGetenv is the environment of a command a test runs: vars, and
// $TETHER_NATS_CREDS of the running test's fleet when vars has none.
func testGetenv(vars map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := vars[k]; ok {
			return v
		}
		if p := fleetCreds.Load(); k == natsCredsEnv && p != nil {
			return *p
		}
		return ""
	}
}
