package protocol

import (
	"strings"
	"testing"
)

// TestInvalidUTF8At: the first byte that is not UTF-8, counted from 1,
// also inside or at the end of a cut sequence; 0 for valid UTF-8 (U+FFFD
// written as itself is valid).
func TestInvalidUTF8At(t *testing.T) {
	for s, want := range map[string]int{
		"": 0, "héllo": 0, "\uFFFD": 0, "\xff": 1, "a\xc3(": 2, "ab\xe2\x82": 3, "é\x80é": 3,
	} {
		if got := InvalidUTF8At(s); got != want {
			t.Errorf("InvalidUTF8At(%q) = %d, want %d", s, got, want)
		}
	}
}

// TestParamsValidateUTF8: exec and pty params refuse a string that JSON
// would carry as U+FFFD, naming the field and the byte.
func TestParamsValidateUTF8(t *testing.T) {
	exec := ExecParams{Argv: []string{"ls", "x\xff"}}
	if err := exec.Validate(); err == nil || !strings.Contains(err.Error(), "argv[1]: not valid UTF-8 at byte 2") {
		t.Errorf("exec params: %v", err)
	}
	pty := PTYParams{Term: "xterm\xff", Rows: 24, Cols: 80}
	if err := pty.Validate(); err == nil || !strings.Contains(err.Error(), "term: not valid UTF-8 at byte 6") {
		t.Errorf("pty params: %v", err)
	}
}
