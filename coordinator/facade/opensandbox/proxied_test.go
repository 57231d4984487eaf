package opensandbox_test

import (
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/policy"
)

// proxiedPolicy lets the local user (token:local) list on the facade.
const proxiedPolicy = `version: 1
identities:
  token:local:
    rules:
      - nodes: "*"
        operations: [forward]
        targets: [opensandbox]
      - operations: [sandboxes.list]
`

// TestOpenSandboxProxiedRequestNoLoopbackIdentity: a proxy on the
// coordinator's host connects over loopback for every caller it forwards,
// so a request carrying a header proxies add (X-Forwarded-For, ...) never
// gets Config.Local's identity; without credentials it is refused as any
// unidentified caller is (401). The same request without the header is
// the local user's.
func TestOpenSandboxProxiedRequestNoLoopbackIdentity(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the socket's owner is known on Linux only")
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(proxiedPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := policy.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(path, m)
	if err != nil {
		t.Fatal(err)
	}
	e := newFacadeEnv(t, func(c *opensandbox.Config) {
		c.Local = func(uint32) policy.Identity { return policy.Identity{Kind: policy.KindToken, Name: "local"} }
		c.Authorizer = caller.Authorizer{Policy: store}
	})
	if code, _, body := e.do(t, "GET", "/v1/sandboxes", nil, ""); code != http.StatusOK {
		t.Fatalf("an unproxied loopback caller: %d %s, want 200", code, body)
	}
	for _, h := range []string{"X-Forwarded-For", "Forwarded", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-IP", "Via"} {
		code, _, body := e.do(t, "GET", "/v1/sandboxes", map[string]string{h: "203.0.113.9"}, "")
		if code != http.StatusUnauthorized || strings.Contains(body, "token:local") {
			t.Errorf("a loopback caller with %s: 203.0.113.9: %d %s, want 401 without the loopback identity", h, code, body)
		}
	}
}
