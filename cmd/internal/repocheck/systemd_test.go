package repocheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSystemdUnitsVerify runs systemd/verify.sh (systemd-analyze verify,
// any message a failure) on the units, with ExecStart pointed at this test
// binary: verify only checks that the command is an executable. Skipped
// where systemd-analyze is missing (CI installs it: .ci/run).
func TestSystemdUnitsVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed (Debian package systemd)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(moduleRoot, "systemd", "verify.sh"), self)
	cmd.Env = append(os.Environ(), "REQUIRE_SYSTEMD_ANALYZE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("systemd/verify.sh: %v\n%s", err, out)
	}
}

// TestSystemdUnitsNotify checks what the daemons' sd_notify support
// relies on in both units: Type=notify, NotifyAccess=main (no job can
// speak for the daemon), Restart=always and a watchdog.
func TestSystemdUnitsNotify(t *testing.T) {
	for _, unit := range []string{"tether-agent.service", "tether-coordinator.service"} {
		b, err := os.ReadFile(filepath.Join(moduleRoot, "systemd", unit))
		if err != nil {
			t.Fatal(err)
		}
		keys := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && regexp.MustCompile(`^[A-Za-z]+$`).MatchString(k) {
				keys[k] = v
			}
		}
		for k, want := range map[string]string{"Type": "notify", "NotifyAccess": "main", "Restart": "always"} {
			if keys[k] != want {
				t.Errorf("%s: %s=%q, want %q", unit, k, keys[k], want)
			}
		}
		if !regexp.MustCompile(`^[1-9][0-9]*(s|min)$`).MatchString(keys["WatchdogSec"]) {
			t.Errorf("%s: WatchdogSec=%q, want a positive duration", unit, keys["WatchdogSec"])
		}
	}
}
