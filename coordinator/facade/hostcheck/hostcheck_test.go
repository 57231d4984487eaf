package hostcheck_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
)

func mustNew(t *testing.T, cfg hostcheck.Config) *hostcheck.Policy {
	t.Helper()
	p, err := hostcheck.New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return p
}

func TestHost(t *testing.T) {
	loop := hostcheck.Loopback()
	withNames := mustNew(t, hostcheck.Config{Listen: "127.0.0.1:7082", Allowed: []string{"osb.example", "10.1.2.3", "*.corp.example", "[fd00::1]"}})
	remote := mustNew(t, hostcheck.Config{Listen: "10.0.0.5:7082"})
	remoteNamed := mustNew(t, hostcheck.Config{Listen: "10.0.0.5:7082", Allowed: []string{"osb.example"}})
	anyIface := mustNew(t, hostcheck.Config{Listen: "[::]:7082"})
	for _, tc := range []struct {
		p     *hostcheck.Policy
		host  string
		allow bool
	}{
		{loop, "127.0.0.1:7082", true},
		{loop, "127.9.9.9", true},
		{loop, "localhost:1", true},
		{loop, "LOCALHOST.", true},
		{loop, "[::1]:7082", true},
		{loop, "::1", true},
		{loop, "[::ffff:127.0.0.1]:80", true},
		{loop, "", true},
		{loop, "attacker.example:7082", false},
		{loop, "localhost.attacker.example", false},
		{loop, "127.0.0.1.nip.io", false},
		{loop, "0.0.0.0:7082", false},
		{loop, "[::]:7082", false},
		{loop, "10.0.0.5", false},
		{loop, "[fe80::1%25eth0]:1", false},
		{withNames, "osb.example:7082", true},
		{withNames, "OSB.Example", true},
		{withNames, "10.1.2.3:1", true},
		{withNames, "a.corp.example", true},
		{withNames, "a.b.corp.example:9", true},
		{withNames, "corp.example", false},
		{withNames, "[fd00::1]:7082", true},
		{withNames, "[fd00:0::1]", true},
		{withNames, "xosb.example", false},
		{remote, "anything.example", true},
		{remote, "10.0.0.5:7082", true},
		{remoteNamed, "10.0.0.5:7082", true},
		{remoteNamed, "osb.example", true},
		{remoteNamed, "localhost", true},
		{remoteNamed, "other.example", false},
		{anyIface, "anything.example", true},
	} {
		err := tc.p.Host("Host", tc.host)
		if (err == nil) != tc.allow {
			t.Errorf("policy %q: Host(%q) = %v, want allowed %v", tc.p, tc.host, err, tc.allow)
		}
	}
}

func TestRefusalMessage(t *testing.T) {
	p := mustNew(t, hostcheck.Config{Listen: "127.0.0.1:7082", Allowed: []string{"osb.example"}, Hint: "add it to --facade-allowed-hosts"})
	err := p.Host(":authority", "evil.example:7081")
	var re *hostcheck.RefusedError
	if !errors.As(err, &re) || re.Header != ":authority" || re.Value != "evil.example:7081" {
		t.Fatalf("Host: %v, want a *RefusedError for :authority", err)
	}
	for _, want := range []string{`:authority "evil.example:7081"`, "localhost, 127.0.0.0/8, ::1, osb.example", "--facade-allowed-hosts"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
}

func TestOrigin(t *testing.T) {
	loop := hostcheck.Loopback()
	remote := mustNew(t, hostcheck.Config{Listen: "10.0.0.5:7082"})
	for _, tc := range []struct {
		p      *hostcheck.Policy
		origin []string
		host   string
		allow  bool
	}{
		{loop, nil, "127.0.0.1:7082", true},
		{loop, []string{"http://localhost:3000"}, "127.0.0.1:7082", true},
		{loop, []string{"http://127.0.0.1:7082"}, "127.0.0.1:7082", true},
		{loop, []string{"http://[::1]:8080"}, "127.0.0.1:7082", true},
		{loop, []string{"https://attacker.example"}, "127.0.0.1:7082", false},
		{loop, []string{"http://localhost:3000", "https://attacker.example"}, "127.0.0.1:7082", false},
		{loop, []string{"null"}, "127.0.0.1:7082", false},
		{loop, []string{"localhost"}, "127.0.0.1:7082", false},
		{loop, []string{"file://"}, "127.0.0.1:7082", false},
		{remote, nil, "osb.example:7082", true},
		{remote, []string{"https://osb.example"}, "osb.example:7082", true},
		{remote, []string{"https://attacker.example"}, "osb.example:7082", false},
	} {
		err := tc.p.Origin(tc.origin, tc.host)
		if (err == nil) != tc.allow {
			t.Errorf("policy %q: Origin(%q, %q) = %v, want allowed %v", tc.p, tc.origin, tc.host, err, tc.allow)
		}
	}
}

func TestNewRejectsBadEntries(t *testing.T) {
	_, err := hostcheck.New(hostcheck.Config{Listen: "127.0.0.1:1", Allowed: []string{"ok.example", "http://x.example", "x.example:80", "a/b", "*", "", "*.", "bad name"}})
	if err == nil {
		t.Fatal("New accepted bad entries")
	}
	for _, want := range []string{`"http://x.example"`, `"x.example:80"`, `"a/b"`, `"*"`, `""`, `"*."`, `"bad name"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), `"ok.example"`) {
		t.Errorf("error %q names a good entry", err)
	}
}

// TestRefusalClipsValue: a refused Host or Origin is quoted clipped; a
// 1 MiB Host header made a 1 MiB error (answered and logged).
func TestRefusalClipsValue(t *testing.T) {
	long := strings.Repeat("a", 1<<20)
	p := hostcheck.Loopback()
	for _, err := range []error{p.Host("Host", long), p.Origin([]string{"http://" + long}, "localhost")} {
		if err == nil || len(err.Error()) > 400 || !strings.Contains(err.Error(), "…") {
			t.Errorf("refusal of %d bytes: %.200v", len(err.Error()), err)
		}
	}
}
