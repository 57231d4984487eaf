package coordinator

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestRateLimitedHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := slog.New(newRateLimitedHandler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), 10*time.Second, 3))
		perConn := log.With("remote_addr", "192.0.2.1:1") // shares the limiter
		for range 100 {
			perConn.Warn("refused")
			log.Debug("health check")
		}
		time.Sleep(10 * time.Second)
		log.Warn("refused")
		out := buf.String()
		if n := strings.Count(out, "msg=refused"); n != 4 {
			t.Errorf("%d refused lines, want 3 then 1 after the interval:\n%s", n, out)
		}
		if n := strings.Count(out, `msg="health check"`); n != 3 {
			t.Errorf("%d health check lines, want 3 (its own limiter)", n)
		}
		if !strings.Contains(out, "suppressed=97") {
			t.Errorf("the line after the pause does not count the 97 dropped:\n%s", out)
		}
		// Past preauthLogKeys distinct messages, the rest share one limiter.
		buf.Reset()
		for i := range 200 {
			log.Info("yamux: failed to read header from peer " + strings.Repeat("x", i))
		}
		if n := strings.Count(buf.String(), "\n"); n > preauthLogKeys*3+3 {
			t.Errorf("%d lines of 200 distinct messages, want at most %d", n, preauthLogKeys*3+3)
		}
	})
}
