package sdnotify

import (
	"context"
	"log/slog"
)

// Loop is the memory a daemon's notifier loop keeps between its sends, so
// that the log says what changed, not what every tick found: a failed send
// is logged once until one succeeds, and the health verdict once when it
// turns bad and once when it turns good again. The daemon still decides
// what healthy is (Tick takes its check's result). A Loop belongs to the
// one goroutine that runs the loop; it is not safe for concurrent use.
type Loop struct {
	N   *Notifier    // where the messages go (nil: nowhere)
	Log *slog.Logger // where failures and verdict changes are logged

	// Unhealthy is the warning logged (with the check's err and the
	// watchdog interval) when the verdict turns bad; Healthy the line
	// logged when it turns good again.
	Unhealthy, Healthy string

	failed    bool // a send failed: logged once until one succeeds
	unhealthy bool // the last check failed
}

// Check logs err, a send's result, if it is the first failure since the
// last success (or since the start); nil forgets a failure.
func (l *Loop) Check(err error) {
	switch {
	case err != nil && !l.failed:
		l.Log.Warn("systemd notification failed", "err", err)
		l.failed = true
	case err == nil:
		l.failed = false
	}
}

// Tick is one watchdog tick whose health check returned health (nil:
// healthy). Healthy, it sends WATCHDOG=1; not, it does not pet the
// watchdog and logs Unhealthy if the verdict just turned (and ctx, which
// may have ended the check, has not ended). It returns status, the
// STATUS= line to send next, with the reason it does not pet appended.
func (l *Loop) Tick(ctx context.Context, status string, health error) string {
	if health != nil {
		if ctx.Err() == nil && !l.unhealthy {
			l.Log.Warn(l.Unhealthy, "err", health, "watchdog", l.N.WatchdogInterval())
		}
		l.unhealthy = true
		return status + "; not petting the watchdog: " + health.Error()
	}
	if l.unhealthy {
		l.Log.Info(l.Healthy)
	}
	l.unhealthy = false
	l.Check(l.N.Watchdog())
	return status
}
