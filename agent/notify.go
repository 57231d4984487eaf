package agent

// The agent's side of systemd's notify protocol (Config.Notify): what it
// tells the service manager and when, and how it decides it is healthy
// enough to pet the watchdog.
//
// One goroutine, runNotify, owns every message after the start: READY=1 on
// the first welcomed session, STATUS= whenever the picture changes (it is
// woken by session ups and downs and redial failures, and looks again every
// tick), WATCHDOG=1 every half watchdog interval after a successful probe,
// STOPPING=1 once Run's ctx ends. The probe is a yamux ping on the current
// session that must come back within a quarter of the interval: a real
// round trip through the coordinator, not "the process is alive", so a
// tunnel that stalls (a partition, a middlebox that stops forwarding, a
// wedged coordinator) stops the petting within one interval, however long
// the keepalive takes to give up on the session. An agent without a
// session (dialing, backing off) does not pet either: systemd restarts it
// after WatchdogSec=, which the unit sets long enough to ride out a
// coordinator restart.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/tunnel"
)

// notifyStatusEvery is how often the STATUS= line is refreshed (execs
// come and go without waking the notifier) when there is no watchdog to
// set the pace.
const notifyStatusEvery = 5 * time.Second

// liveSession is the welcomed session the watchdog probes and the status
// describes: the newest one (a drained session that finishes its streams
// beside its successor is not it).
type liveSession struct {
	sess        *tunnel.Session
	addr        string // the coordinator address dialed
	coordinator string // its id, from the welcome
	transport   string // tls or wss; "" for a test's Dial
}

// notifyState is what runNotify reads; the session code writes it.
type notifyState struct {
	cur   atomic.Pointer[liveSession]
	retry atomic.Pointer[string] // why the last dial or session failed, until the next welcome
	wake  chan struct{}          // capacity 1: something changed
	pings sync.WaitGroup         // probes' ping goroutines; runNotify waits for them
}

// wakeNotify makes runNotify look again now.
func (a *Agent) wakeNotify() {
	select {
	case a.notify.wake <- struct{}{}:
	default:
	}
}

// sessionUp records ls as the current session; the returned func, called
// when the session ends, clears it unless a newer one took its place.
func (a *Agent) sessionUp(ls *liveSession) (down func()) {
	a.notify.cur.Store(ls)
	a.notify.retry.Store(nil)
	a.wakeNotify()
	return func() {
		if a.notify.cur.CompareAndSwap(ls, nil) {
			a.wakeNotify()
		}
	}
}

// noteRetry records why the redialer is about to wait (tunnel.Redialer's
// OnRetry).
func (a *Agent) noteRetry(attempt int, err error) {
	var moved *tunnel.MovedError
	var why string
	switch {
	case errors.As(err, &moved):
		why = "moving: the coordinator drained the session"
	case errors.Is(err, tunnel.ErrHandover):
		why = "enrolled: connecting with the node certificate"
	case err == nil:
		why = "reconnecting: the session ended"
	default:
		why = fmt.Sprintf("reconnecting (attempt %d): %v", attempt, err)
	}
	a.notify.retry.Store(&why)
	a.wakeNotify()
}

// startNotify starts runNotify when Config.Notify sends anything; wg
// counts it. It sends STOPPING=1 and returns once ctx is done.
func (a *Agent) startNotify(ctx context.Context, wg *sync.WaitGroup) {
	if !a.cfg.Notify.Enabled() {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer a.guard.Recover("notify", nil)
		a.runNotify(ctx)
	}()
}

// runNotify is the notifier loop described at the top of this file.
func (a *Agent) runNotify(ctx context.Context) {
	n := a.cfg.Notify
	wd := n.WatchdogInterval()
	every := notifyStatusEvery
	if wd > 0 {
		every = wd / 2
	}
	t := time.NewTicker(every)
	defer t.Stop()
	l := &sdnotify.Loop{
		N: n, Log: a.log,
		Unhealthy: "tunnel unhealthy: not petting the systemd watchdog; systemd restarts the agent if this lasts",
		Healthy:   "tunnel healthy again: petting the systemd watchdog",
	}
	n.Status("connecting to " + strings.Join(a.cfg.Coordinators, ", "))
	for {
		tick := false
		select {
		case <-ctx.Done():
			l.Check(n.Stopping(fmt.Sprintf("stopping: %d execs running", a.running.Load())))
			// The sessions close with ctx, which ends a ping in flight.
			a.notify.pings.Wait()
			return
		case <-a.notify.wake:
		case <-t.C:
			tick = true
		}
		cur := a.notify.cur.Load()
		status := a.notifyStatus(cur)
		if cur != nil && !n.IsReady() {
			l.Check(n.Ready(status))
		}
		if tick && wd > 0 {
			status = l.Tick(ctx, status, a.probe(ctx, cur, wd/4))
		}
		if ctx.Err() == nil {
			l.Check(n.Status(status))
		}
	}
}

// notifyStatus is the STATUS= line for the current session cur (nil
// between sessions).
func (a *Agent) notifyStatus(cur *liveSession) string {
	if cur == nil {
		if why := a.notify.retry.Load(); why != nil {
			return *why
		}
		return "connecting to " + strings.Join(a.cfg.Coordinators, ", ")
	}
	via := ""
	if cur.transport != "" {
		via = " via " + cur.transport
	}
	return fmt.Sprintf("connected to coordinator %s at %s%s, %d execs running", cur.coordinator, cur.addr, via, a.running.Load())
}

// errNoSession is the probe's verdict between sessions.
var errNoSession = errors.New("no session with a coordinator")

// probe pings cur's session and waits up to timeout for the answer: nil
// when a round trip completed in time. The ping runs in a goroutine of its
// own (yamux's Ping waits up to the tunnel's write timeout, twice), which
// ends when the answer comes, the ping times out or the session closes
// (every session closes when Run's ctx ends; runNotify waits for these
// goroutines before it returns).
func (a *Agent) probe(ctx context.Context, cur *liveSession, timeout time.Duration) error {
	if cur == nil {
		return errNoSession
	}
	done := make(chan error, 1)
	a.notify.pings.Add(1)
	go func() {
		defer a.notify.pings.Done()
		defer a.guard.Recover("notify-ping", func(e *panics.Error) { done <- e })
		_, err := cur.sess.Ping()
		done <- err
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("ping over the tunnel to %s: %w", cur.addr, err)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("ping over the tunnel to %s: no answer within %v", cur.addr, timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}
