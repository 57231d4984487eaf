// Package gateway holds clients of the sandbox gateways that run on a node:
// an OpenShell gateway (gRPC service openshell.v1.OpenShell, wire-facts §1)
// and an OpenSandbox lifecycle server (REST under /v1, wire-facts §2).
//
// They list, get and delete sandboxes — what inventories and the reaper
// need — and nothing else: everything else passes through the facades
// opaquely. The agent uses them over loopback to report its inventory; the
// coordinator uses them over a tunnel dial stream to reap. Both transports
// are the caller's: an OpenShell client takes a grpc.ClientConnInterface and
// an OpenSandbox client an *http.Client.
package gateway
