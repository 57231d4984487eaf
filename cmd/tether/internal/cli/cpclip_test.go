package cli

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// cp's messages show a path of kilobytes by its start and end (fresh-user
// pass: a 4 KB path was printed whole, two or three times per error).
func TestCpMessagesClipLongPaths(t *testing.T) {
	long := "/tmp/" + strings.Repeat("a/", 2100) + "x"
	end := copyEnd{node: "vm", path: long}
	s := end.String()
	if len(s) > maxShown+40 || !strings.HasPrefix(s, "vm:/tmp/a/a/") || !strings.HasSuffix(s, "a/x") || !strings.Contains(s, "…(4206 bytes)…") {
		t.Errorf("copyEnd.String() of a %d byte path = %q", len(long), s)
	}
	err := cpError(exitFailure, end, copyEnd{path: "./o"}, long+": "+strings.Repeat("é", 300)+": file name too long")
	if msg := err.Error(); len(msg) > 3*(maxShown+40) || !strings.HasSuffix(msg, ": file name too long") || !utf8.ValidString(msg) {
		t.Errorf("cpError = %d bytes %q", len(msg), msg)
	}
	if short := (copyEnd{node: "vm", path: "/tmp/x"}).String(); short != "vm:/tmp/x" {
		t.Errorf("a short path: %q", short)
	}
}
