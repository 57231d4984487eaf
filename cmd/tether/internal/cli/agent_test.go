package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/agent"
)

func TestAgentTargetFlags(t *testing.T) {
	valid := func() agentOptions {
		o := defaultAgentOptions()
		o.Coordinators = []string{"127.0.0.1:7443"}
		return o
	}
	tests := []struct {
		name        string
		mutate      func(*agentOptions)
		wantErr     []string // substrings; nil means valid
		wantTargets map[string]string
	}{
		{"gateways and targets", func(o *agentOptions) {
			o.OpenShell, o.OpenShellTokenFile, o.OpenShellWorkspaces = "127.0.0.1:8080", "/etc/tether/openshell-token", []string{"default", "team-a"}
			o.OpenSandbox, o.OpenSandboxAPIKeyFile = "127.0.0.1:8090", "/etc/tether/opensandbox-key"
			o.Targets = []string{"web=127.0.0.1:80", "db=[::1]:5432"}
		}, nil, map[string]string{"web": "127.0.0.1:80", "db": "[::1]:5432"}},
		{"credentials without their gateway", func(o *agentOptions) {
			o.OpenShellTokenFile, o.OpenSandboxAPIKeyFile = "/f", "/g"
		}, []string{"--openshell-token-file and --openshell-workspace need --openshell", "--opensandbox-api-key-file needs --opensandbox"}, nil},
		{"bad gateway addresses", func(o *agentOptions) { o.OpenShell, o.OpenSandbox = "8080", "localhost:http" },
			[]string{`--openshell: "8080" is not host:port`, `--opensandbox: "localhost:http": port "http" is not a number`}, nil},
		{"bad targets", func(o *agentOptions) {
			o.Targets = []string{"web", "openshell=127.0.0.1:1", "Web=127.0.0.1:1", "db=db", "a=127.0.0.1:1", "a=127.0.0.1:2", "own-ports=127.0.0.1:3"}
		}, []string{
			`--target "own-ports=127.0.0.1:3": the name own-ports is reserved for SSH port forwards`,
			`--target "web": want NAME=HOST:PORT`,
			`--target "openshell=127.0.0.1:1": the name openshell is reserved: give the gateway with --openshell`,
			`--target: target name "Web"`,
			`--target db: "db" is not host:port`,
			`--target "a=127.0.0.1:2": target a is given twice`,
		}, nil},
		{"transports", func(o *agentOptions) { o.Transports = []string{"wss", "tls"} }, nil, nil},
		{"bad transports", func(o *agentOptions) { o.Transports = []string{"ws", "tls", "tls"} },
			[]string{`--transport "ws": want tls or wss`, `--transport "tls" is listed twice`}, nil},
		{"wss with pings", func(o *agentOptions) { o.Transports, o.WebSocketPing = []string{"tls", "wss"}, 30*time.Second }, nil, nil},
		{"wss without pings", func(o *agentOptions) { o.Transports, o.WebSocketPing = []string{"wss"}, -1 }, nil, nil},
		{"wss with the default ping", func(o *agentOptions) { o.Transports, o.pingGiven = []string{"wss"}, true }, nil, nil},
		{"websocket ping below the floor", func(o *agentOptions) { o.Transports, o.WebSocketPing = []string{"wss"}, 999*time.Millisecond },
			[]string{"--websocket-ping 999ms: want at least 1s"}, nil},
		{"websocket ping without wss", func(o *agentOptions) { o.Transports, o.WebSocketPing = []string{"tls"}, 20*time.Second },
			[]string{"--websocket-ping applies to the wss transport only"}, nil},
		{"empty transport list", func(o *agentOptions) { o.Transports, o.transportGiven = nil, true }, []string{"--transport is empty"}, nil},
		{"empty transport entries", func(o *agentOptions) { o.Transports = []string{"", "wss", " "} },
			[]string{`--transport ",wss, " has an empty entry`}, nil},
		{"empty workspace", func(o *agentOptions) { o.OpenShell, o.OpenShellWorkspaces = "127.0.0.1:8080", []string{" "} },
			[]string{"--openshell-workspace: empty workspace name"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := valid()
			tt.mutate(&o)
			err := o.Validate("join-token")
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if diff := cmp.Diff(tt.wantTargets, o.targets); diff != "" {
					t.Errorf("targets (-want +got):\n%s", diff)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestReadAgentSecrets(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	keyFile := filepath.Join(dir, "key")
	emptyFile := filepath.Join(dir, "empty")
	for path, v := range map[string]string{tokenFile: "file-token\n", keyFile: "  file-key  ", emptyFile: "\n"} {
		if err := os.WriteFile(path, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := agentSecrets{openShellToken: "env-token\n", openSandboxAPIKey: "env-key"}
	o := &agentOptions{}
	if s, err := readAgentSecrets(o, env); err != nil || s != (agentSecrets{"env-token", "env-key"}) {
		t.Errorf("from the environment: %+v, %v", s, err)
	}
	o = &agentOptions{OpenShellTokenFile: tokenFile, OpenSandboxAPIKeyFile: keyFile}
	if s, err := readAgentSecrets(o, env); err != nil || s != (agentSecrets{"file-token", "file-key"}) {
		t.Errorf("files win over the environment: %+v, %v", s, err)
	}
	o = &agentOptions{OpenSandboxAPIKeyFile: emptyFile}
	if _, err := readAgentSecrets(o, env); err == nil || err.Error() != "--opensandbox-api-key-file: file "+emptyFile+" is empty" {
		t.Errorf("empty key file: %v", err)
	}
	o = &agentOptions{OpenShellTokenFile: filepath.Join(dir, "missing")}
	if _, err := readAgentSecrets(o, env); err == nil || !strings.HasPrefix(err.Error(), "--openshell-token-file: open ") {
		t.Errorf("missing token file: %v", err)
	}
}

// The agent command removes the gateway credentials from its environment
// once read, like TETHER_TOKEN.
func TestAgentUnsetsGatewaySecretEnv(t *testing.T) {
	vars := map[string]string{tokenEnv: "join-secret", openShellTokenEnv: "shell-secret", openSandboxAPIKeyEnv: "sandbox-secret"}
	for k, v := range vars {
		t.Setenv(k, v)
	}
	r := runCLI(testCtx(t), vars, "", "agent", "--coordinator", "127.0.0.1:1",
		"--ca-file", filepath.Join(t.TempDir(), "missing.crt"), "--data-dir", t.TempDir(),
		"--openshell", "127.0.0.1:8080", "--opensandbox", "127.0.0.1:8090")
	if r.code == exitOK {
		t.Fatalf("agent with a missing CA file exited 0")
	}
	for k := range vars {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s = %q still set after the agent command read it", k, v)
		}
	}
	if strings.Contains(r.stderr, "secret") {
		t.Errorf("stderr shows a secret: %q", r.stderr)
	}
}

// TestAgentRunErrorExitCode: a refused enrollment ends tether agent with
// 78 (what the systemd unit's RestartPreventExitStatus names); other
// errors keep their usual exit.
func TestAgentRunErrorExitCode(t *testing.T) {
	refused := fmt.Errorf("%w: agent n1: enroll with c:7443: refused: enroll_refused: join token is used up", agent.ErrEnrollRefused)
	var ee *exitError
	if err := agentRunError(refused); !errors.As(err, &ee) || ee.code != 78 || !strings.Contains(err.Error(), "used up") {
		t.Errorf("refused enrollment: %v, want exit 78 with the reason", err)
	}
	other := errors.New("agent n1: create data dir: permission denied")
	if err := agentRunError(other); err != other {
		t.Errorf("other error: %v", err)
	}
	if err := agentRunError(nil); err != nil {
		t.Errorf("nil: %v", err)
	}
	unit, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "systemd", "tether-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), fmt.Sprintf("\nRestartPreventExitStatus=%d\n", agent.ExitEnrollRefused)) {
		t.Errorf("the systemd unit does not keep exit %d from restarting", agent.ExitEnrollRefused)
	}
}
