package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/protocol"
)

// The job shim: the supervisor of one detached job, in a process of its
// own so that the job outlives the agent (a restart, an upgrade, a crash,
// kill -9). The agent starts it as a child of its own binary (argv[1]
// jobShimArg, jobShimEnv set, like the copy helper in copyas.go) in a new
// session, under systemd in a transient scope of its own (jobs.go), sends
// it a jobShimSpec on standard input and reads one jobShimReply from its
// standard output; the shim then points both at /dev/null, so that nothing
// ties it to the agent any more: no pipe, no parent-death signal, no
// session, no cgroup.
//
// The shim is the job's parent. It starts the job in its own process group
// (pgid = the job's pid), copies the job's stdout and stderr from pipes
// into the job directory's files (each capped at the spec's limit; the
// rest is counted and dropped, as for an attached exec), enforces the
// timeout, turns SIGTERM or SIGINT into a cancel (SIGTERM to the job's
// group, SIGKILL after the kill grace), and writes status.json when the
// job and its output are over, then exits. What the agent reads of a job
// is only files (jobs.go):
//
//   - shim.json (shimRecord), written once the job started, before the
//     reply: the shim's and the job leader's pid and start time, which
//     name those processes robustly (procIdentity);
//   - live.json (jobCounts): the output counts while the job runs,
//     rewritten at most every liveEvery when they changed;
//   - stdout, stderr: the kept output, appended as it comes;
//   - status.json: the final protocol.JobStatus.
//
// The agent signals the shim (SIGTERM: cancel) only after checking its
// identity. The shim has no parent-death signal; the job has one
// (SIGKILL, tied to the shim): if the shim itself dies (OOM killer,
// kill -9) the job's leader is killed with it instead of running on
// unsupervised, with its output pipes broken; the job is then "lost".
// Linux ties a parent-death signal to the thread that forked the child,
// not to the process: a Go program may fork from any OS thread, and the
// runtime ends an OS thread when a goroutine locked to it exits, which
// would deliver the signal while the shim lives. The shim therefore starts
// the job from its main goroutine locked to the main thread
// (runtime.LockOSThread, which is never undone), and that thread lives as
// long as the process.
//
// The files' formats are versioned (jobShimVersion), since after an
// upgrade an agent reads the files of a shim of the previous binary.

// jobShimArg is argv[1] of the job shim; jobShimEnv must be "1" as well,
// so that no ordinary command line starts it by accident.
const (
	jobShimArg     = "__tether-agent-job-shim"
	jobShimEnv     = "TETHER_AGENT_JOB_SHIM"
	jobShimVersion = 1
)

const (
	// maxShimSpec bounds the spec the shim reads (the environment and
	// argv; a script is in a file).
	maxShimSpec = 16 << 20
	// liveEvery is how often, at most, the shim rewrites live.json.
	liveEvery = 250 * time.Millisecond
)

// The shim runs before main (and before a test binary's TestMain), like
// the copy helper.
func init() {
	if len(os.Args) == 2 && os.Args[1] == jobShimArg && os.Getenv(jobShimEnv) == "1" {
		os.Exit(runJobShim(os.Stdin, os.Stdout, os.Stderr))
	}
}

// jobShimSpec is what the agent tells the shim about the job to run.
type jobShimSpec struct {
	Version int `json:"v"`
	// Dir is the job directory (DataDir/jobs/ID), where the shim creates
	// stdout and stderr and writes its files.
	Dir  string   `json:"dir"`
	Argv []string `json:"argv"`
	// Cwd is the job's working directory.
	Cwd string   `json:"cwd"`
	Env []string `json:"env"`
	// Cred is the account the job runs as; nil: the shim's own.
	Cred *jobCred `json:"cred,omitempty"`
	// Script: the job's standard input is Dir/script (bash -s); else
	// /dev/null.
	Script bool `json:"script,omitempty"`
	// Limit caps each output file, in bytes.
	Limit int64 `json:"limit"`
	// TimeoutMS ends the job that long after it started; 0: never.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// KillGraceMS is the wait between SIGTERM and SIGKILL.
	KillGraceMS int64 `json:"kill_grace_ms"`
	// Scope is the systemd unit the shim runs in, "" for none (recorded
	// in shim.json).
	Scope string `json:"scope,omitempty"`
	// Status is the job's status at its start (id, node, start time),
	// which status.json completes.
	Status protocol.JobStatus `json:"status"`
}

// jobCred is an account's credential in a spec.
type jobCred struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
}

// jobShimReply is the shim's one line on its standard output: the job's
// pid once it started, or why it could not (Code is a protocol error
// code, Error the message).
type jobShimReply struct {
	PID   int    `json:"pid,omitempty"`
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
}

// shimRecord is a job directory's shim.json.
type shimRecord struct {
	Version int          `json:"v"`
	Shim    procIdentity `json:"shim"`
	// Job is the job's leader; its pid is the job's process group.
	Job   procIdentity `json:"job"`
	Scope string       `json:"scope,omitempty"`
}

// jobCounts is a job directory's live.json, and the counts the shim keeps.
type jobCounts struct {
	StdoutBytes     int64 `json:"stdout_bytes"`
	StderrBytes     int64 `json:"stderr_bytes"`
	StdoutTruncated bool  `json:"stdout_truncated,omitempty"`
	StderrTruncated bool  `json:"stderr_truncated,omitempty"`
}

// Names of the files of a job directory.
const (
	jobFileMeta   = "meta.json"
	jobFileStatus = "status.json"
	jobFileShim   = "shim.json"
	jobFileLive   = "live.json"
	jobFileScript = "script"
	jobFileLog    = "shim.log"
)

// runJobShim is the shim's main; it returns its exit code: 0 once the job
// ended and status.json was written, 2 when the job could not start (the
// reply said why) or the shim failed.
func runJobShim(in, out, errw *os.File) int {
	// See the comment at the top: the job's parent-death signal belongs
	// to this thread, which must live as long as the process.
	runtime.LockOSThread()
	log := slog.New(slog.NewTextHandler(errw, nil)).With("component", "job-shim", "pid", os.Getpid())
	// Before anything else, so that a cancel sent the moment the agent
	// learned the job's pid is not the default action (death).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)

	reply := func(r jobShimReply) {
		if err := json.NewEncoder(out).Encode(r); err != nil {
			log.Error("write reply to the agent", "err", err)
		}
	}
	var spec jobShimSpec
	if err := json.NewDecoder(io.LimitReader(in, maxShimSpec)).Decode(&spec); err != nil {
		reply(jobShimReply{Code: protocol.CodeInternal, Error: fmt.Sprintf("job shim: read spec: %v", err)})
		return 2
	}
	if spec.Version != jobShimVersion {
		reply(jobShimReply{Code: protocol.CodeInternal, Error: fmt.Sprintf("job shim: spec version %d, want %d", spec.Version, jobShimVersion)})
		return 2
	}
	log = log.With("job_id", spec.Status.ID)
	s, rep := startShimJob(&spec, log)
	reply(rep)
	if s == nil {
		return 2
	}
	s.sigs = sigs
	if err := s.reserveStatus(); err != nil {
		log.Warn("reserve space for the job's final status", "err", err)
	}
	// Cut the last ties to the agent: its pipes.
	if err := detachStdio(in, out); err != nil {
		log.Warn("detach from the agent's pipes", "err", err)
	}
	defer func() {
		// A panic here: end the job rather than leave it unsupervised,
		// and record it as lost.
		if r := recover(); r != nil {
			log.Error("job shim panicked; killing the job's process group", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			syscall.Kill(-s.pgid, syscall.SIGKILL)
			st := s.spec.Status
			st.State = protocol.JobLost
			s.finish(st)
		}
	}()
	s.supervise()
	return 0
}

// detachStdio points the shim's standard input and output at /dev/null.
func detachStdio(in, out *os.File) error {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	return errors.Join(unix.Dup3(int(null.Fd()), int(in.Fd()), 0), unix.Dup3(int(null.Fd()), int(out.Fd()), 0))
}

// jobShim is the shim's state once the job started.
type jobShim struct {
	spec  *jobShimSpec
	log   *slog.Logger
	cmd   *exec.Cmd
	pgid  int
	pipes [2]*os.File // read ends of the job's stdout and stderr
	files [2]*os.File // the job directory's stdout and stderr
	sigs  chan os.Signal

	mu     sync.Mutex
	counts jobCounts
	dirty  bool      // counts changed since live.json was written
	errs   [2]string // the first write error of each output file
}

// jobFileReserve is the space the shim reserves at the job's start for its
// final status (reserveStatus): on a file system that filled up meanwhile,
// status.json is written into it rather than not at all (which would make
// the job lost, with a false explanation).
const (
	jobFileReserve = "status.reserve"
	reserveSize    = 8 << 10
)

// reserveStatus writes the reserve file (reserveSize bytes of spaces).
func (s *jobShim) reserveStatus() error {
	b := make([]byte, reserveSize)
	for i := range b {
		b[i] = ' '
	}
	return os.WriteFile(filepath.Join(s.spec.Dir, jobFileReserve), b, 0o600)
}

// writeStatus writes st to status.json; when that fails (ENOSPC, EIO), it
// writes it, with the failure in st.Error, over the reserve file's
// allocated bytes and renames that to status.json.
func (s *jobShim) writeStatus(st protocol.JobStatus) error {
	path := filepath.Join(s.spec.Dir, jobFileStatus)
	reserve := filepath.Join(s.spec.Dir, jobFileReserve)
	err := writeJSONFile(path, st)
	if err == nil {
		os.Remove(reserve)
		return nil
	}
	st.Error = joinErr(st.Error, fmt.Sprintf("write %s: %v (written into the space reserved at the job's start)", path, errnoText(err)))
	b, jerr := json.Marshal(st)
	if jerr != nil || len(b) > reserveSize {
		return err
	}
	f, oerr := os.OpenFile(reserve, os.O_WRONLY, 0)
	if oerr != nil {
		return errors.Join(err, oerr)
	}
	_, werr := f.WriteAt(b, 0)
	if werr == nil {
		werr = f.Truncate(int64(len(b)))
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(reserve, path)
	}
	if werr != nil {
		return errors.Join(err, werr)
	}
	return nil
}

// joinErr joins two error texts with "; ".
func joinErr(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// errnoText is err with its errno's name: "no space left on device
// (ENOSPC)".
func errnoText(err error) string {
	var en syscall.Errno
	if errors.As(err, &en) {
		if name := unix.ErrnoName(en); name != "" {
			return fmt.Sprintf("%v (%s)", err, name)
		}
	}
	return err.Error()
}

// startShimJob creates the output files, starts the job and writes
// shim.json. It returns the reply for the agent and, if the job started,
// the shim's state.
func startShimJob(spec *jobShimSpec, log *slog.Logger) (*jobShim, jobShimReply) {
	fail := func(code, format string, args ...any) (*jobShim, jobShimReply) {
		return nil, jobShimReply{Code: code, Error: fmt.Sprintf(format, args...)}
	}
	if len(spec.Argv) == 0 {
		return fail(protocol.CodeInternal, "job shim: empty argv")
	}
	var files [2]*os.File
	for i, name := range []string{"stdout", "stderr"} {
		f, err := os.OpenFile(filepath.Join(spec.Dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			for _, g := range files[:i] {
				g.Close()
			}
			return fail(protocol.CodeInternal, "create job %s file: %v", name, err)
		}
		files[i] = f
	}
	closeAll := func(fs ...*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir = spec.Cwd
	cmd.Env = spec.Env
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if c := spec.Cred; c != nil {
		attr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: c.Groups}
	}
	cmd.SysProcAttr = attr
	if spec.Script {
		f, err := os.Open(filepath.Join(spec.Dir, jobFileScript))
		if err != nil {
			closeAll(files[:]...)
			return fail(protocol.CodeInternal, "open job script: %v", err)
		}
		defer f.Close()
		cmd.Stdin = f
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(files[:]...)
		return fail(protocol.CodeInternal, "stdout pipe: %v", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(files[0], files[1], outR, outW)
		return fail(protocol.CodeInternal, "stderr pipe: %v", err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		closeAll(files[0], files[1], outR, errR)
		return fail(startFailCode(err, spec.Cwd), "%s", startFailure(cmd.Args[0], err, spec.Cwd))
	}
	s := &jobShim{spec: spec, log: log.With("job_pid", cmd.Process.Pid), cmd: cmd, pgid: cmd.Process.Pid,
		pipes: [2]*os.File{outR, errR}, files: files}
	rec := shimRecord{Version: jobShimVersion, Scope: spec.Scope}
	var errs [2]error
	rec.Shim, errs[0] = selfIdentity()
	rec.Job, errs[1] = identify(cmd.Process.Pid)
	if err := errors.Join(errs[:]...); err != nil {
		// Without shim.json the agent cannot find the job: do not run
		// one it cannot see.
		syscall.Kill(-s.pgid, syscall.SIGKILL)
		cmd.Wait()
		closeAll(files[0], files[1], outR, errR)
		return fail(protocol.CodeInternal, "record job shim: %v", err)
	}
	if err := writeJSONFile(filepath.Join(spec.Dir, jobFileShim), rec); err != nil {
		syscall.Kill(-s.pgid, syscall.SIGKILL)
		cmd.Wait()
		closeAll(files[0], files[1], outR, errR)
		return fail(protocol.CodeInternal, "write %s: %v", jobFileShim, err)
	}
	s.log.Info("detached job started", "scope", spec.Scope)
	return s, jobShimReply{PID: cmd.Process.Pid}
}

// supervise copies the job's output into its files, enforces its timeout
// and cancel, and writes status.json once the job exited and its output
// pipes were closed (or abandoned after a kill).
func (s *jobShim) supervise() {
	defer func() {
		for _, f := range s.pipes {
			f.Close()
		}
		for _, f := range s.files {
			f.Close()
		}
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	waitCh := make(chan error, 1)
	copyDone := make(chan struct{}, 2)
	wg.Add(3)
	go func() {
		defer wg.Done()
		waitCh <- s.cmd.Wait()
	}()
	for i := range s.pipes {
		go func() {
			defer wg.Done()
			defer func() { copyDone <- struct{}{} }()
			s.copyToFile(i)
		}()
	}

	grace := time.Duration(s.spec.KillGraceMS) * time.Millisecond
	var timeoutC, graceC, abandonC <-chan time.Time
	if s.spec.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(s.spec.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeoutC = t.C
	}
	live := time.NewTicker(liveEvery)
	defer live.Stop()
	var (
		exited, termSent, killSent, abandoned bool
		timedOut, cancelled                   bool
		copiers                               = 2
	)
	kill := func(sig syscall.Signal) {
		if err := syscall.Kill(-s.pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			s.log.Warn("kill detached job", "signal", signalName(sig), "err", err)
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
			graceC = time.After(grace)
		}
	}
	var waitErr error
	for !exited || copiers > 0 {
		select {
		case waitErr = <-waitCh:
			exited = true
		case <-copyDone:
			copiers--
		case <-timeoutC:
			timeoutC = nil
			timedOut = true
			s.log.Info("detached job timed out; killing its process group")
			end()
		case sig := <-s.sigs:
			if !exited && !timedOut {
				cancelled = true
			}
			s.log.Info("detached job cancelled; killing its process group", "signal", sig.String())
			end()
		case <-graceC:
			graceC = nil
			killSent = true
			kill(syscall.SIGKILL)
		case <-abandonC:
			abandonC = nil
			abandoned = true
			s.log.Warn("detached job's output pipes still open after killing its group; abandoning them")
			s.pipes[0].SetReadDeadline(time.Now())
			s.pipes[1].SetReadDeadline(time.Now())
		case <-live.C:
			s.writeLive()
		}
		if exited && killSent && !abandoned && abandonC == nil && copiers > 0 {
			abandonC = time.After(grace)
		}
	}
	// SIGTERM was sent but not SIGKILL: give the rest of the group its
	// grace, then kill what is left (zombies are dead: groupWatch).
	group := groupWatch{pgid: s.pgid}
	for termSent && !killSent && group.alive() {
		select {
		case <-graceC:
			killSent = true
			kill(syscall.SIGKILL)
		case <-time.After(groupPoll):
		}
	}

	code := -1
	var signame string
	if ps := s.cmd.ProcessState; ps != nil {
		ws, ok := ps.Sys().(syscall.WaitStatus)
		if ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
			signame = signalName(ws.Signal())
		} else {
			code = ps.ExitCode()
		}
	} else {
		s.log.Warn("wait for detached job", "err", waitErr)
	}
	if timedOut {
		code = 124
	}
	st := s.spec.Status
	st.State = protocol.JobExited
	st.ExitCode = &code
	st.Signal = signame
	st.TimedOut = timedOut
	st.Cancelled = cancelled
	s.finish(st)
	s.log.Info("detached job finished", "exit_code", code, "signal", signame, "timed_out", timedOut, "cancelled", cancelled)
}

// finish completes st with the counts and the finish time and writes it
// to status.json.
func (s *jobShim) finish(st protocol.JobStatus) {
	s.mu.Lock()
	c, errs := s.counts, s.errs
	s.mu.Unlock()
	st.StdoutBytes, st.StderrBytes = c.StdoutBytes, c.StderrBytes
	st.StdoutTruncated, st.StderrTruncated = c.StdoutTruncated, c.StderrTruncated
	for _, e := range errs {
		if e != "" {
			st.Error = joinErr(st.Error, e)
		}
	}
	now := time.Now().UTC()
	st.FinishedAt = &now
	if err := s.writeStatus(st); err != nil {
		s.log.Error("write detached job status", "err", err)
	}
}

// writeLive rewrites live.json if the counts changed since it was last
// written.
func (s *jobShim) writeLive() {
	s.mu.Lock()
	c, dirty := s.counts, s.dirty
	s.dirty = false
	s.mu.Unlock()
	if !dirty {
		return
	}
	if err := writeJSONFile(filepath.Join(s.spec.Dir, jobFileLive), c); err != nil {
		s.log.Warn("write live counts", "err", err)
	}
}

// copyToFile copies output pipe i (0 stdout, 1 stderr) into its file,
// keeping at most the limit and counting everything.
func (s *jobShim) copyToFile(i int) {
	r, f := s.pipes[i], s.files[i]
	buf := make([]byte, protocol.ChunkSize)
	var kept int64
	writeFailed := false
	for {
		n, err := r.Read(buf)
		if n > 0 {
			keep := max(min(int64(n), s.spec.Limit-kept), 0)
			if keep > 0 && !writeFailed {
				if _, werr := f.Write(buf[:keep]); werr != nil {
					// Recorded in the job's final status: the output
					// kept is incomplete from here on.
					s.log.Warn("write detached job output", "file", f.Name(), "err", werr)
					writeFailed = true
					s.mu.Lock()
					s.errs[i] = fmt.Sprintf("write %s: %s; output from byte %d on was dropped", f.Name(), errnoText(werr), kept)
					s.mu.Unlock()
				}
				kept += keep
			}
			s.mu.Lock()
			if i == 1 {
				s.counts.StderrBytes += int64(n)
				s.counts.StderrTruncated = s.counts.StderrTruncated || keep < int64(n)
			} else {
				s.counts.StdoutBytes += int64(n)
				s.counts.StdoutTruncated = s.counts.StdoutTruncated || keep < int64(n)
			}
			s.dirty = true
			s.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}
