package cli

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/client"
)

// $TETHER_DIRECT takes the documented values in any case; anything else
// is an error naming the variable, the value and the accepted values,
// never the default (TETHER_DIRECT=onlyy must not fall back silently).
func TestDirectEnv(t *testing.T) {
	for v, want := range map[string]client.DirectMode{
		"": client.DirectAuto, "auto": client.DirectAuto, " 1 ": client.DirectAuto, "TRUE": client.DirectAuto, "on": client.DirectAuto, "yes": client.DirectAuto,
		"0": client.DirectOff, "false": client.DirectOff, "Off": client.DirectOff, "no": client.DirectOff,
		"only": client.DirectOnly, "ONLY": client.DirectOnly,
	} {
		got, err := directMode(testGetenv(map[string]string{directEnv: v}))
		if err != nil || got != want {
			t.Errorf("%s=%q: %v, %v; want %v", directEnv, v, got, err, want)
		}
	}
	for _, v := range []string{"onlyy", "2", "direct", "o n l y"} {
		_, err := directMode(testGetenv(map[string]string{directEnv: v}))
		if err == nil {
			t.Errorf("%s=%q: no error", directEnv, v)
			continue
		}
		for _, s := range []string{"TETHER_DIRECT", `"` + v + `"`, "auto", "off", "only"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s=%q: error %q does not name %s", directEnv, v, err, s)
			}
		}
	}
	// Through the command line: a usage error, before any connection
	// (the NATS URL is one nothing listens on).
	r := runCLI(testCtx(t), map[string]string{directEnv: "onlyy", natsURLEnv: "nats://127.0.0.1:1"}, "", "nodes")
	if r.code != exitUsage || !strings.Contains(r.stderr, `$TETHER_DIRECT "onlyy"`) || strings.Contains(r.stderr, "connect to NATS") {
		t.Errorf("TETHER_DIRECT=onlyy tether nodes: exit %d, stderr %q; want %d naming the variable and value", r.code, r.stderr, exitUsage)
	}
}
