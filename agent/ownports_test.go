//go:build linux

package agent

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/internal/sockdiag/sockdiagtest"
	"github.com/tetherfleet/tether/protocol"
)

// echoAll serves ln: every connection gets its bytes back. accept wraps each
// Accept (to accept as another uid).
func echoAll(ln net.Listener, accept func(func() error) error) {
	go func() {
		for {
			var c net.Conn
			if err := accept(func() (err error) { c, err = ln.Accept(); return err }); err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
}

func plainAccept(f func() error) error { return f() }

// ping forwards to dest through c and checks the echo.
func ping(t *testing.T, f *sshFixture, c interface {
	Dial(n, addr string) (net.Conn, error)
}, dest string) {
	t.Helper()
	conn, err := c.Dial("tcp", dest)
	if err != nil {
		t.Fatalf("forward to %s: %v", dest, err)
	}
	defer conn.Close()
	conn.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Errorf("forward to %s: %q %v", dest, buf, err)
	}
}

// A loopback port the login listens on is reached with own-ports granted,
// by IPv4, IPv6 and localhost, and on a wildcard listener; without the
// grant, or with the local policy against it, it is refused.
func TestSSHOwnPorts(t *testing.T) {
	var lns []net.Listener
	// Without an IPv6 loopback (Docker's default) [::1] cannot be bound,
	// nor dialled through a wildcard listener: its destinations go too.
	loop6 := false
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "[::]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("listen on %s: %v (skipped)", addr, err)
			continue
		}
		defer ln.Close()
		if addr == "[::1]:0" {
			loop6 = true
		}
		echoAll(ln, plainAccept)
		lns = append(lns, ln)
	}
	f := newSSHFixture(t, nil)
	c, err := f.dial(t, f.params(func(p *protocol.SSHParams) { p.Targets = []string{protocol.TargetOwnPorts} }), f.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, ln := range lns {
		port := ln.Addr().(*net.TCPAddr).Port
		dests := []string{ln.Addr().String()}
		if ln.Addr().(*net.TCPAddr).IP.IsUnspecified() {
			dests = []string{fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("localhost:%d", port)}
			if loop6 {
				dests = append(dests, fmt.Sprintf("[::1]:%d", port))
			}
		} else if ln.Addr().(*net.TCPAddr).IP.To4() != nil {
			dests = append(dests, fmt.Sprintf("localhost:%d", port))
		}
		for _, dest := range dests {
			ping(t, f, c, dest)
		}
	}
	ev := f.event(t, "own-ports forward", func(e *protocol.SSHChannelEvent) bool {
		return e.Type == protocol.SSHChannelForward && e.Result == protocol.AuditOK
	})
	if ev.Target != protocol.TargetOwnPorts || ev.BytesIn != 4 || ev.BytesOut != 4 {
		t.Errorf("forward event %+v", ev)
	}
	// Not loopback, or nothing listening: no.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	for dest, want := range map[string]string{
		closedAddr:           "nothing listens there",
		"192.0.2.1:80":       "not a target you may forward to",
		"example.com:80":     "not a target you may forward to",
		"127.0.0.1:0":        "not a TCP port",
		"[fe80::1%lo]:22":    "not a target you may forward to",
		"localhost.evil:123": "not a target you may forward to",
	} {
		if conn, err := c.Dial("tcp", dest); err == nil {
			conn.Close()
			t.Errorf("forward to %s allowed", dest)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("forward to %s: %v, want %q", dest, err, want)
		}
	}

	// Without the grant: refused, with a hint.
	c2, err := f.dial(t, f.params(nil), f.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := c2.Dial("tcp", lns[0].Addr().String()); err == nil {
		conn.Close()
		t.Error("forward to an own port allowed without own-ports")
	} else if !strings.Contains(err.Error(), "needs a forward grant of target own-ports") {
		t.Errorf("forward without own-ports: %v, want the hint", err)
	}
}

// The node's local policy must allow forwards, and own-ports when it
// lists targets.
func TestSSHOwnPortsLocalPolicy(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Skip(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	echoAll(ln, plainAccept)
	for rules, want := range map[string]string{
		"forward: false\n":                      "forward: true",
		"forward: true\ntargets: [openshell]\n": "targets: own-ports",
		"forward: true\ntargets: [own-ports]\n": "",
		"forward: true\n":                       "",
	} {
		lp, err := localpolicy.Parse("/etc/tether/local-policy.yaml", []byte(fmt.Sprintf(
			"version: 1\nusers:\n  - name: %s\nexec: true\n%s", me.Username, rules)))
		if err != nil {
			t.Fatal(err)
		}
		f := newSSHFixture(t, func(c *Config) { c.LocalPolicy = lp })
		c, err := f.dial(t, f.params(func(p *protocol.SSHParams) { p.Targets = []string{protocol.TargetOwnPorts} }), f.clientConfig())
		if err != nil {
			t.Fatal(err)
		}
		if want == "" {
			ping(t, f, c, ln.Addr().String())
			continue
		}
		if conn, err := c.Dial("tcp", ln.Addr().String()); err == nil {
			conn.Close()
			t.Errorf("local policy %q: forward to an own port allowed", rules)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("local policy %q: %v, want %q", rules, err, want)
		}
	}
}

// A loopback port of another uid is refused before the agent connects,
// whether the listener is bound to the address or to a wildcard; the
// login's own port on another address of the same number still works.
func TestSSHOwnPortsRefusesOtherUIDs(t *testing.T) {
	nobody := func(f func() error) error { return sockdiagtest.Do(t, sockdiagtest.Nobody, f) }
	theirs := sockdiagtest.Listen(t, sockdiagtest.Nobody, "127.0.0.1:0")
	accepted := make(chan struct{}, 16)
	echoAll(theirs, func(f func() error) error {
		err := nobody(f)
		if err == nil {
			accepted <- struct{}{}
		}
		return err
	})
	wild := sockdiagtest.Listen(t, sockdiagtest.Nobody, "[::]:0")
	echoAll(wild, nobody)
	port := theirs.Addr().(*net.TCPAddr).Port
	// The same port on 127.0.0.2 is the login's own.
	mine, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", port))
	if err != nil {
		t.Skipf("listen on 127.0.0.2: %v", err)
	}
	defer mine.Close()
	echoAll(mine, plainAccept)

	f := newSSHFixture(t, nil)
	c, err := f.dial(t, f.params(func(p *protocol.SSHParams) { p.Targets = []string{protocol.TargetOwnPorts} }), f.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	wport := wild.Addr().(*net.TCPAddr).Port
	for _, dest := range []string{theirs.Addr().String(), fmt.Sprintf("localhost:%d", port),
		fmt.Sprintf("127.0.0.1:%d", wport), fmt.Sprintf("[::1]:%d", wport)} {
		if conn, err := c.Dial("tcp", dest); err == nil {
			conn.Close()
			t.Errorf("forward to %s (uid %d's) allowed", dest, sockdiagtest.Nobody)
		} else if !strings.Contains(err.Error(), fmt.Sprintf("of uid %d, not of your uid %d", sockdiagtest.Nobody, os.Geteuid())) {
			t.Errorf("forward to %s: %v, want the owner named", dest, err)
		}
	}
	select {
	case <-accepted:
		t.Error("the agent connected to another uid's listener")
	default:
	}
	ping(t, f, c, mine.Addr().String())
	f.event(t, "refused forward", func(e *protocol.SSHChannelEvent) bool {
		return e.Type == protocol.SSHChannelForward && e.Result == protocol.AuditRefused && e.Target == protocol.TargetOwnPorts
	})
}

// verifyOwnPeer, the check after dialling: a connection accepted by
// another uid is refused, one accepted by the login's uid or still queued
// on the login's listener passes.
func TestVerifyOwnPeer(t *testing.T) {
	theirs := sockdiagtest.Listen(t, sockdiagtest.Nobody, "127.0.0.1:0")
	dst := theirs.Addr().(*net.TCPAddr).AddrPort()
	c, err := net.Dial("tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var s net.Conn
	if err := sockdiagtest.Do(t, sockdiagtest.Nobody, func() (err error) { s, err = theirs.Accept(); return err }); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := verifyOwnPeer(c, dst, uint32(os.Geteuid())); err == nil || !strings.Contains(err.Error(), "accepted by uid 65534") {
		t.Errorf("connection accepted by nobody: %v, want refused", err)
	}
	if err := verifyOwnPeer(c, dst, sockdiagtest.Nobody); err != nil {
		t.Errorf("connection accepted by nobody, checked for nobody: %v", err)
	}
	// Queued, not accepted: the kernel reports uid 0 and the listener
	// (nobody's) decides.
	q, err := net.Dial("tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := verifyOwnPeer(q, dst, sockdiagtest.Nobody); err != nil {
		t.Errorf("queued on nobody's listener, checked for nobody: %v", err)
	}
	if err := verifyOwnPeer(q, dst, 1234); err == nil {
		t.Error("queued on nobody's listener, checked for uid 1234: allowed")
	}
}

// OpenSSH as VS Code Remote-SSH drives it: a direct-tcpip channel (ssh -W,
// as ssh -L's and ssh -D's connections are) to the server the login
// started on the node's loopback.
func TestOpenSSHOwnPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	echoAll(ln, plainAccept)
	port := ln.Addr().(*net.TCPAddr).Port
	f := newSSHFixture(t, nil)
	o := newOpenSSH(t, f, func(p *protocol.SSHParams) { p.Targets = []string{protocol.TargetOwnPorts} })
	for _, dest := range []string{ln.Addr().String(), fmt.Sprintf("localhost:%d", port)} {
		out, errs, code := o.run("ping\n", "-W", dest, sshHost)
		if code != 0 || out != "ping\n" {
			t.Errorf("ssh -W %s with own-ports: exit %d out %q stderr %q", dest, code, out, errs)
		}
	}
	without := newOpenSSH(t, f, nil)
	without.logLevel = "INFO" // shows the channel open failure's reason
	out, errs, code := without.run("ping\n", "-W", ln.Addr().String(), sshHost)
	if code == 0 || !strings.Contains(errs, "administratively prohibited") || !strings.Contains(errs, "own-ports") {
		t.Errorf("ssh -W without own-ports: exit %d out %q stderr %q", code, out, errs)
	}
}

// BenchmarkSSHOwnPortsForwardOpen compares opening a forward (channel
// open, the agent's checks and dial, one byte each way, close) to an own
// port (localhost:PORT, own-ports: two or three sock_diag queries) with
// the same to a named target on the same listener (web), in interleaved
// rounds of 100 forwards, which goes first alternating. It reports the
// median of each round's ratio own-ports/named.
func BenchmarkSSHOwnPortsForwardOpen(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	echoAll(ln, plainAccept)
	port := ln.Addr().(*net.TCPAddr).Port
	f := newSSHFixture(b, func(c *Config) { c.Logger = nil; c.Targets = map[string]string{"web": ln.Addr().String()} })
	c, err := f.dial(b, f.params(func(p *protocol.SSHParams) { p.Targets = []string{"web", protocol.TargetOwnPorts} }), f.clientConfig())
	if err != nil {
		b.Fatal(err)
	}
	one := func(dest string) {
		conn, err := c.Dial("tcp", dest)
		if err != nil {
			b.Fatalf("forward to %s: %v", dest, err)
		}
		buf := []byte{1}
		if _, err := conn.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			b.Fatal(err)
		}
		conn.Close()
	}
	round := func(dest string) float64 {
		start := time.Now()
		for range 100 {
			one(dest)
		}
		return float64(time.Since(start))
	}
	own, named := fmt.Sprintf("localhost:%d", port), fmt.Sprintf("web:%d", port)
	var ratios []float64
	var ownT, namedT float64
	for i := 0; b.Loop(); i++ {
		var o, n float64
		if i%2 == 0 {
			o, n = round(own), round(named)
		} else {
			n, o = round(named), round(own)
		}
		ratios = append(ratios, o/n)
		ownT += o
		namedT += n
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "own/named")
	b.ReportMetric(ownT/float64(len(ratios))/100/1e3, "own-µs/forward")
	b.ReportMetric(namedT/float64(len(ratios))/100/1e3, "named-µs/forward")
}
