package jobstore

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestCommandMarksWhatItLeavesOut: a record's command is its script's
// first line, at most 120 bytes, and says when it is not the whole
// script: "…" where the line was cut, and the number of lines when more
// follow, as job list's COMMAND column shows it (a batch or script showed
// its first line with no mark; fresh-user pass cliux19).
func TestCommandMarksWhatItLeavesOut(t *testing.T) {
	long := strings.Repeat("x", 200)
	for _, tc := range []struct{ script, want string }{
		{"sleep 100", "sleep 100"},
		{"echo hi\n", "echo hi"},
		{"\n  echo hi  \n\n", "echo hi"},
		{"echo a\necho b", "echo a … (2 lines)"},
		{"#!/bin/bash\nset -e\nmake\n", "#!/bin/bash … (3 lines)"},
		{long, long[:117] + "…"},
	} {
		if got := command(tc.script); got != tc.want {
			t.Errorf("command(%q) = %q, want %q", tc.script, got, tc.want)
		}
	}
	got := command(long + "\nnext")
	if len(got) > 120 || !utf8.ValidString(got) || !strings.HasSuffix(got, "… (2 lines)") || strings.Contains(got, "… …") {
		t.Errorf("a long first line of two: %q (%d bytes); want at most 120, ending \"… (2 lines)\"", got, len(got))
	}
}
