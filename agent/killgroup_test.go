package agent

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// zombieScript makes the exec's process group hold, once SIGTERM killed
// it, nothing but a zombie that nobody reaps soon: a member whose parent
// left the group (setsid) and never waits. (The same happens, briefly,
// whenever a killed shell's child is reparented to an init that is slow to
// reap it.) The parent writes its pid to ./ready once it left the group,
// with a builtin: it must not wait for a child of its own after that, or it
// could reap the zombie itself.
const zombieScript = `( sleep 1000 & exec setsid sh -c 'echo $$ > ready; exec sleep 1000' </dev/null >/dev/null 2>&1 ) &
echo $$
wait`

// waitZombieParent waits until zombieScript, run in dir, is ready and
// returns the pid of the parent outside the group; the test's cleanup kills
// it (its zombie child goes with it).
func waitZombieParent(t *testing.T, dir string) int {
	t.Helper()
	var pid int
	waitFor(t, testWait, "the zombie's parent to leave the group", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "ready"))
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// zombieMembers lists the zombies of process group pgid.
func zombieMembers(t *testing.T, pgid int) []int {
	t.Helper()
	paths, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[0] != "Z" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids = append(pids, pid)
		}
	}
	return pids
}

func needSetsid(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid(1)")
	}
}

// TestExecCancelEndsOnceOnlyZombiesRemain: a cancelled exec ends as soon
// as its process group has no live member, even while a zombie of the group
// waits to be reaped, instead of waiting out the kill grace (here an hour,
// so a wait for it cannot pass). Order of events: the exit frame (TERM, not
// KILL) arrives while the zombie is still there.
func TestExecCancelEndsOnceOnlyZombiesRemain(t *testing.T) {
	needSetsid(t)
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.KillGrace = time.Hour })
	dir := t.TempDir()
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"bash", "-c", zombieScript}, Cwd: dir})
	e.until(t, "the pid", func() bool { return strings.Contains(e.stdout.String(), "\n") })
	pgid := firstLinePID(t, e.stdout.String())
	waitZombieParent(t, dir)
	e.send(t, protocol.FrameCancel, nil)
	e.finish(t)
	if e.exit == nil {
		t.Fatalf("error frame: %v", e.errInfo)
	}
	if !e.exit.Cancelled || e.exit.Signal != "TERM" {
		t.Errorf("status = %+v, want cancelled by TERM", e.exit)
	}
	if live := groupMembers(t, pgid); len(live) > 0 {
		t.Errorf("exec ended while group %d has live members %v", pgid, live)
	}
	if z := zombieMembers(t, pgid); len(z) == 0 {
		t.Errorf("the group's zombie is gone already; the test proved nothing")
	}
}

// TestDetachedJobCancelEndsOnceOnlyZombiesRemain: the same for a detached
// job's cancel, whose answer comes once the group is dead.
func TestDetachedJobCancelEndsOnceOnlyZombiesRemain(t *testing.T) {
	needSetsid(t)
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.KillGrace = time.Hour })
	t.Cleanup(h.a.jobs.wg.Wait)
	dir := t.TempDir()
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"bash", "-c", zombieScript}, Cwd: dir, Detach: true, JobID: "zombie-1"})
	e.finish(t)
	if e.exit == nil || !e.exit.Detached {
		t.Fatalf("start: %+v %+v", e.exit, e.errInfo)
	}
	waitZombieParent(t, dir)
	e = h.jobOp(t, protocol.JobParams{Op: protocol.JobOpCancel, ID: "zombie-1"})
	if e.errInfo != nil {
		t.Fatalf("cancel: %v", e.errInfo)
	}
	var st protocol.JobStatus
	if err := json.Unmarshal(e.job, &st); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testWait, "the job to exit", func() bool {
		e := h.jobOp(t, protocol.JobParams{Op: protocol.JobOpStatus, ID: "zombie-1"})
		return e.errInfo == nil && json.Unmarshal(e.job, &st) == nil && st.State == protocol.JobExited
	})
	if !st.Cancelled || st.Signal != "TERM" {
		t.Errorf("status = %+v, want cancelled by TERM", st)
	}
}

// TestPTYHangupEndsOnceOnlyZombiesRemain: the same for a pty's hangup,
// whose session is judged from /proc: a zombie left in it is not waited
// for.
func TestPTYHangupEndsOnceOnlyZombiesRemain(t *testing.T) {
	needSetsid(t)
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.KillGrace = time.Hour })
	dir := t.TempDir()
	e := h.open(t, protocol.KindPTY, protocol.PTYParams{Argv: []string{"bash", "-c", zombieScript}, Cwd: dir})
	e.until(t, "the pid", func() bool { return strings.Contains(e.stdout.String(), "\n") })
	sid := firstLinePID(t, e.stdout.String())
	waitZombieParent(t, dir)
	e.send(t, protocol.FrameCancel, nil)
	e.finish(t)
	if e.exit == nil || e.exit.Signal != "HUP" {
		t.Fatalf("exit = %+v, error %v; want ended by HUP", e.exit, e.errInfo)
	}
	if z := zombieMembers(t, sid); len(z) == 0 {
		t.Errorf("the session's zombie is gone already; the test proved nothing")
	}
}
