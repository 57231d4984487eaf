package hostcheck

import "strings"

// proxyHeaders are the headers proxies add to what they forward, in
// canonical HTTP form (Forwarded: RFC 7239; the de-facto X-Forwarded-*,
// X-Real-IP; Via: RFC 9110).
var proxyHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "Via"}

// Proxied returns the first of proxyHeaders that h carries (even with an
// empty value), "" for none. h is an http.Header (canonical keys) or gRPC
// metadata (metadata.MD: lower-case keys); either spelling matches.
//
// A request with one never gets a loopback identity (the identity of the
// local user owning the caller's socket): a proxy on the coordinator's
// host connects over loopback for every caller it forwards, so the socket
// names the proxy's user, not the sender.
func Proxied(h map[string][]string) string {
	for _, k := range proxyHeaders {
		if _, ok := h[k]; ok {
			return k
		}
		if _, ok := h[strings.ToLower(k)]; ok {
			return k
		}
	}
	return ""
}
