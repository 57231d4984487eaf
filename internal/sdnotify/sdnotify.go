package sdnotify

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// The service manager's environment variables (sd_notify(3),
// sd_watchdog_enabled(3)).
const (
	EnvSocket        = "NOTIFY_SOCKET"
	EnvWatchdogUSec  = "WATCHDOG_USEC"
	EnvWatchdogPID   = "WATCHDOG_PID"
	maxStatusLen     = 400 // systemctl status shows one line; keep it readable
	statusTruncation = "…"
)

// Notifier sends sd_notify messages to one socket. Its methods are safe for
// concurrent use and do nothing on a nil *Notifier. Each message is one
// datagram on a fresh connection, so a service manager that re-executed
// itself (systemctl daemon-reexec) and bound its socket again still gets
// the next one.
type Notifier struct {
	addr     *net.UnixAddr
	watchdog time.Duration

	mu         sync.Mutex
	lastStatus string
	ready      atomic.Bool // READY=1 was sent
	stopping   atomic.Bool // STOPPING=1 was sent
}

// FromEnv returns the Notifier of the service manager that started this
// process, or nil (which sends nothing) when $NOTIFY_SOCKET is unset. The
// watchdog interval is $WATCHDOG_USEC when $WATCHDOG_PID is unset or names
// this process (systemd sets it for the main process; a child that
// inherited the variables must not pet for its parent), else zero. It
// removes $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID from the
// environment, so call it once, early, before the process starts any
// child. A malformed $WATCHDOG_USEC is an error naming the variable; the
// variables are removed all the same.
func FromEnv() (*Notifier, error) {
	socket := os.Getenv(EnvSocket)
	os.Unsetenv(EnvSocket)
	// unsetEnvironment=true removes WATCHDOG_USEC and WATCHDOG_PID.
	wd, err := daemon.SdWatchdogEnabled(true)
	if err != nil {
		return nil, fmt.Errorf("sd_notify: $%s=%q: %w", EnvWatchdogUSec, os.Getenv(EnvWatchdogUSec), err)
	}
	if socket == "" {
		return nil, nil
	}
	return New(socket, wd), nil
}

// New returns a Notifier sending to the unixgram socket at path (a leading
// "@" names an abstract socket, as in $NOTIFY_SOCKET) with watchdog
// interval watchdog (zero: no watchdog). An empty path returns nil.
func New(path string, watchdog time.Duration) *Notifier {
	if path == "" {
		return nil
	}
	return &Notifier{addr: &net.UnixAddr{Name: path, Net: "unixgram"}, watchdog: max(watchdog, 0)}
}

// Enabled reports whether n sends anything.
func (n *Notifier) Enabled() bool { return n != nil }

// WatchdogInterval is the service manager's watchdog timeout
// (WatchdogSec=): a daemon that goes this long without sending WATCHDOG=1
// is killed and, with Restart=, started again. Zero means no watchdog (or
// a nil n). Pet at about half of it.
func (n *Notifier) WatchdogInterval() time.Duration {
	if n == nil {
		return 0
	}
	return n.watchdog
}

// Ready sends READY=1 with status (if not empty) as STATUS=. The start-up
// of a Type=notify unit is complete once the service manager has it.
func (n *Notifier) Ready(status string) error {
	if n == nil {
		return nil
	}
	n.ready.Store(true)
	return n.sendWithStatus(status, daemon.SdNotifyReady)
}

// IsReady reports whether Ready was called.
func (n *Notifier) IsReady() bool { return n != nil && n.ready.Load() }

// Status sends STATUS=status (newlines become spaces; longer than 400
// bytes is cut) if it differs from the last status sent.
func (n *Notifier) Status(status string) error {
	if n == nil {
		return nil
	}
	return n.sendWithStatus(status)
}

// Watchdog sends WATCHDOG=1: the daemon is healthy. Send it only after a
// check that the daemon can do its work (the caller's), at about half of
// WatchdogInterval.
func (n *Notifier) Watchdog() error {
	if n == nil {
		return nil
	}
	return n.send(daemon.SdNotifyWatchdog)
}

// Stopping sends STOPPING=1 with status: the daemon begins its shutdown
// (its drain). Later Watchdog calls are still sent; the service manager
// no longer watches a stopping unit.
func (n *Notifier) Stopping(status string) error {
	if n == nil {
		return nil
	}
	n.stopping.Store(true)
	return n.sendWithStatus(status, daemon.SdNotifyStopping)
}

// IsStopping reports whether Stopping was called.
func (n *Notifier) IsStopping() bool { return n != nil && n.stopping.Load() }

// Reload runs reload between RELOADING=1 (with MONOTONIC_USEC, which
// systemd 253 and later want with it) and READY=1 with the status reload
// returns. Before Ready, or after Stopping, it only runs reload: a reload
// must not declare a daemon ready that is still starting or already
// stopping. Errors sending are returned after reload ran.
func (n *Notifier) Reload(reload func() (status string)) error {
	if n == nil || !n.ready.Load() || n.stopping.Load() {
		reload()
		return nil
	}
	var ts unix.Timespec
	var err error
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) == nil {
		err = n.send(daemon.SdNotifyReloading, "MONOTONIC_USEC="+strconv.FormatInt(ts.Nano()/1000, 10))
	} else {
		err = n.send(daemon.SdNotifyReloading)
	}
	status := reload()
	return errors.Join(err, n.sendWithStatus(status, daemon.SdNotifyReady))
}

// sendWithStatus sends lines plus STATUS=status when status is not empty
// and not the last one sent (always when lines is empty but status is
// new).
func (n *Notifier) sendWithStatus(status string, lines ...string) error {
	status = cleanStatus(status)
	if status != "" {
		n.mu.Lock()
		changed := status != n.lastStatus
		n.lastStatus = status
		n.mu.Unlock()
		if changed || len(lines) > 0 {
			lines = append(lines, "STATUS="+status)
		}
	}
	if len(lines) == 0 {
		return nil
	}
	return n.send(lines...)
}

// send writes lines as one datagram.
func (n *Notifier) send(lines ...string) error {
	conn, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("sd_notify: $%s %s: %w", EnvSocket, n.addr.Name, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(strings.Join(lines, "\n"))); err != nil {
		return fmt.Errorf("sd_notify: $%s %s: %w", EnvSocket, n.addr.Name, err)
	}
	return nil
}

// cleanStatus makes s one line of at most maxStatusLen bytes.
func cleanStatus(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxStatusLen {
		cut := maxStatusLen - len(statusTruncation)
		for cut > 0 && !utf8Start(s[cut]) {
			cut--
		}
		s = s[:cut] + statusTruncation
	}
	return s
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }
