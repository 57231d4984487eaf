package mirror

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReceiveStageErrorNamesTheDirectory: a destination whose directory
// takes no new entries (/proc: mkdir there fails with ENOENT although it
// exists) is refused naming that directory and what the copy tried to
// create there, not "create stage" (the receiver's own word).
func TestReceiveStageErrorNamesTheDirectory(t *testing.T) {
	src := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, recv, _ := runCopy(t, src, "/proc/tether-test-absent", Options{})
	if recv.err == nil {
		t.Fatal("copy into /proc succeeded")
	}
	msg := recv.err.Error()
	if strings.Contains(msg, "stage") || !strings.Contains(msg, "in /proc") {
		t.Errorf("receive into /proc: %q; want the directory /proc named, and no \"stage\"", msg)
	}
}
