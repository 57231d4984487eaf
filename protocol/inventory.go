package protocol

import (
	"fmt"
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

// ValidTargetName checks a target name: 1–63 characters of lowercase
// letters, digits and '-', starting with a letter.
func ValidTargetName(s string) error {
	if len(s) == 0 || len(s) > 63 {
		return fmt.Errorf("target name %q: want 1 to 63 characters", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || i > 0 && (c >= '0' && c <= '9' || c == '-')
		if !ok {
			return fmt.Errorf("target name %q: want lowercase letters, digits and '-', starting with a letter", s)
		}
	}
	return nil
}
