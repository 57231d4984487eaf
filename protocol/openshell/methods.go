package openshell

// ServiceName is the gRPC service of an OpenShell gateway (wire-facts §1.1).
const ServiceName = "openshell.v1.OpenShell"

// Full method paths (wire-facts §1.2), as grpc's Invoke and NewStream take
// them and as a server sees them in its handlers.
const (
	// MethodHealth is unary HealthRequest → HealthResponse; it never needs
	// credentials.
	MethodHealth = "/openshell.v1.OpenShell/Health"
	// MethodCreateSandbox is unary CreateSandboxRequest → SandboxResponse.
	MethodCreateSandbox = "/openshell.v1.OpenShell/CreateSandbox"
	// MethodGetSandbox is unary GetSandboxRequest → SandboxResponse
	// (addresses the sandbox by workspace and name).
	MethodGetSandbox = "/openshell.v1.OpenShell/GetSandbox"
	// MethodListSandboxes is unary ListSandboxesRequest → ListSandboxesResponse.
	MethodListSandboxes = "/openshell.v1.OpenShell/ListSandboxes"
	// MethodDeleteSandbox is unary DeleteSandboxRequest → DeleteSandboxResponse
	// (addresses the sandbox by workspace and name).
	MethodDeleteSandbox = "/openshell.v1.OpenShell/DeleteSandbox"
	// MethodExecSandbox is server-streaming ExecSandboxRequest → stream
	// ExecSandboxEvent (addresses the sandbox by id).
	MethodExecSandbox = "/openshell.v1.OpenShell/ExecSandbox"
	// MethodWatchSandbox is server-streaming WatchSandboxRequest → stream
	// SandboxStreamEvent (addresses the sandbox by id).
	MethodWatchSandbox = "/openshell.v1.OpenShell/WatchSandbox"
	// MethodExecSandboxInteractive is bidi-streaming stream ExecSandboxInput
	// → stream ExecSandboxEvent; the first input must be start.
	MethodExecSandboxInteractive = "/openshell.v1.OpenShell/ExecSandboxInteractive"
	// MethodStopSandbox is unary StopSandboxRequest → SandboxResponse.
	MethodStopSandbox = "/openshell.v1.OpenShell/StopSandbox"
	// MethodStartSandbox is unary StartSandboxRequest → SandboxResponse.
	MethodStartSandbox = "/openshell.v1.OpenShell/StartSandbox"
)

// Gateway limits and defaults (wire-facts §1.1, §1.4).
const (
	// MaxMessageSize is the gateway's maximum decoded gRPC message, in bytes.
	// Anything sent toward a gateway must stay below it.
	MaxMessageSize = 1 << 20
	// DefaultWorkspace is what an empty workspace field means.
	DefaultWorkspace = "default"
	// DefaultListLimit is the page size ListSandboxes uses when limit is 0.
	DefaultListLimit = 100
	// MaxListLimit caps ListSandboxes' limit.
	MaxListLimit = 1000
	// MaxNameLen bounds a sandbox name (MAX_ROUTABLE_NAME_LEN), in bytes.
	MaxNameLen = 19
	// MaxSelectorPairs bounds the key=value pairs of a label selector.
	MaxSelectorPairs = 64
	// ExecTimeoutExitCode is the exit code an exec reports when its
	// timeout_seconds elapsed; the stream then ends normally.
	ExecTimeoutExitCode = 124
	// AuthorizationHeader is the gRPC metadata key of the bearer token,
	// sent as "Bearer <token>".
	AuthorizationHeader = "authorization"
	// MarkerLabel marks a sandbox NeMo Gym created (value "1").
	MarkerLabel = "nemo-gym.sandbox"
)

// Workspace returns w, or DefaultWorkspace when w is empty, as the gateway
// resolves every workspace-scoped request.
func Workspace(w string) string {
	if w == "" {
		return DefaultWorkspace
	}
	return w
}

// ListLimit returns the number of rows a ListSandboxes with limit returns at
// most: DefaultListLimit for 0, else limit capped at MaxListLimit.
func ListLimit(limit uint32) int {
	switch {
	case limit == 0:
		return DefaultListLimit
	case limit > MaxListLimit:
		return MaxListLimit
	}
	return int(limit)
}
