package opensandbox

import (
	"encoding/json"
	"time"
)

// Headers and well-known numbers of the lifecycle server and execd
// (wire-facts §2.1, §2.6).
const (
	// HeaderAPIKey carries the server's API key. Missing → 401
	// CodeMissingAPIKey, wrong → 401 CodeInvalidAPIKey; not checked when
	// the server has no key, nor on the proxy route.
	HeaderAPIKey = "OPEN-SANDBOX-API-KEY"
	// HeaderRequestID is set on every lifecycle response.
	HeaderRequestID = "X-Request-ID"
	// HeaderExecdAccessToken is execd's optional access token header.
	HeaderExecdAccessToken = "X-EXECD-ACCESS-TOKEN"

	// DefaultExecdPort is execd's port inside a sandbox.
	DefaultExecdPort = 44772
	// DefaultEgressPort is the egress sidecar's port inside a sandbox.
	DefaultEgressPort = 18080

	// DefaultPageSize is the list page size when pageSize is absent.
	DefaultPageSize = 20
	// MaxPageSize is the largest pageSize the server accepts; 201 is a 422.
	MaxPageSize = 200
	// MinTimeoutSeconds is the smallest create timeout; below is a 422.
	MinTimeoutSeconds = 60
	// DefaultSDKTimeoutSeconds is the timeout the SDKs send when the caller
	// gives none (NeMo Gym inherits it).
	DefaultSDKTimeoutSeconds = 600

	// ReservedMetadataPrefix starts metadata keys only the server may set;
	// a create or patch using one is a 400 CodeInvalidMetadataLabel.
	ReservedMetadataPrefix = "opensandbox.io/"
)

// Error codes of the lifecycle server's flat error bodies (wire-facts §2.1).
// The not-found code depends on the runtime (Kubernetes or Docker); clients
// must treat any 404 whose message contains "not found" as gone.
const (
	CodeMissingAPIKey         = "MISSING_API_KEY"
	CodeInvalidAPIKey         = "INVALID_API_KEY"
	CodeInvalidMetadataFormat = "INVALID_METADATA_FORMAT"
	CodeInvalidMetadataLabel  = "SANDBOX::INVALID_METADATA_LABEL"
	CodeSandboxNotFound       = "KUBERNETES::SANDBOX_NOT_FOUND"
	CodeDockerSandboxNotFound = "DOCKER::SANDBOX_NOT_FOUND"
	// CodeInvalidParameter is the fake's code for other 400s (e.g.
	// use_server_proxy together with expires, a past renew time).
	CodeInvalidParameter = "SANDBOX::INVALID_PARAMETER"
)

// Sandbox states (SandboxStatus.State). Clients must tolerate other values.
const (
	StatePending    = "Pending"
	StateRunning    = "Running"
	StatePausing    = "Pausing"
	StatePaused     = "Paused"
	StateResuming   = "Resuming"
	StateStopping   = "Stopping"
	StateTerminated = "Terminated"
	StateFailed     = "Failed"
)

// Status reasons (SandboxStatus.Reason) the server uses.
const (
	ReasonUserDelete       = "user_delete"
	ReasonTTLExpiry        = "ttl_expiry"
	ReasonProvisionTimeout = "provision_timeout"
	ReasonRuntimeError     = "runtime_error"
)

// ErrorBody is the lifecycle server's (and execd's) error body:
// {"code":"<CODE>","message":"<text>"}.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ValidationErrorBody is FastAPI's default 422 body for a request that
// fails schema validation (timeout below 60, pageSize above 200, a
// malformed JSON body): {"detail":[...]}. The server does not flatten it
// into an ErrorBody.
type ValidationErrorBody struct {
	Detail []ValidationIssue `json:"detail"`
}

// ValidationIssue is one entry of ValidationErrorBody.Detail, e.g.
// {"type":"greater_than_equal","loc":["body","timeout"],"msg":"Input should
// be greater than or equal to 60","input":30,"ctx":{"ge":60}}.
type ValidationIssue struct {
	Type string `json:"type"`
	// Loc is the path to the bad input: "body"/"query" then field names
	// (strings) or list indexes (numbers).
	Loc   []any          `json:"loc"`
	Msg   string         `json:"msg"`
	Input any            `json:"input,omitempty"`
	Ctx   map[string]any `json:"ctx,omitempty"`
}

// ImageSpec names a container image: {"uri":..., "auth"?:{...}}.
type ImageSpec struct {
	URI  string     `json:"uri"`
	Auth *ImageAuth `json:"auth,omitempty"`
}

// ImageAuth holds registry credentials for ImageSpec.
type ImageAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// Platform is a sandbox's OS and architecture: os "linux"|"windows", arch
// "amd64"|"arm64".
type Platform struct {
	OS   string `json:"os"`
	Arch string `json:"arch"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes (wire-facts §2.3).
// Fields nobody in Tether interprets (network policy, volumes, credential
// proxy) are kept as raw JSON so that a decode and re-encode loses nothing.
type CreateSandboxRequest struct {
	// Image is the image; exactly one of Image and SnapshotID (unless pool
	// mode via Extensions["poolRef"]).
	Image      *ImageSpec `json:"image,omitempty"`
	SnapshotID string     `json:"snapshotId,omitempty"`
	// Entrypoint is the main process argv (≥1 entry with an image); the
	// SDK default is ["tail","-f","/dev/null"].
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Timeout is the lifetime in seconds, at least MinTimeoutSeconds; nil
	// (absent or null) means no automatic expiry.
	Timeout *int `json:"timeout,omitempty"`
	// ResourceLimits maps resource names ("cpu", "memory", "gpu") to
	// quantities ("2", "4096Mi").
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	// Metadata follows Kubernetes label rules (ValidateMetadata); keys under
	// ReservedMetadataPrefix are refused.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Extensions are opaque server knobs, e.g. "imagePullPolicy".
	Extensions      map[string]string `json:"extensions,omitempty"`
	NetworkPolicy   json.RawMessage   `json:"networkPolicy,omitempty"`
	Volumes         json.RawMessage   `json:"volumes,omitempty"`
	Platform        *Platform         `json:"platform,omitempty"`
	SecureAccess    *bool             `json:"secureAccess,omitempty"`
	CredentialProxy json.RawMessage   `json:"credentialProxy,omitempty"`
}

// SandboxStatus is a sandbox's state with the reason for the last
// transition.
type SandboxStatus struct {
	// State is one of the State* constants (or a newer value).
	State            string    `json:"state"`
	Reason           string    `json:"reason,omitempty"`
	Message          string    `json:"message,omitempty"`
	LastTransitionAt time.Time `json:"lastTransitionAt,omitzero"`
}

// CreateSandboxResponse is the 202 body of a create; the response also
// carries a Location header naming the sandbox.
type CreateSandboxResponse struct {
	ID       string            `json:"id"`
	Status   SandboxStatus     `json:"status"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Platform *Platform         `json:"platform,omitempty"`
	// ExpiresAt is omitted when the sandbox never expires.
	ExpiresAt  time.Time `json:"expiresAt,omitzero"`
	CreatedAt  time.Time `json:"createdAt"`
	Entrypoint []string  `json:"entrypoint"`
}

// Sandbox is the body of GET /v1/sandboxes/{id} and one list item.
type Sandbox struct {
	ID         string            `json:"id"`
	Image      *ImageSpec        `json:"image,omitempty"`
	SnapshotID string            `json:"snapshotId,omitempty"`
	Platform   *Platform         `json:"platform,omitempty"`
	Status     SandboxStatus     `json:"status"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Entrypoint []string          `json:"entrypoint"`
	// ExpiresAt is omitted when the sandbox never expires.
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	CreatedAt time.Time `json:"createdAt"`
}

// ListSandboxesResponse is the body of GET /v1/sandboxes.
type ListSandboxesResponse struct {
	Items      []Sandbox  `json:"items"`
	Pagination Pagination `json:"pagination"`
}

// Pagination describes one page of a list. Page counts from 1.
type Pagination struct {
	Page        int  `json:"page"`
	PageSize    int  `json:"pageSize"`
	TotalItems  int  `json:"totalItems"`
	TotalPages  int  `json:"totalPages"`
	HasNextPage bool `json:"hasNextPage"`
}

// Endpoint is the body of GET /v1/sandboxes/{id}/endpoints/{port}.
type Endpoint struct {
	// Endpoint is an address WITHOUT scheme: "<host[:port]>/sandboxes/<id>/proxy/<port>"
	// with use_server_proxy, else a direct address into the sandbox.
	Endpoint string `json:"endpoint"`
	// Headers must be sent with every request to Endpoint; omitted when
	// there are none.
	Headers map[string]string `json:"headers,omitempty"`
}

// RenewExpirationRequest is the body of POST
// /v1/sandboxes/{id}/renew-expiration. ExpiresAt must be in the future and
// later than the current expiry.
type RenewExpirationRequest struct {
	ExpiresAt time.Time `json:"expiresAt"`
}

// RenewExpirationResponse is its 200 body.
type RenewExpirationResponse struct {
	ExpiresAt time.Time `json:"expiresAt"`
}
