package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// TestCpExitCodes: `tether cp` says who failed as the other client
// commands do: 255 for Tether's own failures (no coordinator, the node
// not connected), 1 for a copy that failed (a source missing, not under a
// copy root, the agent's own state, a destination that cannot be a
// directory), 2 for usage, 23 for a partial copy, 130/143 when
// interrupted.
func TestCpExitCodes(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	root := f.DataDir("node-0")
	local := t.TempDir()
	file := filepath.Join(local, "f")
	if err := os.WriteFile(file, []byte("f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "remote-file"), []byte("r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	partial := filepath.Join(local, "partial")
	os.MkdirAll(partial, 0o755)
	os.WriteFile(filepath.Join(partial, "ok"), []byte("ok"), 0o644)
	if err := syscall.Mkfifo(filepath.Join(partial, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	idle := natsWithoutCoordinator(t)
	cp := func(args ...string) []string { return append([]string{"cp", "--nats-url", url}, args...) }

	rows := []exitRow{
		{name: "push", args: cp(file, "node-0:"+root+"/pushed"), code: 0},
		{name: "pull", args: cp("node-0:"+root+"/remote-file", filepath.Join(local, "pulled")), code: 0},

		{name: "usage: one argument", args: cp(file), code: 2, stderr: "want SRC and DST, got 1 argument\n"},
		{name: "usage: no node", args: cp(file, local), code: 2, stderr: "NODE:PATH"},
		{name: "usage: path too long for the node", args: cp(file, "node-0:/"+strings.Repeat("a", protocol.MaxCopyPathLen)), code: 2, stderr: "4097 bytes, over the limit of 4096"},

		{name: "local source missing", args: cp(filepath.Join(local, "missing"), "node-0:"+root+"/x"), code: 1, stderr: "no such file or directory"},
		{name: "remote source missing", args: cp("node-0:"+root+"/missing", filepath.Join(local, "y")), code: 1, stderr: "no such file or directory"},
		{name: "not under a copy root", args: cp(file, "node-0:/etc/tether-cp-test"), code: 1, stderr: "is not under a copy root"},
		{name: "leads outside the copy root", args: cp("node-0:"+root+"/../etc", filepath.Join(local, "z")), code: 1, stderr: "copy root"},
		{name: "the agent's own state", args: cp(file, "node-0:"+filepath.Join(root, "jobs")), code: 1, stderr: "the agent's own state"},
		{name: "remote destination below a file", args: cp(file, "node-0:"+root+"/remote-file/sub/x"), code: 1, stderr: "not a directory"},
		{name: "local destination below a file", args: cp("node-0:"+root+"/remote-file", file+"/sub/y"), code: 1, stderr: "not a directory"},

		{name: "partial", args: cp(partial, "node-0:"+root+"/partial"), code: 23, stderr: "skipped"},

		{name: "interrupted", args: cp(file, "node-0:"+root+"/int"), ctx: cancelledCtx(syscall.SIGINT), code: 130, stderr: "interrupted"},
		{name: "terminated", args: cp("node-0:"+root+"/remote-file", filepath.Join(local, "term")), ctx: cancelledCtx(syscall.SIGTERM), code: 143, stderr: "interrupted"},

		{name: "node not connected", args: cp(file, "node-9:/x"), code: 255, stderr: "(unknown_node)"},
		{name: "coordinator unreachable", args: []string{"cp", "--nats-url", "nats://127.0.0.1:1", file, "node-0:/x"}, code: 255, stderr: "connect to NATS"},
		{name: "no coordinator", args: []string{"cp", "--nats-url", idle, file, "node-0:/x"}, code: 255, stderr: "no Tether coordinator"},
	}
	if os.Geteuid() != 0 {
		denied := filepath.Join(local, "denied")
		os.WriteFile(denied, []byte("d"), 0o000)
		rows = append(rows, exitRow{name: "permission denied", args: cp(denied, "node-0:"+root+"/denied"), code: 1, stderr: "permission denied"})
	}
	checkExitRows(t, rows)
	for _, p := range []string{filepath.Join(local, "z"), filepath.Join(local, "y"), filepath.Join(local, "term"), "/etc/tether-cp-test"} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("a failed copy created %s (%v)", p, err)
		}
	}
}

// TestCpHelpExitCodes: `tether cp --help` carries its exit code table.
func TestCpHelpExitCodes(t *testing.T) {
	r := runCLI(testCtx(t), nil, "", "cp", "--help")
	for _, want := range []string{"Exit codes:", "\n  1 ", "\n  2 ", "\n  23 ", "130/143", "\n  255 "} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("cp --help lacks %q:\n%s", want, r.stdout)
		}
	}
}

// cuttingDial is an agent's Dial that, once armed, cuts the tunnel after
// a MiB has crossed it: a copy of more than that loses its tunnel midway.
type cuttingDial struct {
	mu    sync.Mutex
	armed bool
	n     int64
	conns []net.Conn
	cut   chan struct{}
}

func (d *cuttingDial) hook(_ int, c *agent.Config) {
	tc := tunnel.TunedTLS(c.TLS)
	c.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		conn, err := tunnel.DialTLS(ctx, addr, tc)
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		d.conns = append(d.conns, conn)
		d.mu.Unlock()
		return &countingConn{Conn: conn, d: d}, nil
	}
}

func (d *cuttingDial) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed, d.n, d.cut = true, 0, make(chan struct{})
}

func (d *cuttingDial) count(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.armed {
		return
	}
	if d.n += int64(n); d.n > 1<<20 {
		d.armed = false
		for _, c := range d.conns {
			c.Close()
		}
		d.conns = nil
		close(d.cut)
	}
}

type countingConn struct {
	net.Conn
	d *cuttingDial
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.d.count(n)
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.d.count(n)
	return n, err
}

// TestCpTunnelLost: a copy whose tunnel is lost midway is Tether's
// failure, 255, both ways; the message is the coordinator's reason and
// names the node once, without the layers it came through (mirror, the
// stream, the pipe's inbox); the destination is left as it was.
func TestCpTunnelLost(t *testing.T) {
	d := &cuttingDial{}
	f := startFleet(t, fleettest.Options{Agent: d.hook})
	url := f.NATS.ClientURL()
	root := f.DataDir("node-0")
	big := make([]byte, 16<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	local := t.TempDir()
	if err := os.WriteFile(filepath.Join(local, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	lastSession := ""
	for _, tc := range []struct {
		name      string
		src, dst  string
		unchanged string // must not exist after the copy
	}{
		{"push", filepath.Join(local, "big"), "node-0:" + root + "/pushed", filepath.Join(root, "pushed")},
		{"pull", "node-0:" + root + "/big", filepath.Join(local, "pulled"), filepath.Join(local, "pulled")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A session the last cut ended may still be listed: wait
			// for one that is not.
			checkFor(t, defaultTestTimeout, func() error {
				ns := f.Coordinator.Nodes(protocol.Selector{})
				if len(ns) != 1 || ns[0].SessionID == lastSession {
					return errorString("node-0 is not connected on a new session yet")
				}
				lastSession = ns[0].SessionID
				return nil
			})
			d.arm()
			r := runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, tc.src, tc.dst)
			select {
			case <-d.cut:
			default:
				t.Fatalf("the tunnel was not cut (exit %d, stderr %q)", r.code, r.stderr)
			}
			msg := strings.TrimSuffix(r.stderr, "\n")
			if r.code != 255 || strings.Count(msg, "\n") != 0 || !strings.Contains(msg, "lost") ||
				strings.Count(msg, "node node-0") != 1 || strings.Contains(msg, "mirror:") || strings.Contains(msg, "_INBOX") || strings.Contains(msg, "stream on node") {
				t.Errorf("exit %d, stderr %q; want 255 and one line naming the lost tunnel, with the node named once", r.code, r.stderr)
			}
			if _, err := os.Lstat(tc.unchanged); !os.IsNotExist(err) {
				t.Errorf("the cut copy left %s (%v)", tc.unchanged, err)
			}
		})
	}
}

// TestCpOutcome: what a failed copy's error is shown as, and its code, for
// failures a fleet does not produce on demand: the agent's internal error
// (named with its node, as agents prefix their messages) and the
// coordinator's shutdown are Tether's (255) and name the node once; the
// agent's copy failures are 1; a stream the coordinator closed shows its
// reason.
func TestCpOutcome(t *testing.T) {
	from := copyEnd{path: "/src"}
	to := copyEnd{node: "node-0", path: "/srv/dst"}
	peer := func(code, msg string) error {
		return &mirror.Error{Op: "send", Path: "/src", Err: &mirror.PeerError{Info: protocol.ErrorInfo{Code: code, Message: msg}}}
	}
	quiet := &watchedStream{}
	for _, tc := range []struct {
		name string
		err  error
		st   *watchedStream
		code int
		want string
	}{
		{"agent panic", peer(protocol.CodeInternal, "node node-0: internal error in copy stream: boom"), quiet, 255,
			"cp /src to node-0:/srv/dst: internal error in copy stream: boom (internal)"},
		{"coordinator shutdown", peer(protocol.ResultCodeShutdown, "coordinator c1 is shutting down; copy stream cancelled"), quiet, 255,
			"cp /src to node-0:/srv/dst: coordinator c1 is shutting down; copy stream cancelled (shutdown)"},
		{"agent busy", peer(protocol.CodeBusy, "node node-0 is running 8 copies, its limit"), quiet, 255,
			"cp /src to node-0:/srv/dst: node node-0 is running 8 copies, its limit (busy)"},
		// A copy failure on the node's files says whose files they are.
		{"copy failed on the node", peer(protocol.CodeCopyFailed, "/srv/dst: \"srv\": permission denied"), quiet, 1,
			"cp /src to node-0:/srv/dst: node node-0: /srv/dst: \"srv\": permission denied"},
		{"the node's disk is full", peer(protocol.CodeCopyFailed, "/srv/dst/big: no space left on device (the destination is unchanged)"), quiet, 1,
			"cp /src to node-0:/srv/dst: node node-0: /srv/dst/big: no space left on device (the destination is unchanged)"},
		// A commit that failed past its point of no return (fresh21):
		// the agent's frame names the entry and the errno, exit 1.
		{"commit failed after the renames", peer(protocol.CodeCopyFailed, `commit: the new tree is in place, but: entry "same": chmod: operation not permitted`), quiet, 1,
			`cp /src to node-0:/srv/dst: node node-0: commit: the new tree is in place, but: entry "same": chmod: operation not permitted`},
		{"refused", peer(protocol.CodeBadRequest, "node node-0: copy params: path: must be absolute"), quiet, 1,
			"cp /src to node-0:/srv/dst: copy params: path: must be absolute"},
		{"a control character from the node", peer(protocol.CodeCopyFailed, "/srv/dst/a\nb\x1b[2J: permission denied"), quiet, 1,
			`cp /src to node-0:/srv/dst: node node-0: /srv/dst/a\nb\x1b[2J: permission denied`},
		{"agent cancelled", &mirror.Error{Op: "send", Path: "/src", Err: mirror.ErrCanceled}, quiet, 255,
			"cp /src to node-0:/srv/dst: the agent cancelled the copy (is it shutting down?)"},
		{"coordinator closed the stream", &mirror.Error{Op: "send", Path: "/src", Err: errors.New("x")},
			&watchedStream{err: fmt.Errorf("copy stream on node node-0: %w", &natspipe.Error{Msg: "pipe to _INBOX.x: closed by peer: tunnel to node node-0 lost: EOF", Kind: natspipe.ErrPeerClosed, Reason: "tunnel to node node-0 lost: EOF"})}, 255,
			"cp /src to node-0:/srv/dst: tunnel to node node-0 lost: EOF"},
		{"the pipe went silent", &mirror.Error{Op: "send", Path: "/src", Err: errors.New("x")},
			&watchedStream{err: &natspipe.Error{Msg: "pipe to _INBOX.x: peer silent for 15s", Kind: natspipe.ErrPeerGone}}, 255,
			"cp /src to node-0:/srv/dst: the stream through the coordinator failed: peer silent for 15s"},
		{"local failure", &mirror.Error{Op: "send", Path: "/src", Err: &os.PathError{Op: "open", Path: "/src/a\tb", Err: syscall.EACCES}}, quiet, 1,
			`cp /src to node-0:/srv/dst: local source "/src/a\tb": permission denied`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := cpOutcome(tc.err, tc.st, "node-0", "local source")
			var ee *exitError
			if err := cpError(code, from, to, msg); !errors.As(err, &ee) || ee.code != tc.code || err.Error() != tc.want {
				t.Errorf("shown as %q, exit %d; want %q, exit %d", err, code, tc.want, tc.code)
			}
		})
	}

	// A pull onto a full local disk says it is the local destination,
	// and where, not the stage file's name (fresh17 item 8).
	full := &mirror.Error{Op: "receive", Path: "/dst", Err: &mirror.WriteError{Path: "/dst/big", Err: syscall.ENOSPC}}
	code, msg := cpOutcome(full, quiet, "node-0", "local destination")
	if want := "local destination /dst/big: no space left on device (the destination is unchanged)"; code != 1 || msg != want {
		t.Errorf("local disk full: %q, exit %d; want %q, exit 1", msg, code, want)
	}
}

// TestCpQuotesNames: names that hold control characters, bytes that are
// not UTF-8 or other characters a terminal would not show as they are
// (and only those) are printed quoted, in the summary, in errors and for
// skipped entries: a file name cannot inject lines or escape sequences.
func TestCpQuotesNames(t *testing.T) {
	for in, want := range map[string]string{
		"/srv/plain name":  "/srv/plain name",
		"/srv/ünïcödé":     "/srv/ünïcödé",
		"/srv/a\nb":        `"/srv/a\nb"`,
		"/srv/\x1b[31mred": `"/srv/\x1b[31mred"`,
		"/srv/\xff\xfe":    `"/srv/\xff\xfe"`,
		"/srv/\u202eevil":  `"/srv/\u202eevil"`,
		`/srv/say "hi"`:    `"/srv/say \"hi\""`,
	} {
		if got := protocol.QuoteName(in); got != want {
			t.Errorf("protocol.QuoteName(%q) = %s, want %s", in, got, want)
		}
	}
	if got := printable("a\nb\x1b[2J\xffc \"q\" ü"); got != `a\nb\x1b[2J\xffc "q" ü` {
		t.Errorf("printable = %s", got)
	}

	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	root := f.DataDir("node-0")
	src := filepath.Join(t.TempDir(), "evil\nname\x1b[31m")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "ok"), []byte("ok"), 0o644)
	if err := syscall.Mkfifo(filepath.Join(src, "fifo\n\x1b[2J"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runCLI(testCtx(t), nil, "", "cp", "--nats-url", url, src, "node-0:"+root+"/evil\x1b]0;title\x07")
	if r.code != 23 {
		t.Fatalf("exit %d, stderr %q; want 23 (the fifo is skipped)", r.code, r.stderr)
	}
	if strings.ContainsAny(r.stderr, "\x1b\x07") || strings.Count(r.stderr, "\n") != 3 {
		t.Errorf("stderr holds control characters or more lines than the skip, summary and partial lines:\n%q", r.stderr)
	}
	for _, want := range []string{`tether: cp: skipped "` + src[:len(src)-len("evil\nname\x1b[31m")] + `evil\nname\x1b[31m/fifo\n\x1b[2J": `, `node-0:"` + root + `/evil\x1b]0;title\a"`} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr %q lacks %q", r.stderr, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "evil\x1b]0;title\x07", "ok")); err != nil || string(b) != "ok" {
		t.Errorf("the tree did not arrive under its name: %q, %v", b, err)
	}
}

// TestCpLocalSourceMissing: a missing local source is said in the user's
// terms (which end, which path), once, and before any connection is made
// (the coordinator here is unreachable): not Go's "lstat PATH: ...".
func TestCpLocalSourceMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nonexist")
	r := runCLI(testCtx(t), nil, "", "cp", "--nats-url", unreachableNATS, missing, "vm:/tmp/")
	want := "tether: cp: local source " + missing + ": no such file or directory\n"
	if r.code != exitFailure || r.stderr != want {
		t.Errorf("cp from a missing source: exit %d, stderr %q; want 1, %q", r.code, r.stderr, want)
	}
}
