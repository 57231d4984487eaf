package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/sshgate"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// TestWriteKnownHostsKeepsForeignFiles: ssh-config replaces a known_hosts
// file it wrote, never one it did not (a user's ~/.ssh/known_hosts given by
// mistake lost every entry).
func TestWriteKnownHostsKeepsForeignFiles(t *testing.T) {
	dir := t.TempDir()
	ours := filepath.Join(dir, "sub", "known_hosts")
	text := knownHostsMarker + " c1; rewritten by every run\n@cert-authority *.tether ssh-ed25519 AAAA\n"
	for range 2 { // created, then replaced
		if err := writeKnownHosts(ours, text, true); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(ours); string(b) != text {
		t.Fatalf("known_hosts = %q", b)
	}
	theirs := filepath.Join(dir, "known_hosts")
	os.WriteFile(theirs, []byte("github.com ssh-ed25519 AAAA\n"), 0o644)
	err := writeKnownHosts(theirs, text, true)
	if err == nil || !strings.Contains(err.Error(), "was not written by tether ssh-config") {
		t.Fatalf("writing over a user's known_hosts: %v", err)
	}
	if b, _ := os.ReadFile(theirs); string(b) != "github.com ssh-ed25519 AAAA\n" {
		t.Fatalf("the user's known_hosts was changed: %q", b)
	}
}

// TestSSHConfigRender: the config names every node as NODE.tether with
// its HostKeyAlias, reaches them through the jump host (its address, with
// the NATS host for an unspecified one) or ssh-proxy, checks host keys
// strictly against the known_hosts it writes, and parses with ssh -G.
func TestSSHConfigRender(t *testing.T) {
	info := &protocol.SSHInfo{
		Coordinator:  "c1",
		JumpAddr:     "0.0.0.0:7022",
		JumpHostKey:  "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJ1bXAganVtcCBqdW1wIGp1bXAganVtcCBqdW1wIGp1",
		KnownHostsCA: "@cert-authority *.tether ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhIGNhIGNhIGNhIGNhIGNhIGNhIGNhIGNhIGNhIGNh tether-host-ca",
		Nodes: []protocol.SSHInfoNode{
			{ID: "node-a", Alias: "node-a.tether", Logins: []string{"deploy"}},
			{ID: "node-b", Alias: "node-b.tether", Logins: []string{"alice", "deploy"}},
			{ID: "bad id", Alias: "x", Logins: []string{"x"}},
			{ID: "GPU-07", Alias: "GPU-07.tether", Logins: []string{"deploy"}},
		},
		NodesTotal: 4,
	}
	dir := t.TempDir()
	known := filepath.Join(dir, "known hosts")
	sc := sshConfig{Info: info, NATSHost: "coord.example", KnownHosts: known, Identity: "/keys/id_ed25519", Tether: "/usr/bin/tether"}
	cfg, kh, err := sc.render()
	if err != nil {
		t.Fatal(err)
	}
	// Every hop asks for AES-GCM first: OpenSSH's own order would pick
	// AES-CTR with an HMAC, since the servers offer no chacha20.
	gcmFirst := "aes128-gcm@openssh.com,aes256-gcm@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr"
	for _, want := range []string{
		"Host node-a.tether\n  HostKeyAlias node-a.tether\n  User deploy\n",
		"Host node-b.tether\n  HostKeyAlias node-b.tether\n  # logins: alice, deploy",
		"Host *.tether\n  ProxyJump tether-jump\n  UserKnownHostsFile \"" + known + "\"\n  StrictHostKeyChecking yes\n  Ciphers " + gcmFirst + "\n  IdentityFile /keys/id_ed25519\n  IdentitiesOnly yes\n",
		"Host tether-jump\n  HostName coord.example\n  Port 7022\n  HostKeyAlias tether-jump\n  UserKnownHostsFile \"" + known + "\"\n  StrictHostKeyChecking yes\n  Ciphers " + gcmFirst + "\n",
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	if strings.Contains(cfg, "bad id") {
		t.Errorf("an invalid node id was written:\n%s", cfg)
	}
	// OpenSSH lowercases the host name it is given (and HostName,
	// HostKeyAlias): it asks the jump host for gpu-07 and checks the host
	// certificate for gpu-07.tether, so a Host block for a node id with
	// capitals is a config that never connects. The config says so.
	// HostKeyAlias: the jump host and ssh-proxy find GPU-07 when asked for
	// gpu-07, and its host certificate names gpu-07.tether too.
	if !strings.Contains(cfg, "\nHost gpu-07.tether\n  HostKeyAlias gpu-07.tether\n") || strings.Contains(cfg, "GPU-07.tether") {
		t.Errorf("a node id with capitals gets no lowercase Host block:\n%s", cfg)
	}
	if want := knownHostsMarker + " c1; rewritten by every run\n" + info.KnownHostsCA + "\ntether-jump " + info.JumpHostKey + "\n"; kh != want {
		t.Errorf("known_hosts = %q, want %q", kh, want)
	}

	sc.ProxyCommand, sc.Identity, sc.NATSFlags = true, "", []string{"--nats-url", "nats://h:4222"}
	pcfg, pkh, err := sc.render()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pcfg, "Host *.tether\n  ProxyCommand /usr/bin/tether ssh-proxy --nats-url nats://h:4222 %n\n") || strings.Contains(pcfg, "tether-jump") {
		t.Errorf("proxy-command config:\n%s", pcfg)
	}
	if pkh != kh {
		t.Errorf("proxy-command known_hosts = %q", pkh)
	}

	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("no ssh client to parse the config with")
	}
	for _, c := range []struct{ name, text, host string }{{"jump", cfg, "node-a.tether"}, {"proxy", pcfg, "node-b.tether"}} {
		path := filepath.Join(dir, c.name+".conf")
		os.WriteFile(path, []byte(c.text), 0o600)
		out, err := exec.Command("ssh", "-G", "-F", path, c.host).CombinedOutput()
		if err != nil {
			t.Fatalf("ssh -G %s: %v\n%s", c.name, err, out)
		}
		g := string(out)
		for _, want := range []string{"hostkeyalias " + c.host, "stricthostkeychecking true", "ciphers " + gcmFirst, "userknownhostsfile " + strings.ReplaceAll(known, " ", "\\ ")} {
			if !strings.Contains(g, want) && !strings.Contains(g, strings.ReplaceAll(want, "\\ ", " ")) {
				t.Errorf("ssh -G %s lacks %q:\n%s", c.name, want, g)
			}
		}
		if c.name == "jump" && !strings.Contains(g, "proxyjump tether-jump") || c.name == "proxy" && !strings.Contains(g, "proxycommand /usr/bin/tether ssh-proxy") {
			t.Errorf("ssh -G %s: no proxy:\n%s", c.name, g)
		}
	}
}

// noAudit records nothing (the gate's Auditor).
type noAudit struct{}

func (noAudit) Record(*protocol.AuditEvent) {}

// sshFleet is a fleet of two agents whose coordinator vouches for its NATS
// client and for an SSH key through a jump host, the policy granting both
// ssh as the test's user.
type sshFleet struct {
	f       *fleettest.Fleet
	dir     string
	key     string // the private key file
	natsURL string
	vars    map[string]string
}

func startSSHFleet(t *testing.T) *sshFleet {
	t.Helper()
	for _, bin := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s", bin)
		}
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	pk, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pol := fmt.Sprintf(`version: 1
identities:
  nats:fleettest:
    rules:
      - nodes: "*"
        operations: [ssh]
        run_as: %[1]q
      - nodes: "*"
        operations: [nodes.list]
      - nodes: "*"
        operations: [forward]
        targets: [echo]
  "ssh-key:%[2]s":
    rules:
      - nodes: "index=0"
        operations: [ssh]
        run_as: %[1]q
`, me.Username, ssh.FingerprintSHA256(pk))
	polFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(polFile, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(polFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := sshgate.LoadHostCA(filepath.Join(dir, "ca_key"), 0)
	if err != nil {
		t.Fatal(err)
	}
	var jmu sync.Mutex
	var jumpAddr, jumpKey string
	echo := echoServer(t)
	f := fleettest.Start(t, fleettest.Options{Agents: 2, Agent: func(_ int, c *agent.Config) {
		c.Targets = map[string]string{"echo": echo, "other": echo}
	}, Coordinator: func(c *coordinator.Config) {
		c.Policy = store
		c.SSH.HostCA = ca
		c.SSH.Jump = func() (string, string) { jmu.Lock(); defer jmu.Unlock(); return jumpAddr, jumpKey }
	}})
	gate, err := sshgate.New(sshgate.Config{StateDir: filepath.Join(dir, "gate"), HostCA: ca, AuthorizedKeysFile: key + ".pub",
		Nodes: f.Coordinator.SSHNodes(), Policy: store, Auditor: noAudit{}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); gate.Serve(ln) }()
	t.Cleanup(func() { gate.Close(); <-served })
	jmu.Lock()
	jumpAddr = ln.Addr().String()
	jumpKey = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(gate.HostKey())))
	jmu.Unlock()
	return &sshFleet{f: f, dir: dir, key: key, natsURL: f.NATS.ClientURL(),
		vars: map[string]string{"XDG_CONFIG_HOME": filepath.Join(dir, "config")}}
}

// config runs tether ssh-config with args and writes its output to a file.
func (s *sshFleet) config(t *testing.T, name string, args ...string) string {
	t.Helper()
	args = append([]string{"ssh-config", "--nats-url", s.natsURL, "--nats-creds", s.f.CredsFile}, args...)
	r := runCLI(testCtx(t), s.vars, "", args...)
	if r.code != 0 {
		t.Fatalf("ssh-config: exit %d: %s", r.code, r.stderr)
	}
	path := filepath.Join(s.dir, name)
	if err := os.WriteFile(path, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ssh runs the OpenSSH client with the config file and args, stdin given,
// and returns its stdout, stderr and exit code.
func runSSH(t *testing.T, config, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*defaultTestTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", append([]string{"-F", config, "-o", "BatchMode=yes", "-o", "ConnectTimeout=20"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), cliMainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("ssh: %v", err)
	}
	return stdout.String(), stderr.String(), code
}

// TestSSHThroughFleet: the real OpenSSH client reaches a node's own SSH
// server through tether ssh-config's config, with ProxyJump through the
// jump host (the key proved twice, host keys checked strictly against the
// host CA) and with ProxyCommand tether ssh-proxy (the NATS identity):
// a command's output and exit status, bash -s with the script on stdin,
// and the policy's refusal of a node the key may not reach.
func TestSSHThroughFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet and runs ssh")
	}
	s := startSSHFleet(t)
	jump := s.config(t, "jump.conf", "--identity", s.key)
	proxy := s.config(t, "proxy.conf", "--proxy-command")
	text, _ := os.ReadFile(jump)
	if !strings.Contains(string(text), "Host node-0.tether") || !strings.Contains(string(text), "Host node-1.tether") {
		t.Fatalf("jump config lacks the nodes:\n%s", text)
	}
	for _, c := range []struct{ name, config string }{{"ProxyJump", jump}, {"ProxyCommand", proxy}} {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := runSSH(t, c.config, "", "node-0.tether", "echo hello from $(hostname -s 2>/dev/null || echo node); exit 3")
			if code != 3 || !strings.HasPrefix(out, "hello from") {
				t.Fatalf("ssh: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			out, errOut, code = runSSH(t, c.config, "set -e\nx=41\necho $((x+1))\nfalse\necho not reached\n", "node-0.tether", "bash -s")
			if code != 1 || out != "42\n" {
				t.Fatalf("bash -s: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
		})
	}
	// The key may ssh to index=0 only; NATS may ssh anywhere.
	if _, errOut, code := runSSH(t, jump, "", "node-1.tether", "true"); code != 255 {
		t.Errorf("ssh -J to node-1 with a key policy refuses there: exit %d, stderr %q", code, errOut)
	}
	if out, errOut, code := runSSH(t, proxy, "", "node-1.tether", "echo ok"); code != 0 || out != "ok\n" {
		t.Errorf("ssh-proxy to node-1: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// direct-tcpip (ssh -W, as ssh -L) to a target the policy's forward
	// rule names, by name; another target of the agent is refused.
	if out, errOut, code := runSSH(t, proxy, "through the tunnel\n", "-W", "echo:7", "node-0.tether"); code != 0 || out != "through the tunnel\n" {
		t.Errorf("ssh -W echo:7: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if out, errOut, code := runSSH(t, proxy, "x\n", "-W", "other:7", "node-0.tether"); code == 0 || out != "" {
		t.Errorf("ssh -W other:7 (no forward rule): exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// tether forward --stdio: the same stdio join, for a dial target.
	r := runCLI(testCtx(t), s.vars, "ping\n", "forward", "--stdio", "--nats-url", s.natsURL, "--nats-creds", s.f.CredsFile, "node-1", "echo")
	if r.code != 0 || r.stdout != "ping\n" {
		t.Errorf("forward --stdio: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestSSHProxyRefusal: ssh-proxy exits 255 with the policy's message when
// the caller may not ssh to the node, and 2 for a bad node name.
func TestSSHProxyRefusal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet")
	}
	f := fleettest.Start(t, fleettest.Options{Coordinator: func(c *coordinator.Config) {
		path := filepath.Join(t.TempDir(), "policy.yaml")
		os.WriteFile(path, []byte("version: 1\nidentities:\n  nats:fleettest:\n    rules:\n      - nodes: \"*\"\n        operations: [nodes.list]\n"), 0o600)
		store, err := policy.NewStore(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Policy = store
	}})
	args := []string{"--nats-url", f.NATS.ClientURL(), "--nats-creds", f.CredsFile}
	r := runCLI(testCtx(t), nil, "", append([]string{"ssh-proxy", "node-0.tether"}, args...)...)
	if r.code != exitTether || !strings.Contains(r.stderr, "nats:fleettest") || !strings.Contains(r.stderr, "ssh") || !strings.Contains(r.stderr, "node-0") {
		t.Errorf("refused ssh-proxy: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runCLI(testCtx(t), nil, "", append([]string{"ssh-proxy", "no/de"}, args...)...); r.code != exitUsage {
		t.Errorf("bad node: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runCLI(testCtx(t), nil, "", append([]string{"forward", "--stdio", "node-0", "web", "8080"}, args...)...); r.code != exitUsage {
		t.Errorf("forward --stdio with a local address: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestDevSSHKeys: tether dev takes the user's ~/.ssh/*.pub plain keys
// (certificates and junk skipped, duplicates once) into the jump host's
// authorized_keys, and its policy grants each ssh and forward as the dev
// user; without a key it writes nothing and says how to make one; a policy
// written before the keys is named in a note.
func TestDevSSHKeys(t *testing.T) {
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("no ssh-keygen")
	}
	home := t.TempDir()
	getenv := testGetenv(map[string]string{"HOME": home})
	out := filepath.Join(t.TempDir(), "ssh", "authorized_keys")
	ids, note, err := writeDevAuthorizedKeys(out, getenv)
	if err != nil || ids != nil || !strings.Contains(note, "ssh-keygen -t ed25519") {
		t.Fatalf("no keys: %v %q %v", ids, note, err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("an authorized_keys file without keys was written")
	}
	os.MkdirAll(filepath.Join(home, ".ssh"), 0o700)
	key := filepath.Join(home, ".ssh", "id_ed25519")
	if b, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me@host", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, b)
	}
	pub, _ := os.ReadFile(key + ".pub")
	os.WriteFile(filepath.Join(home, ".ssh", "copy.pub"), pub, 0o600)
	os.WriteFile(filepath.Join(home, ".ssh", "junk.pub"), []byte("not a key\n"), 0o600)
	ids, note, err = writeDevAuthorizedKeys(out, getenv)
	if err != nil || len(ids) != 1 || note != "" {
		t.Fatalf("keys: %v %q %v", ids, note, err)
	}
	pk, _, _, _, _ := ssh.ParseAuthorizedKey(pub)
	if want := "ssh-key:" + ssh.FingerprintSHA256(pk); ids[0] != want {
		t.Errorf("identity %s, want %s", ids[0], want)
	}
	if b, err := os.ReadFile(out); err != nil || strings.TrimSpace(string(b)) != strings.TrimSpace(string(pub)) {
		t.Errorf("authorized_keys = %q, %v; want %q", b, err, pub)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("authorized_keys mode %v, %v", fi.Mode(), err)
	}

	data, err := devPolicy("nats:alice", "alice", ids...)
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("dev", data)
	if err != nil {
		t.Fatal(err)
	}
	node := policy.Node{ID: "n", Labels: map[string]string{"dev": "true"}}
	kid := policy.Identity{Kind: policy.KindSSHKey, Name: strings.TrimPrefix(ids[0], "ssh-key:")}
	for _, id := range []policy.Identity{kid, {Kind: policy.KindNATS, Name: "alice"}} {
		gs, err := p.Grants(id, policy.OpSSH, node)
		if err != nil || len(gs) != 1 || gs[0].RunAs != "alice" {
			t.Errorf("%s ssh grants %+v, %v; want run_as alice", id, gs, err)
		}
		for _, target := range []string{"openshell", protocol.TargetOwnPorts} { // own-ports: VS Code Remote-SSH
			if _, err := p.Decide(id, policy.OpForward, node, policy.Object{Target: target}); err != nil {
				t.Errorf("%s forward to %s: %v", id, target, err)
			}
		}
	}
	if _, err := p.Decide(kid, policy.OpExec, node, policy.Object{}); err == nil {
		t.Error("the key may exec over NATS")
	}
	dir := t.TempDir()
	old, err := writeDevPolicy(dir, "nats:alice", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if note := devPolicySSHNote(old, ids); !strings.Contains(note, ids[0]) {
		t.Errorf("note for a policy without the key: %q", note)
	}
	if note := devPolicySSHNote(filepath.Join(t.TempDir(), "none"), ids); note != "" {
		t.Errorf("note without a policy file: %q", note)
	}
	fresh := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(fresh, data, 0o600)
	if note := devPolicySSHNote(fresh, ids); note != "" {
		t.Errorf("note for a policy granting the key: %q", note)
	}

	// The banner's advice without a key ("ssh-keygen, then restart tether
	// dev") works: a policy dev wrote before any key existed, unedited,
	// is written again with the keys; an edited one stays the user's.
	if _, err := writeDevPolicy(dir, "nats:alice", "alice", ids...); err != nil {
		t.Fatal(err)
	}
	if note := devPolicySSHNote(old, ids); note != "" {
		t.Errorf("after a restart with a new key, the unedited dev policy still grants it nothing: %q", note)
	}
	edited := t.TempDir()
	ep, _ := writeDevPolicy(edited, "nats:alice", "alice")
	b, _ := os.ReadFile(ep)
	b = append(b, []byte("# mine\n")...)
	os.WriteFile(ep, b, 0o600)
	if _, err := writeDevPolicy(edited, "nats:alice", "alice", ids...); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(ep); !bytes.Equal(got, b) {
		t.Errorf("writeDevPolicy replaced an edited dev policy: %q", got)
	}
}

// TestDevSSH: tether dev with a key in ~/.ssh runs the jump host for it,
// says so in its banner, and the real OpenSSH client logs in to the dev
// node with the config tether ssh-config prints (its key, host keys
// checked strictly), and through ssh-proxy too.
func TestDevSSH(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a full dev stack and runs ssh")
	}
	for _, bin := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s", bin)
		}
	}
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".ssh"), 0o700)
	key := filepath.Join(home, ".ssh", "id_ed25519")
	if b, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, b)
	}
	dir := t.TempDir()
	vars := map[string]string{"XDG_CONFIG_HOME": t.TempDir(), "HOME": home}
	dev := runDevT(t, dir, testGetenv(vars))
	url := dev.URL
	node := devNodeID()
	banner := dev.Banner()
	for _, w := range []string{"ssh jump:", "tether ssh-config --nats-url " + url + " >> ~/.ssh/config", "ssh " + node + ".tether"} {
		if !strings.Contains(banner, w) {
			t.Errorf("banner lacks %q:\n%s", w, banner)
		}
	}
	// The ProxyCommand runs outside this process's variables: the
	// credentials' path goes into it, as --nats-creds does.
	creds := filepath.Join(vars["XDG_CONFIG_HOME"], "tether", "dev.creds")
	for _, mode := range [][]string{{"--identity", key}, {"--proxy-command", "--nats-creds", creds}} {
		r := runCLI(testCtx(t), vars, "", append([]string{"ssh-config", "--nats-url", url}, mode...)...)
		if r.code != 0 {
			t.Fatalf("ssh-config %v: exit %d, stderr %q", mode, r.code, r.stderr)
		}
		cfg := filepath.Join(t.TempDir(), "config")
		os.WriteFile(cfg, []byte(r.stdout), 0o600)
		out, errOut, code := runSSH(t, cfg, "", node+".tether", "echo dev ok")
		if code != 0 || out != "dev ok\n" {
			t.Errorf("ssh %v to the dev node: exit %d, stdout %q, stderr %q\nconfig:\n%s", mode, code, out, errOut, r.stdout)
		}
	}
}

// TestSSHProxyNodeIDEndingInSuffix: a node whose id itself ends in .tether
// ("n1.tether") is reached as "n1.tether.tether" (ssh-config's alias, the
// %n ssh-proxy is given), as the jump host reaches it; ssh-proxy cut the
// suffix twice and asked for node "n1".
func TestSSHProxyNodeIDEndingInSuffix(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet")
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	f := fleettest.Start(t, fleettest.Options{NodeID: func(int) string { return "n1.tether" }, Coordinator: func(c *coordinator.Config) {
		path := filepath.Join(t.TempDir(), "policy.yaml")
		pol := fmt.Sprintf("version: 1\nidentities:\n  nats:fleettest:\n    rules:\n      - nodes: \"*\"\n        operations: [ssh]\n        run_as: %q\n", me.Username)
		if err := os.WriteFile(path, []byte(pol), 0o600); err != nil {
			t.Fatal(err)
		}
		store, err := policy.NewStore(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Policy = store
	}})
	args := []string{"--nats-url", f.NATS.ClientURL(), "--nats-creds", f.CredsFile}
	r := runCLI(testCtx(t), nil, "", append([]string{"ssh-proxy", "n1.tether.tether"}, args...)...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "SSH-2.0-") {
		t.Errorf("ssh-proxy n1.tether.tether: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestWriteKnownHostsOddFiles: a FIFO or a directory at --known-hosts is
// refused as not a regular file (it was "not written by tether
// ssh-config: its host keys would be lost"), and a symlink to a file
// ssh-config wrote is written through, the link kept (it was replaced by
// a regular file, leaving its target stale).
func TestWriteKnownHostsOddFiles(t *testing.T) {
	dir := t.TempDir()
	text := knownHostsMarker + " c1; rewritten by every run\n@cert-authority *.tether ssh-ed25519 AAAA\n"
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, dir} {
		if err := writeKnownHosts(p, text, true); err == nil || !strings.Contains(err.Error(), "not a regular file but a") || !strings.Contains(err.Error(), p) {
			t.Errorf("known_hosts %s: %v, want not a regular file", p, err)
		}
	}
	target := filepath.Join(dir, "real_known_hosts")
	if err := os.WriteFile(target, []byte(knownHostsMarker+" old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := writeKnownHosts(link, text, true); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the symlink was replaced: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(target); string(b) != text {
		t.Errorf("the link's target = %q, want the new text", b)
	}
}

// TestDevSSHKeysSkipsFIFOs: a named pipe among ~/.ssh/*.pub is skipped:
// tether dev opened it for reading and waited for a writer forever,
// printing nothing, before its banner (and SIGTERM waited with it).
func TestDevSSHKeysSkipsFIFOs(t *testing.T) {
	if _, err := exec.LookPath("ssh-keygen"); err != nil {
		t.Skip("no ssh-keygen")
	}
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".ssh"), 0o700)
	if err := syscall.Mkfifo(filepath.Join(home, ".ssh", "a-fifo.pub"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(home, ".ssh", "id_ed25519")
	if b, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, b)
	}
	type answer struct {
		ids []string
		err error
	}
	done := make(chan answer, 1)
	go func() {
		ids, _, err := writeDevAuthorizedKeys(filepath.Join(t.TempDir(), "authorized_keys"), testGetenv(map[string]string{"HOME": home}))
		done <- answer{ids, err}
	}()
	select {
	case a := <-done:
		if a.err != nil || len(a.ids) != 1 {
			t.Errorf("keys beside a FIFO: %v, %v; want the one key", a.ids, a.err)
		}
	case <-testCtx(t).Done():
		// Unblock the open so that the goroutine ends.
		if f, err := os.OpenFile(filepath.Join(home, ".ssh", "a-fifo.pub"), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("writeDevAuthorizedKeys blocked on a FIFO named *.pub")
	}
}

// TestSSHConfigTildePaths: --identity=~/KEY and --known-hosts=~/FILE, which
// the shell leaves unexpanded after "=", are in the home directory (as
// OpenSSH takes ~ in IdentityFile); they were taken relative to the
// working directory ("stat /cwd/~/.ssh/id_ed25519").
func TestSSHConfigTildePaths(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet")
	}
	f := fleettest.Start(t, fleettest.Options{Agents: 1})
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "id_test"), []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"HOME": home, "XDG_CONFIG_HOME": filepath.Join(home, "config")}
	r := runCLI(testCtx(t), vars, "", "ssh-config", "--nats-url", f.NATS.ClientURL(), "--nats-creds", f.CredsFile,
		"--identity=~/id_test", "--known-hosts=~/kh")
	if r.code != 0 || !strings.Contains(r.stdout, "IdentityFile "+filepath.Join(home, "id_test")+"\n") ||
		!strings.Contains(r.stdout, "UserKnownHostsFile "+filepath.Join(home, "kh")+"\n") {
		t.Fatalf("ssh-config with ~ paths: exit %d, stderr %q, stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	if _, err := os.Stat(filepath.Join(home, "kh")); err != nil {
		t.Errorf("known_hosts not written in the home directory: %v", err)
	}
}

// TestSSHConfigCaseCollision: node ids equal but for case share OpenSSH's
// lowercased alias; the lowercase one keeps it (a lowercase request finds
// it exactly), the other gets a comment, never a second Host block.
func TestSSHConfigCaseCollision(t *testing.T) {
	info := &protocol.SSHInfo{
		Coordinator: "c1",
		Nodes: []protocol.SSHInfoNode{
			{ID: "GPU-07", Alias: "GPU-07.tether"},
			{ID: "gpu-07", Alias: "gpu-07.tether"},
			{ID: "Big", Alias: "Big.tether"},
		},
		NodesTotal: 3,
	}
	sc := sshConfig{Info: info, KnownHosts: filepath.Join(t.TempDir(), "kh"), Tether: "/usr/bin/tether"}
	cfg, _, err := sc.render()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(cfg, "\nHost gpu-07.tether\n"); n != 1 {
		t.Errorf("%d Host blocks for gpu-07.tether, want 1:\n%s", n, cfg)
	}
	if !strings.Contains(cfg, "# GPU-07: not reachable with OpenSSH") {
		t.Errorf("the shadowed node GPU-07 is not named:\n%s", cfg)
	}
	if !strings.Contains(cfg, "\nHost big.tether\n") {
		t.Errorf("node Big has no lowercase Host block:\n%s", cfg)
	}
}

// TestWriteKnownHostsMakesNoDirectoriesForAGivenPath: a --known-hosts
// path in a directory that does not exist is refused, naming it, and no
// directory is made (fresh-user pass: /nonexistent/dir/kh made
// /nonexistent/dir); only the default's ~/.config/tether is created.
func TestWriteKnownHostsMakesNoDirectoriesForAGivenPath(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "typo", "dir")
	err := writeKnownHosts(filepath.Join(missing, "kh"), knownHostsMarker+" c1\n", false)
	if err == nil || !strings.Contains(err.Error(), missing+" does not exist") {
		t.Fatalf("a path in a missing directory: %v; want a refusal naming %s", err, missing)
	}
	if _, err := os.Stat(filepath.Join(dir, "typo")); !os.IsNotExist(err) {
		t.Errorf("a directory was made: %v", err)
	}
	if err := writeKnownHosts(filepath.Join(dir, "kh"), knownHostsMarker+" c1\n", false); err != nil {
		t.Errorf("a path in an existing directory: %v", err)
	}
}

// TestSSHConfigRefusesUnusablePaths: what ssh-config refuses about its
// paths is a usage error (exit 2), with nothing written and the reason
// and the way out in the message: a --known-hosts FILE it did not write
// (it exited 255), and an --identity or --known-hosts path with a control
// character, which OpenSSH's config cannot hold (a newline was written
// escaped, "\n", naming another file; fresh-user pass cliux19).
func TestSSHConfigRefusesUnusablePaths(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet")
	}
	f := fleettest.Start(t, fleettest.Options{Agents: 1})
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreign := write("known_hosts", "gate.example ssh-ed25519 AAAA\n")
	key := write("id_ok", "key")
	nlKey := write("id\nx", "key")
	tabKey := write("id\tx", "key")
	nlDir := filepath.Join(dir, "a\nb")
	if err := os.Mkdir(nlDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"foreign known_hosts", []string{"--known-hosts", foreign}, []string{"--known-hosts " + foreign + " exists and was not written by tether ssh-config", "give another file, or remove it first"}},
		{"newline in --identity", []string{"--identity", nlKey, "--known-hosts", filepath.Join(dir, "kh1")}, []string{"--identity", fmt.Sprintf(`control character '\n' at byte %d`, len(dir)+4)}},
		{"tab in --identity", []string{"--identity", tabKey, "--known-hosts", filepath.Join(dir, "kh2")}, []string{"--identity", fmt.Sprintf(`control character '\t' at byte %d`, len(dir)+4)}},
		{"newline in --known-hosts", []string{"--identity", key, "--known-hosts", filepath.Join(nlDir, "kh")}, []string{"--known-hosts", fmt.Sprintf(`control character '\n' at byte %d`, len(dir)+3)}},
	} {
		r := runCLI(testCtx(t), nil, "", append([]string{"ssh-config", "--nats-url", f.NATS.ClientURL(), "--nats-creds", f.CredsFile}, c.args...)...)
		if r.code != exitUsage || r.stdout != "" {
			t.Errorf("%s: exit %d (want %d), stdout %q, stderr %q", c.name, r.code, exitUsage, r.stdout, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: stderr %q, want %q", c.name, r.stderr, w)
			}
		}
	}
	if b, _ := os.ReadFile(foreign); string(b) != "gate.example ssh-ed25519 AAAA\n" {
		t.Errorf("the foreign known_hosts changed: %q", b)
	}
	for _, kh := range []string{filepath.Join(dir, "kh1"), filepath.Join(dir, "kh2"), filepath.Join(nlDir, "kh")} {
		if _, err := os.Stat(kh); !os.IsNotExist(err) {
			t.Errorf("%q was written: %v", kh, err)
		}
	}
}
