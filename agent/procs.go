package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// groupScanEvery bounds how often a groupWatch reads /proc: the kill(2)
// probe runs every poll, the scan at most this often, and less often on a
// node with so many processes that one scan takes over a tenth of it.
const groupScanEvery = 100 * time.Millisecond

// groupWatch tells the end of an exec (or detached job) whether the process
// group it sent SIGTERM to still has a live member, i.e. whether the kill
// grace must still be waited out.
//
// A member that exited but was not reaped yet (a zombie) is dead, and is not
// waited for: a killed shell's child is reparented to init, and an init that
// is slow to reap it (a container's PID 1, or the agent itself as PID 1,
// which never reaps) would otherwise hold the exec's end, and so its result
// and the client's Ctrl-C, for the whole grace. kill(-pgid, 0) answers
// first: ESRCH (or EPERM) means no member at all; only when it finds members
// is /proc read, at once the first time and then at most every
// groupScanEvery (or ten times as long as a scan took), to tell live members
// from zombies. Without /proc every member counts.
type groupWatch struct {
	pgid     int
	nextScan time.Time
}

// alive reports whether w's group may still have a live member.
func (w *groupWatch) alive() bool {
	if syscall.Kill(-w.pgid, 0) != nil {
		return false
	}
	now := time.Now()
	if now.Before(w.nextScan) {
		return true
	}
	procs, ok := liveProcs(func(p procInfo) bool { return p.pgrp == w.pgid })
	w.nextScan = now.Add(max(groupScanEvery, 10*time.Since(now)))
	return !ok || len(procs) > 0
}

// procInfo is what liveProcs reports of one process.
type procInfo struct{ pid, pgrp, sid int }

// liveProcs lists the live processes (not zombies, not dead) for which
// keep returns true, from /proc. ok is false when /proc cannot be read.
func liveProcs(keep func(procInfo) bool) (procs []procInfo, ok bool) {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	for _, e := range dir {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		st := string(b)
		i := strings.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		// After the command name: state ppid pgrp session ...
		f := strings.Fields(st[i+1:])
		if len(f) < 4 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		g, _ := strconv.Atoi(f[2])
		s, _ := strconv.Atoi(f[3])
		if p := (procInfo{pid: pid, pgrp: g, sid: s}); keep(p) {
			procs = append(procs, p)
		}
	}
	return procs, true
}

// userHZ is the unit of /proc's clock ticks (USER_HZ, sysconf(_SC_CLK_TCK)):
// 100 per second on every architecture Go builds for Linux except alpha and
// ia64. startTicks is checked against /proc before it is trusted, so a
// different unit only costs the /proc reads it saves.
const userHZ = 100

// bootTicks returns CLOCK_BOOTTIME in the clock ticks of /proc/PID/stat's
// start time (field 22): the kernel takes a process's start time from that
// clock when it forks it, and shows it in the reader's time namespace, as
// clock_gettime does. ok is false when the clock cannot be read.
func bootTicks() (ticks uint64, ok bool) {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0, false
	}
	return uint64(ts.Nano()) / (uint64(time.Second) / userHZ), true
}

// procStatus is what /proc/PID/stat says of one process.
type procStatus struct {
	state byte // R, S, D, Z, X, ...
	ppid  int
	pgrp  int
	sid   int
	// start is the process's start time in clock ticks since boot (field
	// 22): with the pid it names one process for the life of the system,
	// since a pid is reused only by a process started later.
	start uint64
}

// readProcStatus reads /proc/PID/stat. The error wraps fs.ErrNotExist when
// there is no such process (or no /proc).
func readProcStatus(pid int) (procStatus, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStatus{}, err
	}
	return parseProcStatus(string(b))
}

// parseProcStatus parses the contents of a /proc/PID/stat file.
func parseProcStatus(st string) (procStatus, error) {
	// The command name (field 2) is in parentheses and may hold anything,
	// spaces and parentheses included: the fields resume after the last ')'.
	i := strings.LastIndexByte(st, ')')
	if i < 0 {
		return procStatus{}, fmt.Errorf("parse /proc stat: no ')' in %q", clipStat(st))
	}
	f := strings.Fields(st[i+1:])
	// f[0] is field 3 (state); field 22 (starttime) is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return procStatus{}, fmt.Errorf("parse /proc stat: %d fields after the command name in %q, want at least 20", len(f), clipStat(st))
	}
	var ps procStatus
	ps.state = f[0][0]
	var errs [4]error
	ps.ppid, errs[0] = strconv.Atoi(f[1])
	ps.pgrp, errs[1] = strconv.Atoi(f[2])
	ps.sid, errs[2] = strconv.Atoi(f[3])
	ps.start, errs[3] = strconv.ParseUint(f[19], 10, 64)
	if err := errors.Join(errs[:]...); err != nil {
		return procStatus{}, fmt.Errorf("parse /proc stat %q: %w", clipStat(st), err)
	}
	return ps, nil
}

func clipStat(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// live reports whether the process is running (not a zombie, not dead).
func (ps procStatus) live() bool { return ps.state != 'Z' && ps.state != 'X' && ps.state != 'x' }

// procIdentity names one process for the life of the system: its pid and
// its start time (procStatus.start), so that a recycled pid is not taken for
// it.
type procIdentity struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// selfIdentity returns this process's identity.
func selfIdentity() (procIdentity, error) {
	ps, err := readProcStatus(os.Getpid())
	if err != nil {
		return procIdentity{}, fmt.Errorf("read own /proc stat: %w", err)
	}
	return procIdentity{PID: os.Getpid(), Start: ps.start}, nil
}

// identify returns the identity of process pid.
func identify(pid int) (procIdentity, error) {
	ps, err := readProcStatus(pid)
	if err != nil {
		return procIdentity{}, fmt.Errorf("read /proc stat of %d: %w", pid, err)
	}
	return procIdentity{PID: pid, Start: ps.start}, nil
}

// alive reports whether the process id names is still running: a live
// process with that pid and that start time. Without /proc it reports
// false (nothing can be identified).
func (id procIdentity) alive() bool {
	if id.PID <= 0 {
		return false
	}
	ps, err := readProcStatus(id.PID)
	return err == nil && ps.start == id.Start && ps.live()
}

// signal sends sig to the process id names, only if it still is that
// process: through a pidfd where the kernel has them (Linux 5.3), so that
// the check and the signal name the same process whatever happens in
// between; else by pid right after the check. It returns an error wrapping
// syscall.ESRCH when the process is gone (or is another one).
func (id procIdentity) signal(sig syscall.Signal) error {
	if id.PID <= 0 {
		return fmt.Errorf("signal pid %d: %w", id.PID, syscall.ESRCH)
	}
	fd, err := unix.PidfdOpen(id.PID, 0)
	if err == nil {
		defer unix.Close(fd)
	}
	if !id.alive() {
		return fmt.Errorf("signal pid %d (start %d): %w", id.PID, id.Start, syscall.ESRCH)
	}
	if err == nil {
		err = unix.PidfdSendSignal(fd, sig, nil, 0)
	} else {
		err = syscall.Kill(id.PID, sig)
	}
	if err != nil {
		return fmt.Errorf("signal pid %d: %w", id.PID, err)
	}
	return nil
}
