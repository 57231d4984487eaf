package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// newWriteErrShim is a shim whose stdout file is /dev/full (every write
// fails with ENOSPC), fed by a pipe holding out.
func newWriteErrShim(t *testing.T, out string) *jobShim {
	t.Helper()
	dir := t.TempDir()
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	t.Cleanup(func() { full.Close() })
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString(out)
	w.Close()
	t.Cleanup(func() { r.Close() })
	s := &jobShim{
		spec: &jobShimSpec{Dir: dir, Limit: 1 << 20, Status: protocol.JobStatus{ID: "j", Node: "n", StartedAt: time.Now()}},
		log:  slog.New(slog.DiscardHandler),
	}
	s.pipes[0], s.files[0] = r, full
	return s
}

// TestJobShimOutputWriteErrorRecorded: a detached job's output file that
// cannot be written (ENOSPC here) is named, with the errno, in the job's
// final status, which the coordinator records as the node's error.
func TestJobShimOutputWriteErrorRecorded(t *testing.T) {
	s := newWriteErrShim(t, "some output\n")
	s.copyToFile(0)
	code := 0
	s.finish(protocol.JobStatus{ID: "j", Node: "n", State: protocol.JobExited, ExitCode: &code, StartedAt: s.spec.Status.StartedAt})
	var st protocol.JobStatus
	if err := readJSONFile(filepath.Join(s.spec.Dir, jobFileStatus), &st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Error, "/dev/full") || !strings.Contains(st.Error, "no space left on device") {
		t.Errorf("status error %q, want it to name the file and ENOSPC", st.Error)
	}
	r := protocol.JobRecord{ID: "j", Nodes: []string{"n"}, State: protocol.JobStateRunning}
	if _, err := protocol.ObserveJob(&r, &st, time.Now()); err != nil {
		t.Fatal(err)
	}
	if len(r.Results) != 1 || !strings.Contains(r.Results[0].Error, "no space left on device") || r.State == protocol.JobSucceeded {
		t.Errorf("record after the status: %+v, want a failed result naming ENOSPC", r)
	}
}

// TestJobShimStatusWriteErrorNotLost: when status.json cannot be written
// (its temporary file here is a directory, as a full disk refuses a new
// file), the shim writes the status into the space it reserved at the
// job's start, saying why, so that the job is not reported lost.
func TestJobShimStatusWriteErrorNotLost(t *testing.T) {
	s := newWriteErrShim(t, "")
	if err := s.reserveStatus(); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(s.spec.Dir, jobFileStatus+".tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	code := 3
	s.finish(protocol.JobStatus{ID: "j", Node: "n", State: protocol.JobExited, ExitCode: &code, StartedAt: s.spec.Status.StartedAt})
	var st protocol.JobStatus
	if err := readJSONFile(filepath.Join(s.spec.Dir, jobFileStatus), &st); err != nil {
		t.Fatalf("no status.json: %v", err)
	}
	if st.State != protocol.JobExited || st.ExitCode == nil || *st.ExitCode != 3 || !strings.Contains(st.Error, jobFileStatus) {
		t.Errorf("status %+v, want exited 3 with an error naming %s", st, jobFileStatus)
	}
}
