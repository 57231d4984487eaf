package openshell_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/coordinator/caller"
	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/policy"
	osh "github.com/tetherfleet/tether/protocol/openshell"
)

// proxiedPolicy lets the local user (token:local) list on the facade.
const proxiedPolicy = `version: 1
identities:
  token:local:
    rules:
      - nodes: "*"
        operations: [forward]
        targets: [openshell]
      - operations: [sandboxes.list]
`

// TestOpenShellProxiedCallNoLoopbackIdentity: a gRPC proxy on the
// coordinator's host (Envoy, ...) connects over loopback for every caller
// it forwards, so a call whose metadata carries a header proxies add
// (x-forwarded-for, forwarded, ...) never gets Config.Local's identity;
// without credentials it is refused as any unidentified caller is
// (UNAUTHENTICATED). The same call without it is the local user's.
func TestOpenShellProxiedCallNoLoopbackIdentity(t *testing.T) {
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
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) {
		c.Local = func(uint32) policy.Identity { return policy.Identity{Kind: policy.KindToken, Name: "local"} }
		c.Authorizer = caller.Authorizer{Policy: store}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.list(ctx, &osh.ListSandboxesRequest{}); err != nil {
		t.Fatalf("an unproxied loopback caller: %v, want OK", err)
	}
	for _, k := range []string{"x-forwarded-for", "forwarded", "x-forwarded-host", "x-forwarded-proto", "x-real-ip", "via"} {
		_, err := e.list(metadata.AppendToOutgoingContext(ctx, k, "203.0.113.9"), &osh.ListSandboxesRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("a loopback caller with %s: 203.0.113.9: %v, want UNAUTHENTICATED", k, err)
		}
	}
}
