package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func writeConfig(t *testing.T, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func testEnv(vars map[string]string) *env {
	return &env{getenv: testGetenv(vars), now: time.Now}
}

// The example of each role validates as printed, and names every flag of
// the role's command as a key (set, or commented out with its default).
func TestConfigExampleValidates(t *testing.T) {
	for _, r := range []*configRole{agentConfigRole, coordinatorConfigRole} {
		t.Run(r.name, func(t *testing.T) {
			res := runCLI(testCtx(t), nil, "", "config", "example", "--role", r.name)
			if res.code != 0 {
				t.Fatalf("config example: exit %d: %s", res.code, res.stderr)
			}
			// Every commented-out default is a value: uncommenting one
			// must not give YAML's null (a zero duration printed as "").
			for _, line := range strings.Split(res.stdout, "\n") {
				rest, ok := strings.CutPrefix(line, "# ")
				key, v, isKey := strings.Cut(rest, ":")
				if ok && isKey && key != "" && !strings.ContainsAny(key, " \t") && strings.TrimSpace(v) == "" {
					t.Errorf("example line %q has no default value", line)
				}
			}
			path := writeConfig(t, withTestPolicy(t, res.stdout))
			if res := runCLI(testCtx(t), nil, "", "config", "validate", path); res.code != 0 || !strings.Contains(res.stdout, "ok") {
				t.Fatalf("config validate of the example: exit %d, stdout %q, stderr:\n%s", res.code, res.stdout, res.stderr)
			}
			cmd, _ := r.newCmd(testEnv(nil))
			cmd.Flags().VisitAll(func(f *pflag.Flag) {
				if f.Name == configFlag || f.Name == "help" {
					return
				}
				if !regexp.MustCompile(`(?m)^(# )?` + regexp.QuoteMeta(f.Name) + `: `).MatchString(res.stdout) {
					t.Errorf("the example has no key %s", f.Name)
				}
			})
		})
	}
	// The checked-in examples are valid too, and are exactly what config
	// example prints (README and deploy/examples say so): a flag added or
	// reworded without regenerating them fails here. Regenerate with
	// tether config example --role ROLE > deploy/examples/ROLE.yaml.
	for _, r := range []string{"agent", "coordinator"} {
		path := filepath.Join("..", "..", "..", "..", "deploy", "examples", r+".yaml")
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if res := runCLI(testCtx(t), nil, "", "config", "validate", writeConfig(t, withTestPolicy(t, string(data)))); res.code != 0 {
			t.Errorf("config validate %s: exit %d:\n%s", path, res.code, res.stderr)
		}
		res := runCLI(testCtx(t), nil, "", "config", "example", "--role", r)
		if res.stdout != string(data) {
			t.Errorf("%s differs from tether config example --role %s: regenerate it", path, r)
		}
	}
}

// examplePolicy is the policy file the coordinator's example names.
const examplePolicy = "policy: /etc/tether/policy.yaml\n"

// withTestPolicy is the config file doc with the example's policy file
// replaced by a valid one that exists (validate loads it, and the example's
// is not on this machine).
func withTestPolicy(t *testing.T, doc string) string {
	t.Helper()
	if !strings.Contains(doc, examplePolicy) {
		return doc // the agent's
	}
	pol := writeTestPolicy(t, "version: 1\nidentities:\n  nats:ops:\n    rules: [{operations: [admin]}]\n")
	return strings.Replace(doc, examplePolicy, "policy: "+pol+"\n", 1)
}

// Bad files: each error names the file, the line and the key, and says
// what was wanted; every problem is reported at once.
func TestConfigStrictErrors(t *testing.T) {
	tests := []struct {
		name, role, file string
		want             []string
	}{
		{"unknown key", "coordinator", "listen: :7443\nlisten-addr: :1\n",
			[]string{":2: key listen-addr: unknown key for the coordinator; did you mean listen?"}},
		{"unknown key far from any", "agent", "frobnicate: 1\n",
			[]string{":1: key frobnicate: unknown key for the agent (the keys are the flags of tether agent --help"}},
		{"duration that is no duration", "coordinator", "exec-timeout: soon\n",
			[]string{`:1: key exec-timeout: "soon" is not a duration: want a duration like 30s, 5m or 1h30m, or a number of seconds`}},
		{"duration NaN", "coordinator", "exec-timeout: .nan\n",
			[]string{`:1: key exec-timeout: ".nan" is not a duration: want a duration like 30s, 5m or 1h30m, or a number of seconds`}},
		{"string for an int", "coordinator", "max-handshakes-per-source: many\n",
			[]string{`:1: key max-handshakes-per-source: want a whole number, got the string "many"`}},
		{"string for a bool", "coordinator", "no-reaper: \"yes\"\n",
			[]string{`:1: key no-reaper: want a boolean (true or false), got the string "yes"`}},
		{"scalar for a list", "agent", "coordinator: a:1\n",
			[]string{`:1: key coordinator: want a list of strings`}},
		{"number for a string", "agent", "node-id: 7\n",
			[]string{`:1: key node-id: want a string, got the whole number 7`}},
		{"NaN", "coordinator", "admit-rate: .nan\n",
			[]string{`:1: key admit-rate: want a finite number, got .nan`}},
		{"inline join token", "agent", "coordinator: [a:1]\ntoken: s3cret-value\n",
			[]string{":2: key token: a secret is not accepted inline in a config file: give token-file: FILE, or token: {env: VARIABLE}, or set $TETHER_TOKEN"}},
		{"inline NATS password", "coordinator", "nats:\n  url: nats://n:4222\n  password: hunter2\n",
			[]string{":3: key nats.password: a secret is not accepted inline in a config file: give nats-creds: FILE"}},
		{"inline facade token", "coordinator", "facade-token: abc\n",
			[]string{":1: key facade-token: a secret is not accepted inline", "facade-token-file"}},
		{"set twice through a group", "coordinator", "log-level: debug\nlog:\n  level: warn\n",
			[]string{":3: key log.level: sets log-level again (first set on line 1)"}},
		{"unknown key in a group", "coordinator", "log:\n  levle: warn\n",
			[]string{":2: key log.levle: unknown key for the coordinator; did you mean log-level?"}},
		{"other role", "agent", "role: coordinator\n",
			[]string{":1: key role: this is a coordinator's config file, not an agent's"}},
		{"not a mapping", "agent", "- a\n- b\n",
			[]string{":1: the file must be a mapping"}},
		{"several problems at once", "coordinator", "listne: x\nheartbeat: true\n",
			[]string{":1: key listne:", ":2: key heartbeat: want a duration"}},
		{"a key that is no string", "coordinator", "log:\n  level: warn\n  7: x\n",
			[]string{":3: keys must be strings (flag names); under log: this one is the whole number 7"}},
		{"a second document", "coordinator", "listen: :7443\n# more\n---\nlisten: :1\n",
			[]string{":3: one YAML document expected, found more (the --- line)"}},
		{"a second document that is bad YAML", "coordinator", "listen: :7443\n---\nlisten: [\n",
			[]string{":3: did not find expected node content"}},
		{"bad YAML", "coordinator", "listen: [\n",
			[]string{"config.yaml:"}},
		{"semantic error names the key's line", "coordinator", "policy: /p.yaml\n\nlisten: nohostport\n",
			[]string{`:3: key listen: "nohostport" is not host:port`}},
		// Type errors do not hide the checks made before start (F2 of fresh2).
		{"type and range errors at once", "coordinator", "role: coordinator\nheartbeat: true\nmax-handshakes-per-source: -3\nadmit-rate: x\nlables: 1\n",
			[]string{":2: key heartbeat: want a duration", ":3: key max-handshakes-per-source: -3 is negative: want 0 or more (0: the default, 8)",
				":4: key admit-rate: want a number", ":5: key lables: unknown key", ": key policy: required (or --policy)"}},
		{"a duration flag's own error is not wrapped in a second want", "coordinator", "heartbeat: .nan\nexec-timeout: 999999999h\n",
			[]string{`:1: key heartbeat: ".nan" is not a duration: want a duration like 30s`, ":2: key exec-timeout: 999999999h is over the limit"}},
		{"a sentence about two keys keeps the flags' names", "coordinator", "policy: /p.yaml\ntls-cert: /c.pem\n",
			[]string{":2: --tls-cert and --tls-key go together"}},
		{"negative duration names the key and what is allowed", "coordinator", "policy: /p.yaml\nexec-timeout: -5s\n",
			[]string{":2: key exec-timeout: -5s is negative: want 0 (no timeout) or more"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.file)
			err := validateConfigFile(testEnv(nil), configRoles[tt.role], path)
			if err == nil {
				t.Fatalf("no error for:\n%s", tt.file)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error does not name the file %s:\n%v", path, err)
			}
			if strings.Contains(err.Error(), "s3cret-value") || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error shows the secret:\n%v", err)
			}
		})
	}
}

// TestConfigDurationSeconds: a config file's duration takes a bare number
// of seconds as every duration flag does (exec-timeout: 30 is 30s).
func TestConfigDurationSeconds(t *testing.T) {
	o := defaultCoordinatorOptions()
	cmd := coordinatorCommand(testEnv(nil), &o)
	pol := writeTestPolicy(t, "version: 1\nidentities:\n  nats:ops:\n    rules: [{operations: [admin]}]\n")
	path := writeConfig(t, "policy: "+pol+"\nexec-timeout: 30\nheartbeat: 1.5\n")
	cmd.ParseFlags([]string{"--config", path})
	if _, err := loadDaemonConfig(cmd, testEnv(nil), coordinatorConfigRole, &o.Log); err != nil {
		t.Fatal(err)
	}
	if o.ExecTimeout != 30*time.Second || o.Heartbeat != 1500*time.Millisecond {
		t.Fatalf("exec-timeout: 30, heartbeat: 1.5 gave %s and %s; want 30s and 1.5s", o.ExecTimeout, o.Heartbeat)
	}
	if err := validateConfigFile(testEnv(nil), coordinatorConfigRole, path); err != nil {
		t.Errorf("validate: %v", err)
	}
}

// Groups map onto flags by joining with a dash; an empty file sets
// nothing.
func TestConfigGroupsAndEmpty(t *testing.T) {
	for name, file := range map[string]string{"empty": "", "comments only": "# nothing\n"} {
		t.Run(name, func(t *testing.T) {
			if err := validateConfigFile(testEnv(nil), coordinatorConfigRole, writeConfig(t, file)); err == nil || !strings.Contains(err.Error(), ": key policy: required (or --policy)") {
				t.Fatalf("err = %v, want only the coordinator's own missing --policy", err)
			}
		})
	}
	o := defaultCoordinatorOptions()
	cmd := coordinatorCommand(testEnv(nil), &o)
	path := writeConfig(t, "policy: /p.yaml\nlog:\n  level: debug\n  format: json\nnats:\n  listen: 127.0.0.1:0\nfacade:\n  allowed-hosts: [a.example, b.example]\n")
	cmd.ParseFlags([]string{"--config", path})
	if _, err := loadDaemonConfig(cmd, testEnv(nil), coordinatorConfigRole, &o.Log); err != nil {
		t.Fatal(err)
	}
	if o.Log.Level != "debug" || o.Log.Format != "json" || o.NATSListen != "127.0.0.1:0" || strings.Join(o.Sandbox.AllowedHosts, ",") != "a.example,b.example" {
		t.Fatalf("options after the groups: log %+v nats-listen %q allowed-hosts %q", o.Log, o.NATSListen, o.Sandbox.AllowedHosts)
	}
}

// Precedence: a flag on the command line, then the environment variable
// that stands for the setting, then the file, then the default.
func TestConfigPrecedence(t *testing.T) {
	file := "coordinator: [file:7443]\ntoken-file: /file/token\nlabels: zone=file\nnode-id: file-node\npipe-wait: 2s\n"
	path := writeConfig(t, file)
	load := func(t *testing.T, vars map[string]string, args ...string) agentOptions {
		t.Helper()
		o := defaultAgentOptions()
		e := testEnv(vars)
		cmd := agentCommand(e, &o)
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		if _, err := loadDaemonConfig(cmd, e, agentConfigRole, &o.Log); err != nil {
			t.Fatal(err)
		}
		return o
	}
	t.Run("file over defaults", func(t *testing.T) {
		o := load(t, nil, "--config", path)
		if strings.Join(o.Coordinators, ",") != "file:7443" || o.TokenFile != "/file/token" || o.NodeID != "file-node" || o.PipeWait != 2*time.Second {
			t.Fatalf("options: %+v", o)
		}
		if o.JobRetention != 0 || o.DataDir != defaultAgentOptions().DataDir {
			t.Fatalf("keys the file does not set changed: job-retention %v data-dir %q", o.JobRetention, o.DataDir)
		}
	})
	t.Run("flags over the file", func(t *testing.T) {
		o := load(t, nil, "--config", path, "--coordinator", "flag:1,flag:2", "--node-id", "flag-node", "--token-file", "/flag/token")
		if strings.Join(o.Coordinators, ",") != "flag:1,flag:2" || o.NodeID != "flag-node" || o.TokenFile != "/flag/token" {
			t.Fatalf("options: %+v", o)
		}
		if o.Labels != "zone=file" {
			t.Fatalf("labels %q, want the file's (no flag)", o.Labels)
		}
	})
	t.Run("environment over the file", func(t *testing.T) {
		o := load(t, map[string]string{tokenEnv: "from-env"}, "--config", path)
		if o.TokenFile != "" {
			t.Fatalf("token-file %q: the file's, want none ($%s is set)", o.TokenFile, tokenEnv)
		}
		if o.NodeID != "file-node" {
			t.Fatalf("node-id %q, want the file's", o.NodeID)
		}
	})
	t.Run("flag over the environment", func(t *testing.T) {
		o := load(t, map[string]string{tokenEnv: "from-env"}, "--config", path, "--token-file", "/flag/token")
		if o.TokenFile != "/flag/token" {
			t.Fatalf("token-file %q, want the flag's", o.TokenFile)
		}
	})
	t.Run("TETHER_CONFIG names the file", func(t *testing.T) {
		o := load(t, map[string]string{configEnv: path})
		if o.NodeID != "file-node" {
			t.Fatalf("node-id %q: $%s not read", o.NodeID, configEnv)
		}
		o = load(t, map[string]string{configEnv: "/nonexistent"}, "--config", path)
		if o.NodeID != "file-node" {
			t.Fatalf("node-id %q: --config should win over $%s", o.NodeID, configEnv)
		}
	})
}

// tether config validate's exit codes: 0 and ok, 1 and the errors with
// their lines for an invalid file, 2 for a usage error.
func TestConfigValidateExitCodes(t *testing.T) {
	pol := writeTestPolicy(t, "version: 1\nidentities:\n  nats:ops:\n    rules: [{operations: [admin]}]\n")
	badPol := writeTestPolicy(t, "version: 1\nidentities:\n  nats:x:\n    rules: [{operations: [bogus]}]\n")
	good := writeConfig(t, "role: coordinator\npolicy: "+pol+"\n")
	noRole := writeConfig(t, "policy: "+pol+"\n")
	// The policy is loaded as the coordinator loads it at start (and
	// tether policy check does): a missing or bad file is an error of
	// the key, with its line, and the policy file's own lines.
	noPolicy := writeConfig(t, "role: coordinator\npolicy: /nonexistent/policy.yaml\n")
	badPolicy := writeConfig(t, "role: coordinator\n\npolicy: "+badPol+"\n")
	bad := writeConfig(t, "role: coordinator\npolicy: /p\nlistne: :1\n")
	dup := writeConfig(t, "role: agent\nlabels: a=b\nlabels: c=d\n")
	tab := writeConfig(t, "role: agent\nlog:\n\tlevel: info\n")
	roleList := writeConfig(t, "role: [agent]\n")
	roleTwice := writeConfig(t, "role: agent\nrole: coordinator\n")
	tests := []struct {
		args       []string
		code       int
		out, inErr string
	}{
		{[]string{"config", "validate", good}, 0, good + ": ok (coordinator)", ""},
		{[]string{"config", "validate", "--role", "coordinator", noRole}, 0, "ok (coordinator)", ""},
		{[]string{"config", "validate", bad}, 1, "", bad + ":3: key listne: unknown key"},
		{[]string{"config", "validate", noPolicy}, 1, "", noPolicy + ":2: key policy: open /nonexistent/policy.yaml: no such file or directory"},
		{[]string{"config", "validate", badPolicy}, 1, "", badPolicy + ":3: key policy: " + badPol + `:4:27: identities["nats:x"].rules[0].operations[0]: unknown operation "bogus"`},
		{[]string{"config", "validate", "--role", "agent", good}, 1, "", "this is a coordinator's config file, not an agent's"},
		{[]string{"config", "validate", "/nonexistent.yaml", "--role", "agent"}, 1, "", "no such file"},
		{[]string{"config", "validate", noRole}, 2, "", "names no role"},
		// A file that names its role but does not parse, or sets the role
		// wrongly, gets its own error with the line, not "names no role".
		{[]string{"config", "validate", dup}, 1, "", dup + ":3: key labels: sets labels again (first set on line 2)"},
		{[]string{"config", "validate", tab}, 1, "", tab + ":3: found character that cannot start any token (a tab: YAML indents with spaces only)"},
		{[]string{"config", "validate", "--role", "agent", tab}, 1, "", tab + ":3: found character that cannot start any token (a tab: YAML indents with spaces only)"},
		{[]string{"config", "validate", roleList}, 1, "", roleList + ":1: key role: want agent or coordinator"},
		{[]string{"config", "validate", roleTwice}, 1, "", roleTwice + ":2: key role: sets role again (first set on line 1)"},
		{[]string{"config", "validate", "--role", "agent", roleTwice}, 1, "", roleTwice + ":2: key role: sets role again (first set on line 1)"},
		{[]string{"config", "validate", "--role", "nats", good}, 2, "", `--role "nats"`},
		{[]string{"config", "validate"}, 2, "", "accepts 1 arg"},
		{[]string{"config", "example"}, 2, "", "want agent or coordinator"},
		{[]string{"config"}, 2, "", "a subcommand is required"},
	}
	for _, tt := range tests {
		res := runCLI(testCtx(t), nil, "", tt.args...)
		if res.code != tt.code || !strings.Contains(res.stdout, tt.out) || !strings.Contains(res.stderr, tt.inErr) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q", tt.args, res.code, res.stdout, res.stderr, tt.code, tt.out, tt.inErr)
		}
	}
}

// The daemons refuse a bad config file as a usage error naming the line,
// before they start anything.
func TestDaemonConfigErrors(t *testing.T) {
	path := writeConfig(t, "coordinator: [c:7443]\ntoken-file: /t\nnode-id: [x]\n")
	res := runCLI(testCtx(t), nil, "", "agent", "--config", path)
	if res.code != exitUsage || !strings.Contains(res.stderr, path+":3: key node-id: want a string, got a list") {
		t.Fatalf("agent with a bad config: exit %d, stderr:\n%s", res.code, res.stderr)
	}
	res = runCLI(testCtx(t), map[string]string{configEnv: path}, "", "coordinator")
	if res.code != exitUsage || !strings.Contains(res.stderr, path+":1: key coordinator: unknown key for the coordinator") {
		t.Fatalf("coordinator with an agent's config: exit %d, stderr:\n%s", res.code, res.stderr)
	}
	// Start-up reports the type errors and its own checks at once (F2 of fresh2).
	path = writeConfig(t, "heartbeat: true\nmax-handshakes-per-source: -3\n")
	res = runCLI(testCtx(t), nil, "", "coordinator", "--config", path)
	for _, w := range []string{path + ":1: key heartbeat: want a duration", path + ":2: key max-handshakes-per-source: -3 is negative", path + ": key policy: required (or --policy)"} {
		if res.code != exitUsage || !strings.Contains(res.stderr, w) {
			t.Errorf("coordinator with a bad config: exit %d, stderr:\n%s\nwant %q", res.code, res.stderr, w)
		}
	}
}

// A secret may be named by the environment variable that holds it, never
// written inline; $TETHER_TOKEN (the variable the daemon reads by itself)
// overrides the file's.
func TestConfigSecretFromNamedEnv(t *testing.T) {
	path := writeConfig(t, "coordinator: [c:7443]\ntoken:\n  env: MY_JOIN_TOKEN\nopenshell: 127.0.0.1:8080\nopenshell-token: {env: GW_TOKEN}\n")
	load := func(vars map[string]string) *configSource {
		t.Helper()
		_, src := loadAgentConfig(t, path, vars)
		return src
	}
	vars := map[string]string{"MY_JOIN_TOKEN": "join-secret", "GW_TOKEN": "gw-secret"}
	src := load(vars)
	e := testEnv(vars)
	if got := src.getenv(e, tokenEnv); got != "join-secret" {
		t.Errorf("token = %q, want $MY_JOIN_TOKEN's", got)
	}
	if got := src.getenv(e, openShellTokenEnv); got != "gw-secret" {
		t.Errorf("openshell token = %q, want $GW_TOKEN's", got)
	}
	if got := strings.Join(src.envRefs(), ","); got != "GW_TOKEN,MY_JOIN_TOKEN" {
		t.Errorf("envRefs = %q: the daemon unsets these", got)
	}
	vars[tokenEnv] = "env-wins"
	if got := load(vars).getenv(testEnv(vars), tokenEnv); got != "env-wins" {
		t.Errorf("token = %q, want $%s's over the file's", got, tokenEnv)
	}
	if err := validateConfigFile(testEnv(map[string]string{"MY_JOIN_TOKEN": "x"}), agentConfigRole, path); err != nil {
		t.Errorf("validate with the named variable set: %v", err)
	}

	for name, tt := range map[string]struct{ file, want string }{
		"bad variable name": {"token: {env: \"my token\"}\n", ":2: key token: want {env: VARIABLE}"},
		"file: instead":     {"token: {file: /t}\n", ":2: key token: want {env: VARIABLE}"},
		"and token-file":    {"token-file: /t\ntoken: {env: T}\n", ":3: key token: give token or token-file (line 2), not both"},
		"token-file after":  {"token: {env: T}\ntoken-file: /t\n", ":3: key token-file: give token-file or token (line 2), not both"},
	} {
		t.Run(name, func(t *testing.T) {
			err := validateConfigFile(testEnv(nil), agentConfigRole, writeConfig(t, "coordinator: [c:1]\n"+tt.file))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// The agent unsets the variable its config file names for a secret, as it
// does $TETHER_TOKEN, and takes the token from it: with no other token, an
// unenrolled agent passes validation (and fails later, on the CA file).
func TestAgentUnsetsConfigNamedEnv(t *testing.T) {
	t.Setenv("MY_JOIN_TOKEN", "from-named-env")
	path := writeConfig(t, "coordinator: [127.0.0.1:1]\ntoken: {env: MY_JOIN_TOKEN}\nca-file: "+filepath.Join(t.TempDir(), "missing.crt")+"\ndata-dir: "+t.TempDir()+"\n")
	r := runCLI(testCtx(t), map[string]string{"MY_JOIN_TOKEN": "from-named-env"}, "", "agent", "--config", path)
	if r.code == exitOK || r.code == exitUsage || !strings.Contains(r.stderr, "missing.crt") {
		t.Fatalf("agent: exit %d, want the CA file's failure after validation:\n%s", r.code, r.stderr)
	}
	if v, ok := os.LookupEnv("MY_JOIN_TOKEN"); ok {
		t.Errorf("MY_JOIN_TOKEN = %q still set after the agent command read it", v)
	}
}

// A config file is read only when it is a regular file of at most
// maxConfigFileSize bytes: /dev/zero, a FIFO with no writer or a huge file
// is refused with its path, by validate (with or without --role) and by
// the daemons, instead of being read without end or blocking forever.
func TestConfigFileNotRegularOrTooLarge(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.yaml")
	data := []byte("role: agent\n" + strings.Repeat("#", maxConfigFileSize) + "\n")
	if err := os.WriteFile(huge, data, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, inErr string
	}{
		{"/dev/zero", "/dev/zero: not a regular file"},
		{fifo, fifo + ": not a regular file"},
		{dir, dir + ": not a regular file"},
		{huge, huge + ": over 1048576 bytes"},
	}
	for _, tt := range tests {
		for _, args := range [][]string{
			{"config", "validate", tt.path},
			{"config", "validate", "--role", "agent", tt.path},
			{"agent", "--config", tt.path},
			{"coordinator", "--config", tt.path},
		} {
			res := runCLI(testCtx(t), nil, "", args...)
			if res.code == 0 || !strings.Contains(res.stderr, "config file: "+tt.inErr) {
				t.Errorf("%v: exit %d, stderr %q; want an error with %q", args, res.code, res.stderr, tt.inErr)
			}
		}
	}
}

// A secret named by an environment variable that is not set: the error
// that the secret is missing names the file's key, its line and the
// variable, so the operator knows which variable to export.
func TestConfigSecretEnvUnsetNamed(t *testing.T) {
	path := writeConfig(t, "role: agent\ncoordinator: [c:7443]\ntoken: {env: NOPE_NOT_SET}\n")
	t.Setenv("HOME", t.TempDir())
	res := runCLI(testCtx(t), nil, "", "config", "validate", "--role", "agent", path)
	want := path + ":3: key token: $NOPE_NOT_SET is not set or empty"
	if res.code != 1 || !strings.Contains(res.stderr, want) || !strings.Contains(res.stderr, "a join token is required") {
		t.Fatalf("validate with an unset token variable: exit %d, stderr %q; want exit 1 and %q", res.code, res.stderr, want)
	}
	res = runCLI(testCtx(t), nil, "", "agent", "--config", path)
	if res.code != exitUsage || !strings.Contains(res.stderr, want) {
		t.Fatalf("agent with an unset token variable: exit %d, stderr %q; want %q", res.code, res.stderr, want)
	}
	// Set, the variable is the token: no such error.
	res = runCLI(testCtx(t), map[string]string{"NOPE_NOT_SET": "tok"}, "", "config", "validate", "--role", "agent", path)
	if strings.Contains(res.stderr, "NOPE_NOT_SET") || strings.Contains(res.stderr, "join token is required") {
		t.Fatalf("validate with the variable set: exit %d, stderr %q", res.code, res.stderr)
	}
}

// A required value the file does not give is named by the file's key, with
// the file, not only by its flag (fresh17 item 11: an agent file without
// coordinator: read "--coordinator is required", and the join token's
// error named no file).
func TestConfigValidateNamesMissingKeys(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	agent := writeConfig(t, "role: agent\ndata-dir: "+t.TempDir()+"\n")
	res := runCLI(testCtx(t), nil, "", "config", "validate", agent)
	for _, want := range []string{
		agent + ": key coordinator: required (or --coordinator)\n",
		agent + ": key token-file: a join token is required until the agent has enrolled",
	} {
		if res.code != 1 || !strings.Contains(res.stderr, want) {
			t.Errorf("validate an agent file without coordinator or token: exit %d, stderr %q; want 1 and %q", res.code, res.stderr, want)
		}
	}
	coord := writeConfig(t, "role: coordinator\n")
	res = runCLI(testCtx(t), nil, "", "config", "validate", coord)
	if want := coord + ": key policy: required (or --policy): the coordinator refuses everything"; res.code != 1 || !strings.Contains(res.stderr, want) {
		t.Errorf("validate a coordinator file without policy: exit %d, stderr %q; want 1 and %q", res.code, res.stderr, want)
	}
	// On the command line, without a file, the flags are named.
	res = runCLI(testCtx(t), nil, "", "agent", "--data-dir", t.TempDir())
	if res.code != exitUsage || !strings.Contains(res.stderr, "--coordinator is required") || strings.Contains(res.stderr, "key coordinator") {
		t.Errorf("agent without --coordinator: exit %d, stderr %q", res.code, res.stderr)
	}
}
