package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// runReporting runs an agent with data directory dataDir against fc.
func runReporting(t *testing.T, fc *fakeCoordinator, dataDir string) (*Agent, func()) {
	t.Helper()
	cfg := testConfig(t)
	cfg.Coordinators = []string{fc.addr}
	cfg.TLS = fc.clientTLS
	cfg.Token = "good-token"
	cfg.DataDir = dataDir
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.jobs.wg.Wait) // after the jobs were ended (registered later, run first)
	return a, runAgent(t, a)
}

// startDetached starts detached job id running script on sess.
func startDetachedOn(t *testing.T, sess *tunnel.Session, id, script string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	st, err := sess.Open(ctx, protocol.KindExec, protocol.ExecParams{Script: script, Detach: true, JobID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.SetReadDeadline(time.Now().Add(testWait))
	e := &execStream{st: st, fr: protocol.NewFrameReader(st)}
	e.finish(t)
	if e.exit == nil || !e.exit.Detached {
		t.Fatalf("job %s: exit %+v, error %v; want detached", id, e.exit, e.errInfo)
	}
}

// killShim kills job id's shim (kill -9): the job is lost.
func killShim(t *testing.T, dataDir, id string) {
	t.Helper()
	jdir := filepath.Join(dataDir, "jobs", id)
	rec, err := readShimRecord(jdir)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Shim.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testWait, "job "+id+"'s leader to die with its shim", func() bool { return !rec.Shim.alive() && !rec.Job.alive() })
}

// reportsUntil receives fc's job exit reports until every id in want
// arrived, and returns them by id; a report twice fails the test.
func reportsUntil(t *testing.T, fc *fakeCoordinator, want ...string) map[string]protocol.JobStatus {
	t.Helper()
	got := map[string]protocol.JobStatus{}
	missing := func() []string {
		var m []string
		for _, id := range want {
			if _, ok := got[id]; !ok {
				m = append(m, id)
			}
		}
		return m
	}
	for len(missing()) > 0 {
		st := recv(t, fc.jobExits, fmt.Sprintf("job exit reports of %v", missing()))
		if _, dup := got[st.ID]; dup {
			t.Errorf("job %s reported twice: %+v", st.ID, st)
		}
		got[st.ID] = st
	}
	return got
}

func checkReport(t *testing.T, st protocol.JobStatus, state string, code int) {
	t.Helper()
	if st.State != state || st.Node != "node-a" || st.FinishedAt == nil {
		t.Errorf("report %+v, want %s from node-a with a finish time", st, state)
	}
	if state == protocol.JobExited && (st.ExitCode == nil || *st.ExitCode != code) {
		t.Errorf("report %+v, want exit code %d", st, code)
	}
}

// TestJobExitReported: a coordinator that takes job exit reports gets one
// as soon as a detached job exits and when one is lost (its shim killed),
// each once: a reconnected session does not repeat them. The job's
// directory records the report.
func TestJobExitReported(t *testing.T) {
	t.Parallel()
	fc := startFakeCoordinatorFeatures(t, "good-token", protocol.FeatureJobExit)
	dataDir := t.TempDir()
	runReporting(t, fc, dataDir)
	sess := recv(t, fc.sessions, "welcomed session")

	startDetachedOn(t, sess, "quick", "echo hi; exit 3")
	checkReport(t, reportsUntil(t, fc, "quick")["quick"], protocol.JobExited, 3)
	waitFor(t, testWait, "the report's marker", func() bool {
		return exists(filepath.Join(dataDir, "jobs", "quick", jobFileReported))
	})

	startDetachedOn(t, sess, "gone", "exec sleep 300")
	killShim(t, dataDir, "gone")
	checkReport(t, reportsUntil(t, fc, "gone")["gone"], protocol.JobLost, 0)
	// Delivery is at least once: a write that yamux reports failed
	// because the session closed as it completed is sent again at the
	// next session. Once marked, never.
	waitFor(t, testWait, "the report's marker", func() bool {
		return exists(filepath.Join(dataDir, "jobs", "gone", jobFileReported))
	})

	// A new session: only the new job's end comes, not the old ones'
	// again (reportsUntil fails on a repeat; the new session's backlog
	// goes before any other report).
	sess.Close()
	sess = recv(t, fc.sessions, "second session")
	startDetachedOn(t, sess, "after", "exit 0")
	got := reportsUntil(t, fc, "after")
	if len(got) != 1 {
		t.Errorf("reports on the second session: %+v, want only job after's", got)
	}
	checkReport(t, got["after"], protocol.JobExited, 0)
}

// TestJobExitReportedAfterRestart: ends the agent could not report (its
// coordinator did not take reports; no agent ran when the job exited or
// its shim died) are reported at the first session whose coordinator
// takes them, by the next agent on the data directory, oldest first; a
// job found running at start is reported when it ends although its shim
// is not this agent's child.
func TestJobExitReportedAfterRestart(t *testing.T) {
	t.Parallel()
	old := startFakeCoordinator(t, "good-token") // takes no reports: it fails the test on one
	dataDir := t.TempDir()
	release := filepath.Join(t.TempDir(), "release")
	release2 := filepath.Join(t.TempDir(), "release2")
	waitRelease := func(f string, code int) string {
		return fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; exit %d", f, code)
	}
	_, stop := runReporting(t, old, dataDir)
	sess := recv(t, old.sessions, "welcomed session")
	startDetachedOn(t, sess, "early", "exit 5")
	waitFor(t, testWait, "job early's end", func() bool { return exists(filepath.Join(dataDir, "jobs", "early", jobFileStatus)) })
	startDetachedOn(t, sess, "rel", waitRelease(release, 4))
	startDetachedOn(t, sess, "rel2", waitRelease(release2, 0))
	startDetachedOn(t, sess, "orphan", "exec sleep 300")
	t.Cleanup(func() { writeFile(release); writeFile(release2) })
	stop()
	if exists(filepath.Join(dataDir, "jobs", "early", jobFileReported)) {
		t.Fatal("job early marked reported to a coordinator that takes no reports")
	}

	// With no agent: rel exits, orphan's shim dies.
	if err := writeFile(release); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testWait, "job rel's end", func() bool { return exists(filepath.Join(dataDir, "jobs", "rel", jobFileStatus)) })
	killShim(t, dataDir, "orphan")

	fc := startFakeCoordinatorFeatures(t, "good-token", protocol.FeatureJobExit)
	runReporting(t, fc, dataDir)
	var order []string
	got := map[string]protocol.JobStatus{}
	for len(order) < 3 {
		st := recv(t, fc.jobExits, "the reports of the ends the first agent missed")
		order = append(order, st.ID)
		got[st.ID] = st
	}
	if order[0] != "early" || len(got) != 3 {
		t.Errorf("reports in order %v, want early first, then rel and orphan", order)
	}
	checkReport(t, got["early"], protocol.JobExited, 5)
	checkReport(t, got["rel"], protocol.JobExited, 4)
	checkReport(t, got["orphan"], protocol.JobLost, 0)

	// rel2 runs on, its shim init's (here: the old agent's) child.
	if err := writeFile(release2); err != nil {
		t.Fatal(err)
	}
	checkReport(t, reportsUntil(t, fc, "rel2")["rel2"], protocol.JobExited, 0)
}
