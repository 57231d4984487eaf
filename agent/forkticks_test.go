package agent

import (
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// A group recorded from the clock read around its fork (recordStartedGroup)
// names its leader as /proc does: the same start time and session, so an
// agent that finds the record later (of this or an earlier release, which
// compare start times exactly) ends the same group. The clock is trusted
// only after /proc agreed with it once, and a bracket that does not hold
// the /proc start time stops its use.
func TestRecordStartedGroupMatchesProc(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	a := h.a
	start := func() (int, forkTicks) {
		cmd := exec.Command("sleep", "300")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		forked := bracketFork()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ft := forked()
		pid := cmd.Process.Pid
		t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL); cmd.Wait() })
		return pid, ft
	}
	check := func(pid int, ft forkTicks) {
		t.Helper()
		remove := a.recordStartedGroup(pid, ft)
		defer remove()
		ps, err := readProcStatus(pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range slotRecords(t, a) {
			if rec.Leader.PID != pid {
				continue
			}
			if rec.Leader.Start != ps.start || rec.SID != ps.sid {
				t.Errorf("record of %d: start %d sid %d, /proc says start %d sid %d (bracket %+v, clock %d)",
					pid, rec.Leader.Start, rec.SID, ps.start, ps.sid, ft, a.bootClock.Load())
			}
			return
		}
		t.Errorf("no record of %d", pid)
	}

	pid, ft := start()
	if !ft.ok || ft.before > ft.after {
		t.Fatalf("bracket %+v: CLOCK_BOOTTIME unreadable or going back", ft)
	}
	check(pid, ft) // read from /proc, which checks the clock
	if got := a.bootClock.Load(); got != 1 {
		t.Fatalf("bootClock %d after a /proc read within the bracket %+v, want 1 (trusted)", got, ft)
	}
	for range 20 { // from the clock when the bracket is one tick
		pid, ft := start()
		check(pid, ft)
	}

	// A bracket the /proc start time is not in: the clock is not used.
	b := newHarness(t, nil).a
	a = b
	pid, ft = start()
	ft.before, ft.after = ft.before+1000, ft.after+1000
	check(pid, ft)
	if got := a.bootClock.Load(); got != -1 {
		t.Fatalf("bootClock %d after a bracket missing the /proc start time, want -1", got)
	}
	pid, ft = start()
	ft.before, ft.after = ft.before+1000, ft.before+1000
	check(pid, ft) // /proc again, not the wrong tick
}

// An exec's processes leave their group records (and pipes) until its
// final frame is written, but a fail-fast batch clears each process's
// record before the next starts: one exec holds one record slot, so the
// slot file stays within MaxExecs slots, and none is left once the stream
// ended.
func TestExecBatchHoldsOneRecordSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Commands: []string{"true", "true", "true", "true"}, FailFast: true})
	e.finish(t)
	if e.errInfo != nil || e.exit == nil || e.exit.ExitCode != 0 {
		t.Fatalf("exit %+v, error %+v", e.exit, e.errInfo)
	}
	fi, err := os.Stat(h.a.slots.path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != slotSize {
		t.Errorf("slot file of a 4-process batch is %d bytes, want one %d-byte slot", fi.Size(), slotSize)
	}
	if recs := slotRecords(t, h.a); len(recs) != 0 {
		t.Errorf("records left after the exec's stream ended: %+v", recs)
	}
}
