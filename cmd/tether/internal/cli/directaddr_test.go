package cli

import (
	"crypto/tls"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/protocol"
)

// --direct-addr is checked before anything starts: a port number from 1
// to 65535, a host that is empty, an IP address or a host name, or "off"
// in any case; every error names the flag and the value.
func TestDirectAddrFlag(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want string // substring of the error; "" when valid
	}{
		{"", ""},
		{"coord.example.com:7443", ""},
		{"10.0.0.1:7443", ""},
		{"[fd00::1]:7443", ""},
		{":7443", ""},
		{"off", ""},
		{"OFF", ""},
		{"Off", ""},
		{"coord.example.com:", "has no port"},
		{"coord.example.com", "is not host:port"},
		{"coord.example.com:0", "not a number from 1 to 65535"},
		{"coord.example.com:70000", "not a number from 1 to 65535"},
		{"coord.example.com:https", "not a number from 1 to 65535"},
		{"coord.example.com:-1", "not a number from 1 to 65535"},
		{"bad host:7443", `host "bad host"`},
		{"http://coord:7443", "is not host:port"},
		{"-coord:7443", `host "-coord"`},
		{"a..b:7443", `host "a..b"`},
		{"offf", "is not host:port"},
	} {
		o := testCoordinatorOptions(t, t.TempDir())
		o.DirectAddr = tc.addr
		err := o.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("--direct-addr %q: %v, want valid", tc.addr, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "--direct-addr") || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"`+tc.addr+`"`) {
			t.Errorf("--direct-addr %q: %v, want an error naming the flag, the value and %q", tc.addr, err, tc.want)
		}
	}
	// Through the command line: a usage error.
	r := runCLI(testCtx(t), nil, "", "coordinator", "--direct-addr", "coord:99999")
	if r.code != exitUsage || !strings.Contains(r.stderr, `--direct-addr: "coord:99999"`) {
		t.Errorf("exit %d, stderr %q; want %d naming --direct-addr", r.code, r.stderr, exitUsage)
	}
}

// --direct-addr OFF turns the direct path off as "off" does: the
// coordinator starts, and refuses a client's direct connection as one to
// a coordinator without the path (reason direct_off).
func TestDirectAddrOffAnyCase(t *testing.T) {
	o := testCoordinatorOptions(t, t.TempDir())
	o.DirectAddr = "OFF"
	reg := prometheus.NewRegistry()
	cs, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatalf("--direct-addr OFF: %v", err)
	}
	serveCoordinator(t, cs)
	conn, err := tls.Dial("tcp", cs.tunnelLn.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{protocol.ALPNClient}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	checkFor(t, defaultTestTimeout, func() error {
		mfs, err := reg.Gather()
		if err != nil {
			return err
		}
		for _, mf := range mfs {
			if mf.GetName() != "tether_coordinator_direct_refusals_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == "direct_off" && m.GetCounter().GetValue() == 1 {
						return nil
					}
				}
			}
		}
		return errorString("no direct_off refusal counted yet")
	})
}
