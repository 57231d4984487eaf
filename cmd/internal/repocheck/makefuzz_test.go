package repocheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fakeGo stands in for the go command under `make fuzz`: two packages,
// four fuzz targets, of which FuzzB fails and FuzzD ends in Go's fuzztime
// deadline race (go.dev/issue/75804) with no input written; each target reports two
// progress lines, the last with 7 times the length of its -fuzz pattern
// as its execs (49 for "^FuzzA$").
const fakeGo = `#!/bin/bash
case "$1 $2" in
"list -m") echo example.com/m ;;
"list ./...") echo example.com/m/a; echo example.com/m/b ;;
"test -list") if [ "$4" = example.com/m/a ]; then printf 'FuzzA\nFuzzB\nok\n'; else printf 'FuzzC\nFuzzD\nok\n'; fi ;;
"test -run")
	pat=$5
	echo "fuzz: elapsed: 0s, gathering baseline coverage: 0/3 completed"
	echo "fuzz: elapsed: 3s, execs: 5 (2/sec), new interesting: 0 (total: 3)"
	echo "fuzz: elapsed: 4s, execs: $(( ${#pat} * 7 )) (1/sec), new interesting: 0 (total: 3)"
	if [ "$pat" = '^FuzzB$' ]; then printf -- '--- FAIL: FuzzB (1.00s)\n    --- FAIL: FuzzB (0.00s)\n        x_test.go:1: boom\n    Failing input written to testdata/fuzz/FuzzB/1\n'; exit 1; fi
	if [ "$pat" = '^FuzzD$' ]; then printf -- '--- FAIL: FuzzD (1.00s)\n    context deadline exceeded\nFAIL\n'; exit 1; fi
	echo PASS ;;
*) echo "fake go: unexpected $*" >&2; exit 3 ;;
esac
`

// TestMakeFuzzSummary runs the Makefile's fuzz target with a fake go
// command: every target runs although one fails, the table at the end
// lists each with the executions of its last progress line and its
// result (the deadline race is not a failure), and make fails.
func TestMakeFuzzSummary(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	goBin := filepath.Join(t.TempDir(), "go")
	if err := os.WriteFile(goBin, []byte(fakeGo), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "--no-print-directory", "-C", moduleRoot, "fuzz", "GO="+goBin, "FUZZTIME=1s")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("make fuzz succeeded with a failing target:\n%s", out)
	}
	text := string(out)
	for _, row := range []string{`a\s+FuzzA\s+49\s+ok`, `a\s+FuzzB\s+49\s+FAIL`, `b\s+FuzzC\s+49\s+ok`, `b\s+FuzzD\s+49\s+ok-deadline-race`} {
		if !regexp.MustCompile(`(?m)^` + row + `\s*$`).MatchString(text) {
			t.Errorf("summary has no row %q:\n%s", row, text)
		}
	}
	if i, j := strings.Index(text, "==> example.com/m/b FuzzC"), strings.Index(text, "--- FAIL: FuzzB"); i < 0 || i < j {
		t.Errorf("FuzzC did not run after FuzzB failed:\n%s", text)
	}
}
