package agent

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
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
