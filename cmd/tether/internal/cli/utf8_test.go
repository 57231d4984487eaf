package cli

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

// Bytes that are not UTF-8 in what exec sends as JSON strings (script,
// -c, argv, env, cwd) would reach the node as U+FFFD: a different command.
// The CLI refuses them as a usage error before sending anything.
func TestExecRefusesInvalidUTF8(t *testing.T) {
	script := filepath.Join(t.TempDir(), "l1.sh")
	if err := os.WriteFile(script, []byte("echo caf\xe9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"exec", "--nats-url", unreachableNATS, "--node", "n1"}
	for _, tt := range []struct {
		name  string
		args  []string
		stdin string
		want  string
	}{
		{"script file", []string{"--script", script}, "", "--script " + script + ": not valid UTF-8 at byte 9 (Tether sends commands as UTF-8 text; convert the file, e.g. with iconv)"},
		{"script stdin", []string{"--script", "-"}, "echo caf\xe9\n", "--script -: not valid UTF-8 at byte 9"},
		{"script with NUL", []string{"--script", "-"}, "echo a\x00b\n", "--script -: a NUL byte at byte 7 (a script is text; bash would drop it)"},
		{"-c", []string{"-c", "true", "-c", "echo caf\xe9"}, "", "-c command 2: not valid UTF-8 at byte 9"},
		{"argv", []string{"--", "ls", "/tmp/\xff"}, "", "argument 2: not valid UTF-8 at byte 6"},
		{"env value", []string{"--env", "X=caf\xe9", "--", "true"}, "", "--env X: value not valid UTF-8 at byte 4"},
		{"env name", []string{"--env", "X\xff=1", "--", "true"}, "", `--env "X\xff": name not valid UTF-8 at byte 2`},
		{"cwd", []string{"--cwd", "/tmp/\xff", "--", "true"}, "", "--cwd: not valid UTF-8 at byte 6"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(testCtx(t), nil, tt.stdin, append(append([]string(nil), base...), tt.args...)...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", r.code, clipForLog(r.stderr), exitUsage, tt.want)
			}
			if strings.Contains(r.stderr, "connect to NATS") {
				t.Errorf("the command tried to reach the coordinator: %q", clipForLog(r.stderr))
			}
		})
	}
}

// tether shell sends argv, env and cwd as JSON strings too.
func TestShellRefusesInvalidUTF8(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"argv", []string{"--", "ls", "/tmp/\xff"}, "argument 2: not valid UTF-8 at byte 6"},
		{"env value", []string{"--env", "X=caf\xe9"}, "--env X: value not valid UTF-8 at byte 4"},
		{"cwd", []string{"--cwd", "/tmp/\xff"}, "--cwd: not valid UTF-8 at byte 6"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"shell", "--nats-url", unreachableNATS}
			if tt.args[0] == "--" {
				args = append(append(args, "n1"), tt.args...)
			} else {
				args = append(append(args, tt.args...), "n1")
			}
			r := runCLI(testCtx(t), nil, "", args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", r.code, clipForLog(r.stderr), exitUsage, tt.want)
			}
		})
	}
}

// Standard input is bytes, not a JSON string: bytes that are not UTF-8
// reach the command unchanged, streamed (--node) and buffered (--stdin on
// several nodes: base64 in the request).
func TestExecBinaryStdinUnchanged(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 2})
	url := f.NATS.ClientURL()
	data := []byte("caf\xe9 \xff\xfe\x80\n")
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	r := runCLIWith(testCtx(t), nil, bytes.NewReader(data), "exec", "--nats-url", url, "--node", "node-0", "--", "sha256sum")
	if r.code != 0 || !strings.HasPrefix(r.stdout, want) {
		t.Errorf("--node: exit %d, stdout %q, want %s; stderr %q", r.code, r.stdout, want, r.stderr)
	}
	r = runCLIWith(testCtx(t), nil, bytes.NewReader(data), "exec", "--nats-url", url, "--all", "--stdin", "--", "sha256sum")
	if r.code != 0 || strings.Count(r.stdout, want) != 2 {
		t.Errorf("--all --stdin: exit %d, stdout %q, want %s twice; stderr %q", r.code, r.stdout, want, r.stderr)
	}
}
