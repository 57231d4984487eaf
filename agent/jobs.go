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

	"github.com/tetherfleet/tether/protocol"
)

// Detached jobs (ExecParams.Detach). Each runs under a job shim
// (jobshim.go): a process of the agent's own binary, in its own session
// and, under systemd, in its own transient scope (tether-job-ID.scope), so
// that neither the exec stream's end, nor the tunnel's loss, nor the
// agent's own stop, restart, upgrade or crash touches it, nor does the
// agent unit's KillMode. The shim is the job's parent: it writes the
// job's output into files under DataDir/jobs/<id>/ (each capped at the
// output limit, the rest counted and dropped), enforces its timeout,
// handles its cancel and writes status.json when it exits. The agent only
// reads those files and signals the shim, so a restarted agent finds its
// jobs again from the files: a job whose shim is alive (pid and start
// time, procIdentity) is running, one whose shim died without writing
// status.json is lost. Job streams (KindJob) query, read and cancel a job
// by id.
//
// Files of a job directory: meta.json (JobStatus at start, written by the
// agent once the shim reported the job started), script (the bash -s
// script, if any), shim.log (the shim's log, and systemd-run's), and the
// shim's: shim.json, live.json, stdout, stderr, status.json (jobshim.go),
// and reported.json once the job's end was reported to a coordinator
// (jobreport.go).
// Finished jobs' directories are removed Config.JobRetention after they
// finished, by a sweep that runs with job operations (at most once a
// minute); so are lost jobs', which the first agent to start after their
// shim died marks as such (status.json with state lost).

// Error code of a job stream for an unknown job id.
const codeJobNotFound = "job_not_found"

// shimStartTimeout bounds the wait for a shim's reply (systemd-run may
// take a while on a loaded host).
const shimStartTimeout = time.Minute

// jobTable holds the shims this agent process started: it is their parent
// and reaps them (a shim found again after a restart is reaped by init).
type jobTable struct {
	mu        sync.Mutex
	lastSweep time.Time
	wg        sync.WaitGroup // one per shim this process started and waits for

	scopeOnce sync.Once
	scope     string // systemd-run's path when jobs get scopes, else ""
}

func (a *Agent) jobsDir() string { return filepath.Join(a.cfg.DataDir, "jobs") }

// jobStartError is a job that could not start, with the protocol error
// code the exec is failed with.
type jobStartError struct{ code, msg string }

func (e *jobStartError) Error() string { return e.msg }

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
	pid, err := a.launchDetached(p, x.acct, dir, jdir)
	if err != nil {
		os.RemoveAll(jdir)
		code := startFailCode(err, dir)
		var se *jobStartError
		if errors.As(err, &se) {
			code = se.code
		}
		x.fail(code, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	x.log.Info("detached job started", "job_id", p.JobID, "pid", pid)
	x.release() // the job runs on in its shim, outside MaxExecs
	if err := x.w.final(protocol.FrameExit, &protocol.ExitStatus{Detached: true}); err != nil {
		x.log.Warn("detached job start not reported", "job_id", p.JobID, "err", err)
	}
}

// launchDetached starts the shim of p's job, run as acct in dir, with its
// files in jdir, and returns the job's pid once it started. The job's
// files are the agent's and its shim's (created and written by them, 0600
// in the agent's data directory): the job gets its script and output as
// descriptors, so it needs no right on them, and status, output and
// cancel keep working whatever account the job runs as.
func (a *Agent) launchDetached(p *protocol.ExecParams, acct *account, dir, jdir string) (int, error) {
	limit := p.OutputLimit
	if limit == 0 {
		limit = a.cfg.OutputLimit
	}
	spec := jobShimSpec{
		Version:     jobShimVersion,
		Dir:         jdir,
		Cwd:         dir,
		Env:         a.procEnv(acct, p.Env, dir),
		Limit:       limit,
		TimeoutMS:   p.TimeoutMS,
		KillGraceMS: a.cfg.KillGrace.Milliseconds(),
		Status: protocol.JobStatus{
			ID:        p.JobID,
			Node:      a.cfg.NodeID,
			State:     protocol.JobRunning,
			StartedAt: time.Now().UTC(),
		},
	}
	if c := acct.credential(); c != nil {
		spec.Cred = &jobCred{UID: c.Uid, GID: c.Gid, Groups: c.Groups}
	}
	if s := p.ShellScript(); s != "" {
		if err := os.WriteFile(filepath.Join(jdir, jobFileScript), []byte(s), 0o600); err != nil {
			return 0, fmt.Errorf("write job script: %w", err)
		}
		spec.Argv, spec.Script = []string{"bash", "-s"}, true
	} else {
		spec.Argv = p.Argv
	}
	exe := fmt.Sprintf("/proc/%d/exe", os.Getpid())
	var pid int
	var err error
	if run := a.jobScope(); run != "" {
		unit := "tether-job-" + p.JobID
		spec.Scope = unit + ".scope"
		// systemd-run --scope registers itself as the scope's process and
		// then execs the shim: the shim is the agent's child, in the scope.
		pid, err = a.startShim([]string{run, "--scope", "--collect", "--quiet", "--unit", unit,
			"--description", "Tether detached job " + p.JobID,
			// As the agent's unit: a job may fork many processes.
			"--property", "TasksMax=infinity",
			"--", exe, jobShimArg}, &spec)
		var ne *shimNoReply
		if errors.As(err, &ne) && !exists(filepath.Join(jdir, "stdout")) {
			// systemd-run failed before it ran the shim: the job did
			// not start. Run it without a scope rather than not at
			// all; it then does not outlive a stop of the agent's unit.
			a.log.Warn("detached job: systemd-run failed; running the job without a scope of its own", "job_id", p.JobID, "err", err)
			spec.Scope = ""
			pid, err = a.startShim([]string{exe, jobShimArg}, &spec)
		}
	} else {
		pid, err = a.startShim([]string{exe, jobShimArg}, &spec)
	}
	if err != nil {
		return 0, err
	}
	meta := spec.Status
	if err := writeJSONFile(filepath.Join(jdir, jobFileMeta), meta); err != nil {
		// Without meta.json the job cannot be queried: cancel it.
		a.log.Error("write detached job meta; cancelling the job", "job_id", p.JobID, "err", err)
		if rec, rerr := readShimRecord(jdir); rerr == nil {
			rec.Shim.signal(syscall.SIGTERM)
		}
		return 0, fmt.Errorf("write job %s: %w", jobFileMeta, err)
	}
	return pid, nil
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// shimNoReply is a shim (or the systemd-run before it) that ended or
// timed out without replying.
type shimNoReply struct {
	err error
	log string // the tail of shim.log
}

func (e *shimNoReply) Error() string {
	if e.log != "" {
		return fmt.Sprintf("job shim gave no reply: %v; its log: %s", e.err, e.log)
	}
	return fmt.Sprintf("job shim gave no reply: %v", e.err)
}
func (e *shimNoReply) Unwrap() error { return e.err }

// startShim runs argv (the shim, or systemd-run running it) in a new
// session, sends it spec and returns the job's pid from its reply. A shim
// that replied is waited for by a goroutine of a.jobs.wg.
func (a *Agent) startShim(argv []string, spec *jobShimSpec) (int, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("job shim stdin pipe: %w", err)
	}
	defer inW.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		return 0, fmt.Errorf("job shim stdout pipe: %w", err)
	}
	defer outR.Close()
	logPath := filepath.Join(spec.Dir, jobFileLog)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		inR.Close()
		outW.Close()
		return 0, fmt.Errorf("create %s: %w", logPath, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/" // hold no directory busy
	cmd.Env = append(a.childEnv(nil, ""), jobShimEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, logf
	// Its own session, and no parent-death signal: the shim must outlive
	// the agent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	inR.Close()
	outW.Close()
	logf.Close()
	if err != nil {
		return 0, fmt.Errorf("start job shim %s: %w", argv[0], err)
	}
	b, err := json.Marshal(spec)
	if err == nil {
		_, err = inW.Write(b)
	}
	inW.Close()
	var rep jobShimReply
	if err == nil {
		outR.SetReadDeadline(time.Now().Add(shimStartTimeout))
		err = json.NewDecoder(outR).Decode(&rep)
	}
	if err != nil {
		// No reply: the shim (or systemd-run) failed or hangs.
		cmd.Process.Kill()
		cmd.Wait()
		return 0, &shimNoReply{err: err, log: logTail(logPath)}
	}
	if rep.PID == 0 {
		cmd.Wait()
		if rep.Code == "" {
			rep.Code = protocol.CodeInternal
		}
		return 0, &jobStartError{code: rep.Code, msg: rep.Error}
	}
	// The shim's end is the job's (it wrote status.json first): the
	// reporter sends it (jobreport.go).
	a.watchJob(spec.Status.ID, nil)
	a.jobs.wg.Add(1)
	go func() {
		defer a.jobs.wg.Done()
		cmd.Wait()
		a.wakeReporter()
	}()
	return rep.PID, nil
}

// logTail returns the last line(s) of the file at path, at most 1 KiB, on
// one line.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 1024 {
		b = b[len(b)-1024:]
	}
	return strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", "; ")
}

// jobScope returns the path of systemd-run when detached jobs get a
// transient systemd scope each: systemd is the init system
// (/run/systemd/system exists), the agent runs as root (the system
// manager creates scopes for root only) and systemd-run is on PATH.
// Otherwise "": jobs run in their own session only, and a stop of the
// agent's unit kills them with it. Decided once per agent.
func (a *Agent) jobScope() string {
	a.jobs.scopeOnce.Do(func() {
		if a.systemdRunPath != nil {
			a.jobs.scope = a.systemdRunPath()
			return
		}
		a.jobs.scope = detectSystemdRun()
	})
	return a.jobs.scope
}

// detectSystemdRun is jobScope's detection.
func detectSystemdRun() string {
	if fi, err := os.Stat("/run/systemd/system"); err != nil || !fi.IsDir() || os.Geteuid() != 0 {
		return ""
	}
	path, err := exec.LookPath("systemd-run")
	if err != nil {
		return ""
	}
	return path
}

// readJSONFile decodes the JSON file at path into v.
func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}

// readShimRecord reads a job directory's shim.json.
func readShimRecord(jdir string) (*shimRecord, error) {
	var rec shimRecord
	if err := readJSONFile(filepath.Join(jdir, jobFileShim), &rec); err != nil {
		return nil, err
	}
	if rec.Version != jobShimVersion {
		return nil, fmt.Errorf("%s: version %d, want %d", filepath.Join(jdir, jobFileShim), rec.Version, jobShimVersion)
	}
	return &rec, nil
}

// shimAlive reports whether jdir's job has a live shim.
func shimAlive(jdir string) bool {
	rec, err := readShimRecord(jdir)
	return err == nil && rec.Shim.alive()
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

// jobStatus returns the status of job id, from its directory: status.json
// once it ended; else running while its shim lives (with the output counts
// so far), lost when the shim is gone.
func (a *Agent) jobStatus(id string) (protocol.JobStatus, error) {
	jdir := filepath.Join(a.jobsDir(), id)
	var st protocol.JobStatus
	err := readJSONFile(filepath.Join(jdir, jobFileStatus), &st)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		if err != nil {
			err = fmt.Errorf("read status of job %s: %w", id, err)
		}
		return st, err
	}
	if err := readJSONFile(filepath.Join(jdir, jobFileMeta), &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return st, errJobNotFound
		}
		return st, fmt.Errorf("read meta of job %s: %w", id, err)
	}
	if shimAlive(jdir) {
		st.State = protocol.JobRunning
		liveCounts(jdir, &st)
		return st, nil
	}
	// The shim ended: it may have written status.json since the first
	// look.
	var fin protocol.JobStatus
	if err := readJSONFile(filepath.Join(jdir, jobFileStatus), &fin); err == nil {
		return fin, nil
	}
	st.State = protocol.JobLost
	liveCounts(jdir, &st)
	return st, nil
}

// liveCounts sets st's output counts from live.json and the output files'
// sizes (whichever is further: live.json lags).
func liveCounts(jdir string, st *protocol.JobStatus) {
	var c jobCounts
	readJSONFile(filepath.Join(jdir, jobFileLive), &c)
	st.StdoutBytes, st.StderrBytes = c.StdoutBytes, c.StderrBytes
	st.StdoutTruncated, st.StderrTruncated = c.StdoutTruncated, c.StderrTruncated
	for i, name := range []string{"stdout", "stderr"} {
		fi, err := os.Stat(filepath.Join(jdir, name))
		if err != nil {
			continue
		}
		if i == 0 {
			st.StdoutBytes = max(st.StdoutBytes, fi.Size())
		} else {
			st.StderrBytes = max(st.StderrBytes, fi.Size())
		}
	}
}

// cancelJob asks job id's shim to cancel it (SIGTERM) and waits until it
// ended, at most the kill grace and a second, or until ctx is done. A
// lost job whose leader outlived its shim gets its group killed.
func (a *Agent) cancelJob(ctx context.Context, id string) {
	jdir := filepath.Join(a.jobsDir(), id)
	rec, err := readShimRecord(jdir)
	if err != nil {
		return
	}
	if err := rec.Shim.signal(syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) && rec.Job.alive() {
			a.log.Warn("cancel of a lost detached job: killing the process group its shim left", "job_id", id, "pgid", rec.Job.PID)
			syscall.Kill(-rec.Job.PID, syscall.SIGKILL)
		}
		return
	}
	// Report the status after the kill when it comes quickly.
	deadline := time.NewTimer(a.cfg.KillGrace + time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(groupPoll)
	defer tick.Stop()
	for rec.Shim.alive() && !exists(filepath.Join(jdir, jobFileStatus)) {
		select {
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// recoverJobs runs when the agent starts: it logs the detached jobs whose
// shims are still running (they need nothing else: every operation reads
// their files), and marks the jobs whose shim died without a status as
// lost (status.json with state lost), killing the process group of any
// that outlived its shim.
func (a *Agent) recoverJobs() {
	entries, err := os.ReadDir(a.jobsDir())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			a.log.Warn("read detached jobs", "dir", a.jobsDir(), "err", err)
		}
		return
	}
	running, lost := 0, 0
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		jdir := filepath.Join(a.jobsDir(), e.Name())
		if exists(filepath.Join(jdir, jobFileStatus)) {
			continue
		}
		rec, recErr := readShimRecord(jdir)
		if recErr == nil && rec.Shim.alive() {
			running++
			a.log.Info("detached job still running", "job_id", e.Name(), "shim_pid", rec.Shim.PID, "pid", rec.Job.PID, "scope", rec.Scope)
			// Its shim is init's child now: the reporter checks it
			// (jobreport.go).
			a.watchJob(e.Name(), rec)
			continue
		}
		if a.recordLost(e.Name(), jdir, rec, recErr) {
			lost++
		}
	}
	if running > 0 || lost > 0 {
		a.log.Info("detached jobs found again", "running", running, "lost", lost)
	}
}

// sweepJobs removes the directories of jobs that finished (or were lost)
// more than Config.JobRetention ago. Unless force, it runs at most once per
// min(JobRetention, 1 minute). A job whose shim lives is never removed.
func (a *Agent) sweepJobs(force bool) {
	now := time.Now()
	every := min(a.cfg.JobRetention, time.Minute)
	a.jobs.mu.Lock()
	if !force && now.Sub(a.jobs.lastSweep) < every {
		a.jobs.mu.Unlock()
		return
	}
	a.jobs.lastSweep = now
	a.jobs.mu.Unlock()
	entries, err := os.ReadDir(a.jobsDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		jdir := filepath.Join(a.jobsDir(), e.Name())
		var ended time.Time
		var st protocol.JobStatus
		if readJSONFile(filepath.Join(jdir, jobFileStatus), &st) == nil && st.FinishedAt != nil {
			ended = *st.FinishedAt
		} else if shimAlive(jdir) {
			continue
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
		a.cancelJob(ctx, p.ID)
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
