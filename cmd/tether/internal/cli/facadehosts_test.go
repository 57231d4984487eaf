package cli

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// --facade-allowed-hosts takes names only, and says which entry is not.
func TestFacadeAllowedHostsValidated(t *testing.T) {
	o := defaultSandboxOptions()
	o.AllowedHosts = []string{"osb.example", "https://osb.example", "osb.example:7082"}
	err := o.Validate()
	if err == nil || !strings.Contains(err.Error(), "--facade-allowed-hosts") || !strings.Contains(err.Error(), `"https://osb.example"`) || !strings.Contains(err.Error(), `"osb.example:7082"`) {
		t.Fatalf("Validate = %v, want both bad entries named", err)
	}
	d := defaultDevOptions()
	d.AllowedHosts = []string{"*"}
	if err := d.Validate(); err == nil || !strings.Contains(err.Error(), `"*"`) {
		t.Fatalf("dev Validate = %v, want the bad entry named", err)
	}
}

// A coordinator with --facade-allowed-hosts answers to those names on its
// loopback facades, and refuses others with a message that names the flag.
func TestFacadeAllowedHostsServed(t *testing.T) {
	o := testCoordinatorOptions(t, t.TempDir())
	o.Sandbox.AllowedHosts = []string{"osb.example"}
	cs, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	serveCoordinator(t, cs)

	get := func(host string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", "http://"+cs.info.OpenSandboxAddr+"/health", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Close = true
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if code, body := get(cs.info.OpenSandboxAddr); code != http.StatusOK {
			return errorString("facade not serving yet: " + body)
		}
		return nil
	})
	if code, body := get("osb.example:7082"); code != http.StatusOK {
		t.Errorf("Host osb.example: %d %s", code, body)
	}
	if code, body := get("other.example"); code != http.StatusMisdirectedRequest || !strings.Contains(body, "--facade-allowed-hosts") {
		t.Errorf("Host other.example: %d %s, want 421 naming --facade-allowed-hosts", code, body)
	}
}
