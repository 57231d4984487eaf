package cli

import (
	"bufio"
	"context"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/fleettest"
)

func TestParseForwardArgs(t *testing.T) {
	for _, tt := range []struct {
		args      []string
		local     string
		wantError string
	}{
		{[]string{"n1", "openshell"}, "127.0.0.1:0", ""},
		{[]string{"n1", "openshell", "8080"}, "127.0.0.1:8080", ""},
		{[]string{"n1", "openshell", ":8080"}, "127.0.0.1:8080", ""},
		{[]string{"n1", "openshell", "localhost:8080"}, "127.0.0.1:8080", ""},
		{[]string{"n1", "openshell", "[::1]:8080"}, "[::1]:8080", ""},
		{[]string{"n1", "openshell", "0.0.0.0:8080"}, "", "loopback only"},
		{[]string{"n1", "openshell", "example.com:8080"}, "", "loopback only"},
		{[]string{"n1", "Bad Target"}, "", "target"},
		{[]string{"-x", "openshell"}, "", "node"},
	} {
		a, err := parseForwardArgs(tt.args)
		if tt.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantError) {
				t.Errorf("%q: err %v, want one containing %q", tt.args, err, tt.wantError)
			}
			continue
		}
		if err != nil || a.Local != tt.local {
			t.Errorf("%q: local %q, err %v; want %q", tt.args, a.Local, err, tt.local)
		}
	}
}

// echoServer accepts connections and echoes each one's bytes until it
// half-closes, then closes.
func echoServer(t *testing.T) string {
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
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// tether forward carries connections to an allow-listed target and back,
// half-closes included; unknown targets are refused before listening.
func TestForwardOnFleet(t *testing.T) {
	echo := echoServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close() // a target nothing listens on
	f := startFleet(t, fleettest.Options{Agent: func(_ int, c *agent.Config) {
		c.Targets = map[string]string{"echo": echo, "down": down}
	}})
	url := f.NATS.ClientURL()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()

	// A refused dial names the node and the target once each.
	r := runCLI(ctx, nil, "", "forward", "--stdio", "--nats-url", url, "node-0", "down")
	if want := "tether: dial down on node node-0: " + down + ": connect: connection refused (dial_failed)\n"; r.code != 255 || r.stderr != want {
		t.Errorf("refused dial: exit %d, stderr %q; want 255, %q", r.code, r.stderr, want)
	}
	// The agent's refusal of an unknown target reads as the CLI's own.
	r = runCLI(ctx, nil, "", "forward", "--stdio", "--nats-url", url, "node-0", "ssh")
	if r.code != 255 || r.stderr != "tether: node node-0 has no target \"ssh\" (it serves: down, echo) (unknown_target)\n" {
		t.Errorf("--stdio unknown target: exit %d, stderr %q", r.code, r.stderr)
	}

	r = runCLI(ctx, nil, "", "forward", "--nats-url", url, "node-0", "ssh")
	if r.code != 255 || r.stderr != "tether: node node-0 has no target \"ssh\" (it serves: down, echo)\n" {
		t.Errorf("unknown target: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(ctx, nil, "", "forward", "--nats-url", url, "node-9", "echo")
	if r.code != 255 || !strings.HasPrefix(r.stderr, `tether: node "node-9" is not connected (unknown_node;`) {
		t.Errorf("unknown node: exit %d, stderr %q", r.code, r.stderr)
	}

	pr, pw := io.Pipe()
	var stderr syncBuffer
	e := &env{stdin: strings.NewReader(""), stdout: pw, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"forward", "--nats-url", url, "node-0", "echo"}, e); pw.Close() }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no listening line: %v (stderr %q)", err, stderr.String())
	}
	m := regexp.MustCompile(`^Forwarding from (127\.0\.0\.1:\d+) -> node-0/echo\n$`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("listening line %q", line)
	}
	go io.Copy(io.Discard, pr)
	for i := range 3 { // several connections, one after the other and at once
		conn, err := net.Dial("tcp", m[1])
		if err != nil {
			t.Fatal(err)
		}
		msg := strings.Repeat("ping", 1000*(i+1))
		go func() { io.WriteString(conn, msg); conn.(*net.TCPConn).CloseWrite() }()
		got, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || string(got) != msg {
			t.Errorf("connection %d: read %d bytes, err %v; want the %d bytes echoed", i, len(got), err, len(msg))
		}
	}
	cancel()
	if code := <-done; code != exitInterrupted {
		t.Errorf("forward exit %d after cancel, want %d; stderr %q", code, exitInterrupted, stderr.String())
	}
}

// TestForwardArgumentErrors: a bad NODE or TARGET is named as the user
// typed it, with the form wanted, once ("target: target name ..." said
// it twice in the package's terms); a wrong number of arguments names the
// form the command takes.
func TestForwardArgumentErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"forward", "nosuch"}, []string{"want NODE TARGET [LOCAL_ADDR]", "got 1 argument"}},
		{[]string{"forward", "n1", "bad:name"}, []string{`TARGET "bad:name"`, "lowercase letters, digits and '-'", "openshell"}},
		{[]string{"forward", "n1", "Bad Target"}, []string{`TARGET "Bad Target"`}},
		{[]string{"forward", "--", " ", "openshell"}, []string{`NODE " "`}},
		// A value holding ": " is named once, and the problem follows
		// it whole.
		{[]string{"forward", "n1", "a: b"}, []string{`TARGET "a: b": want lowercase letters`}},
		{[]string{"forward", "x: y", "openshell"}, []string{`NODE "x: y": must be 1-`}},
	} {
		r := runCLI(testCtx(t), nil, "", append([]string{tt.args[0], "--nats-url", unreachableNATS}, tt.args[1:]...)...)
		if r.code != exitUsage {
			t.Errorf("tether %q: exit %d, want 2; stderr %q", tt.args, r.code, r.stderr)
		}
		for _, w := range tt.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("tether %q: stderr %q lacks %q", tt.args, r.stderr, w)
			}
		}
		if strings.Contains(r.stderr, "target: target") || strings.Contains(r.stderr, "node: node") {
			t.Errorf("tether %q: doubled prefix in %q", tt.args, r.stderr)
		}
	}
}
