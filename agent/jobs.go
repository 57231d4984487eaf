package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// Detached jobs (ExecParams.Detach). The agent starts the job in its own
// session (setsid, no parent-death signal), so that neither the exec
// stream's end nor the tunnel's loss touches it, and supervises it from a
// goroutine that copies its stdout and stderr into files under
// DataDir/jobs/<id>/ (each capped at the output limit, the rest counted and
// dropped), enforces its timeout and writes status.json when it exits. Job
// streams (KindJob) query, read and cancel it by id.
//
// Files of a job directory: meta.json (JobStatus at start), stdout, stderr,
// script (the bash -s script, if any), status.json (JobStatus at exit).
// A directory without status.json whose job is not in the table belongs to
// an agent process that stopped while the job ran: its state is "lost".
// Finished jobs' directories are removed Config.JobRetention after they
// finished, by a sweep that runs with job operations (at most once a minute).

// Error code of a job stream for an unknown job id.
const codeJobNotFound = "job_not_found"

// jobTable holds the detached jobs this agent process supervises.
type jobTable struct {
	mu        sync.Mutex
	jobs      map[string]*detachedJob
	lastSweep time.Time
	wg        sync.WaitGroup // one per supervisor
}

// detachedJob is one supervised detached job.
type detachedJob struct {
	id       string
	dir      string
	pgid     int
	cancelCh chan struct{} // buffered 1: cancel requested
	done     chan struct{} // closed once status.json is written

	finishOnce sync.Once // finish runs once, also after a contained panic

	mu sync.Mutex
	st protocol.JobStatus
}

func (j *detachedJob) snapshot() protocol.JobStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.st
}

func (a *Agent) jobsDir() string { return filepath.Join(a.cfg.DataDir, "jobs") }

// startDetached starts x's job detached and answers the exec stream with a
// Detached exit status, or an error frame if it could not start.
func (a *Agent) startDetached(x *execution) {
	p := &x.p
	a.sweepJobs(false)
	dir, err := a.workDir(x.acct, p.Cwd)
	if err != nil {
		x.fail(protocol.CodeStartFailed, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	if err := os.MkdirAll(a.jobsDir(), 0o700); err != nil {
		x.fail(protocol.CodeInternal, fmt.Sprintf("node %s: create jobs directory: %v", a.cfg.NodeID, err))
		return
	}
	jdir := filepath.Join(a.jobsDir(), p.JobID)
	if err := os.Mkdir(jdir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			x.fail(protocol.CodeBadRequest, fmt.Sprintf("node %s: a detached job %s already exists", a.cfg.NodeID, protocol.Clip(p.JobID)))
			return
		}
		x.fail(protocol.CodeInternal, fmt.Sprintf("node %s: create job directory: %v", a.cfg.NodeID, err))
		return
	}
	j, err := a.launchDetached(p, x.acct, dir, jdir)
	if err != nil {
		os.RemoveAll(jdir)
		x.fail(startFailCode(err, dir), fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	x.log.Info("detached job started", "job_id", j.id, "pid", j.pgid)
	if err := x.w.final(protocol.FrameExit, &protocol.ExitStatus{Detached: true}); err != nil {
		x.log.Warn("detached job start not reported", "job_id", j.id, "err", err)
	}
}

// launchDetached starts the process of p as acct in jdir's job and its
// supervisor. The job's files are the agent's (created and written by it,
// 0600 in its own data directory): the process gets its script and output
// as descriptors, so it needs no right on them, and status, output and
// cancel keep working whatever account the job runs as (the agent signals
// its process group as root, or as the same uid).
func (a *Agent) launchDetached(p *protocol.ExecParams, acct *account, dir, jdir string) (*detachedJob, error) {
	var cmd *exec.Cmd
	var stdin *os.File
	if s := p.ShellScript(); s != "" {
		path := filepath.Join(jdir, "script")
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			return nil, fmt.Errorf("write job script: %w", err)
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("open job script: %w", err)
		}
		defer f.Close()
		stdin = f
		cmd = exec.Command("bash", "-s")
	} else {
		cmd = exec.Command(p.Argv[0], p.Argv[1:]...)
	}
	cmd.Dir = dir
	cmd.Env = a.procEnv(acct, p.Env, dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: acct.credential()}
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var files [2]*os.File
	for i, name := range []string{"stdout", "stderr"} {
		f, err := os.OpenFile(filepath.Join(jdir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			for _, g := range files[:i] {
				g.Close()
			}
			return nil, fmt.Errorf("create job %s file: %w", name, err)
		}
		files[i] = f
	}
	closeFiles := func() { files[0].Close(); files[1].Close() }
	outR, outW, err := os.Pipe()
	if err != nil {
		closeFiles()
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeFiles()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		closeFiles()
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("start %s: %w", cmd.Args[0], explainStart(err, dir))
	}
	j := &detachedJob{
		id:       p.JobID,
		dir:      jdir,
		pgid:     cmd.Process.Pid,
		cancelCh: make(chan struct{}, 1),
		done:     make(chan struct{}),
		st: protocol.JobStatus{
			ID:        p.JobID,
			Node:      a.cfg.NodeID,
			State:     protocol.JobRunning,
			StartedAt: time.Now().UTC(),
		},
	}
	if err := writeJSONFile(filepath.Join(jdir, "meta.json"), j.st); err != nil {
		a.log.Warn("write detached job meta", "job_id", j.id, "err", err)
	}
	limit := p.OutputLimit
	if limit == 0 {
		limit = a.cfg.OutputLimit
	}
	a.jobs.mu.Lock()
	if a.jobs.jobs == nil {
		a.jobs.jobs = map[string]*detachedJob{}
	}
	a.jobs.jobs[j.id] = j
	a.jobs.wg.Add(1)
	a.jobs.mu.Unlock()
	go func() {
		defer a.jobs.wg.Done()
		// The supervisor killed the job's group while unwinding; what is
		// left to do is to record it as lost.
		defer a.guard.Recover("detached job supervisor", func(e *panics.Error) {
			st := j.snapshot()
			st.State = protocol.JobLost
			a.finishJob(j, st, a.log.With("job_id", j.id, "pid", j.pgid))
		})
		a.superviseJob(j, cmd, [2]*os.File{outR, errR}, files, limit, time.Duration(p.TimeoutMS)*time.Millisecond)
	}()
	return j, nil
}

// superviseJob copies the job's output into its files, enforces its timeout
// and cancel, and records its end. It returns once the job's process exited
// and its output pipes were closed (or abandoned after a kill).
func (a *Agent) superviseJob(j *detachedJob, cmd *exec.Cmd, pipes, files [2]*os.File, limit int64, timeout time.Duration) {
	log := a.log.With("job_id", j.id, "pid", j.pgid)
	defer func() {
		for _, f := range pipes {
			f.Close()
		}
		for _, f := range files {
			f.Close()
		}
	}()
	var wg sync.WaitGroup
	waitCh := make(chan error, 1)
	copyDone := make(chan struct{}, 2)
	cr := newCrash() // a helper below panicked
	wg.Add(3)
	go func() {
		defer wg.Done()
		defer a.guard.Recover("detached job waiter", func(e *panics.Error) {
			cr.report(e)
			waitCh <- e
		})
		waitCh <- cmd.Wait()
	}()
	for i := range pipes {
		go func() {
			defer wg.Done()
			defer func() { copyDone <- struct{}{} }()
			defer a.guard.Recover("detached job output copier", cr.report)
			if i == 0 {
				a.hook("job-output", j.id)
			}
			j.copyToFile(pipes[i], files[i], i == 1, limit, log)
		}()
	}
	defer wg.Wait()
	// A panic unwinding the loop below must not wait (above) for copiers
	// of a job that keeps running: end its group and stop reading.
	returned := false
	defer func() {
		if !returned {
			syscall.Kill(-j.pgid, syscall.SIGKILL)
			pipes[0].SetReadDeadline(time.Now())
			pipes[1].SetReadDeadline(time.Now())
		}
	}()

	var timeoutC, graceC, abandonC <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	var (
		exited, termSent, killSent, abandoned bool
		timedOut, cancelled, crashed          bool
		copiers                               = 2
		crashC                                = cr.done()
	)
	kill := func(sig syscall.Signal) {
		if err := syscall.Kill(-j.pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			log.Warn("kill detached job", "signal", signalName(sig), "err", err)
		}
	}
	end := func() {
		switch {
		case exited && !killSent:
			killSent = true
			kill(syscall.SIGKILL)
		case !exited && !termSent && !killSent:
			termSent = true
			kill(syscall.SIGTERM)
			graceC = time.After(a.cfg.KillGrace)
		}
	}
	var waitErr error
	a.hook("job-supervise", j.id)
	for !exited || copiers > 0 {
		select {
		case waitErr = <-waitCh:
			exited = true
		case <-copyDone:
			copiers--
		case <-timeoutC:
			timeoutC = nil
			timedOut = true
			log.Info("detached job timed out; killing its process group")
			end()
		case <-j.cancelCh:
			if !exited && !timedOut {
				cancelled = true
			}
			log.Info("detached job cancelled; killing its process group")
			end()
		case <-graceC:
			graceC = nil
			killSent = true
			kill(syscall.SIGKILL)
		case <-crashC:
			// Its outcome can no longer be told: end it now.
			crashC = nil
			crashed = true
			log.Error("detached job failed with an internal error; killing its process group")
			killSent = true
			kill(syscall.SIGKILL)
		case <-abandonC:
			abandonC = nil
			abandoned = true
			log.Warn("detached job's output pipes still open after killing its group; abandoning them")
			pipes[0].SetReadDeadline(time.Now())
			pipes[1].SetReadDeadline(time.Now())
		}
		if exited && killSent && !abandoned && abandonC == nil && copiers > 0 {
			abandonC = time.After(a.cfg.KillGrace)
		}
	}
	group := groupWatch{pgid: j.pgid}
	for termSent && !killSent && group.alive() {
		select {
		case <-graceC:
			killSent = true
			kill(syscall.SIGKILL)
		case <-time.After(groupPoll):
		}
	}
	returned = true

	code := -1
	var signal string
	if ps := cmd.ProcessState; ps != nil {
		ws, ok := ps.Sys().(syscall.WaitStatus)
		if ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
			signal = signalName(ws.Signal())
		} else {
			code = ps.ExitCode()
		}
	} else {
		log.Warn("wait for detached job", "err", waitErr)
	}
	if timedOut {
		code = 124
	}
	st := j.snapshot()
	st.State = protocol.JobExited
	st.ExitCode = &code
	st.Signal = signal
	st.TimedOut = timedOut
	st.Cancelled = cancelled
	if crashed {
		st = j.snapshot()
		st.State = protocol.JobLost
	}
	a.finishJob(j, st, log)
	log.Info("detached job finished", "state", st.State, "exit_code", code, "signal", signal, "timed_out", timedOut, "cancelled", cancelled)
}

// finishJob records the end of job j with status st (FinishedAt is set
// here), removes it from the table and closes j.done, once: a later call
// does nothing.
func (a *Agent) finishJob(j *detachedJob, st protocol.JobStatus, log interface{ Warn(string, ...any) }) {
	j.finishOnce.Do(func() {
		now := time.Now().UTC()
		st.FinishedAt = &now
		// status.json first: whoever sees the job ended may rely on it.
		if err := writeJSONFile(filepath.Join(j.dir, "status.json"), st); err != nil {
			log.Warn("write detached job status", "err", err)
		}
		j.mu.Lock()
		j.st = st
		j.mu.Unlock()
		a.jobs.mu.Lock()
		if a.jobs.jobs[j.id] == j {
			delete(a.jobs.jobs, j.id)
		}
		a.jobs.mu.Unlock()
		close(j.done)
	})
}

// copyToFile copies one output pipe into its file, keeping at most limit
// bytes and counting everything.
func (j *detachedJob) copyToFile(r, f *os.File, isErr bool, limit int64, log interface{ Warn(string, ...any) }) {
	buf := make([]byte, protocol.ChunkSize)
	var kept int64
	writeFailed := false
	for {
		n, err := r.Read(buf)
		if n > 0 {
			keep := min(int64(n), limit-kept)
			if keep > 0 && !writeFailed {
				if _, werr := f.Write(buf[:keep]); werr != nil {
					log.Warn("write detached job output", "err", werr)
					writeFailed = true
				}
				kept += keep
			}
			j.mu.Lock()
			if isErr {
				j.st.StderrBytes += int64(n)
				j.st.StderrTruncated = j.st.StderrTruncated || keep < int64(n)
			} else {
				j.st.StdoutBytes += int64(n)
				j.st.StdoutTruncated = j.st.StdoutTruncated || keep < int64(n)
			}
			j.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// writeJSONFile writes v to path atomically (temporary file, then rename).
func writeJSONFile(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// errJobNotFound is returned for a job id the node does not know.
var errJobNotFound = errors.New("no such detached job")

// jobStatus returns the status of job id: live from the table, else from
// its directory.
func (a *Agent) jobStatus(id string) (protocol.JobStatus, error) {
	a.jobs.mu.Lock()
	j := a.jobs.jobs[id]
	a.jobs.mu.Unlock()
	if j != nil {
		return j.snapshot(), nil
	}
	jdir := filepath.Join(a.jobsDir(), id)
	var st protocol.JobStatus
	if b, err := os.ReadFile(filepath.Join(jdir, "status.json")); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return st, fmt.Errorf("read status of job %s: %w", id, err)
		}
		return st, nil
	}
	if b, err := os.ReadFile(filepath.Join(jdir, "meta.json")); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return st, fmt.Errorf("read meta of job %s: %w", id, err)
		}
		// Started by an agent process that stopped before the job ended.
		st.State = protocol.JobLost
		for i, name := range []string{"stdout", "stderr"} {
			if fi, err := os.Stat(filepath.Join(jdir, name)); err == nil {
				if i == 0 {
					st.StdoutBytes = fi.Size()
				} else {
					st.StderrBytes = fi.Size()
				}
			}
		}
		return st, nil
	}
	return st, errJobNotFound
}

// sweepJobs removes the directories of jobs that finished (or were lost)
// more than Config.JobRetention ago. Unless force, it runs at most once per
// min(JobRetention, 1 minute).
func (a *Agent) sweepJobs(force bool) {
	now := time.Now()
	every := min(a.cfg.JobRetention, time.Minute)
	a.jobs.mu.Lock()
	if !force && now.Sub(a.jobs.lastSweep) < every {
		a.jobs.mu.Unlock()
		return
	}
	a.jobs.lastSweep = now
	running := map[string]bool{}
	for id := range a.jobs.jobs {
		running[id] = true
	}
	a.jobs.mu.Unlock()
	entries, err := os.ReadDir(a.jobsDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || running[e.Name()] {
			continue
		}
		jdir := filepath.Join(a.jobsDir(), e.Name())
		var ended time.Time
		var st protocol.JobStatus
		if b, err := os.ReadFile(filepath.Join(jdir, "status.json")); err == nil && json.Unmarshal(b, &st) == nil && st.FinishedAt != nil {
			ended = *st.FinishedAt
		} else if fi, err := e.Info(); err == nil {
			ended = fi.ModTime()
		}
		if !ended.IsZero() && now.Sub(ended) > a.cfg.JobRetention {
			if err := os.RemoveAll(jdir); err != nil {
				a.log.Warn("remove expired detached job", "job_id", e.Name(), "err", err)
			} else {
				a.log.Info("removed expired detached job", "job_id", e.Name())
			}
		}
	}
}

// serveJob answers one job stream (KindJob): status, output or cancel of a
// detached job. It closes st.
func (a *Agent) serveJob(ctx context.Context, st *yamux.Stream, h protocol.Header) {
	defer st.Close()
	defer a.guard.Recover("job stream", a.answerPanic(st, nil))
	var p protocol.JobParams
	if err := h.DecodeParams(&p); err != nil {
		a.refuse(st, protocol.CodeBadRequest, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	if err := p.Validate(); err != nil {
		a.refuse(st, protocol.CodeBadRequest, fmt.Sprintf("node %s: job params: %s", a.cfg.NodeID, joinLines(err)))
		return
	}
	a.sweepJobs(false)
	notFound := func() {
		a.refuse(st, codeJobNotFound, fmt.Sprintf("node %s: no detached job %s", a.cfg.NodeID, protocol.Clip(p.ID)))
	}
	// status reads the job's status, answering the failure itself when
	// there is none to read.
	status := func() (protocol.JobStatus, bool) {
		js, err := a.jobStatus(p.ID)
		if errors.Is(err, errJobNotFound) {
			notFound()
			return protocol.JobStatus{}, false
		}
		if err != nil {
			a.refuse(st, protocol.CodeInternal, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
			return protocol.JobStatus{}, false
		}
		return js, true
	}
	answer := func(v any) {
		st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
		if err := protocol.WriteJSONFrame(st, protocol.FrameJob, v); err != nil {
			a.log.Debug("write job answer", "job_id", p.ID, "op", p.Op, "err", err)
		}
	}
	switch p.Op {
	case protocol.JobOpStatus:
		js, ok := status()
		if !ok {
			return
		}
		answer(js)
	case protocol.JobOpCancel:
		a.jobs.mu.Lock()
		j := a.jobs.jobs[p.ID]
		a.jobs.mu.Unlock()
		if j != nil {
			select {
			case j.cancelCh <- struct{}{}:
			default:
			}
			// Report the status after the kill when it comes quickly.
			t := time.NewTimer(a.cfg.KillGrace + time.Second)
			select {
			case <-j.done:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		js, ok := status()
		if !ok {
			return
		}
		answer(js)
	case protocol.JobOpOutput:
		js, ok := status()
		if !ok {
			return
		}
		f, err := os.Open(filepath.Join(a.jobsDir(), p.ID, p.Stream))
		if err != nil {
			a.refuse(st, protocol.CodeInternal, fmt.Sprintf("node %s: job %s %s: %v", a.cfg.NodeID, p.ID, p.Stream, err))
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			a.refuse(st, protocol.CodeInternal, fmt.Sprintf("node %s: job %s %s: %v", a.cfg.NodeID, p.ID, p.Stream, err))
			return
		}
		size := fi.Size()
		limit := p.Limit
		if limit == 0 {
			limit = protocol.MaxJobOutputLimit
		}
		n := max(min(size-p.Offset, limit), 0)
		r := io.NewSectionReader(f, p.Offset, n)
		buf := make([]byte, protocol.ChunkSize)
		var sent int64
		for sent < n {
			k, err := r.Read(buf)
			if k > 0 {
				st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
				if werr := protocol.WriteFrame(st, protocol.FrameStdout, buf[:k]); werr != nil {
					a.log.Debug("write job output", "job_id", p.ID, "err", werr)
					return
				}
				sent += int64(k)
			}
			if err != nil {
				break
			}
		}
		answer(protocol.JobOutputEnd{Total: size, EOF: js.State != protocol.JobRunning && p.Offset+sent >= size})
	}
}

// joinLines puts a joined error on one line.
func joinLines(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }
