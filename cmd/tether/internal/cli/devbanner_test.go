package cli

import (
	"strings"
	"testing"
)

// The dev banner's console line gives a URL a browser on this machine is
// admitted at (dev has no console tokens: loopback callers only), and for
// a non-loopback --http-addr says that none is and what works instead.
func TestDevBannerConsoleLine(t *testing.T) {
	o := &devOptions{DataDir: t.TempDir()}
	for addr, want := range map[string][]string{
		"127.0.0.1:7080":  {"http://127.0.0.1:7080/console/ (a browser on this machine)"},
		"0.0.0.0:7080":    {"http://127.0.0.1:7080/console/"},
		"[::]:7080":       {"http://127.0.0.1:7080/console/"},
		"192.0.2.2:24080": {"loopback callers only", "--http-addr 127.0.0.1:24080", "ssh -L 24080:127.0.0.1:24080"},
	} {
		b := devBanner(o, coordinatorInfo{AdminAddr: addr, NATSURL: defaultNATSURL}, "_INBOX_U", "vm", "")
		for _, w := range want {
			if !strings.Contains(b, w) {
				t.Errorf("--http-addr %s: banner lacks %q:\n%s", addr, w, b)
			}
		}
		if strings.Contains(b, "http://192.0.2.2:24080/console/ (a browser on this machine)") {
			t.Errorf("--http-addr %s: banner sends a local browser to a URL that refuses it:\n%s", addr, b)
		}
	}
}
