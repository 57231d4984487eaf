// Package sdnotify tells systemd (a Type=notify unit) how a Tether daemon is
// doing: READY=1 once it serves, STATUS= lines saying what it does,
// RELOADING=1 and READY=1 around a SIGHUP reload, STOPPING=1 when its drain
// starts, and WATCHDOG=1 while the daemon judges itself healthy (the agent
// and the coordinator decide what healthy means; this package only sends).
//
// The protocol is sd_notify(3): one datagram per message, KEY=VALUE lines,
// to the unix socket named by $NOTIFY_SOCKET (a leading "@" names an
// abstract socket). FromEnv reads the service manager's variables once and
// removes them from the process environment, so that the jobs, shells and
// helpers the daemons start never inherit them: a job could otherwise pet
// the agent's watchdog or claim readiness for it. The watchdog variables
// ($WATCHDOG_USEC, $WATCHDOG_PID) are parsed by
// github.com/coreos/go-systemd/v22/daemon; the datagrams are sent here, to
// the socket FromEnv captured, because that library's SdNotify reads
// $NOTIFY_SOCKET at every call and so needs it left in the environment.
//
// Loop is what both daemons' notifier loops share: it logs a failed send
// once a run and a turn of the health verdict once, and pets the watchdog
// only on a healthy tick (the daemon's check says what healthy is).
//
// A nil *Notifier is valid and sends nothing; FromEnv returns nil when the
// process was not started by a service manager that listens, so callers
// never check. The package starts no goroutines and imports no project
// package.
package sdnotify
