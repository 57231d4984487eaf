package fleettest_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// TestFacadeListenersRefuseForeignCallers drives the facades as the
// coordinator wires them (sandboxes.Attach, both on loopback): a rebinding
// Host is misdirected (421), a header block over the 64 KiB cap is refused
// (431) and a gRPC :authority naming another host is PERMISSION_DENIED,
// while the addresses the fleet hands out work. On dfbdcef all three were
// served.
func TestFacadeListenersRefuseForeignCallers(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Agents: 1, Gateways: &fleettest.GatewayOptions{}})
	_, port, _ := net.SplitHostPort(f.OpenSandboxFacade)

	get := func(host string, hdr http.Header) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", "http://"+f.OpenSandboxFacade+"/health", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(f.OpenSandboxFacade, nil); code != http.StatusOK {
		t.Fatalf("GET /health: %d %s", code, body)
	}
	if code, body := get("rebound.example:"+port, nil); code != http.StatusMisdirectedRequest || !strings.Contains(body, "rebound.example") {
		t.Errorf("GET /health with a rebinding Host: %d %s, want 421 naming it", code, body)
	}
	big := http.Header{"X-Filler": {strings.Repeat("x", 100<<10)}}
	if code, body := get(f.OpenSandboxFacade, big); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("GET /health with 100 KiB of headers: %d %s, want 431", code, body)
	}

	call := func(opts ...grpc.DialOption) error {
		t.Helper()
		cc, err := grpc.NewClient(f.OpenShellFacade, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return cc.Invoke(ctx, openshell.MethodHealth, &openshell.HealthRequest{}, new(openshell.HealthResponse))
	}
	if err := call(); err != nil {
		t.Fatalf("Health: %v", err)
	}
	if err := call(grpc.WithAuthority("rebound.example:" + port)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Health with a foreign :authority: %v, want PERMISSION_DENIED", err)
	}
}
