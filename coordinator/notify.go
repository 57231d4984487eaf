package coordinator

// The coordinator's side of systemd's notify protocol (Config.Notify).
//
// Serve starts runNotify once it accepts agents and its micro service is
// subscribed: READY=1 then, STATUS= on every tick, WATCHDOG=1 on every
// tick whose health check passes, and STOPPING=1 as the drain begins
// (drain calls stopNotify first). The health check is what a wedged or cut
// off coordinator fails: Ready (serving, NATS connected), a NATS round trip
// (FlushTimeout: PING, PONG) and the registry lock (c.mu, which every
// registration, job and listing takes) acquired, each within a quarter of
// the watchdog interval. A coordinator whose NATS connection stays down
// serves no API; systemd restarts it after WatchdogSec=.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tetherfleet/tether/internal/sdnotify"
)

// errNATSDown is the health check's verdict without a NATS connection.
var errNATSDown = errors.New("NATS connection down")

// startNotify starts runNotify when Config.Notify sends anything. The
// returned stop sends STOPPING=1 with status and waits for the loop.
func (c *Coordinator) startNotify() (stop func(status string)) {
	n := c.cfg.Notify
	if !n.Enabled() {
		return func(string) {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer c.guard.Recover("notify", nil)
		c.runNotify(ctx)
	}()
	var once sync.Once
	return func(status string) {
		once.Do(func() {
			cancel()
			wg.Wait()
			if err := n.Stopping(status); err != nil {
				c.log.Warn("systemd notification failed", "err", err)
			}
		})
	}
}

// runNotify sends READY=1 and then, every half watchdog interval (or 5 s
// without a watchdog), the status and, when healthy, WATCHDOG=1, until ctx
// ends.
func (c *Coordinator) runNotify(ctx context.Context) {
	n := c.cfg.Notify
	wd := n.WatchdogInterval()
	every := 5 * time.Second
	if wd > 0 {
		every = wd / 2
	}
	l := &sdnotify.Loop{
		N: n, Log: c.log,
		Unhealthy: "coordinator unhealthy: not petting the systemd watchdog; systemd restarts it if this lasts",
		Healthy:   "coordinator healthy again: petting the systemd watchdog",
	}
	l.Check(n.Ready(c.notifyStatus()))
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		status := c.notifyStatus()
		if wd > 0 {
			status = l.Tick(ctx, status, c.healthy(ctx, wd/4))
		}
		if ctx.Err() == nil {
			l.Check(n.Status(status))
		}
	}
}

// notifyStatus is the STATUS= line: what the coordinator serves.
func (c *Coordinator) notifyStatus() string {
	c.mu.Lock()
	agents, jobs := len(c.nodes), c.jobs.len()
	c.mu.Unlock()
	nats := "NATS " + c.cfg.NATS.ConnectedUrlRedacted()
	if !c.cfg.NATS.IsConnected() {
		nats = "NATS disconnected"
	}
	return fmt.Sprintf("serving %d agents, %d jobs running; %s", agents, jobs, nats)
}

// healthy checks, within timeout, that the coordinator can do its work:
// serving, its NATS connection up and answering a round trip, its
// registry lock free. The lock is taken in a goroutine of its own that
// returns once it got it.
func (c *Coordinator) healthy(ctx context.Context, timeout time.Duration) error {
	if !c.serving.Load() {
		return errors.New("not serving")
	}
	if !c.cfg.NATS.IsConnected() {
		return errNATSDown
	}
	if err := c.cfg.NATS.FlushTimeout(timeout); err != nil {
		return fmt.Errorf("NATS round trip: %w", err)
	}
	locked := make(chan struct{})
	go func() {
		c.mu.Lock()
		c.mu.Unlock()
		close(locked)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-locked:
		return nil
	case <-t.C:
		return fmt.Errorf("registry lock not free within %v", timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}
