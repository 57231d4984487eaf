package hostcheck

import "testing"

// TestProxied: either spelling of a proxy header (http.Header's canonical
// keys, gRPC metadata's lower-case ones) marks a request, even empty;
// other headers do not.
func TestProxied(t *testing.T) {
	for _, c := range []struct {
		h    map[string][]string
		want string
	}{
		{map[string][]string{"X-Forwarded-For": {"203.0.113.9"}}, "X-Forwarded-For"},
		{map[string][]string{"x-forwarded-for": {"203.0.113.9"}}, "X-Forwarded-For"},
		{map[string][]string{"X-Real-Ip": {""}}, "X-Real-Ip"},
		{map[string][]string{"via": {"1.1 envoy"}}, "Via"},
		{map[string][]string{"forwarded": {"for=192.0.2.7"}}, "Forwarded"},
		{map[string][]string{"Host": {"localhost"}, "tether-token": {"x"}}, ""},
		{nil, ""},
	} {
		if got := Proxied(c.h); got != c.want {
			t.Errorf("Proxied(%v) = %q, want %q", c.h, got, c.want)
		}
	}
}
