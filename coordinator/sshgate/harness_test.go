package sshgate

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// newSigner returns a fresh ed25519 signer.
func newSigner(t testing.TB) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// userKey is a client key pair written as OpenSSH files.
type userKey struct {
	signer ssh.Signer
	priv   ed25519.PrivateKey
	path   string // the private key file; path+".pub" the public one
}

func newUserKey(t testing.TB, dir, name string) *userKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, name)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".pub", ssh.MarshalAuthorizedKey(s.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	return &userKey{signer: s, priv: priv, path: path}
}

func (k *userKey) fingerprint() string { return ssh.FingerprintSHA256(k.signer.PublicKey()) }

// certTemplate is a valid user certificate for key, for principals.
func certTemplate(key ssh.PublicKey, principals ...string) *ssh.Certificate {
	now := time.Now()
	return &ssh.Certificate{
		Key:             key,
		Serial:          1,
		CertType:        ssh.UserCert,
		KeyId:           "test",
		ValidPrincipals: principals,
		ValidAfter:      uint64(now.Add(-time.Hour).Unix()),
		ValidBefore:     uint64(now.Add(time.Hour).Unix()),
		Permissions: ssh.Permissions{Extensions: map[string]string{
			"permit-pty": "", "permit-port-forwarding": "",
		}},
	}
}

// signRaw signs c with authority without the library's checks (which
// refuse a certificate authority and empty principals), setting
// SignatureKey to sigKey (authority's key when nil).
func signRaw(t testing.TB, c *ssh.Certificate, authority ssh.Signer, sigKey ssh.PublicKey) {
	t.Helper()
	if sigKey == nil {
		sigKey = authority.PublicKey()
	}
	c.Nonce = make([]byte, 32)
	rand.Read(c.Nonce)
	c.SignatureKey = sigKey
	c.Signature = &ssh.Signature{Format: "placeholder"}
	full := c.Marshal()
	data := full[:len(full)-4-len(ssh.Marshal(c.Signature))]
	sig, err := authority.Sign(rand.Reader, data)
	if err != nil {
		t.Fatal(err)
	}
	c.Signature = sig
}

// writeCert writes c as OpenSSH's KEY-cert.pub beside the key.
func (k *userKey) writeCert(t testing.TB, c *ssh.Certificate) string {
	t.Helper()
	path := k.path + "-cert.pub"
	if err := os.WriteFile(path, ssh.MarshalAuthorizedKey(c), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// certSigner is a client signer presenting c.
func certSigner(t testing.TB, c *ssh.Certificate, s ssh.Signer) ssh.Signer {
	t.Helper()
	cs, err := ssh.NewCertSigner(c, s)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// fakeNode is a node of fakeNodes: its labels and host key.
type fakeNode struct {
	labels  map[string]string
	hostKey ssh.Signer
	refuse  *protocol.ErrorInfo // OpenSSH answers this when set
	// stuck: the stream half-closes (CloseWrite succeeds, the node never
	// sees it) and the node never answers nor closes.
	stuck bool
}

// halfCloser is a stream that claims to half-close but swallows it.
type halfCloser struct{ net.Conn }

func (halfCloser) CloseWrite() error { return nil }

// fakeNodes is the fleet: OpenSSH serves each stream with a small SSH
// server that checks the params the way the agent does (the key compared
// byte for byte, the login among Logins) and runs exec requests as
// "true", "false", "exit N", "whoami", "params" (the identity and logins)
// and "cat".
type fakeNodes struct {
	t     testing.TB
	nodes map[string]*fakeNode
	// drain: OpenSSH's stream end is only drained (benchmarks).
	drain bool

	mu     sync.Mutex
	params []protocol.SSHParams
	errs   []error
}

func (f *fakeNodes) Node(id string) (policy.Node, bool) {
	n, ok := f.nodes[id]
	if !ok {
		return policy.Node{}, false
	}
	return policy.Node{ID: id, Labels: n.labels}, true
}

func (f *fakeNodes) HostKey(id string) []byte {
	n, ok := f.nodes[id]
	if !ok {
		return nil
	}
	return n.hostKey.PublicKey().Marshal()
}

func (f *fakeNodes) OpenSSH(ctx context.Context, id string, params protocol.SSHParams) (net.Conn, error) {
	n, ok := f.nodes[id]
	if !ok {
		return nil, fmt.Errorf("node %s: not connected", id)
	}
	if n.refuse != nil {
		return nil, n.refuse
	}
	f.mu.Lock()
	f.params = append(f.params, params)
	f.mu.Unlock()
	a, b := net.Pipe()
	if n.stuck {
		go io.Copy(io.Discard, b)
		return halfCloser{a}, nil
	}
	if f.drain {
		go func() { io.Copy(io.Discard, b); b.Close() }()
		return a, nil
	}
	go f.serve(b, n, params)
	return a, nil
}

func (f *fakeNodes) fail(err error) {
	f.mu.Lock()
	f.errs = append(f.errs, err)
	f.mu.Unlock()
}

func (f *fakeNodes) recorded() ([]protocol.SSHParams, []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.SSHParams(nil), f.params...), append([]error(nil), f.errs...)
}

// serve is the node's SSH server for one stream.
func (f *fakeNodes) serve(conn net.Conn, n *fakeNode, p protocol.SSHParams) {
	defer conn.Close()
	if err := p.Validate(); err != nil {
		f.fail(fmt.Errorf("params: %w", err))
		return
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if !bytes.Equal(key.Marshal(), p.PublicKey) {
				return nil, errors.New("not the key the coordinator vouched for")
			}
			if !p.AllowsLogin(meta.User()) {
				return nil, fmt.Errorf("login %q not in %v", meta.User(), p.Logins)
			}
			return &ssh.Permissions{}, nil
		},
	}
	cfg.AddHostKey(n.hostKey)
	if len(p.HostCertificate) != 0 {
		k, err := ssh.ParsePublicKey(p.HostCertificate)
		if err != nil {
			f.fail(fmt.Errorf("host certificate: %w", err))
			return
		}
		cert, ok := k.(*ssh.Certificate)
		if !ok || !bytes.Equal(cert.Key.Marshal(), n.hostKey.PublicKey().Marshal()) {
			f.fail(errors.New("host certificate does not certify the node's key"))
			return
		}
		cs, err := ssh.NewCertSigner(cert, n.hostKey)
		if err != nil {
			f.fail(err)
			return
		}
		cfg.AddHostKey(cs)
	}
	sconn, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		return // the client's business (a refused login is a test's point)
	}
	defer sconn.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "session only")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go serveSession(ch, creqs, sconn.User(), p)
	}
}

func serveSession(ch ssh.Channel, reqs <-chan *ssh.Request, user string, p protocol.SSHParams) {
	defer ch.Close()
	for r := range reqs {
		switch r.Type {
		case "env", "pty-req":
			r.Reply(true, nil)
		case "exec":
			var cmd struct{ Command string }
			if ssh.Unmarshal(r.Payload, &cmd) != nil {
				r.Reply(false, nil)
				return
			}
			r.Reply(true, nil)
			status := 0
			switch c := cmd.Command; {
			case c == "true":
			case c == "false":
				status = 1
			case c == "whoami":
				fmt.Fprintln(ch, user)
			case c == "params":
				fmt.Fprintf(ch, "%s %s\n", p.Identity, strings.Join(p.Logins, ","))
			case c == "cat":
				io.Copy(ch, ch)
			case strings.HasPrefix(c, "exit "):
				fmt.Sscanf(c, "exit %d", &status)
			default:
				fmt.Fprintf(ch.Stderr(), "unknown command %q\n", c)
				status = 127
			}
			ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(status)}))
			return
		default:
			r.Reply(false, nil)
		}
	}
}

// recorder is an Auditor keeping every event.
type recorder struct {
	mu  sync.Mutex
	evs []protocol.AuditEvent
}

func (r *recorder) Record(ev *protocol.AuditEvent) {
	r.mu.Lock()
	r.evs = append(r.evs, *ev)
	r.mu.Unlock()
}

func (r *recorder) events() []protocol.AuditEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]protocol.AuditEvent(nil), r.evs...)
}

// env is a running gate with its fleet, keys and policy.
type env struct {
	t       testing.TB
	dir     string
	gate    *Gate
	addr    *net.TCPAddr
	nodes   *fakeNodes
	audit   *recorder
	reg     *prometheus.Registry
	alice   *userKey // an authorized plain key: ssh on env=staging as deploy and alice
	mallory *userKey // a key nobody authorized
	carol   *userKey // a key with certificates from userCA: principal carol may ssh anywhere as carol
	userCA  ssh.Signer
	otherCA ssh.Signer // a CA the gate does not trust
	bob     *userKey   // another authorized key: ssh anywhere as bob
}

type envOption func(*Config)

// newEnv starts a gate on 127.0.0.1 with nodes node-a (env=staging) and
// node-b (env=prod).
func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, audit: &recorder{}, reg: prometheus.NewRegistry()}
	e.alice = newUserKey(t, dir, "alice")
	e.mallory = newUserKey(t, dir, "mallory")
	e.carol = newUserKey(t, dir, "carol")
	e.bob = newUserKey(t, dir, "bob")
	e.userCA, e.otherCA = newSigner(t), newSigner(t)
	ak := string(ssh.MarshalAuthorizedKey(e.alice.signer.PublicKey())) + "# bob\n" + string(ssh.MarshalAuthorizedKey(e.bob.signer.PublicKey()))
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), []byte(ak), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "user_ca.pub"), []byte("cert-authority "+string(ssh.MarshalAuthorizedKey(e.userCA.PublicKey()))), 0o600); err != nil {
		t.Fatal(err)
	}
	pol := fmt.Sprintf(`version: 1
identities:
  ssh-key:%s:
    rules:
      - nodes: "env=staging"
        operations: [ssh]
        run_as: deploy
      - nodes: "env=staging"
        operations: [ssh]
        run_as: alice
      - nodes: "env=staging"
        operations: [ssh]
        run_as: deploy
      - nodes: "*"
        operations: [forward]
        targets: [web, db]
  ssh-key:%s:
    rules:
      - nodes: "*"
        operations: [ssh]
        run_as: bob
  ssh-principal:carol:
    rules:
      - nodes: "*"
        operations: [ssh]
        run_as: carol
`, e.alice.fingerprint(), e.bob.fingerprint())
	p, err := policy.Parse("policy.yaml", []byte(pol))
	if err != nil {
		t.Fatal(err)
	}
	e.nodes = &fakeNodes{t: t, nodes: map[string]*fakeNode{
		"node-a": {labels: map[string]string{"env": "staging"}, hostKey: newSigner(t)},
		"node-b": {labels: map[string]string{"env": "prod"}, hostKey: newSigner(t)},
	}}
	cfg := Config{
		StateDir:           filepath.Join(dir, "state"),
		HostNames:          []string{"gate.test"},
		AuthorizedKeysFile: filepath.Join(dir, "authorized_keys"),
		UserCAFiles:        []string{filepath.Join(dir, "user_ca.pub")},
		Nodes:              e.nodes,
		Policy:             p,
		Auditor:            e.audit,
		Registerer:         e.reg,
	}
	for _, o := range opts {
		o(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.gate = g
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().(*net.TCPAddr)
	served := make(chan error, 1)
	go func() { served <- g.Serve(l) }()
	t.Cleanup(func() {
		g.Close()
		if err := <-served; !errors.Is(err, ErrClosed) {
			t.Errorf("Serve returned %v, want ErrClosed", err)
		}
		if n, err := testutil.GatherAndCount(e.reg, panics.MetricName); err != nil || n != 1 {
			t.Errorf("panics metric: %d series, %v", n, err)
		} else if err := testutil.GatherAndCompare(e.reg, strings.NewReader(panicsZero), panics.MetricName); err != nil {
			t.Errorf("panics contained: %v", err)
		}
	})
	return e
}

// authFailures is tether_ssh_auth_failures_total{reason}.
func (e *env) authFailures(reason string) float64 {
	return testutil.ToFloat64(e.gate.m.authFailures.WithLabelValues(reason))
}

func (e *env) conns(result string) float64 {
	return testutil.ToFloat64(e.gate.m.connections.WithLabelValues(result))
}

func (e *env) channels(result string) float64 {
	return testutil.ToFloat64(e.gate.m.channels.WithLabelValues(result))
}

// dial connects an x/crypto client with the given signers.
func (e *env) dial(signers ...ssh.Signer) (*ssh.Client, error) {
	return e.dialConfig(&ssh.ClientConfig{
		User:            "whoever",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signers...)},
		HostKeyCallback: ssh.FixedHostKey(e.gate.HostKey()),
		Timeout:         30 * time.Second,
	})
}

func (e *env) dialConfig(cfg *ssh.ClientConfig) (*ssh.Client, error) {
	if cfg.HostKeyCallback == nil {
		cfg.HostKeyCallback = ssh.FixedHostKey(e.gate.HostKey())
	}
	cfg.HostKeyAlgorithms = []string{ssh.KeyAlgoED25519}
	return ssh.Dial("tcp", e.addr.String(), cfg)
}

// sshOpts are the OpenSSH client settings of one run.
type sshOpts struct {
	key        *userKey
	cert       string // CertificateFile
	knownHosts string // the known_hosts text; empty: no checking
	dest       string // USER@HOST
	cmd        []string
	stdin      string   // a file to give ssh as stdin; empty: none
	pre        []string // options before the destination
	// identities are IdentityFile paths tried before key's (a path whose
	// private key is missing is offered by its .pub alone).
	identities []string
}

// runSSH runs the OpenSSH client through the gate (ProxyJump) and returns
// its exit code and stderr.
func (e *env) runSSH(o sshOpts) (int, string, string) {
	e.t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil {
		e.t.Skip("no OpenSSH client")
	}
	dir := e.t.TempDir()
	strict := "no"
	kh := "/dev/null"
	if o.knownHosts != "" {
		strict = "yes"
		kh = filepath.Join(dir, "known_hosts")
		if err := os.WriteFile(kh, []byte(o.knownHosts), 0o600); err != nil {
			e.t.Fatal(err)
		}
	}
	certLine := ""
	if o.cert != "" {
		certLine = "  CertificateFile " + o.cert + "\n"
	}
	cfg := fmt.Sprintf(`Host gate
  HostName 127.0.0.1
  Port %d
  HostKeyAlias gate.test
Host node-* *.tether
  ProxyJump gate
Host *
  User nobody
%s  IdentityFile %s
%s  IdentitiesOnly yes
  IdentityAgent none
  BatchMode yes
  StrictHostKeyChecking %s
  UserKnownHostsFile %s
  GlobalKnownHostsFile /dev/null
  UpdateHostKeys no
  LogLevel INFO
  ConnectTimeout 30
`, e.addr.Port, identityLines(o.identities), o.key.path, certLine, strict, kh)
	cfgPath := filepath.Join(dir, "config")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append(append(append([]string{"-F", cfgPath}, o.pre...), o.dest), o.cmd...)
	cmd := exec.CommandContext(ctx, "ssh", args...)
	cmd.Env = []string{"HOME=" + dir, "PATH=" + os.Getenv("PATH")}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if o.stdin != "" {
		f, err := os.Open(o.stdin)
		if err != nil {
			e.t.Fatal(err)
		}
		defer f.Close()
		cmd.Stdin = f
	}
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			e.t.Fatalf("ssh %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

var randReader = rand.Reader

func testutilBytes(e *env, dir string) float64 {
	return testutil.ToFloat64(e.gate.m.bytes.WithLabelValues(dir))
}

const panicsZero = `
# HELP tether_panics_total Panics contained in a per-connection, per-stream or per-request goroutine, by component. Each one failed one caller with an internal error; the daemon kept serving.
# TYPE tether_panics_total counter
tether_panics_total{component="sshgate"} 0
`

func identityLines(paths []string) string {
	var b strings.Builder
	for _, p := range paths {
		b.WriteString("  IdentityFile " + p + "\n")
	}
	return b.String()
}

// revokedConns is tether_ssh_connections_revoked_total, all reasons.
func (e *env) revokedConns() float64 {
	var n float64
	for _, r := range revokeReasons {
		n += testutil.ToFloat64(e.gate.m.revoked.WithLabelValues(r))
	}
	return n
}
