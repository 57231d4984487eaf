package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

func writeFile(path string) error { return os.WriteFile(path, []byte("x"), 0o600) }

// jobOp runs one job stream and returns its answer.
func (h *harness) jobOp(t *testing.T, p protocol.JobParams) *execStream {
	t.Helper()
	e := h.open(t, protocol.KindJob, p)
	e.finish(t)
	return e
}

func (h *harness) jobStatus(t *testing.T, id string) protocol.JobStatus {
	t.Helper()
	e := h.jobOp(t, protocol.JobParams{Op: protocol.JobOpStatus, ID: id})
	if e.errInfo != nil {
		t.Fatalf("status of job %s: %v", id, e.errInfo)
	}
	var st protocol.JobStatus
	if err := json.Unmarshal(e.job, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// reconnect gives the harness's agent a fresh tunnel session, as after a
// redial.
func (h *harness) reconnect(t *testing.T) {
	t.Helper()
	h.client.Close()
	select {
	case <-h.done:
	case <-time.After(testWait):
		t.Fatal("serveStreams did not return after the session closed")
	}
	client, srv := tunneltest.Pair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.a.serveStreams(ctx, client)
	}()
	h.client, h.srv, h.done = client, srv, done
	t.Cleanup(func() {
		cancel()
		client.Close()
		<-done
	})
}

func TestDetachedJobSurvivesTunnelLoss(t *testing.T) {
	t.Parallel()
	var dataDir string
	h := newHarness(t, func(c *Config) { dataDir = c.DataDir })
	t.Cleanup(h.a.jobs.wg.Wait)
	release := filepath.Join(t.TempDir(), "release")
	script := "echo out1\necho err1 >&2\nwhile [ ! -e " + release + " ]; do sleep 0.02; done\necho out2\nexit 3"
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Script: script, Detach: true, JobID: "job-1"})
	e.finish(t)
	if e.exit == nil || !e.exit.Detached {
		t.Fatalf("exit = %+v, error %v; want detached", e.exit, e.errInfo)
	}
	if st := h.jobStatus(t, "job-1"); st.State != protocol.JobRunning || st.ExitCode != nil || st.Node != "node-a" {
		t.Fatalf("status = %+v, want running", st)
	}

	// The tunnel drops: the job keeps running.
	h.reconnect(t)
	if st := h.jobStatus(t, "job-1"); st.State != protocol.JobRunning {
		t.Fatalf("status after reconnect = %+v, want running", st)
	}
	if err := writeFile(release); err != nil {
		t.Fatal(err)
	}
	var st protocol.JobStatus
	waitFor(t, testWait, "job exit", func() bool {
		st = h.jobStatus(t, "job-1")
		return st.State == protocol.JobExited
	})
	if st.ExitCode == nil || *st.ExitCode != 3 || st.FinishedAt == nil || st.StdoutBytes != 10 || st.StderrBytes != 5 {
		t.Errorf("status = %+v", st)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "jobs", "job-1", "status.json")); err != nil {
		t.Errorf("status.json: %v", err)
	}

	// Output, whole and in pages.
	for _, tt := range []struct {
		stream        string
		offset, limit int64
		want          string
		eof           bool
	}{
		{"stdout", 0, 0, "out1\nout2\n", true},
		{"stderr", 0, 0, "err1\n", true},
		{"stdout", 2, 3, "t1\n", false},
		{"stdout", 7, 100, "t2\n", true},
		{"stdout", 50, 0, "", true},
	} {
		e := h.jobOp(t, protocol.JobParams{Op: protocol.JobOpOutput, ID: "job-1", Stream: tt.stream, Offset: tt.offset, Limit: tt.limit})
		var end protocol.JobOutputEnd
		if e.errInfo != nil || json.Unmarshal(e.job, &end) != nil {
			t.Fatalf("output %+v: error %v, answer %q", tt, e.errInfo, e.job)
		}
		if got := e.stdout.String(); got != tt.want || end.EOF != tt.eof || end.Total != map[string]int64{"stdout": 10, "stderr": 5}[tt.stream] {
			t.Errorf("output %+v = %q %+v", tt, got, end)
		}
	}

	// A second job with the same id is refused; an unknown id is not found.
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}, Detach: true, JobID: "job-1"})
	e.finish(t)
	if e.errInfo == nil || !strings.Contains(e.errInfo.Message, "already exists") {
		t.Errorf("duplicate job: %+v %+v", e.exit, e.errInfo)
	}
	e = h.jobOp(t, protocol.JobParams{Op: protocol.JobOpStatus, ID: "nope"})
	if e.errInfo == nil || e.errInfo.Code != codeJobNotFound {
		t.Errorf("unknown job: %+v", e.errInfo)
	}
}

func TestDetachedJobCancelTimeoutAndLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.OutputLimit = 1000 })
	t.Cleanup(h.a.jobs.wg.Wait)
	start := func(id string, p protocol.ExecParams) {
		t.Helper()
		p.Detach, p.JobID = true, id
		e := h.open(t, protocol.KindExec, p)
		e.finish(t)
		if e.exit == nil || !e.exit.Detached {
			t.Fatalf("job %s: exit = %+v, error %v", id, e.exit, e.errInfo)
		}
	}
	start("c", protocol.ExecParams{Argv: []string{"sleep", "30"}})
	start("t", protocol.ExecParams{Argv: []string{"sleep", "30"}, TimeoutMS: 200})
	start("big", protocol.ExecParams{Script: "head -c 5000 /dev/zero"})

	e := h.jobOp(t, protocol.JobParams{Op: protocol.JobOpCancel, ID: "c"})
	var st protocol.JobStatus
	if e.errInfo != nil || json.Unmarshal(e.job, &st) != nil {
		t.Fatalf("cancel: %v %q", e.errInfo, e.job)
	}
	if st.State != protocol.JobExited || !st.Cancelled || st.ExitCode == nil || *st.ExitCode != 128+15 {
		t.Errorf("cancelled job = %+v", st)
	}
	waitFor(t, testWait, "timeout", func() bool { return h.jobStatus(t, "t").State == protocol.JobExited })
	if st := h.jobStatus(t, "t"); !st.TimedOut || *st.ExitCode != 124 {
		t.Errorf("timed out job = %+v", st)
	}
	waitFor(t, testWait, "big job", func() bool { return h.jobStatus(t, "big").State == protocol.JobExited })
	if st := h.jobStatus(t, "big"); st.StdoutBytes != 5000 || !st.StdoutTruncated {
		t.Errorf("big job = %+v", st)
	}
	e = h.jobOp(t, protocol.JobParams{Op: protocol.JobOpOutput, ID: "big", Stream: "stdout"})
	if e.stdout.Len() != 1000 {
		t.Errorf("big job output: %d bytes, want the 1000 byte limit", e.stdout.Len())
	}
}

func TestDetachedJobsExpireAndLost(t *testing.T) {
	t.Parallel()
	var dataDir string
	h := newHarness(t, func(c *Config) { dataDir = c.DataDir; c.JobRetention = 300 * time.Millisecond })
	t.Cleanup(h.a.jobs.wg.Wait)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}, Detach: true, JobID: "old"})
	e.finish(t)
	waitFor(t, testWait, "exit", func() bool { return h.jobStatus(t, "old").State == protocol.JobExited })

	// A job directory left by an agent process that stopped mid-job.
	lost := filepath.Join(dataDir, "jobs", "lost")
	if err := os.MkdirAll(lost, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeJSONFile(filepath.Join(lost, "meta.json"), protocol.JobStatus{ID: "lost", Node: "node-a", State: protocol.JobRunning, StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if st := h.jobStatus(t, "lost"); st.State != protocol.JobLost {
		t.Errorf("lost job = %+v", st)
	}

	waitFor(t, testWait, "expiry", func() bool {
		h.a.sweepJobs(true)
		_, err := os.Stat(filepath.Join(dataDir, "jobs", "old"))
		return os.IsNotExist(err)
	})
}
