// Package hostcheck decides which names the coordinator's facades answer
// to, so that a web page cannot reach a facade through a name it controls
// (DNS rebinding: the page's own name resolves to 127.0.0.1, the browser
// sends it in Host) or from another site (a cross-site WebSocket or POST:
// right Host, foreign Origin).
//
// A Policy is built from the facade's bound address and an optional list
// of extra names (New). It checks when the facade listens on loopback, or
// when extra names are configured:
//
//   - the Host header (HTTP) or :authority (gRPC) must name localhost, an
//     address of 127.0.0.0/8 or ::1, the listen address, or an extra name
//     (any port: a name, not an address, is what a rebinding page
//     controls);
//   - an Origin header, when a request carries one, must name one of the
//     same hosts (so pages served from this machine may talk to it, pages
//     of other sites may not); "null" and unparsable origins are refused.
//
// A facade on a non-loopback address with no extra names accepts any Host:
// it is an authentication boundary there (a token, or a verified client
// certificate), and its remote clients reach it by names the coordinator
// cannot know. An Origin must then be the request's own Host (same
// origin): non-browser clients send none, and a browser page of another
// site has no business with a facade.
//
// Clients such as NeMo Gym's send Host (or :authority) = the address they
// dialed and no Origin, and pass.
//
// Proxied tells a request a proxy forwarded (it carries Forwarded,
// X-Forwarded-For, -Host, -Proto, X-Real-IP or Via): the console and the
// facades give such a request no loopback identity, since a proxy on the
// coordinator's host connects over loopback for every caller.
//
// The package has no state and starts no goroutines; a Policy is
// immutable and safe for concurrent use. It imports only the standard
// library.
package hostcheck
