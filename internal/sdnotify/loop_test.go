package sdnotify_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/internal/sdnotify/sdnotifytest"
)

// TestLoopLogsChanges: a Loop logs the first of a run of failed sends and
// each turn of the health verdict, once; it pets the watchdog only when
// healthy, and says in the status why it does not.
func TestLoopLogsChanges(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	var logs bytes.Buffer
	l := &sdnotify.Loop{
		N:         sdnotify.New(sock.Path, 10*time.Second),
		Log:       slog.New(slog.NewTextHandler(&logs, nil)),
		Unhealthy: "sick",
		Healthy:   "well again",
	}
	ctx := context.Background()
	send := errors.New("send broke")
	l.Check(send)
	l.Check(send)
	l.Check(nil)
	l.Check(send)
	if n := strings.Count(logs.String(), "systemd notification failed"); n != 2 {
		t.Errorf("%d send failures logged, want 2 (one a run):\n%s", n, logs.String())
	}

	sick := errors.New("no NATS")
	if got := l.Tick(ctx, "serving", sick); got != "serving; not petting the watchdog: no NATS" {
		t.Errorf("unhealthy status %q", got)
	}
	l.Tick(ctx, "serving", sick)
	if got := l.Tick(ctx, "serving", nil); got != "serving" {
		t.Errorf("healthy status %q", got)
	}
	l.Tick(ctx, "serving", nil)
	if n := strings.Count(logs.String(), "msg=sick"); n != 1 {
		t.Errorf("%d unhealthy warnings, want 1:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), `msg="well again"`); n != 1 {
		t.Errorf("%d healthy-again lines, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "watchdog=10s") {
		t.Errorf("the warning does not give the watchdog interval:\n%s", logs.String())
	}
	// Two healthy ticks: two WATCHDOG=1, none while unhealthy.
	sock.Wait(t, 10*time.Second, "two WATCHDOG=1", func(sdnotifytest.Message) bool {
		n := 0
		for _, m := range sock.Messages() {
			if m.Has("WATCHDOG=1") {
				n++
			}
		}
		return n == 2
	})

	// A check that ended with ctx is not a verdict worth a warning.
	done, cancel := context.WithCancel(ctx)
	cancel()
	logs.Reset()
	l.Tick(done, "stopping", context.Canceled)
	if strings.Contains(logs.String(), "sick") {
		t.Errorf("a check ended by ctx logged a warning:\n%s", logs.String())
	}
}
