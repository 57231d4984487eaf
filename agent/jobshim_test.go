package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// seqScript prints 1, 2, 3, ... one a line every 20 ms until the file
// release exists.
func seqScript(release string) string {
	return "i=0\nwhile [ ! -e " + release + " ]; do i=$((i+1)); echo $i; sleep 0.02; done\necho done"
}

// checkSeq checks that out is "1\n2\n...\nN\n" (then "done\n" if done)
// with at least min numbers, and returns N.
func checkSeq(t *testing.T, out string, min int, done bool) int {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if done {
		if len(lines) == 0 || lines[len(lines)-1] != "done" {
			t.Fatalf("output does not end with done: %q", out)
		}
		lines = lines[:len(lines)-1]
	} else if !strings.HasSuffix(out, "\n") {
		lines = lines[:len(lines)-1] // a line being written
	}
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			t.Fatalf("line %d is %q, want %d: a gap or a repeat in the output %q", i+1, l, i+1, out)
		}
	}
	if len(lines) < min {
		t.Fatalf("%d numbers, want at least %d", len(lines), min)
	}
	return len(lines)
}

func (h *harness) jobOutput(t *testing.T, id, stream string) string {
	t.Helper()
	e := h.jobOp(t, protocol.JobParams{Op: protocol.JobOpOutput, ID: id, Stream: stream})
	if e.errInfo != nil {
		t.Fatalf("output of job %s: %v", id, e.errInfo)
	}
	return e.stdout.String()
}

func (h *harness) startJob(t *testing.T, id string, p protocol.ExecParams) {
	t.Helper()
	p.Detach, p.JobID = true, id
	e := h.open(t, protocol.KindExec, p)
	e.finish(t)
	if e.exit == nil || !e.exit.Detached {
		t.Fatalf("job %s: exit = %+v, error %v; want detached", id, e.exit, e.errInfo)
	}
}

// A detached job does not depend on the agent that started it: a second
// agent on the same data directory (the first one gone, as after a
// restart) finds it running, reads its output with no gap, follows it,
// and cancels it; the job's end is recorded by its shim.
func TestDetachedJobSurvivesAgent(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	release := filepath.Join(t.TempDir(), "release")
	h1 := newHarness(t, func(c *Config) { c.DataDir = dataDir })
	t.Cleanup(h1.a.jobs.wg.Wait)
	h1.startJob(t, "seq", protocol.ExecParams{Script: seqScript(release)})
	h1.startJob(t, "long", protocol.ExecParams{Argv: []string{"sleep", "300"}})
	waitFor(t, testWait, "some output", func() bool { return strings.Count(h1.jobOutput(t, "seq", "stdout"), "\n") >= 3 })
	before := h1.jobOutput(t, "seq", "stdout")
	h1.client.Close() // the first agent stops serving

	h2 := newHarness(t, func(c *Config) { c.DataDir = dataDir })
	h2.a.recoverJobs()
	for _, id := range []string{"seq", "long"} {
		if st := h2.jobStatus(t, id); st.State != protocol.JobRunning || st.ExitCode != nil {
			t.Fatalf("job %s after the restart: %+v, want running", id, st)
		}
	}
	// Follow from where the first agent's reader stopped.
	off := int64(len(before))
	waitFor(t, testWait, "more output", func() bool {
		e := h2.jobOp(t, protocol.JobParams{Op: protocol.JobOpOutput, ID: "seq", Stream: "stdout", Offset: off})
		before += e.stdout.String()
		off += int64(e.stdout.Len())
		return strings.Count(before, "\n") >= 10
	})
	n := checkSeq(t, before, 10, false)
	if st := h2.jobStatus(t, "seq"); st.StdoutBytes < off {
		t.Errorf("running job's stdout_bytes %d, want at least the %d bytes read", st.StdoutBytes, off)
	}
	if err := writeFile(release); err != nil {
		t.Fatal(err)
	}
	var st protocol.JobStatus
	waitFor(t, testWait, "the job's exit", func() bool {
		st = h2.jobStatus(t, "seq")
		return st.State == protocol.JobExited
	})
	out := h2.jobOutput(t, "seq", "stdout")
	if m := checkSeq(t, out, n, true); st.ExitCode == nil || *st.ExitCode != 0 || st.StdoutBytes != int64(len(out)) || st.FinishedAt == nil {
		t.Errorf("status %+v after %d lines (%d bytes)", st, m, len(out))
	}

	// Cancel through the second agent.
	e := h2.jobOp(t, protocol.JobParams{Op: protocol.JobOpCancel, ID: "long"})
	if e.errInfo != nil || json.Unmarshal(e.job, &st) != nil {
		t.Fatalf("cancel: %v %q", e.errInfo, e.job)
	}
	if st.State != protocol.JobExited || !st.Cancelled || st.Signal != "TERM" {
		t.Errorf("cancelled job: %+v", st)
	}
	// A second restart finds nothing to change.
	h2.a.recoverJobs()
	if st := h2.jobStatus(t, "long"); st.State != protocol.JobExited || !st.Cancelled {
		t.Errorf("cancelled job after another restart: %+v", st)
	}
}

// A job whose shim dies (kill -9) is lost: its leader dies with the shim
// (parent-death signal), status says lost, and the next agent to start
// records it as such.
func TestDetachedJobShimKilledIsLost(t *testing.T) {
	t.Parallel()
	var dataDir string
	h := newHarness(t, func(c *Config) { dataDir = c.DataDir })
	t.Cleanup(h.a.jobs.wg.Wait)
	h.startJob(t, "victim", protocol.ExecParams{Argv: []string{"sleep", "300"}})
	jdir := filepath.Join(dataDir, "jobs", "victim")
	rec, err := readShimRecord(jdir)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Shim.alive() || !rec.Job.alive() || rec.Shim.PID == rec.Job.PID {
		t.Fatalf("shim.json %+v: want a live shim and a live job, apart", rec)
	}
	if ps, err := readProcStatus(rec.Job.PID); err != nil || ps.pgrp != rec.Job.PID || ps.ppid != rec.Shim.PID {
		t.Fatalf("job process %+v (%v): want its own group, child of the shim %d", ps, err, rec.Shim.PID)
	}
	if ps, err := readProcStatus(rec.Shim.PID); err != nil || ps.sid != rec.Shim.PID {
		t.Fatalf("shim process %+v (%v): want its own session", ps, err)
	}
	if err := rec.Shim.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testWait, "the job's leader to die with its shim", func() bool { return !rec.Job.alive() })
	if st := h.jobStatus(t, "victim"); st.State != protocol.JobLost || st.ExitCode != nil {
		t.Errorf("status %+v, want lost", st)
	}
	h.a.recoverJobs()
	var st protocol.JobStatus
	if err := readJSONFile(filepath.Join(jdir, jobFileStatus), &st); err != nil || st.State != protocol.JobLost || st.FinishedAt == nil {
		t.Errorf("status.json after the restart: %+v (%v), want lost with a finish time", st, err)
	}
	// Signalling a dead shim's identity does nothing.
	if err := rec.Shim.signal(syscall.SIGTERM); err == nil {
		t.Error("signal to a dead shim succeeded")
	}
}

// Under systemd the shim runs through systemd-run --scope in a unit named
// after the job; when systemd-run fails before it ran the shim the job
// runs without a scope.
func TestDetachedJobSystemdScope(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	argsFile := filepath.Join(dir, "args")
	// A stand-in for systemd-run --scope: record the arguments, then exec
	// what follows "--", as systemd-run does once the scope exists.
	fake := filepath.Join(dir, "systemd-run")
	script := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + argsFile + "\nwhile [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n"
	broken := filepath.Join(dir, "systemd-run-broken")
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'Failed to connect to bus: No such file or directory' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, run, wantScope string
	}{
		{"scope", fake, "tether-job-scoped.scope"},
		{"fallback", broken, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var dataDir string
			h := newHarnessWith(t, func(c *Config) { dataDir = c.DataDir }, func(a *Agent) { a.systemdRunPath = func() string { return tt.run } })
			t.Cleanup(h.a.jobs.wg.Wait)
			id := "scoped"
			h.startJob(t, id, protocol.ExecParams{Script: "echo hello"})
			waitFor(t, testWait, "exit", func() bool { return h.jobStatus(t, id).State == protocol.JobExited })
			if out := h.jobOutput(t, id, "stdout"); out != "hello\n" {
				t.Errorf("output %q", out)
			}
			rec, err := readShimRecord(filepath.Join(dataDir, "jobs", id))
			if err != nil || rec.Scope != tt.wantScope {
				t.Fatalf("shim.json %+v (%v), want scope %q", rec, err, tt.wantScope)
			}
			if tt.wantScope == "" {
				return
			}
			b, err := os.ReadFile(argsFile)
			if err != nil {
				t.Fatal(err)
			}
			args := strings.Split(strings.TrimSpace(string(b)), "\n")
			want := []string{"--scope", "--collect", "--quiet", "--unit", "tether-job-" + id}
			if len(args) < len(want) || strings.Join(args[:len(want)], " ") != strings.Join(want, " ") || args[len(args)-1] != jobShimArg {
				t.Errorf("systemd-run arguments %q, want %q ... %s", args, want, jobShimArg)
			}
		})
	}
}

// A job that cannot start is reported by its shim as the exec's error,
// classified as for an attached exec, and leaves no directory.
func TestDetachedJobStartFailure(t *testing.T) {
	t.Parallel()
	var dataDir string
	h := newHarness(t, func(c *Config) { dataDir = c.DataDir })
	t.Cleanup(h.a.jobs.wg.Wait)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"/nonexistent/prog"}, Detach: true, JobID: "nope"})
	e.finish(t)
	if e.errInfo == nil || e.errInfo.Code != protocol.CodeCommandNotFound || !strings.Contains(e.errInfo.Message, "/nonexistent/prog") {
		t.Fatalf("exit %+v error %+v, want command_not_found naming the program", e.exit, e.errInfo)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "jobs", "nope")); !os.IsNotExist(err) {
		t.Errorf("job directory left: %v", err)
	}
	if strings.Contains(e.errInfo.Message, "fork/exec") {
		t.Errorf("message %q has Go's fork/exec", e.errInfo.Message)
	}
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"no-such-tool-xyz"}, Detach: true, JobID: "nope2"})
	e.finish(t)
	if e.errInfo == nil || e.errInfo.Code != protocol.CodeCommandNotFound || !strings.Contains(e.errInfo.Message, `command "no-such-tool-xyz" not found in PATH`) {
		t.Fatalf("exit %+v error %+v, want command_not_found in a shell's words", e.exit, e.errInfo)
	}
}

func TestParseProcStatus(t *testing.T) {
	t.Parallel()
	rest := " 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 987654 19 20"
	for _, tt := range []struct {
		in   string
		want procStatus
		bad  bool
	}{
		{"42 (bash) S 7 42 40" + rest, procStatus{state: 'S', ppid: 7, pgrp: 42, sid: 40, start: 987654}, false},
		{"42 (a) b) (c) Z 1 2 3" + rest, procStatus{state: 'Z', ppid: 1, pgrp: 2, sid: 3, start: 987654}, false},
		{"42 (x y) R 1 2 3 4", procStatus{}, true},
		{"42 no parens", procStatus{}, true},
		{"42 (x) R a 2 3" + rest, procStatus{}, true},
	} {
		got, err := parseProcStatus(tt.in)
		if (err != nil) != tt.bad || got != tt.want {
			t.Errorf("parseProcStatus(%q) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.bad)
		}
	}
	self, err := selfIdentity()
	if err != nil || !self.alive() || (procIdentity{PID: self.PID, Start: self.Start + 1}).alive() {
		t.Errorf("own identity %+v (%v): want alive, and not with another start time", self, err)
	}
}

// startGroup starts script in a process group of its own, as an exec
// does, and returns its leader's identity and session.
func startGroup(t *testing.T, script string) (procIdentity, int) {
	t.Helper()
	// The leader waits for its stdin to close, which happens once it was
	// identified: a leader that exits at once could be gone before (CI
	// saw "read /proc/PID/stat: no such process").
	cmd := exec.Command("bash", "-c", "read -r _; "+script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	hold, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		cmd.Wait() // reap the leader when it exits; the group lives on
	}()
	t.Cleanup(func() {
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-reaped
	})
	id, err := identify(pgid)
	if err != nil {
		t.Fatal(err)
	}
	ps, _ := readProcStatus(pgid)
	return id, ps.sid
}

// groupLive counts the live members of process group pgid.
func groupLive(pgid int) int { return len(procsByGroup()[pgid]) }

// An agent that starts kills the process groups that its dead
// predecessor's attached execs left (the leader alive, or gone as its
// parent-death signal arranges), and leaves groups that are not the
// recorded ones, or that belong to a live agent.
func TestKillOrphanGroups(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	a := h.a
	dead := procIdentity{PID: 1, Start: 1<<63 - 1} // no such process: a dead agent
	self, err := selfIdentity()
	if err != nil {
		t.Fatal(err)
	}
	write := func(rec groupRecord) {
		t.Helper()
		rec.Version = groupRecordVersion
		if err := os.MkdirAll(a.execsDir(), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := writeJSONFile(filepath.Join(a.execsDir(), fmt.Sprintf("%d-%d.json", rec.Leader.PID, rec.Leader.Start)), rec); err != nil {
			t.Fatal(err)
		}
	}
	// Leader alive.
	l1, sid1 := startGroup(t, "sleep 300 & sleep 300; wait")
	write(groupRecord{Leader: l1, SID: sid1, Agent: dead})
	// Leader gone, children left.
	l2, sid2 := startGroup(t, "sleep 300 & sleep 300 & echo started")
	waitFor(t, testWait, "the leader to exit", func() bool { return !l2.alive() && groupLive(l2.PID) == 2 })
	write(groupRecord{Leader: l2, SID: sid2, Agent: dead})
	// Leader gone; the record's session is not the group's: another group.
	l3, sid3 := startGroup(t, "sleep 300 & echo started")
	waitFor(t, testWait, "the leader to exit", func() bool { return !l3.alive() && groupLive(l3.PID) == 1 })
	write(groupRecord{Leader: l3, SID: sid3 + 1, Agent: dead})
	// A live agent's.
	l4, sid4 := startGroup(t, "sleep 300")
	write(groupRecord{Leader: l4, SID: sid4, Agent: self})
	os.WriteFile(filepath.Join(a.execsDir(), "junk.json"), []byte("{"), 0o600)

	a.killOrphanGroups()
	for _, tt := range []struct {
		name string
		pgid int
		want int
	}{{"leader alive", l1.PID, 0}, {"leader gone", l2.PID, 0}, {"another session", l3.PID, 1}, {"live agent", l4.PID, 1}} {
		if n := groupLive(tt.pgid); n != tt.want {
			t.Errorf("%s: group %d has %d live members, want %d", tt.name, tt.pgid, n, tt.want)
		}
	}
	left, _ := os.ReadDir(a.execsDir())
	if len(left) != 1 {
		t.Errorf("records left: %v, want only the live agent's", left)
	}
}

// An attached exec's process group is recorded while it runs, and the
// record cleared once it is over.
func TestExecGroupRecorded(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Script: "echo $$; exec sleep 300"})
	e.until(t, "the pid", func() bool { return strings.Contains(e.stdout.String(), "\n") })
	pgid := firstLinePID(t, e.stdout.String())
	var rec groupRecord
	waitFor(t, testWait, "the record", func() bool {
		for _, r := range slotRecords(t, h.a) {
			if r.Leader.PID == pgid {
				rec = r
				return true
			}
		}
		return false
	})
	if !rec.Leader.alive() || rec.Leader.PID != pgid || !rec.Agent.alive() || rec.Agent.PID != os.Getpid() {
		t.Errorf("record %+v: want the live leader %d and this process", rec, pgid)
	}
	e.send(t, protocol.FrameCancel, nil)
	e.finish(t)
	if recs := slotRecords(t, h.a); len(recs) != 0 {
		t.Errorf("records left after the exec: %+v", recs)
	}
}

// slotRecords returns the records in a's slot files.
func slotRecords(t *testing.T, a *Agent) []groupRecord {
	t.Helper()
	ents, _ := os.ReadDir(a.execsDir())
	var recs []groupRecord
	for _, en := range ents {
		if !strings.HasPrefix(en.Name(), slotPrefix) {
			t.Errorf("unexpected file %s in %s", en.Name(), a.execsDir())
			continue
		}
		b, err := os.ReadFile(filepath.Join(a.execsDir(), en.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if len(b)%slotSize != 0 {
			t.Errorf("slot file %s is %d bytes, not a whole number of %d-byte slots", en.Name(), len(b), slotSize)
		}
		recs = append(recs, readSlots(b)...)
	}
	return recs
}

// Records of several execs at once take distinct slots, slots are reused
// once cleared, and an agent that starts ends the groups recorded in a
// dead agent process's slot file (and removes it) but leaves a live one's.
func TestGroupSlots(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	a := h.a
	l1, _ := startGroup(t, "sleep 300")
	l2, _ := startGroup(t, "sleep 300")
	r1 := a.recordGroup(l1.PID)
	r2 := a.recordGroup(l2.PID)
	if recs := slotRecords(t, a); len(recs) != 2 {
		t.Fatalf("records %+v, want 2", recs)
	}
	r1()
	recs := slotRecords(t, a)
	if len(recs) != 1 || recs[0].Leader != l2 {
		t.Fatalf("records after clearing one: %+v, want only %+v", recs, l2)
	}
	r3 := a.recordGroup(l1.PID) // reuses the cleared slot
	if fi, err := os.Stat(a.slots.path); err != nil || fi.Size() != 2*slotSize {
		t.Fatalf("slot file: %v, size %d; want 2 slots", err, fi.Size())
	}
	r3()
	r2()

	// A dead agent process's file with one live group and one torn slot.
	dead := procIdentity{PID: 1, Start: 1<<63 - 1}
	l4, sid4 := startGroup(t, "sleep 300")
	b, _ := json.Marshal(groupRecord{Version: groupRecordVersion, Leader: l4, SID: sid4, Agent: dead})
	slot := make([]byte, 2*slotSize)
	copy(slot, b)
	copy(slot[slotSize:], `{"v":1,"lead`)
	deadFile := filepath.Join(a.execsDir(), fmt.Sprintf("%s%d-%d-x", slotPrefix, dead.PID, dead.Start))
	if err := os.WriteFile(deadFile, slot, 0o600); err != nil {
		t.Fatal(err)
	}
	a.killOrphanGroups()
	if n := groupLive(l4.PID); n != 0 {
		t.Errorf("dead agent's recorded group %d has %d live members, want 0", l4.PID, n)
	}
	if _, err := os.Stat(deadFile); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dead agent's slot file: %v, want removed", err)
	}
	if _, err := os.Stat(a.slots.path); err != nil {
		t.Errorf("this (live) agent's slot file: %v, want left", err)
	}
	a.closeSlots()
	if ents, _ := os.ReadDir(a.execsDir()); len(ents) != 0 {
		t.Errorf("files left after closeSlots: %v", ents)
	}
}

// A hostile or corrupt record never names a group the agent may not end:
// pgid 0 (kill(0) is the agent's own group; kernel threads are pgrp 0),
// pgid 1 (kill(-1) signals every process), a negative pgid (kill of one
// pid), the agent's own group, or a live pid whose start time differs.
// Checked through orphanGroupMismatch, so that a regression refuses
// nothing rather than signalling the machine.
func TestOrphanGroupMismatchRefusesHostileRecords(t *testing.T) {
	t.Parallel()
	members := procsByGroup()
	own := syscall.Getpgrp()
	self, err := readProcStatus(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ownSID := self.sid
	ownLeader := procIdentity{PID: own}
	if id, err := identify(own); err == nil {
		ownLeader = id
	}
	init := procIdentity{PID: 1}
	initSID := 0
	if ps, err := readProcStatus(1); err == nil {
		init.Start, initSID = ps.start, ps.sid
	}
	l, sid := startGroup(t, "sleep 300")
	for _, tt := range []struct {
		name string
		rec  groupRecord
	}{
		{"pgid 0", groupRecord{Leader: procIdentity{PID: 0}, SID: 0}},
		{"pgid 1", groupRecord{Leader: init, SID: initSID}},
		{"negative pgid", groupRecord{Leader: procIdentity{PID: -l.PID}, SID: sid}},
		{"own group", groupRecord{Leader: ownLeader, SID: ownSID}},
		{"start time differs", groupRecord{Leader: procIdentity{PID: l.PID, Start: l.Start + 1}, SID: sid}},
	} {
		if why := orphanGroupMismatch(tt.rec, members[tt.rec.Leader.PID]); why == "" {
			t.Errorf("%s: record %+v would be killed", tt.name, tt.rec)
		}
	}
	if why := orphanGroupMismatch(groupRecord{Leader: l, SID: sid}, procsByGroup()[l.PID]); why != "" {
		t.Errorf("the recorded group itself: %s, want it matched", why)
	}
}

// A slot file that is a symlink (here to records outside the data
// directory naming a live group) is not followed: its group is left.
func TestKillOrphanGroupsIgnoresSymlinks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	a := h.a
	dead := procIdentity{PID: 1, Start: 1<<63 - 1}
	l, sid := startGroup(t, "sleep 300")
	b, _ := json.Marshal(groupRecord{Version: groupRecordVersion, Leader: l, SID: sid, Agent: dead})
	outside := filepath.Join(t.TempDir(), "records")
	if err := os.WriteFile(outside, append(b, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(a.execsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(a.execsDir(), fmt.Sprintf("%s%d-%d-x", slotPrefix, dead.PID, dead.Start))); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(a.execsDir(), fmt.Sprintf("%d-%d.json", l.PID, l.Start))); err != nil {
		t.Fatal(err)
	}
	a.killOrphanGroups()
	if n := groupLive(l.PID); n != 1 {
		t.Errorf("group %d named through a symlink has %d live members, want 1 (left alone)", l.PID, n)
	}
}
