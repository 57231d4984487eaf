package agent

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
)

// Exit reports of detached jobs (protocol.FrameJobExit; see
// protocol/jobexit.go). When a detached job of this node ends (its shim
// wrote status.json) or is found lost (its shim gone without one), the
// agent tells the coordinator on the control stream, so that the job's
// durable record is settled at once instead of when someone next asks:
// `tether job list` stays current.
//
// One goroutine, the reporter (reportJobs, started by Run), does all of
// it. It learns of ends two ways: a shim this process started is its
// child, and the goroutine reaping it wakes the reporter; a job found
// running at start (recoverJobs), whose shim is init's child now, is
// checked every jobWatchEvery (status.json, else whether its shim
// lives). It sends only on a session whose coordinator listed
// protocol.FeatureJobExit in its Welcome (an older coordinator ends the
// session on a frame it does not know), through writeControl. After a
// successful write it records the report in the job's directory
// (jobFileReported), and at the start of every such session it first
// sends the reports of ended jobs that have no such file, oldest first:
// jobs that ended while no session was up, while the coordinator did not
// take reports, or while no agent ran at all (an agent restarted while
// its job exited reports it at its first session). A write yamux reports
// failed is sent again at the next session, even when it arrived (yamux
// may say so of a frame sent as the session closed): a repeat changes
// nothing. A write it took but the session lost before the coordinator
// read it is not sent again; job.get and reconciliation settle such a
// record, as they did before reports existed.

const (
	// jobWatchEvery is how often the reporter checks the jobs it watches
	// for an end it was not woken for (a recovered job's shim is not the
	// agent's child), and sends the next batch of a backlog.
	jobWatchEvery = time.Second
	// maxReportBatch bounds the reports sent at once (at a session's
	// start, then per jobWatchEvery while a backlog lasts). Reports share
	// the control stream with heartbeats, which wait behind them, and
	// each costs the coordinator a read and a write of the job store: a
	// node back from a long disconnection with thousands of ended jobs,
	// or a fleet reconnecting at once after a coordinator restart, must
	// not flood either. The coordinator's queue holds a few batches
	// (coordinator/jobexit.go).
	maxReportBatch = 256
	// jobFileReported marks a job whose end was reported (reportMarker).
	jobFileReported = "reported.json"
)

// reportSession is a session whose coordinator takes job exit reports.
type reportSession struct {
	ctl *yamux.Stream
	id  string // Welcome.SessionID, recorded in the marker
}

// reportMarker is a job directory's jobFileReported.
type reportMarker struct {
	Session string    `json:"session"`
	At      time.Time `json:"at"`
}

// jobReporter is the reporter's state (Agent.reports).
type jobReporter struct {
	// cur is the session reports go to; nil when there is none, or its
	// coordinator does not take them, or it drains.
	cur atomic.Pointer[reportSession]
	// wake asks the reporter to look now (a shim ended, a session
	// began); capacity 1, sends never block.
	wake chan struct{}

	mu sync.Mutex
	// watch holds the jobs believed running, with their shim record
	// once read (nil: read it).
	watch map[string]*shimRecord
}

// wakeReporter asks the reporter to look now. It never blocks.
func (a *Agent) wakeReporter() {
	select {
	case a.reports.wake <- struct{}{}:
	default:
	}
}

// watchJob adds running job id (shim record rec, nil if not read yet) to
// the jobs the reporter checks.
func (a *Agent) watchJob(id string, rec *shimRecord) {
	a.reports.mu.Lock()
	defer a.reports.mu.Unlock()
	if a.reports.watch == nil {
		a.reports.watch = map[string]*shimRecord{}
	}
	a.reports.watch[id] = rec
}

// setReportSession makes rs (nil: none) the session reports go to, and
// wakes the reporter for a new one.
func (a *Agent) setReportSession(rs *reportSession) {
	a.reports.cur.Store(rs)
	if rs != nil {
		a.wakeReporter()
	}
}

// reportJobs is the reporter: it runs until ctx is done.
func (a *Agent) reportJobs(ctx context.Context) {
	t := time.NewTicker(jobWatchEvery)
	defer t.Stop()
	var scanned *reportSession // the session whose backlog was sent
	backlog := false           // the last scan left reports unsent
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.reports.wake:
		case <-t.C:
		}
		func() {
			defer a.guard.Recover("job reporter", nil)
			ended := a.checkWatched()
			rs := a.reports.cur.Load()
			if rs == nil {
				return // the next session's scan finds them
			}
			if rs != scanned || backlog {
				var more []string
				more, backlog = a.unreportedJobs(maxReportBatch)
				scanned = rs
				for _, id := range ended {
					if !slices.Contains(more, id) {
						more = append(more, id)
					}
				}
				ended = more
			}
			for _, id := range ended {
				if ctx.Err() != nil {
					return
				}
				if err := a.reportJob(rs, id); err != nil {
					// The session is failing (its heartbeat closes
					// it): look again at the next tick.
					a.log.Debug("job exit report not sent", "job_id", id, "err", err)
					backlog = true
					return
				}
			}
		}()
	}
}

// checkWatched checks the watched jobs and returns those that ended,
// which it stops watching: status.json was written, or the shim is gone
// without one (then it records the job lost, as recoverJobs does).
func (a *Agent) checkWatched() []string {
	a.reports.mu.Lock()
	ids := make([]string, 0, len(a.reports.watch))
	recs := make([]*shimRecord, 0, len(a.reports.watch))
	for id, rec := range a.reports.watch {
		ids, recs = append(ids, id), append(recs, rec)
	}
	a.reports.mu.Unlock()
	var ended []string
	for i, id := range ids {
		jdir := filepath.Join(a.jobsDir(), id)
		done, rec := a.jobEnded(id, jdir, recs[i])
		a.reports.mu.Lock()
		if done {
			delete(a.reports.watch, id)
		} else if rec != nil {
			a.reports.watch[id] = rec
		}
		a.reports.mu.Unlock()
		if done && exists(filepath.Join(jdir, jobFileStatus)) {
			ended = append(ended, id)
		}
	}
	return ended
}

// jobEnded reports whether job id (in jdir, shim record rec if read) is
// over: ended, lost (recorded so here), or gone (its directory removed).
// It returns the shim record it read for the next check.
func (a *Agent) jobEnded(id, jdir string, rec *shimRecord) (bool, *shimRecord) {
	if exists(filepath.Join(jdir, jobFileStatus)) {
		return true, nil
	}
	if !exists(filepath.Join(jdir, jobFileMeta)) && !exists(filepath.Join(jdir, jobFileShim)) {
		return true, nil // removed, or never started
	}
	var recErr error
	if rec == nil {
		rec, recErr = readShimRecord(jdir)
	}
	if recErr == nil && rec.Shim.alive() {
		return false, rec
	}
	a.recordLost(id, jdir, rec, recErr)
	return true, nil
}

// recordLost records job id, whose shim is gone (rec, or recErr when its
// shim.json could not be read), as lost in its status.json, unless the
// shim wrote one after all, and kills the job's process group if its
// leader outlived the shim. It reports whether it recorded the loss.
func (a *Agent) recordLost(id, jdir string, rec *shimRecord, recErr error) bool {
	var st protocol.JobStatus
	if err := readJSONFile(filepath.Join(jdir, jobFileMeta), &st); err != nil {
		return false // not started, or not a job: the sweep removes it
	}
	if recErr == nil && rec.Job.alive() {
		a.log.Warn("detached job's shim is gone but its process is not; killing its process group", "job_id", id, "pgid", rec.Job.PID)
		syscall.Kill(-rec.Job.PID, syscall.SIGKILL)
	}
	st.State = protocol.JobLost
	liveCounts(jdir, &st)
	now := time.Now().UTC()
	st.FinishedAt = &now
	if exists(filepath.Join(jdir, jobFileStatus)) {
		return false // the shim finished after all
	}
	if err := writeJSONFile(filepath.Join(jdir, jobFileStatus), st); err != nil {
		a.log.Warn("record lost detached job", "job_id", id, "err", err)
		return false
	}
	a.log.Warn("detached job lost: its shim ended without recording how the job ended", "job_id", id, "shim_log", logTail(filepath.Join(jdir, jobFileLog)))
	return true
}

// unreportedJobs returns the ended jobs whose end was not reported yet,
// oldest end (status.json's modification time) first, at most max, and
// whether there are more.
func (a *Agent) unreportedJobs(max int) ([]string, bool) {
	entries, err := os.ReadDir(a.jobsDir())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			a.log.Warn("read detached jobs for their exit reports", "dir", a.jobsDir(), "err", err)
		}
		return nil, false
	}
	type ended struct {
		id string
		at time.Time
	}
	var out []ended
	for _, e := range entries {
		if !e.IsDir() || protocol.ValidJobID(e.Name()) != nil {
			continue
		}
		jdir := filepath.Join(a.jobsDir(), e.Name())
		fi, err := os.Stat(filepath.Join(jdir, jobFileStatus))
		if err != nil || exists(filepath.Join(jdir, jobFileReported)) {
			continue
		}
		out = append(out, ended{e.Name(), fi.ModTime()})
	}
	slices.SortFunc(out, func(x, y ended) int {
		if c := x.at.Compare(y.at); c != 0 {
			return c
		}
		return strings.Compare(x.id, y.id)
	})
	more := len(out) > max
	if more {
		out = out[:max]
	}
	ids := make([]string, len(out))
	for i, e := range out {
		ids[i] = e.id
	}
	return ids, more
}

// reportJob sends job id's final status on rs, unless it was reported
// already, and then records that it was. A job whose status cannot be
// read is skipped (nil): it is not reportable.
func (a *Agent) reportJob(rs *reportSession, id string) error {
	jdir := filepath.Join(a.jobsDir(), id)
	if exists(filepath.Join(jdir, jobFileReported)) {
		return nil
	}
	var st protocol.JobStatus
	if err := readJSONFile(filepath.Join(jdir, jobFileStatus), &st); err != nil {
		a.log.Warn("job exit report: read the job's status", "job_id", id, "err", err)
		return nil
	}
	if st.State != protocol.JobExited && st.State != protocol.JobLost {
		return nil
	}
	st.ID, st.Node = id, a.cfg.NodeID
	a.hook("job-exit", &st)
	if err := a.writeControl(rs.ctl, protocol.FrameJobExit, &st); err != nil {
		return err
	}
	if err := writeJSONFile(filepath.Join(jdir, jobFileReported), reportMarker{Session: rs.id, At: time.Now().UTC()}); err != nil {
		// Sent again at the next session: a repeat changes nothing.
		a.log.Warn("record a job's exit report", "job_id", id, "err", err)
	}
	return nil
}

// startReporter starts the reporter in a goroutine counted in wg; it ends
// when ctx is done.
func (a *Agent) startReporter(ctx context.Context, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.reportJobs(ctx) // each round contains its own panics

	}()
}
