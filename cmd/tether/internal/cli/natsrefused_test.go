package cli

import (
	"bufio"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/natsauth"
)

// fakeNATS is a NATS server speaking just enough of the protocol for a
// client to connect: it announces version, answers PING, and refuses
// every subscription with a permissions violation, as a nats-server older
// than 2.11 does to a Tether client user (its reply inbox is granted by a
// signing-key template such servers do not expand). It returns its URL.
func fakeNATS(t *testing.T, version string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "INFO {\"server_id\":\"FAKE\",\"version\":%q,\"proto\":1,\"headers\":true,\"max_payload\":1048576}\r\n", version)
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					f := strings.Fields(line)
					if len(f) == 0 {
						continue
					}
					switch strings.ToUpper(f[0]) {
					case "PING":
						fmt.Fprint(c, "PONG\r\n")
					case "SUB":
						fmt.Fprintf(c, "-ERR 'Permissions Violation for Subscription to \"%s\"'\r\n", f[1])
					case "PUB", "HPUB":
						n, _ := strconv.Atoi(f[len(f)-1])
						r.Discard(n + 2)
					}
				}
			}()
		}
	}()
	return "nats://" + ln.Addr().String()
}

// TestClientPermissionViolation: a NATS server that refuses the client's
// subscription to its reply inbox (an old nats-server, or credentials
// without the client permissions) fails the command at once with one
// error saying what was refused and the likely causes, not nats.go's raw
// line on stderr and a request timeout 10 s later (issue 13's fresh-user
// pass, F1).
func TestClientPermissionViolation(t *testing.T) {
	url := fakeNATS(t, "2.9.10")
	for _, args := range [][]string{{"nodes", "--nats-url", url}, {"exec", "--nats-url", url, "--all", "-n", "--", "true"}} {
		t.Run(args[0], func(t *testing.T) { checkRefused(t, args) })
	}
}

func checkRefused(t *testing.T, args []string) {
	r := runCLI(testCtx(t), nil, "", args...)
	if r.code != exitTether {
		t.Errorf("exit %d, want %d", r.code, exitTether)
	}
	for _, want := range []string{"refused", "replies", "2.11.0", "permissions"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	for _, bad := range []string{"_INBOX", "deadline exceeded", "nats: permissions violation"} {
		if strings.Contains(r.stderr, bad) {
			t.Errorf("stderr has %q:\n%s", bad, r.stderr)
		}
	}
	t.Logf("stderr: %s", r.stderr)
	if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
		t.Errorf("stderr has %d lines, want one error:\n%s", n+1, r.stderr)
	}
}

// TestCoordinatorRefusesOldNATS: a coordinator given an external NATS server
// older than nats-server 2.11.0 does not start (its clients would all be
// refused their replies), naming the server's version and the minimum; the
// version check itself takes suffixes and lets an unparsable version
// through.
func TestCoordinatorRefusesOldNATS(t *testing.T) {
	for v, ok := range map[string]bool{"2.9.10": false, "2.10.29": false, "1.4.1": false, "2.11.0": true, "2.11.0-RC.2": true,
		"2.15.2": true, "3.0.0": true, "v2.12.1": true, "main": true, "": true} {
		if err := checkNATSVersion(v); (err == nil) != ok {
			t.Errorf("checkNATSVersion(%q) = %v; want ok %v", v, err, ok)
		}
	}
	url := fakeNATS(t, "2.9.10")
	dir := t.TempDir()
	// The coordinator's own layout mints its credentials (another layout's
	// are refused before the server's version is looked at).
	l, err := natsauth.Load(natsAuthDir(filepath.Join(dir, "data")), natsauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := l.MintCoordinator("coordinator-test")
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(dir, "coordinator.creds")
	if err := natsauth.WriteCreds(credsFile, creds); err != nil {
		t.Fatal(err)
	}
	pol := writeTestPolicy(t, "version: 1\nidentities:\n  nats:ops:\n    rules: [{operations: [admin]}]\n")
	r := runCLI(testCtx(t), nil, "", "coordinator", "--data-dir", filepath.Join(dir, "data"), "--policy", pol,
		"--nats-url", url, "--nats-creds", credsFile, "--insecure-nats",
		"--listen", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--openshell-listen", "", "--opensandbox-listen", "")
	if r.code == 0 || !strings.Contains(r.stderr, "nats-server 2.9.10 is older than 2.11.0") {
		t.Errorf("coordinator on nats-server 2.9.10: exit %d, stderr:\n%s", r.code, r.stderr)
	}
}
