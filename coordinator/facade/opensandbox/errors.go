package opensandbox

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	osb "github.com/tetherfleet/tether/protocol/opensandbox"
)

// Codes of the facade's own errors. They use the lifecycle server's flat
// body (osb.ErrorBody) so that clients parse them as they parse the
// server's, and the TETHER:: prefix so that nobody mistakes them for one.
const (
	// CodeUnauthenticated (401): Config.CheckToken is set and the request
	// carried neither an accepted Tether-Token nor a verified client
	// certificate.
	CodeUnauthenticated = "TETHER::UNAUTHENTICATED"
	// CodeNodeUnavailable (502 when the node did not answer a request, 503
	// when it is not connected or lacks the opensandbox target): the
	// message names the node and the target.
	CodeNodeUnavailable = "TETHER::NODE_UNAVAILABLE"
	// CodeNoNode (503): no connected node has the opensandbox target (or
	// none matches the Tether-Node-Selector).
	CodeNoNode = "TETHER::NO_NODE"
	// CodeInvalidPlacement (400): the Tether-Node-Selector header does not
	// parse, or both placement headers are set.
	CodeInvalidPlacement = "TETHER::INVALID_PLACEMENT"
	// CodeInvalidRun (400): the Tether-Run header is not a valid run id
	// (protocol.ValidRunID).
	CodeInvalidRun = "TETHER::INVALID_RUN"
	// CodeRunClosed (409): the Tether-Run header names a run whose lease
	// was closed.
	CodeRunClosed = "TETHER::RUN_CLOSED"
	// CodeAmbiguousSandbox (409): the ledger does not know the id and more
	// than one node answered that it holds it.
	CodeAmbiguousSandbox = "TETHER::AMBIGUOUS_SANDBOX"
	// CodeShuttingDown (503): the facade was closed.
	CodeShuttingDown = "TETHER::SHUTTING_DOWN"
	// CodeInternal (500): a bug in the facade, reached by this request
	// (a contained panic, counted in tether_panics_total).
	CodeInternal = "TETHER::INTERNAL"
	// CodeMisdirected (421 Misdirected Request): the Host header names
	// none of the facade's names (Config.Hosts), as a page that rebound
	// its own name to this address sends. The message names the Host and
	// the names the facade answers to.
	CodeMisdirected = "TETHER::MISDIRECTED_REQUEST"
	// CodeForbiddenOrigin (403): the request carries the Origin of a page
	// of another site (a cross-site WebSocket or POST from a browser).
	CodeForbiddenOrigin = "TETHER::FORBIDDEN_ORIGIN"
	// CodeAuthThrottled (429 Too Many Requests, with Retry-After in whole
	// seconds): the request's source IP failed authentication too often
	// (coordinator/authlimit), so its Tether-Token was refused without
	// being checked.
	CodeAuthThrottled = "TETHER::AUTH_THROTTLED"
)

// Target is the node target the facade dials: the node's OpenSandbox
// lifecycle server.
const Target = "opensandbox"

// writeError writes a flat {"code","message"} error body with status.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, osb.ErrorBody{Code: code, Message: msg})
}

// writeJSON writes v as a JSON body with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own types reach here; they always marshal.
		panic(fmt.Sprintf("opensandbox facade: marshal %T: %v", v, err))
	}
	writeBody(w, status, "application/json", b)
}

// writeBody writes b with status and content type.
func writeBody(w http.ResponseWriter, status int, contentType string, b []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// writeNotFound writes the lifecycle server's answer for an unknown sandbox
// id (OSB-5): 404 {"code":"KUBERNETES::SANDBOX_NOT_FOUND","message":"Sandbox
// '<id>' not found"}. NeMo Gym treats it as "already gone" on delete.
func writeNotFound(w http.ResponseWriter, id string) {
	writeError(w, http.StatusNotFound, osb.CodeSandboxNotFound, fmt.Sprintf("Sandbox '%s' not found", id))
}

// writeRouteNotFound writes FastAPI's answer for a path no route matches:
// 404 {"detail":"Not Found"}.
func writeRouteNotFound(w http.ResponseWriter) {
	writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
}

// writeMethodNotAllowed writes FastAPI's answer for a known path with an
// unserved method: 405 {"detail":"Method Not Allowed"} with an Allow header.
func writeMethodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
}
