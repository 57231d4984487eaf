package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Attached execs that lost their agent. An attached exec's process group
// is the agent's to end (its result can only be reported by this agent
// process), but an agent killed with SIGKILL (or crashing) ends nothing:
// the leader dies of its parent-death signal (exec.go), the rest of its
// group runs on, orphaned. So while an exec's process runs, the agent
// records its group in DataDir/execs/PGID-START.json (groupRecord: the
// leader's pid, which is the pgid, and start time, its session, and the
// agent process's identity), and removes the record when the group is
// over. An agent that starts kills the groups of the records it finds
// (SIGTERM, SIGKILL after the kill grace) and removes them.
//
// A recorded pgid may by then name another group: the original emptied
// and the pid was reused. The group is killed only if it still is the
// recorded one: its leader is alive with the recorded start time; or the
// leader is gone (as its parent-death signal arranges) and no other
// process has its pid, and every member is in the recorded session and
// started no earlier than the leader did. (A pid is not reused while any
// process still has it as its group or session, so a group that never
// emptied keeps its pgid.) A record whose agent process is still alive is
// another agent's (two agents on one data directory): left alone.
//
// Left: the moment between an exec's start and its record (an agent
// killed then leaves that group's non-leader members, as before); and
// pty sessions and SSH channels, whose processes get a hangup when the
// agent's end of their terminal closes.

// groupRecord is one DataDir/execs/*.json file.
type groupRecord struct {
	Version int `json:"v"`
	// Leader is the group's leader; its pid is the pgid.
	Leader procIdentity `json:"leader"`
	SID    int          `json:"sid"`
	// Agent is the agent process that started the group.
	Agent procIdentity `json:"agent"`
}

const groupRecordVersion = 1

func (a *Agent) execsDir() string { return filepath.Join(a.cfg.DataDir, "execs") }

// recordGroup records the process group pgid an exec just started and
// returns the function that removes the record, to call once the group is
// over. A group that cannot be recorded (its leader exited already, the
// data directory is not writable) is logged and not recorded.
func (a *Agent) recordGroup(pgid int) (remove func()) {
	nop := func() {}
	ps, err := readProcStatus(pgid)
	if err != nil {
		return nop // exited already
	}
	self, err := a.selfIdentity()
	if err != nil {
		a.log.Warn("record exec process group", "pgid", pgid, "err", err)
		return nop
	}
	rec := groupRecord{Version: groupRecordVersion, Leader: procIdentity{PID: pgid, Start: ps.start}, SID: ps.sid, Agent: self}
	b, err := json.Marshal(rec)
	if err != nil {
		a.log.Warn("record exec process group", "pgid", pgid, "err", err)
		return nop
	}
	// Written in place, not renamed into place: an exec pays for each
	// syscall here, and a record cut short by a crash is only unreadable
	// (removed at the next start), for a group that was microseconds old.
	path := filepath.Join(a.execsDir(), fmt.Sprintf("%d-%d.json", pgid, ps.start))
	err = os.WriteFile(path, b, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(a.execsDir(), 0o700); err == nil {
			err = os.WriteFile(path, b, 0o600)
		}
	}
	if err != nil {
		a.log.Warn("record exec process group", "pgid", pgid, "err", err)
		return nop
	}
	return func() {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			a.log.Warn("remove exec process group record", "path", path, "err", err)
		}
	}
}

// selfIdentity is this agent process's identity, read once.
func (a *Agent) selfIdentity() (procIdentity, error) {
	a.selfOnce.Do(func() { a.self, a.selfErr = selfIdentity() })
	return a.self, a.selfErr
}

// killOrphanGroups ends the process groups that execs of a previous agent
// process left (see the top of this file) and removes their records. It
// returns once they are dead, at most the kill grace after it started.
func (a *Agent) killOrphanGroups() {
	entries, err := os.ReadDir(a.execsDir())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			a.log.Warn("read exec process group records", "dir", a.execsDir(), "err", err)
		}
		return
	}
	if len(entries) == 0 {
		return
	}
	members := procsByGroup()
	var killed []int
	for _, e := range entries {
		path := filepath.Join(a.execsDir(), e.Name())
		if !strings.HasSuffix(e.Name(), ".json") {
			os.Remove(path) // a temporary file of an interrupted write
			continue
		}
		var rec groupRecord
		if err := readJSONFile(path, &rec); err != nil || rec.Version != groupRecordVersion {
			a.log.Warn("unreadable exec process group record; removing it", "path", path, "err", err)
			os.Remove(path)
			continue
		}
		if rec.Agent.alive() {
			continue // a live agent's: not ours to end
		}
		pgid := rec.Leader.PID
		if why := orphanGroupMismatch(rec, members[pgid]); why != "" {
			if len(members[pgid]) > 0 {
				a.log.Info("exec process group record names another group now; leaving it", "pgid", pgid, "why", why)
			}
		} else if len(members[pgid]) > 0 {
			a.log.Warn("killing the process group of an exec whose agent died", "pgid", pgid, "members", len(members[pgid]))
			if err := syscall.Kill(-pgid, syscall.SIGTERM); err == nil {
				killed = append(killed, pgid)
			}
		}
		if err := os.Remove(path); err != nil {
			a.log.Warn("remove exec process group record", "path", path, "err", err)
		}
	}
	deadline := time.Now().Add(a.cfg.KillGrace)
	for _, pgid := range killed {
		g := groupWatch{pgid: pgid}
		for g.alive() && time.Now().Before(deadline) {
			time.Sleep(groupPoll)
		}
		if g.alive() {
			syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}
}

// orphanGroupMismatch returns why rec's pgid no longer names the recorded
// group, given the group's live members; "" when it still does.
func orphanGroupMismatch(rec groupRecord, members []procMember) string {
	pgid := rec.Leader.PID
	if rec.Leader.alive() {
		return ""
	}
	if ps, err := readProcStatus(pgid); err == nil && ps.start != rec.Leader.Start {
		return "its pid belongs to another process"
	}
	for _, m := range members {
		if m.sid != rec.SID {
			return fmt.Sprintf("member %d is in session %d, not %d", m.pid, m.sid, rec.SID)
		}
		if m.start < rec.Leader.Start {
			return fmt.Sprintf("member %d started before the recorded leader", m.pid)
		}
	}
	return ""
}

// procMember is a live process, as procsByGroup reports it.
type procMember struct {
	pid int
	procStatus
}

// procsByGroup lists the live processes by process group, from /proc.
func procsByGroup() map[int][]procMember {
	out := map[int][]procMember{}
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range dir {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ps, err := readProcStatus(pid)
		if err != nil || !ps.live() {
			continue
		}
		out[ps.pgrp] = append(out[ps.pgrp], procMember{pid: pid, procStatus: ps})
	}
	return out
}
