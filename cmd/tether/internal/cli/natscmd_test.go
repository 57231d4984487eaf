package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
)

// serveCoordinator runs cs until the test ends.
func serveCoordinator(t *testing.T, cs *coordinatorServer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cs.serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	checkReady(t, cs)
}

// A client user minted by `tether nats user create` while the coordinator
// runs gets in at once; `tether nats user revoke` cuts its live
// connection and its new ones within the revocation poll, by name.
func TestNATSUserCreateAndRevoke(t *testing.T) {
	dir := t.TempDir()
	cs, err := startCoordinator(testCoordinatorOptions(t, dir), "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	serveCoordinator(t, cs)
	url := cs.info.NATSURL

	creds := filepath.Join(t.TempDir(), "alice.creds")
	r := runCLI(testCtx(t), nil, "", "nats", "user", "create", "alice", "--data-dir", dir, "-o", creds, "--ttl", "1h")
	if r.code != 0 || !strings.Contains(r.stdout, "inbox prefix: _INBOX_U") {
		t.Fatalf("user create: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if fi, err := os.Stat(creds); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("creds file: %v, %v; want mode 0600", fi, err)
	}
	if r := runCLI(testCtx(t), nil, "", "nodes", "--nats-url", url, "--nats-creds", creds); r.code != 0 {
		t.Fatalf("nodes as alice: exit %d, stderr %q", r.code, r.stderr)
	}
	c, err := natsauth.ReadCreds(creds)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	natsauthtest.Connect(t, url, c, nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))

	r = runCLI(testCtx(t), nil, "", "nats", "user", "list", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "alice") || !strings.Contains(r.stdout, c.PublicKey()) || !strings.Contains(r.stdout, "false") {
		t.Fatalf("user list: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(testCtx(t), nil, "", "nats", "user", "revoke", "nobody", "--data-dir", dir); r.code == 0 || !strings.Contains(r.stderr, `no client user named "nobody"`) {
		t.Errorf("revoke unknown name: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(testCtx(t), nil, "", "nats", "user", "revoke", "alice", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "revoked "+c.PublicKey()) {
		t.Fatalf("user revoke: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	select {
	case <-closed:
	case <-time.After(defaultTestTimeout):
		t.Fatal("the revoked user's live connection was not cut")
	}
	r = runCLI(testCtx(t), nil, "", "nodes", "--nats-url", url, "--nats-creds", creds)
	if r.code != exitTether || !strings.Contains(r.stderr, "not valid there") {
		t.Errorf("nodes as revoked alice: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runCLI(testCtx(t), nil, "", "nats", "user", "list", "--data-dir", dir); !strings.Contains(r.stdout, "true") {
		t.Errorf("user list after revoke: %q", r.stdout)
	}
}

// An external NATS server given the layout by `tether nats server-config`
// admits no anonymous client; the coordinator starts against it with
// credentials from `tether nats coordinator-creds`, and a client user gets
// its answers.
func TestExternalNATSWithServerConfig(t *testing.T) {
	dir := t.TempDir()
	r := runCLI(testCtx(t), nil, "", "nats", "server-config", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "resolver_preload") || !strings.Contains(r.stderr, "created a new NATS layout") {
		t.Fatalf("server-config: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(testCtx(t), nil, "", "nats", "user", "revoke", "bob", "--data-dir", t.TempDir()); r.code == 0 || !strings.Contains(r.stderr, "no NATS layout in") {
		t.Errorf("revoke in a directory without a layout: exit %d, stderr %q", r.code, r.stderr)
	}
	conf := "listen: 127.0.0.1:-1\njetstream { store_dir: " + strconv.Quote(filepath.Join(t.TempDir(), "js")) + " }\n" + r.stdout
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := runConfiguredServer(t, path)
	coordCreds := filepath.Join(t.TempDir(), "c1.creds")
	if r := runCLI(testCtx(t), nil, "", "nats", "coordinator-creds", "c1", "--data-dir", dir, "-o", coordCreds); r.code != 0 {
		t.Fatalf("coordinator-creds: exit %d, stderr %q", r.code, r.stderr)
	}
	o := testCoordinatorOptions(t, dir)
	o.NATSURL, o.NATSCreds = ns.ClientURL(), coordCreds
	cs, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("coordinator on a server with the layout: %v", err)
	}
	serveCoordinator(t, cs)
	creds := filepath.Join(t.TempDir(), "bob.creds")
	if r := runCLI(testCtx(t), nil, "", "nats", "user", "create", "bob", "--data-dir", dir, "-o", creds); r.code != 0 {
		t.Fatalf("user create: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runCLI(testCtx(t), nil, "", "nodes", "--nats-url", ns.ClientURL(), "--nats-creds", creds); r.code != 0 {
		t.Fatalf("nodes as bob: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runCLI(testCtx(t), nil, "", "nodes", "--nats-url", ns.ClientURL()); r.code != exitTether || !strings.Contains(r.stderr, "Authorization Violation") {
		t.Errorf("nodes without credentials: exit %d, stderr %q", r.code, r.stderr)
	}
}

// A second coordinator whose data directory holds another NATS layout than
// the server's refuses to start, naming both layouts and the fix, even with
// credentials the server accepts (minted from the server's layout): it
// would otherwise join the queue group and refuse the fleet's clients.
func TestCoordinatorRefusesOtherLayout(t *testing.T) {
	first := t.TempDir()
	r := runCLI(testCtx(t), nil, "", "nats", "server-config", "--data-dir", first)
	if r.code != 0 {
		t.Fatalf("server-config: exit %d, stderr %q", r.code, r.stderr)
	}
	conf := "listen: 127.0.0.1:-1\njetstream { store_dir: " + strconv.Quote(filepath.Join(t.TempDir(), "js")) + " }\n" + r.stdout
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := runConfiguredServer(t, path)
	coordCreds := filepath.Join(t.TempDir(), "c2.creds")
	if r := runCLI(testCtx(t), nil, "", "nats", "coordinator-creds", "c2", "--data-dir", first, "-o", coordCreds); r.code != 0 {
		t.Fatalf("coordinator-creds: exit %d, stderr %q", r.code, r.stderr)
	}
	second := t.TempDir() // a fresh data directory: a new layout
	o := testCoordinatorOptions(t, second)
	o.ID = "c2"
	o.NATSURL, o.NATSCreds = ns.ClientURL(), coordCreds
	cs, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err == nil {
		cs.close()
		t.Fatal("a coordinator with another layout than its credentials' started")
	}
	for _, want := range []string{natsAuthDir(second), coordCreds, "share one layout", "copy DATA-DIR/nats-auth"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// Client credentials given to a coordinator as its own (--nats-creds) are
// refused as client credentials, naming the file and the command that makes
// coordinator credentials, not as another layout's (whose advice, copying
// nats-auth over, would break a correct layout); with the layout's JWTs
// given as files (nsc-managed) too. The refusal comes before any connect.
func TestCoordinatorRefusesClientCreds(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(t.TempDir(), "bob.creds")
	if r := runCLI(testCtx(t), nil, "", "nats", "user", "create", "bob", "--data-dir", dir, "-o", creds); r.code != 0 {
		t.Fatalf("user create: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, nsc := range []bool{false, true} {
		t.Run(fmt.Sprintf("nsc=%v", nsc), func(t *testing.T) {
			o := testCoordinatorOptions(t, dir)
			o.ID = "c1"
			o.NATSURL, o.NATSCreds = "nats://127.0.0.1:1", creds
			if nsc {
				o.NATSOperatorJWT = filepath.Join(natsAuthDir(dir), "operator.jwt")
				o.NATSClientsJWT = filepath.Join(natsAuthDir(dir), "account-CLIENTS.jwt")
			}
			cs, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
			if err == nil {
				cs.close()
				t.Fatal("a coordinator with client credentials started")
			}
			if !errors.Is(err, natsauth.ErrClientCreds) {
				t.Errorf("error %q: not ErrClientCreds", err)
			}
			for _, want := range []string{creds, "--nats-creds", "client credentials", "tether nats coordinator-creds c1"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			for _, bad := range []string{"another", "copy DATA-DIR/nats-auth"} {
				if strings.Contains(err.Error(), bad) {
					t.Errorf("error %q says %q", err, bad)
				}
			}
		})
	}
}

func runConfiguredServer(t *testing.T, path string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	return startNATSServer(t, opts)
}

func startNATSServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(defaultTestTimeout) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// The coordinator refuses an external server that lets a connection
// without credentials publish to tether.v1.>, unless --insecure-nats; a
// server that admits anonymous connections but denies them the API
// passes.
func TestCoordinatorRefusesAnonymousNATS(t *testing.T) {
	open := startNATSServer(t, &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir()})
	dir := t.TempDir()
	layout, err := natsauth.Load(natsAuthDir(dir), natsauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	creds := natsauthtest.CredsFile(t, natsauthtest.CoordinatorCreds(t, layout, "c1"))
	o := testCoordinatorOptions(t, dir)
	o.NATSURL, o.NATSCreds = open.ClientURL(), creds
	_, err = startCoordinator(o, "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err == nil || !strings.Contains(err.Error(), "lets anonymous clients publish to tether.v1.>") || !strings.Contains(err.Error(), "--insecure-nats") {
		t.Fatalf("coordinator on an open server: %v, want refused", err)
	}
	o.InsecureNATS = true
	cs, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("coordinator on an open server with --insecure-nats: %v", err)
	}
	cs.close()

	// Anonymous connections get in, but may not publish to the API.
	guarded := startNATSServer(t, &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "anon", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Deny: []string{"tether.v1.>"}}}}},
		NoAuthUser: "anon"})
	if err := checkNoAnonymous(guarded.ClientURL()); err != nil {
		t.Errorf("a server that denies anonymous clients the API: %v", err)
	}
	if err := checkNoAnonymous(open.ClientURL()); err == nil {
		t.Error("an open server passed the check")
	}
}

// Client commands take their credentials from --nats-creds, then
// $TETHER_NATS_CREDS, then the nats CLI's context (--nats-context or the
// selected one: its url too), then the file `tether dev` writes.
func TestNATSCredsPrecedence(t *testing.T) {
	home := t.TempDir()
	ctxDir := filepath.Join(home, "nats", "context")
	if err := os.MkdirAll(ctxDir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ctxDir, "prod.json"), []byte(`{"description":"x","url":"nats://prod:4222","creds":"/ctx/prod.creds","inbox_prefix":"_INBOX_X"}`), 0o600)
	os.WriteFile(filepath.Join(ctxDir, "lab.json"), []byte(`{"url":"nats://lab:4222","creds":"/ctx/lab.creds"}`), 0o600)
	devCreds := filepath.Join(home, "tether", "dev.creds")
	os.MkdirAll(filepath.Dir(devCreds), 0o700)
	os.WriteFile(devCreds, nil, 0o600)
	tests := []struct {
		name               string
		opts               natsOptions
		env                map[string]string
		selected           string
		wantURL, wantCreds string
	}{
		{"dev creds last", natsOptions{}, nil, "", defaultNATSURL, devCreds},
		{"selected context", natsOptions{}, nil, "prod", "nats://prod:4222", "/ctx/prod.creds"},
		{"named context", natsOptions{Context: "lab"}, nil, "prod", "nats://lab:4222", "/ctx/lab.creds"},
		{"env over context", natsOptions{}, map[string]string{natsCredsEnv: "/env.creds", natsURLEnv: "nats://env:4222"}, "prod", "nats://env:4222", "/env.creds"},
		{"flags first", natsOptions{URL: "nats://flag:4222", Creds: "/flag.creds"}, map[string]string{natsCredsEnv: "/env.creds"}, "prod", "nats://flag:4222", "/flag.creds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(filepath.Join(home, "nats", "context.txt"))
			if tt.selected != "" {
				os.WriteFile(filepath.Join(home, "nats", "context.txt"), []byte(tt.selected+"\n"), 0o600)
			}
			env := map[string]string{"XDG_CONFIG_HOME": home}
			for k, v := range tt.env {
				env[k] = v
			}
			got, err := tt.opts.resolve(func(k string) string { return env[k] })
			if err != nil || got.url != tt.wantURL || got.creds != tt.wantCreds {
				t.Errorf("resolve = %+v, %v; want url %s creds %s", got, err, tt.wantURL, tt.wantCreds)
			}
		})
	}
	o := natsOptions{Context: "missing"}
	if _, err := o.resolve(func(k string) string { return map[string]string{"XDG_CONFIG_HOME": home}[k] }); err == nil || !strings.Contains(err.Error(), "nats context missing") {
		t.Errorf("a missing named context: %v", err)
	}
}

// tether dev keeps its user's credentials across restarts while they are
// valid for its layout, and mints new ones (0600) when they are not: a
// revoked user, another layout's user, another name.
func TestDevCredsReuse(t *testing.T) {
	l := natsauthtest.NewLayout(t)
	path := filepath.Join(t.TempDir(), "cfg", "tether", "dev.creds")
	first, err := writeDevCreds(l, path, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dev creds: %v, %v; want 0600", fi, err)
	}
	again, err := writeDevCreds(l, path, "alice")
	if err != nil || again.creds.PublicKey() != first.creds.PublicKey() {
		t.Fatalf("restart: %v, key %s; want the same user %s", err, again.creds.PublicKey(), first.creds.PublicKey())
	}
	if err := l.Revoke(first.creds.PublicKey()); err != nil {
		t.Fatal(err)
	}
	revoked, err := writeDevCreds(l, path, "alice")
	if err != nil || revoked.creds.PublicKey() == first.creds.PublicKey() {
		t.Fatalf("after a revocation: %v; want a new user", err)
	}
	other, err := writeDevCreds(natsauthtest.NewLayout(t), path, "alice")
	if err != nil || other.creds.PublicKey() == revoked.creds.PublicKey() {
		t.Fatalf("another layout: %v; want a new user", err)
	}
	renamed, err := writeDevCreds(l, path, "bob")
	if err != nil || renamed.creds.Name() != "bob" {
		t.Fatalf("another name: %v, %s", err, renamed.creds.Name())
	}
}

func TestNATSUserName(t *testing.T) {
	for in, want := range map[string]string{
		"alice": "alice", "Jean Dupont": "Jean-Dupont", "_svc": "u_svc", "": "user",
		`DOMAIN\bob`: "DOMAIN-bob", "a.b@c+d": "a.b@c+d",
	} {
		if got := natsUserName(in); got != want {
			t.Errorf("natsUserName(%q) = %q, want %q", in, got, want)
		}
	}
}

// tether nats user create never overwrites a credentials file, never mints
// a second user of a live name (it would hold the first one's grants)
// unless --force, and a bad name is a usage error.
func TestNATSUserCreateRefusesOverwritesAndTwins(t *testing.T) {
	dir, out := t.TempDir(), t.TempDir()
	a, b := filepath.Join(out, "a.creds"), filepath.Join(out, "b.creds")
	create := func(args ...string) result {
		return runCLI(testCtx(t), nil, "", append([]string{"nats", "user", "create", "--data-dir", dir}, args...)...)
	}
	if r := create("alice", "-o", a); r.code != 0 {
		t.Fatalf("first create: exit %d, stderr %q", r.code, r.stderr)
	}
	first, _ := os.ReadFile(a)
	if r := create("bob", "-o", a); r.code == 0 || !strings.Contains(r.stderr, a+" exists: not overwritten") {
		t.Errorf("create over another user's file: exit %d, stderr %q", r.code, r.stderr)
	}
	if now, _ := os.ReadFile(a); string(now) != string(first) {
		t.Error("alice's credentials file was changed")
	}
	if r := create("alice", "-o", b); r.code == 0 || !strings.Contains(r.stderr, "a client user named alice exists") {
		t.Errorf("second alice: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := create("alice", "-o", b, "--force"); r.code != 0 {
		t.Errorf("second alice with --force: exit %d, stderr %q", r.code, r.stderr)
	}
	// Racing creates of one file: exactly one writes it (the check before
	// minting is not the guard; the exclusive write is).
	same := filepath.Join(out, "same.creds")
	var wg sync.WaitGroup
	var wrote atomic.Int32
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := create(fmt.Sprintf("racer%d", i), "-o", same); r.code == 0 {
				wrote.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := wrote.Load(); n != 1 {
		t.Errorf("%d racing creates said they wrote %s, want 1", n, same)
	}
	if r := create("-bad", "-o", filepath.Join(out, "c.creds")); r.code != 2 {
		t.Errorf("bad name: exit %d (want 2), stderr %q", r.code, r.stderr)
	}
	if r := create("b@d name", "-o", filepath.Join(out, "c.creds")); r.code != 2 || !strings.Contains(r.stderr, "user name") {
		t.Errorf("bad name: exit %d (want 2), stderr %q", r.code, r.stderr)
	}
}

// Without --data-dir, the nats commands that may create a layout (user
// create, server-config, coordinator-creds) refuse a default directory
// that holds none, naming --data-dir and tether dev's: a new layout there
// minted credentials no running server trusts (the README's "from `tether
// nats user create`" beside a tether dev). Given explicitly, a directory
// gets a new layout, as the external NATS setup needs.
func TestNATSLayoutNotCreatedInTheDefaultDir(t *testing.T) {
	def := filepath.Join(t.TempDir(), "default")
	for _, args := range [][]string{
		{"nats", "user", "create", "alice", "-o", filepath.Join(t.TempDir(), "alice.creds")},
		{"nats", "server-config"},
		{"nats", "coordinator-creds", "c1", "-o", filepath.Join(t.TempDir(), "c1.creds")},
	} {
		var stdout, stderr syncBuffer
		e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now, natsDefaultDataDir: def}
		code := run(testCtx(t), args, e)
		if code == 0 || !strings.Contains(stderr.String(), "no NATS layout in "+filepath.Join(def, "nats-auth")) || !strings.Contains(stderr.String(), "--data-dir") {
			t.Errorf("tether %q with no layout in the default dir: exit %d, stderr %q; want a refusal naming the directory and --data-dir", args, code, stderr.String())
		}
		if _, err := os.Stat(filepath.Join(def, "nats-auth", "operator.nk")); err == nil {
			t.Fatalf("tether %q created a layout in the default dir", args)
		}
	}
	dir := t.TempDir()
	r := runCLI(testCtx(t), nil, "", "nats", "user", "create", "alice", "--data-dir", dir, "-o", filepath.Join(t.TempDir(), "alice.creds"))
	if r.code != 0 || !strings.Contains(r.stderr, "created a new NATS layout") {
		t.Errorf("user create in an explicit new --data-dir: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestNATSLayoutUnreadable: a layout in a directory this user may not read
// (a non-root user and the coordinator's /var/lib/tether, 0700 root) is
// named as unreadable, not reported as "mkdir ...: permission denied" of a
// directory that exists. As root (who reads everything), a copy of the test
// binary runs as tether under the uid nobody.
func TestNATSLayoutUnreadable(t *testing.T) {
	data := filepath.Join(t.TempDir(), "coord")
	if r := runCLI(testCtx(t), nil, "", "nats", "server-config", "--data-dir", data); r.code != exitOK {
		t.Fatalf("server-config making the layout: exit %d, stderr %q", r.code, r.stderr)
	}
	want := "tether: cannot read the NATS layout in " + filepath.Join(data, "nats-auth") + ": permission denied reading " + data + "; "
	var code int
	var stderr string
	if os.Geteuid() != 0 {
		if err := os.Chmod(data, 0); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(data, 0o700)
		r := runCLI(testCtx(t), nil, "", "nats", "server-config", "--data-dir", data)
		code, stderr = r.code, r.stderr
	} else {
		if err := os.Chmod(data, 0o700); err != nil {
			t.Fatal(err)
		}
		for p := filepath.Dir(data); p != filepath.Dir(p); p = filepath.Dir(p) {
			os.Chmod(p, 0o755) // t.TempDir's own directories are 0700
		}
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(filepath.Dir(filepath.Dir(data)), "cli.test")
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
		for p := filepath.Dir(bin); p != filepath.Dir(p); p = filepath.Dir(p) {
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o001 == 0 {
				t.Skipf("nobody cannot reach %s: %s is not searchable", bin, p)
			}
		}
		var errb strings.Builder
		cmd := exec.Command(bin, "nats", "server-config", "--data-dir", data)
		cmd.Dir = "/"
		cmd.Env = []string{cliMainEnv + "=1", "PATH=/usr/bin:/bin", "HOME=/nonexistent"}
		cmd.Stderr = &errb
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if err := cmd.Run(); cmd.ProcessState == nil {
			t.Fatal(err)
		}
		code, stderr = cmd.ProcessState.ExitCode(), errb.String()
	}
	if code != exitFailure || !strings.HasPrefix(stderr, want) || strings.Contains(stderr, "mkdir") {
		t.Fatalf("server-config on an unreadable data dir: exit %d, stderr %q; want %d, %q...", code, stderr, exitFailure, want)
	}
}

// TestNATSUserCreateTTLAndOutputDir: a --ttl under a minute is refused
// naming the minimum (it minted credentials that expired seconds later,
// silently); a TTL's expiry is printed on stderr; -o into a directory
// that does not exist names the user's path, not the temporary file
// (F9, F10 of fresh2).
func TestNATSUserCreateTTLAndOutputDir(t *testing.T) {
	dir := t.TempDir()
	out := t.TempDir()
	r := runCLI(testCtx(t), nil, "", "nats", "user", "create", "u5", "--data-dir", dir, "-o", filepath.Join(out, "u5.creds"), "--ttl", "5")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--ttl 5s is under the minimum, 1m") {
		t.Errorf("--ttl 5: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "u5.creds")); err == nil {
		t.Error("--ttl 5 wrote credentials")
	}
	r = runCLI(testCtx(t), nil, "", "nats", "user", "create", "u1h", "--data-dir", dir, "-o", filepath.Join(out, "u1h.creds"), "--ttl", "1h")
	if r.code != 0 || !strings.Contains(r.stderr, "the credentials expire at ") || !strings.Contains(r.stderr, "(in 1h)") {
		t.Errorf("--ttl 1h: exit %d, stderr:\n%s\nwant the expiry", r.code, r.stderr)
	}
	missing := filepath.Join(out, "nodir", "f.creds")
	r = runCLI(testCtx(t), nil, "", "nats", "user", "create", "f", "--data-dir", dir, "-o", missing)
	want := "--output " + missing + ": directory " + filepath.Dir(missing) + " does not exist"
	if r.code != 1 || !strings.Contains(r.stderr, want) || strings.Contains(r.stderr, ".tmp") {
		t.Errorf("-o into a missing directory: exit %d, stderr:\n%s\nwant %q", r.code, r.stderr, want)
	}
}

// A NATS URL with a scheme nats.go does not know (it would dial it as
// plain TCP, looking its host up) is a usage error naming where the URL
// came from and the schemes it takes (fresh17 item 10).
func TestNATSURLScheme(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"nats://h:4222", true}, {"tls://h:4222", true}, {"ws://h:80", true}, {"wss://h:443", true},
		{"NATS://h", true}, {"h:4222", true}, {"nats://a:1, tls://b:2", true},
		{"bogus://x", false}, {"nats://a:1,http://b:2", false}, {"://x", false},
	} {
		if err := checkNATSURL(tc.url); (err == nil) != tc.ok {
			t.Errorf("checkNATSURL(%q) = %v, want ok %v", tc.url, err, tc.ok)
		}
	}

	want := `unknown scheme "bogus" in bogus://x: want nats, tls, ws or wss`
	r := runCLI(testCtx(t), nil, "", "exec", "--nats-url", "bogus://x", "--node", "vm", "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "tether: --nats-url: "+want) {
		t.Errorf("--nats-url bogus://x: exit %d, stderr %q; want 2 and %q", r.code, r.stderr, want)
	}
	r = runCLI(testCtx(t), map[string]string{natsURLEnv: "bogus://x"}, "", "nodes")
	if r.code != exitUsage || !strings.Contains(r.stderr, "tether: $"+natsURLEnv+": "+want) {
		t.Errorf("$%s=bogus://x: exit %d, stderr %q; want 2 and %q", natsURLEnv, r.code, r.stderr, want)
	}

	pol := writeTestPolicy(t, "version: 1\nidentities:\n  nats:ops:\n    rules: [{operations: [admin]}]\n")
	cfg := writeConfig(t, "role: coordinator\npolicy: "+pol+"\nnats-creds: /c.creds\nnats-url: bogus://x\n")
	r = runCLI(testCtx(t), nil, "", "config", "validate", cfg)
	if r.code != 1 || !strings.Contains(r.stderr, cfg+":4: key nats-url: "+want) {
		t.Errorf("config validate with nats-url: bogus://x: exit %d, stderr %q; want 1 and %q", r.code, r.stderr, cfg+":4: key nats-url: "+want)
	}
}
