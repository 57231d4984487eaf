package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestExecScriptThatNeverComes: `--script` on a FIFO nobody writes reads
// as an empty script (it used to wait in open for a writer, past SIGINT
// and SIGTERM), and one whose writer never writes (`--script <(sleep 1h)`)
// is given up when the command's context ends (Ctrl-C: exit 130).
func TestExecScriptThatNeverComes(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := runCLI(ctx, nil, "", "exec", "--node", "n1", "--script", fifo)
	if ctx.Err() != nil || r.code != exitUsage || !strings.Contains(r.stderr, "the script file is empty") {
		t.Errorf("FIFO without a writer: exit %d (ctx %v), stderr %q; want exit 2, the script file is empty", r.code, ctx.Err(), r.stderr)
	}

	// A writer that holds the FIFO open and writes nothing.
	w, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ictx, icancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, icancel) // Ctrl-C
	done := make(chan result, 1)
	go func() { done <- runCLI(ictx, nil, "", "exec", "--node", "n1", "--script", fifo) }()
	select {
	case r := <-done:
		if r.code != exitInterrupted || !strings.Contains(r.stderr, "interrupted") {
			t.Errorf("interrupted while reading the script: exit %d, stderr %q; want 130, interrupted", r.code, r.stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("exec --script on a silent FIFO did not end when its context did")
	}
}
