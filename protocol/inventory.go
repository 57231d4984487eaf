package protocol

import (
	"fmt"
	"strings"
	"time"
)

// Providers: the sandbox gateways Tether knows. They name a sandbox's
// provider in inventories, the ledger and the NATS API.
const (
	// ProviderOpenShell is an OpenShell gateway (gRPC service
	// openshell.v1.OpenShell; wire-facts §1).
	ProviderOpenShell = "openshell"
	// ProviderOpenSandbox is an OpenSandbox lifecycle server (REST under
	// /v1; wire-facts §2).
	ProviderOpenSandbox = "opensandbox"
)

// ValidProvider reports whether p is ProviderOpenShell or
// ProviderOpenSandbox.
func ValidProvider(p string) bool { return p == ProviderOpenShell || p == ProviderOpenSandbox }

// InventoryParams are the params of an inventory stream (KindInventory),
// which the coordinator opens to ask an agent for the sandboxes of every
// gateway it is configured for. The agent answers with FrameInventory
// frames (one InventoryPage each, at most MaxFrameSize) and then exactly one
// FrameInventoryEnd, or a FrameError.
type InventoryParams struct{}

// Sandbox is one sandbox as its gateway reported it. Fields are copied
// verbatim: Tether never renames what it passes through (wire-facts §8.3).
type Sandbox struct {
	// Provider is ProviderOpenShell or ProviderOpenSandbox.
	Provider string `json:"provider"`
	// ID is OpenShell's ObjectMeta.id (a UUID) or OpenSandbox's sandbox id.
	ID string `json:"id"`
	// Name is OpenShell's ObjectMeta.name (unique per workspace); empty for
	// OpenSandbox, whose sandboxes have only an id.
	Name string `json:"name,omitempty"`
	// Workspace is OpenShell's ObjectMeta.workspace; empty for OpenSandbox.
	Workspace string `json:"workspace,omitempty"`
	// Labels are OpenShell's ObjectMeta.labels or OpenSandbox's metadata.
	Labels map[string]string `json:"labels,omitempty"`
	// LabelsTruncated says the agent sent a bounded copy of Labels
	// (BoundLabels) because the sandbox did not fit a frame otherwise.
	LabelsTruncated bool `json:"labels_truncated,omitempty"`
	// State is the gateway's phase or state verbatim, e.g.
	// "SANDBOX_PHASE_READY" (OpenShell) or "Running" (OpenSandbox).
	State string `json:"state,omitempty"`
	// CreatedAt is when the gateway created it (UTC); zero if unknown.
	CreatedAt time.Time `json:"created_at,omitzero"`
	// ExpiresAt is OpenSandbox's expiresAt (UTC); zero when it has none.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Deleting says the gateway shows a deletion in progress (OpenShell
	// phase DELETING or a deletion timestamp; OpenSandbox Stopping or
	// Terminated).
	Deleting bool `json:"deleting,omitempty"`
}

// InventoryPage is the payload of a FrameInventory frame: some sandboxes of
// one target.
type InventoryPage struct {
	// Target is the agent's target name the sandboxes were listed from.
	Target string `json:"target"`
	// Sandboxes are this page's sandboxes.
	Sandboxes []Sandbox `json:"sandboxes"`
}

// GatewayStatus says how listing one target went.
type GatewayStatus struct {
	// Target is the agent's target name.
	Target string `json:"target"`
	// Provider is the target's provider.
	Provider string `json:"provider"`
	// Complete is true when every sandbox of the target was listed. When
	// false, sandboxes missing from the inventory must not be taken as gone.
	Complete bool `json:"complete"`
	// Count is the number of sandboxes sent for the target.
	Count int `json:"count"`
	// Error says why the listing is incomplete; empty when Complete.
	Error string `json:"error,omitempty"`
}

// InventoryEnd is the payload of the FrameInventoryEnd frame that ends an
// inventory stream.
type InventoryEnd struct {
	// Gateways has one status per target listed.
	Gateways []GatewayStatus `json:"gateways"`
}

// DialParams are the params of a dial stream (KindDial): raw bytes to one
// of the agent's configured targets. The agent answers with one frame,
// FrameDialOK or FrameError (CodeUnknownTarget, CodeDialFailed); after
// FrameDialOK the stream carries the target connection's bytes both ways,
// unframed, and a half-close is passed on as a half-close.
type DialParams struct {
	// Target names the target, e.g. "openshell" (see ValidTargetName).
	Target string `json:"target"`
}

// Dial stream error codes (ErrorInfo.Code).
const (
	CodeUnknownTarget = "unknown_target" // the agent has no target of that name
	CodeDialFailed    = "dial_failed"    // the target refused or did not answer
)

// Target names the agent serves for the two gateway providers.
const (
	TargetOpenShell   = "openshell"
	TargetOpenSandbox = "opensandbox"
)

// TargetOwnPorts is a reserved target name that no agent target may
// take: granted (a forward grant's targets, carried in SSHParams.Targets),
// it lets an SSH connection's direct-tcpip channels reach loopback ports
// (127.0.0.0/8, ::1, localhost) whose listening socket belongs to the
// login's own uid: the user's own servers, e.g. VS Code's remote server,
// never another user's or the node's gateways. Dial streams do not serve
// it.
const TargetOwnPorts = "own-ports"

// ValidTargetName checks a target name: 1–63 characters of lowercase
// letters, digits and '-', starting with a letter.
func ValidTargetName(s string) error {
	if len(s) == 0 || len(s) > 63 {
		return fmt.Errorf("target name %s: want 1 to 63 characters", Clip(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || i > 0 && (c >= '0' && c <= '9' || c == '-')
		if !ok {
			return fmt.Errorf("target name %s: want lowercase letters, digits and '-', starting with a letter", Clip(s))
		}
	}
	return nil
}

// SandboxOpParams are the params of a sandbox stream (KindSandbox): one
// operation on one sandbox of the agent's gateways, run by the agent with
// its own gateway credentials. The agent answers with one FrameSandboxOp
// (JSON SandboxOpResult) or a FrameError (CodeUnknownTarget when the agent
// has no gateway of that provider, CodeDialFailed when the gateway cannot
// be reached, CodeInternal for any other gateway error, message verbatim).
type SandboxOpParams struct {
	// Op is the operation; only SandboxOpDelete is defined.
	Op string `json:"op"`
	// Provider selects the gateway: ProviderOpenShell or ProviderOpenSandbox.
	Provider string `json:"provider"`
	// ID is the OpenSandbox sandbox id (OpenSandbox addresses by id).
	ID string `json:"id,omitempty"`
	// Workspace and Name address an OpenShell sandbox (DeleteSandbox takes
	// them, not the id; wire-facts §1.3).
	Workspace string `json:"workspace,omitempty"`
	Name      string `json:"name,omitempty"`
}

// SandboxOpDelete deletes the sandbox. Deleting one that is not found is
// done: the result says NotFound.
const SandboxOpDelete = "delete"

// Validate reports the first problem with p: the agent checks every
// sandbox header with it before it calls a gateway. Id, name and
// workspace are at most MaxSandboxIDLen bytes without control characters;
// the id, which the agent puts in an OpenSandbox URL path
// (/v1/sandboxes/ID), is also not "." or ".." and has no '/' or '\\', so
// that it can only name a sandbox.
func (p *SandboxOpParams) Validate() error {
	if p.Op != SandboxOpDelete {
		return fmt.Errorf("sandbox op %s: want %q", Clip(p.Op), SandboxOpDelete)
	}
	for _, f := range []struct{ name, v string }{{"id", p.ID}, {"name", p.Name}, {"workspace", p.Workspace}} {
		if err := checkSandboxRef(f.name, f.v); err != nil {
			return fmt.Errorf("sandbox op %s: %w", p.Op, err)
		}
	}
	switch p.Provider {
	case ProviderOpenShell:
		if p.Name == "" {
			return fmt.Errorf("sandbox op %s: an OpenShell sandbox needs its name", p.Op)
		}
	case ProviderOpenSandbox:
		if p.ID == "" {
			return fmt.Errorf("sandbox op %s: an OpenSandbox sandbox needs its id", p.Op)
		}
	default:
		return fmt.Errorf("sandbox op %s: provider %s: want %q or %q", p.Op, Clip(p.Provider), ProviderOpenShell, ProviderOpenSandbox)
	}
	return nil
}

// checkSandboxRef checks one field that names a sandbox on a gateway (see
// SandboxOpParams.Validate).
func checkSandboxRef(name, v string) error {
	if len(v) > MaxSandboxIDLen {
		return fmt.Errorf("%s is %d bytes, over the %d byte limit", name, len(v), MaxSandboxIDLen)
	}
	if i := strings.IndexFunc(v, func(c rune) bool { return c < ' ' || c == 0x7f }); i >= 0 {
		return fmt.Errorf("%s %s: control character %q is not allowed", name, Clip(v), v[i])
	}
	if name == "id" && (v == "." || v == ".." || strings.ContainsAny(v, "/\\")) {
		return fmt.Errorf("id %s: an id cannot be \".\" or \"..\" or contain '/' or '\\'", Clip(v))
	}
	return nil
}

// SandboxOpResult is the payload of FrameSandboxOp.
type SandboxOpResult struct {
	// Deleted is the gateway's answer: OpenShell DeleteSandboxResponse.deleted
	// (false when the compute was already gone), true for an OpenSandbox 204.
	Deleted bool `json:"deleted"`
	// NotFound says the gateway did not know the sandbox (OpenShell
	// NOT_FOUND, OpenSandbox 404): it is gone.
	NotFound bool `json:"not_found,omitempty"`
}
