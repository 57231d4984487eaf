package sdnotify_test

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/internal/sdnotify/sdnotifytest"
)

func TestNilNotifierSendsNothing(t *testing.T) {
	var n *sdnotify.Notifier
	if n.Enabled() || n.WatchdogInterval() != 0 || n.IsReady() || n.IsStopping() {
		t.Fatal("a nil Notifier claims to be enabled")
	}
	for _, err := range []error{n.Ready("x"), n.Status("x"), n.Watchdog(), n.Stopping("x")} {
		if err != nil {
			t.Fatal(err)
		}
	}
	ran := false
	if err := n.Reload(func() string { ran = true; return "" }); err != nil || !ran {
		t.Fatalf("Reload on nil: ran %v, err %v", ran, err)
	}
	if sdnotify.New("", time.Second) != nil {
		t.Fatal(`New("") is not nil`)
	}
}

// FromEnv takes the service manager's variables out of the environment,
// so that children do not inherit them, and honours WATCHDOG_PID.
func TestFromEnv(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	for _, tc := range []struct {
		name, usec, pid string
		want            time.Duration
	}{
		{"no watchdog", "", "", 0},
		{"watchdog", "4000000", "", 4 * time.Second},
		{"watchdog for this process", "4000000", strconv.Itoa(os.Getpid()), 4 * time.Second},
		{"watchdog for another process", "4000000", "1", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(sdnotify.EnvSocket, sock.Path)
			t.Setenv(sdnotify.EnvWatchdogUSec, tc.usec)
			t.Setenv(sdnotify.EnvWatchdogPID, tc.pid)
			n, err := sdnotify.FromEnv()
			if err != nil {
				t.Fatal(err)
			}
			if !n.Enabled() || n.WatchdogInterval() != tc.want {
				t.Fatalf("enabled %v, watchdog %v; want true, %v", n.Enabled(), n.WatchdogInterval(), tc.want)
			}
			for _, k := range []string{sdnotify.EnvSocket, sdnotify.EnvWatchdogUSec, sdnotify.EnvWatchdogPID} {
				if v, ok := os.LookupEnv(k); ok {
					t.Errorf("$%s=%q left in the environment", k, v)
				}
			}
		})
	}
	t.Run("no socket", func(t *testing.T) {
		t.Setenv(sdnotify.EnvSocket, "")
		os.Unsetenv(sdnotify.EnvSocket)
		t.Setenv(sdnotify.EnvWatchdogUSec, "4000000")
		n, err := sdnotify.FromEnv()
		if err != nil || n != nil {
			t.Fatalf("FromEnv without a socket: %v, %v; want nil, nil", n, err)
		}
		if _, ok := os.LookupEnv(sdnotify.EnvWatchdogUSec); ok {
			t.Error("$WATCHDOG_USEC left in the environment")
		}
	})
	t.Run("bad watchdog", func(t *testing.T) {
		t.Setenv(sdnotify.EnvSocket, sock.Path)
		t.Setenv(sdnotify.EnvWatchdogUSec, "soon")
		if _, err := sdnotify.FromEnv(); err == nil || !strings.Contains(err.Error(), "WATCHDOG_USEC") {
			t.Fatalf("err = %v, want one naming WATCHDOG_USEC", err)
		}
	})
}

// Each call is one datagram with the lines sd_notify(3) defines; a status
// is sent once per change; a reload before READY=1 is not announced.
func TestMessages(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	n := sdnotify.New(sock.Path, 10*time.Second)
	if n.WatchdogInterval() != 10*time.Second {
		t.Fatalf("watchdog %v", n.WatchdogInterval())
	}
	reloaded := 0
	reload := func() string { reloaded++; return "reloaded" }
	steps := []func() error{
		func() error { return n.Reload(reload) }, // before READY=1: runs, sends nothing
		func() error { return n.Status("starting:\n dialing") },
		func() error { return n.Status("starting: dialing") }, // the same: not sent
		func() error { return n.Ready("connected") },
		func() error { return n.Watchdog() },
		func() error { return n.Reload(reload) },
		func() error { return n.Status(strings.Repeat("é", 300)) },
		func() error { return n.Stopping("draining") },
		func() error { return n.Reload(reload) }, // stopping: not announced
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if reloaded != 3 {
		t.Fatalf("reload ran %d times, want 3", reloaded)
	}
	sock.Wait(t, 10*time.Second, "STOPPING=1", func(m sdnotifytest.Message) bool { return m.Has("STOPPING=1") })
	got := sock.Messages()
	long := cleanLong(t, got)
	want := [][]string{
		{"STATUS=starting: dialing"},
		{"READY=1", "STATUS=connected"},
		{"WATCHDOG=1"},
		{"RELOADING=1", "MONOTONIC_USEC=*"},
		{"READY=1", "STATUS=reloaded"},
		{"STATUS=" + long},
		{"STOPPING=1", "STATUS=draining"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d messages %q, want %d %q", len(got), got, len(want), want)
	}
	for i, m := range got {
		if len(m.Lines) != len(want[i]) {
			t.Fatalf("message %d: %q, want %q", i, m.Lines, want[i])
		}
		for j, l := range m.Lines {
			w := want[i][j]
			if k, ok := strings.CutSuffix(w, "*"); ok {
				v, found := strings.CutPrefix(l, k)
				if _, err := strconv.ParseUint(v, 10, 64); !found || err != nil {
					t.Errorf("message %d line %d: %q, want %s<number>", i, j, l, k)
				}
				continue
			}
			if l != w {
				t.Errorf("message %d line %d: %q, want %q", i, j, l, w)
			}
		}
	}
}

// cleanLong checks the long status was cut to at most 400 bytes of valid
// UTF-8 ending in an ellipsis, and returns it.
func cleanLong(t *testing.T, msgs []sdnotifytest.Message) string {
	t.Helper()
	for _, m := range msgs {
		if v, ok := m.Value("STATUS"); ok && strings.HasPrefix(v, "é") {
			if len(v) > 400 || !strings.HasSuffix(v, "…") || !utf8.ValidString(v) {
				t.Fatalf("long status not cut cleanly: %d bytes %q", len(v), v)
			}
			return v
		}
	}
	t.Fatal("long status not sent")
	return ""
}

// $NOTIFY_SOCKET may name an abstract socket ("@name").
func TestAbstractSocket(t *testing.T) {
	name := "@tether-sdnotify-test-" + strconv.Itoa(os.Getpid())
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Skipf("no abstract sockets here: %v", err)
	}
	defer conn.Close()
	if err := sdnotify.New(name, 0).Ready("up"); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 512)
	k, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:k]); got != "READY=1\nSTATUS=up" {
		t.Fatalf("got %q", got)
	}
}

// A socket nobody listens on is an error naming $NOTIFY_SOCKET, not a
// hang or a panic.
func TestNoListener(t *testing.T) {
	err := sdnotify.New(t.TempDir()+"/gone", 0).Watchdog()
	if err == nil || !strings.Contains(err.Error(), "NOTIFY_SOCKET") {
		t.Fatalf("err = %v, want one naming NOTIFY_SOCKET", err)
	}
}
