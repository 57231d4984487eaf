package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCredsFileErrors: a NATS credentials file that cannot be used is
// named once, with where it came from and what is wrong with it in the
// user's terms: no "natsauth:" prefix, no Go "open PATH:" operation, no
// doubled path (issue 13).
func TestCredsFileErrors(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "loose.creds")
	junk := filepath.Join(dir, "junk.creds")
	if err := os.WriteFile(loose, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(junk, []byte("not credentials\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "none.creds")
	for _, tt := range []struct {
		name string
		vars map[string]string
		args []string
		want string
	}{
		{"missing, from the variable", map[string]string{natsCredsEnv: missing}, nil,
			"tether: NATS credentials file " + missing + " (from $" + natsCredsEnv + "): no such file or directory"},
		{"mode, from the flag", nil, []string{"--nats-creds", loose},
			"tether: NATS credentials file " + loose + " (from --nats-creds): mode 0644 lets the group or others access it"},
		{"a directory", nil, []string{"--nats-creds", dir},
			"tether: NATS credentials file " + dir + " (from --nats-creds): not a regular file (a directory)"},
		{"not credentials", nil, []string{"--nats-creds", junk},
			"tether: NATS credentials file " + junk + " (from --nats-creds): not NATS user credentials"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"nodes", "--nats-url", "nats://127.0.0.1:1"}, tt.args...)
			r := runCLI(testCtx(t), tt.vars, "", args...)
			if r.code == 0 || !strings.Contains(r.stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want %q", r.code, r.stderr, tt.want)
			}
			for _, bad := range []string{"natsauth:", "open /", "stat /"} {
				if strings.Contains(r.stderr, bad) {
					t.Errorf("stderr %q has %q", r.stderr, bad)
				}
			}
			// The path once, besides the hint that repeats it as a command.
			p := strings.Fields(tt.want)[4]
			if strings.Count(strings.ReplaceAll(r.stderr, "(chmod 600 "+p+")", ""), p) != 1 {
				t.Errorf("stderr %q names %s more than once", r.stderr, p)
			}
		})
	}
}
