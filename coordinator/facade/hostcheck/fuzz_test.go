package hostcheck_test

import (
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
)

// loopbackHost reports whether h (a URL's Hostname) names this machine:
// localhost or a loopback address, in any case, with or without a trailing
// dot.
func loopbackHost(h string) bool {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// FuzzHostPolicy checks Host/:authority and Origin values against the
// loopback policy and against one with extra names, as the facades do on
// every request: whatever a loopback policy accepts, a URL parser (a
// browser's view) reads as a loopback host; an Origin it accepts is an
// absolute URL of such a host; a refusal names the header and is short,
// however long the value.
func FuzzHostPolicy(f *testing.F) {
	for _, s := range []string{"localhost:9000", "127.0.0.1", "[::1]:80", "LOCALHOST.", "evil.example", "127.0.0.1.nip.io", "localhost@evil", "[::ffff:127.0.0.1]",
		"localhost:80:90", "0x7f000001", "127.1", "localhost#", strings.Repeat("a", 5000)} {
		f.Add(s, "http://"+s, "osb.example")
	}
	f.Add("x", "null", "*.example")
	f.Fuzz(func(t *testing.T, host, origin, allowed string) {
		lp := hostcheck.Loopback()
		if err := lp.Host("Host", host); err != nil {
			if !strings.HasPrefix(err.Error(), "Host ") || len(err.Error()) > 400 {
				t.Fatalf("Host %.100q: refused with %.300q", host, err)
			}
		} else if host != "" {
			if u, err := url.Parse("http://" + host + "/"); err == nil && u.Host == host && !loopbackHost(u.Hostname()) {
				t.Fatalf("Host %q accepted by the loopback policy; a browser reads host %q", host, u.Hostname())
			}
		}
		if err := lp.Origin([]string{origin}, host); err != nil {
			if !strings.HasPrefix(err.Error(), "Origin ") || len(err.Error()) > 400 {
				t.Fatalf("Origin %.100q: refused with %.300q", origin, err)
			}
		} else {
			u, err := url.Parse(strings.TrimSpace(origin))
			if err != nil || u.Scheme == "" || !loopbackHost(u.Hostname()) {
				t.Fatalf("Origin %q accepted by the loopback policy (parsed %+v, %v)", origin, u, err)
			}
		}
		p, err := hostcheck.New(hostcheck.Config{Listen: "0.0.0.0:9000", Allowed: []string{allowed}})
		if err != nil {
			return
		}
		if !p.Checks() {
			t.Fatalf("allowed %q: a policy with extra names does not check", allowed)
		}
		if p.Host("Host", host) == nil && host != "" {
			h := host
			if hh, _, err := net.SplitHostPort(host); err == nil {
				h = hh
			}
			h = strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".")
			a := strings.TrimSuffix(strings.ToLower(strings.Trim(strings.TrimSpace(allowed), "[]")), ".")
			ip, aip := net.ParseIP(h), net.ParseIP(a)
			ok := loopbackHost(h) || h == a || ip != nil && aip != nil && ip.Equal(aip) ||
				strings.HasPrefix(a, "*.") && strings.HasSuffix(h, a[1:])
			if !ok {
				t.Fatalf("Host %q accepted by a policy of %q", host, allowed)
			}
		}
	})
}
