package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Attached execs that lost their agent. An attached exec's process group
// is the agent's to end (its result can only be reported by this agent
// process), but an agent killed with SIGKILL (or crashing) ends nothing:
// the leader dies of its parent-death signal (exec.go), the rest of its
// group runs on, orphaned. So while an exec's process runs, the agent
// records its group (groupRecord: the leader's pid, which is the pgid, and
// start time, its session, and the agent process's identity), and clears
// the record when the group is over. An agent that starts kills the groups
// of the records it finds (SIGTERM, SIGKILL after the kill grace) and
// removes them.
//
// The records live in one file per Agent: DataDir/execs/slots-PID-START-ID
// (the agent process's pid and start time, and the Agent's instance id),
// opened once and made of fixed-size slots, one per exec running at once
// (groupSlots). Recording a group is one pwrite into a free slot and
// clearing it another: a file created and removed per exec cost more than
// forking the exec's process (openat with O_CREAT and unlink walk and
// change the directory; a fan-out of `true` paid twice its fork for them).
// A slot is written whole by one pwrite; one cut short by a crash is only
// unparseable, and skipped, for a group that was microseconds old. Records
// in DataDir/execs/PGID-START.json files (what earlier agents wrote, one
// file per exec) are read and ended the same way. The leader's start time
// comes from the boot clock read just before and after its fork when both
// readings fall in one clock tick (startTicks), not from /proc/PID/stat,
// whose read, while the child execs, cost an exec of /bin/true a tenth of
// its round trip; the value is the same, so records are as before.
//
// A recorded pgid may by then name another group: the original emptied
// and the pid was reused. The group is killed only if it still is the
// recorded one: its leader is alive with the recorded start time; or the
// leader is gone (as its parent-death signal arranges) and no other
// process has its pid, and every member is in the recorded session and
// started no earlier than the leader did. (A pid is not reused while any
// process still has it as its group or session, so a group that never
// emptied keeps its pgid.) A record whose agent process is still alive is
// another agent's (two agents on one data directory): left alone, and so
// is the slot file of a live agent process.
//
// Left: the moment between an exec's start and its record (an agent
// killed then leaves that group's non-leader members, as before); and
// pty sessions and SSH channels, whose processes get a hangup when the
// agent's end of their terminal closes.

// groupRecord is one record: a DataDir/execs/*.json file or a slot.
type groupRecord struct {
	Version int `json:"v"`
	// Leader is the group's leader; its pid is the pgid.
	Leader procIdentity `json:"leader"`
	SID    int          `json:"sid"`
	// Agent is the agent process that started the group.
	Agent procIdentity `json:"agent"`
	// Boot is the kernel's boot id (/proc/sys/kernel/random/boot_id)
	// when the record was written: start times count clock ticks since
	// boot, so a record of another boot names nothing. Version 2 on;
	// a version 1 record has none and is not checked for it.
	Boot string `json:"boot,omitempty"`
}

// groupRecordVersion is the version the agent writes; it reads
// minGroupRecordVersion up to it.
const (
	groupRecordVersion    = 2
	minGroupRecordVersion = 1
)

// bootID returns the kernel's boot id, or "" if it cannot be read.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// slotSize is the size of one record slot in bytes: a record's JSON
// (under 150 bytes with 20-digit numbers), padded with spaces, then a
// newline. A free slot is all zero bytes.
const slotSize = 256

// slotPrefix starts the name of a slot file in DataDir/execs.
const slotPrefix = "slots-"

func (a *Agent) execsDir() string { return filepath.Join(a.cfg.DataDir, "execs") }

// groupSlots is an Agent's slot file (see the top of this file). Its mutex
// guards the free list and the file's opening and closing; pwrites to
// distinct slots need no lock.
type groupSlots struct {
	mu   sync.Mutex
	f    *os.File // nil until the first record, and after close
	path string
	n    int   // slots handed out so far: the file's length in slots
	free []int // slots handed back, reused first
}

// take returns a free slot of the agent's slot file, opening (creating)
// the file first if needed.
func (a *Agent) takeSlot() (*os.File, int, error) {
	g := &a.slots
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.f == nil {
		self, err := a.selfIdentity()
		if err != nil {
			return nil, 0, err
		}
		path := filepath.Join(a.execsDir(), fmt.Sprintf("%s%d-%d-%s", slotPrefix, self.PID, self.Start, a.instance))
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if errors.Is(err, fs.ErrNotExist) {
			if err = os.MkdirAll(a.execsDir(), 0o700); err == nil {
				f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
			}
		}
		if err != nil {
			return nil, 0, err
		}
		g.f, g.path, g.n, g.free = f, path, 0, nil
	}
	if k := len(g.free); k > 0 {
		slot := g.free[k-1]
		g.free = g.free[:k-1]
		return g.f, slot, nil
	}
	g.n++
	return g.f, g.n - 1, nil
}

// putSlot hands slot of f back, once its record was cleared.
func (a *Agent) putSlot(f *os.File, slot int) {
	g := &a.slots
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.f == f {
		g.free = append(g.free, slot)
	}
}

// closeSlots closes and removes the agent's slot file. Run calls it last,
// when no exec runs any more: every record in it is clear.
func (a *Agent) closeSlots() {
	g := &a.slots
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.f == nil {
		return
	}
	g.f.Close()
	if err := os.Remove(g.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		a.log.Warn("remove exec process group records", "path", g.path, "err", err)
	}
	g.f, g.free = nil, nil
}

// zeroSlot is a free slot's contents.
var zeroSlot [slotSize]byte

// recordGroup records the process group pgid an exec just started and
// returns the function that clears the record, to call once the group is
// over. A group that cannot be recorded (its leader exited already, the
// data directory is not writable) is logged and not recorded.
func (a *Agent) recordGroup(pgid int) (remove func()) {
	return a.recordStartedGroup(pgid, forkTicks{})
}

// forkTicks brackets a fork in bootTicks: read just before the fork
// (before) and once its child was started (after). The child's start time
// lies between them. The zero value brackets nothing.
type forkTicks struct {
	before, after uint64
	ok            bool
}

// bracketFork returns the bootTicks before a fork and the function that
// completes the bracket once the child was started.
func bracketFork() func() forkTicks {
	before, ok := bootTicks()
	return func() forkTicks {
		after, ok2 := bootTicks()
		return forkTicks{before: before, after: after, ok: ok && ok2 && before <= after}
	}
}

// startTicks returns the start time of pgid, the child just forked
// within ft, and its session: when ft's two readings are the same tick,
// that tick is the child's start time, and its session is getsid's, with
// no read of /proc/PID/stat (which costs more than any other step of an
// exec's start: the kernel reads the child's state while it execs). The
// clock is trusted once a /proc read agreed with it (a.bootClock);
// otherwise, and when the bracket spans a tick, /proc tells. err is
// non-nil when the process is gone (exited and reaped) or cannot be read.
func (a *Agent) startTicks(pgid int, ft forkTicks) (start uint64, sid int, err error) {
	if ft.ok && ft.before == ft.after && a.bootClock.Load() > 0 {
		sid, err := unix.Getsid(pgid)
		return ft.before, sid, err
	}
	ps, err := readProcStatus(pgid)
	if err != nil {
		return 0, 0, err
	}
	if ft.ok && a.bootClock.Load() == 0 {
		if ft.before <= ps.start && ps.start <= ft.after {
			a.bootClock.CompareAndSwap(0, 1)
		} else {
			a.bootClock.Store(-1)
		}
	}
	return ps.start, ps.sid, nil
}

// recordStartedGroup is recordGroup of a group whose leader was forked
// within ft (see startTicks).
func (a *Agent) recordStartedGroup(pgid int, ft forkTicks) (remove func()) {
	nop := func() {}
	start, sid, err := a.startTicks(pgid, ft)
	if err != nil {
		return nop // exited already
	}
	self, err := a.selfIdentity()
	if err != nil {
		a.log.Warn("record exec process group", "pgid", pgid, "err", err)
		return nop
	}
	rec := groupRecord{Version: groupRecordVersion, Leader: procIdentity{PID: pgid, Start: start}, SID: sid, Agent: self, Boot: bootID()}
	var buf [slotSize]byte
	b, err := json.Marshal(rec)
	if err == nil && len(b) >= slotSize {
		err = fmt.Errorf("record of %d bytes does not fit a %d-byte slot", len(b), slotSize)
	}
	if err != nil {
		a.log.Warn("record exec process group", "pgid", pgid, "err", err)
		return nop
	}
	n := copy(buf[:], b)
	for i := n; i < slotSize-1; i++ {
		buf[i] = ' '
	}
	buf[slotSize-1] = '\n'
	f, slot, err := a.takeSlot()
	if err == nil {
		if _, err = f.WriteAt(buf[:], int64(slot)*slotSize); err != nil {
			a.putSlot(f, slot)
		}
	}
	if err != nil {
		a.log.Warn("record exec process group", "pgid", pgid, "err", err)
		return nop
	}
	return func() {
		if _, err := f.WriteAt(zeroSlot[:], int64(slot)*slotSize); err != nil {
			// The slot is not handed back: its stale record, if the
			// agent dies, names a group that is over (left alone).
			a.log.Warn("clear exec process group record", "pgid", pgid, "err", err)
			return
		}
		a.putSlot(f, slot)
	}
}

// readSlots returns the records of a slot file's contents, skipping free
// slots and slots that do not parse (cut short by a crash).
func readSlots(b []byte) []groupRecord {
	var recs []groupRecord
	for len(b) > 0 {
		n := min(len(b), slotSize)
		s := bytes.Trim(b[:n], " \n\x00")
		b = b[n:]
		if len(s) == 0 {
			continue
		}
		var rec groupRecord
		if json.Unmarshal(s, &rec) == nil && rec.Version >= minGroupRecordVersion && rec.Version <= groupRecordVersion {
			recs = append(recs, rec)
		}
	}
	return recs
}

// slotOwner returns the agent process a slot file's name names.
func slotOwner(name string) (procIdentity, bool) {
	var id procIdentity
	f := strings.SplitN(strings.TrimPrefix(name, slotPrefix), "-", 3)
	if len(f) < 2 {
		return id, false
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return id, false
	}
	return procIdentity{PID: pid, Start: start}, true
}

// selfIdentity is this agent process's identity, read once.
func (a *Agent) selfIdentity() (procIdentity, error) {
	a.selfOnce.Do(func() { a.self, a.selfErr = selfIdentity() })
	return a.self, a.selfErr
}

// killOrphanGroups ends the process groups that execs of a previous agent
// process left (see the top of this file) and removes their records. It
// returns once they are dead, at most the kill grace after it started.
//
// Only records the agent could have written are acted on: the execs
// directory and each record file must be owned by the agent's uid and
// not writable by its group or others (checked on descriptors, opened
// without following symlinks); a record of another boot (version 2 on)
// or whose leader's pid now has another start time is removed with a
// warning naming it. Such a record kills nothing; an untrusted directory
// is left as it is and nothing in it is read.
func (a *Agent) killOrphanGroups() {
	dir := a.execsDir()
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if !errors.Is(err, unix.ENOENT) {
			a.log.Warn("read exec process group records", "dir", dir, "err", err)
		}
		return
	}
	dirf := os.NewFile(uintptr(dfd), dir)
	defer dirf.Close()
	if why := untrustedState(dfd); why != "" {
		a.log.Warn("exec process group records directory is not the agent's: no process group killed, nothing removed",
			"dir", dir, "why", why, "fix", fmt.Sprintf("chown %d %s; chmod go-w %s", os.Geteuid(), dir, dir))
		return
	}
	entries, err := dirf.ReadDir(-1)
	if err != nil {
		a.log.Warn("read exec process group records", "dir", dir, "err", err)
		return
	}
	if len(entries) == 0 {
		return
	}
	remove := func(name string) error { return unix.Unlinkat(dfd, name, 0) }
	members := procsByGroup()
	var killed []int
	// end kills rec's group if it still is the recorded one and its agent
	// is dead; it reports whether the record may go.
	end := func(rec groupRecord, path string) bool {
		if rec.Agent.alive() {
			return false // a live agent's: not ours to end
		}
		pgid := rec.Leader.PID
		if boot := bootID(); rec.Boot != "" && boot != "" && rec.Boot != boot {
			a.log.Warn("exec process group record of another boot; removing it, killing nothing", "record", path, "pgid", pgid, "boot", rec.Boot, "this_boot", boot)
			return true
		}
		if why := orphanGroupMismatch(rec, members[pgid]); why != "" {
			if len(members[pgid]) > 0 {
				a.log.Warn("exec process group record names another group now; removing it, killing nothing", "record", path, "pgid", pgid, "why", why)
			}
		} else if len(members[pgid]) > 0 {
			a.log.Warn("killing the process group of an exec whose agent died", "pgid", pgid, "members", len(members[pgid]), "record", path)
			if err := syscall.Kill(-pgid, syscall.SIGTERM); err == nil {
				killed = append(killed, pgid)
			}
		}
		return true
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() {
			// The agent writes only regular files here: a symlink (to
			// records elsewhere, or to /dev/zero), a FIFO or a directory
			// is not its, and is neither read nor followed.
			a.log.Warn("exec process group records: not a regular file; ignoring it", "path", path, "type", e.Type().String())
			continue
		}
		isSlots := strings.HasPrefix(e.Name(), slotPrefix)
		if !isSlots && !strings.HasSuffix(e.Name(), ".json") {
			remove(e.Name()) // a temporary file of an interrupted write
			continue
		}
		if isSlots {
			if owner, ok := slotOwner(e.Name()); ok && owner.alive() {
				continue // a live agent process's file, in use
			}
		}
		f, err := openRecord(dfd, e.Name())
		var ue untrustedError
		if errors.As(err, &ue) {
			a.log.Warn("exec process group record the agent did not write; removing it, killing nothing", "record", path, "why", string(ue))
			remove(e.Name())
			continue
		}
		if err != nil {
			a.log.Warn("read exec process group records", "path", path, "err", err)
			continue
		}
		if isSlots {
			b, size, err := readSlotsFrom(f, a.slotFileCap())
			f.Close()
			if err != nil {
				a.log.Warn("read exec process group records", "path", path, "err", err)
				continue
			}
			if size > int64(len(b)) {
				a.log.Warn("exec process group records: slot file larger than max execs × slot size; reading its first slots only",
					"path", path, "bytes", size, "read", len(b), "max_execs", a.cfg.MaxExecs, "slot_size", slotSize)
			}
			for _, rec := range readSlots(b) {
				end(rec, path)
			}
			if err := remove(e.Name()); err != nil {
				a.log.Warn("remove exec process group records", "path", path, "err", err)
			}
			continue
		}
		var rec groupRecord
		b, err := io.ReadAll(io.LimitReader(f, 64<<10))
		f.Close()
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil || rec.Version < minGroupRecordVersion || rec.Version > groupRecordVersion {
			a.log.Warn("unreadable exec process group record; removing it", "path", path, "err", err)
			remove(e.Name())
			continue
		}
		if !end(rec, path) {
			continue
		}
		if err := remove(e.Name()); err != nil {
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

// untrustedError says why a record file is not the agent's.
type untrustedError string

func (e untrustedError) Error() string { return string(e) }

// untrustedState returns why the file open at fd cannot be the agent's
// own state (owned by another uid, or writable by its group or others),
// or "".
func untrustedState(fd int) string {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err.Error()
	}
	if euid := os.Geteuid(); int(st.Uid) != euid {
		return fmt.Sprintf("owned by uid %d, not the agent's uid %d", st.Uid, euid)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Sprintf("mode %04o: writable by its group or others", st.Mode&0o7777)
	}
	return ""
}

// openRecord opens the record file name in the directory dfd without
// following a final symlink nor blocking on a FIFO; an untrustedError
// when it is not the agent's (untrustedState).
func openRecord(dfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	if why := untrustedState(fd); why != "" {
		f.Close()
		return nil, untrustedError(why)
	}
	return f, nil
}

// slotFileCap is the most bytes of a slot file killOrphanGroups reads:
// an agent holds at most MaxExecs execs at once, so its slot file never
// grows past MaxExecs slots (the larger of this agent's MaxExecs and the
// default, in case the dead agent ran with a higher one).
func (a *Agent) slotFileCap() int64 {
	return int64(max(a.cfg.MaxExecs, DefaultMaxExecs)) * slotSize
}

// readSlotFile returns the first limit bytes (at most) of the regular
// file at path and the file's size in bytes, without reading past limit:
// a slot file another process grew (or made sparse and huge) costs no
// more memory than limit. It refuses a file that is not regular
// (opened without following a final symlink).
func readSlotFile(path string, limit int64) ([]byte, int64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	return readSlotsFrom(f, limit)
}

// readSlotsFrom is readSlotFile of the open file f.
func readSlotsFrom(f *os.File, limit int64) ([]byte, int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("%s: not a regular file (%s)", f.Name(), fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, 0, err
	}
	return b, max(fi.Size(), int64(len(b))), nil
}

// orphanGroupMismatch returns why rec's pgid no longer names the recorded
// group, given the group's live members; "" when it still does.
func orphanGroupMismatch(rec groupRecord, members []procMember) string {
	pgid := rec.Leader.PID
	// kill(-pgid) of these is not one exec's group: pgid 1 signals every
	// process, 0 the agent's own group, a negative one a single pid. An
	// exec's leader is the agent's child, never pid 1 nor in its group.
	switch {
	case pgid <= 1:
		return fmt.Sprintf("pgid %d is never an exec's group", pgid)
	case pgid == syscall.Getpgrp():
		return "it is the agent's own process group"
	}
	if rec.Leader.alive() {
		return ""
	}
	if ps, err := readProcStatus(pgid); err == nil && ps.start != rec.Leader.Start {
		return fmt.Sprintf("its pid belongs to another process (start time %d, the record says %d)", ps.start, rec.Leader.Start)
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
