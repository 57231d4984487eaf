package opensandbox

import (
	"strconv"
	"strings"
)

// Path pieces of the lifecycle API (wire-facts §2.2). The server mounts
// every route at the root and under VersionPrefix.
const (
	VersionPrefix = "/v1"
	// SandboxesPath is the collection path under the root.
	SandboxesPath = "/sandboxes"
)

// RouteKind says which lifecycle route a path names.
type RouteKind int

// Lifecycle routes. The comment gives the path relative to the root or /v1
// and the methods the server serves there.
const (
	RouteUnknown         RouteKind = iota
	RouteSandboxes                 // /sandboxes: GET list, POST create
	RouteSandbox                   // /sandboxes/{id}: GET, DELETE
	RouteEndpoint                  // /sandboxes/{id}/endpoints/{port}: GET
	RouteRenewExpiration           // /sandboxes/{id}/renew-expiration: POST
	RouteMetadata                  // /sandboxes/{id}/metadata: PATCH
	RoutePause                     // /sandboxes/{id}/pause: POST
	RouteResume                    // /sandboxes/{id}/resume: POST
	RouteProxy                     // /sandboxes/{id}/proxy/{port}[/rest]: any method, HTTP or WebSocket
)

var routeNames = [...]string{"unknown", "sandboxes", "sandbox", "endpoint", "renew-expiration", "metadata", "pause", "resume", "proxy"}

func (k RouteKind) String() string {
	if k < 0 || int(k) >= len(routeNames) {
		return "RouteKind(" + strconv.Itoa(int(k)) + ")"
	}
	return routeNames[k]
}

// Route is a parsed lifecycle path.
type Route struct {
	Kind RouteKind
	// V1 is true when the path began with /v1.
	V1 bool
	// ID is the sandbox id (every kind but RouteSandboxes).
	ID string
	// Port is the sandbox port of RouteEndpoint and RouteProxy, 1–65535.
	Port int
	// Rest is RouteProxy's path inside the sandbox port: "" or a path
	// starting with "/" (e.g. "/pty/abc/ws"), never containing a ".."
	// segment.
	Rest string
}

// ParsePath parses an HTTP request path (as in url.URL.Path: decoded, no
// query) into a lifecycle Route. It accepts exactly the routes of RouteKind,
// with or without the /v1 prefix, and no trailing slash except inside a
// proxy route's Rest. The proxy route matches the server's auth exemption:
// ^(/v1)?/sandboxes/<id>/proxy/<digits>(/|$) with no ".." segment. ok is
// false for anything else.
func ParsePath(path string) (r Route, ok bool) {
	if p, found := strings.CutPrefix(path, VersionPrefix); found && strings.HasPrefix(p, "/") {
		r.V1 = true
		path = p
	}
	p, found := strings.CutPrefix(path, SandboxesPath)
	if !found {
		return Route{}, false
	}
	if p == "" {
		r.Kind = RouteSandboxes
		return r, true
	}
	if p[0] != '/' {
		return Route{}, false
	}
	p = p[1:]
	id, p, _ := strings.Cut(p, "/")
	if !validIDSegment(id) {
		return Route{}, false
	}
	r.ID = id
	// p is now what followed "<id>/", or "" when nothing followed. A path
	// ending in "<id>/" is not a route: distinguish it by length.
	if len(path) == len(SandboxesPath)+1+len(id) {
		r.Kind = RouteSandbox
		return r, true
	}
	sub, rest, hasRest := strings.Cut(p, "/")
	switch sub {
	case "renew-expiration", "metadata", "pause", "resume":
		if hasRest {
			return Route{}, false
		}
		r.Kind = map[string]RouteKind{"renew-expiration": RouteRenewExpiration, "metadata": RouteMetadata, "pause": RoutePause, "resume": RouteResume}[sub]
		return r, true
	case "endpoints":
		port, ok := parsePort(rest)
		if !hasRest || !ok {
			return Route{}, false
		}
		r.Kind, r.Port = RouteEndpoint, port
		return r, true
	case "proxy":
		if !hasRest {
			return Route{}, false
		}
		portStr, tail, hasTail := strings.Cut(rest, "/")
		port, ok := parsePort(portStr)
		if !ok {
			return Route{}, false
		}
		if hasTail {
			tail = "/" + tail
			for seg := range strings.SplitSeq(tail, "/") {
				if seg == ".." {
					return Route{}, false
				}
			}
		}
		r.Kind, r.Port, r.Rest = RouteProxy, port, tail
		return r, true
	}
	return Route{}, false
}

// Path renders r back into a path that ParsePath maps to r (with /v1 when
// r.V1). It returns "" for RouteUnknown.
func (r Route) Path() string {
	var b strings.Builder
	if r.V1 {
		b.WriteString(VersionPrefix)
	}
	b.WriteString(SandboxesPath)
	if r.Kind == RouteSandboxes {
		return b.String()
	}
	b.WriteString("/")
	b.WriteString(r.ID)
	switch r.Kind {
	case RouteSandbox:
	case RouteEndpoint:
		b.WriteString("/endpoints/" + strconv.Itoa(r.Port))
	case RouteRenewExpiration, RouteMetadata, RoutePause, RouteResume:
		b.WriteString("/" + r.Kind.String())
	case RouteProxy:
		b.WriteString("/proxy/" + strconv.Itoa(r.Port) + r.Rest)
	default:
		return ""
	}
	return b.String()
}

// SandboxPath is the root-relative path of one sandbox: /sandboxes/<id>
// (the server's Location header uses this shape under /v1).
func SandboxPath(id string) string { return SandboxesPath + "/" + id }

// ProxyPath is the server-proxy base path of a sandbox port, without /v1:
// /sandboxes/<id>/proxy/<port>, as the server puts in Endpoint.Endpoint.
func ProxyPath(id string, port int) string {
	return SandboxesPath + "/" + id + "/proxy/" + strconv.Itoa(port)
}

// ProxyEndpoint is the Endpoint.Endpoint the server returns with
// use_server_proxy=true when answering on host (a "host[:port]" without
// scheme): "<host>/sandboxes/<id>/proxy/<port>" (wire-facts §2.5, OSB-6).
func ProxyEndpoint(host, id string, port int) string { return host + ProxyPath(id, port) }

// validIDSegment accepts a non-empty path segment other than "." and "..".
func validIDSegment(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.Contains(s, "/")
}

// parsePort parses 1–5 ASCII digits naming a port 1–65535.
func parsePort(s string) (int, bool) {
	if len(s) == 0 || len(s) > 5 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	if n < 1 || n > 65535 {
		return 0, false
	}
	return n, true
}
