package protocol

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Subjects of the sandbox ledger's NATS API (served by the micro service
// ServiceName next to the job API). Every request body is JSON, decoded
// strictly (DecodeRequest); errors are APIErrors.
const (
	// SubjectLeaseOpen takes a LeaseOpenRequest and replies with the
	// LeaseInfo: a new lease, or the run's open lease renewed (with the
	// request's holder and TTL). A closed run's lease cannot be reopened:
	// 409 ErrCodeLeaseClosed; a live lease of another holder cannot be
	// taken: 409 ErrCodeLeaseHeld.
	SubjectLeaseOpen = "tether.v1.lease.open"
	// SubjectLeaseRenew takes a LeaseRequest and replies with the renewed
	// LeaseInfo (expires_at = now + its TTL). An unknown run is 404
	// ErrCodeNotFound, a closed one 409 ErrCodeLeaseClosed.
	SubjectLeaseRenew = "tether.v1.lease.renew"
	// SubjectLeaseClose takes a LeaseRequest, closes the run's lease
	// (creating it closed if the run had none) and replies with the
	// LeaseInfo. The run's sandboxes are reaped at once. Idempotent.
	SubjectLeaseClose = "tether.v1.lease.close"
	// SubjectSandboxesList takes a SandboxesListRequest (an empty body is
	// allowed) and replies with one page of the ledger's records, a
	// SandboxesListResponse. 503 ErrCodeUnavailable while the ledger loads.
	SubjectSandboxesList = "tether.v1.sandboxes.list"
	// SubjectSandboxesRegister takes a SandboxRegisterRequest, records the
	// sandbox in the ledger as managed (Source "register") and replies with
	// its SandboxInfo. A node the coordinators have never seen connected is
	// 404 ErrCodeUnknownNode.
	SubjectSandboxesRegister = "tether.v1.sandboxes.register"
	// SubjectSandboxesReap takes a ReapRequest and replies with a
	// ReapResponse. With dry_run it only lists what the reaper would delete
	// (and why, or why not yet); with a run too, it lists what reaping the
	// run would delete, as if its lease were closed. Without dry_run, it
	// closes the run's lease (SubjectLeaseClose) so the active reaper
	// deletes the run's sandboxes now, and lists them. A run with no lease
	// and no sandboxes is 404 ErrCodeNotFound, and nothing is created (a
	// mistyped run id is not burnt).
	SubjectSandboxesReap = "tether.v1.sandboxes.reap"
	// SubjectSandboxesSync takes an empty body, takes an inventory of every
	// connected node's gateways now, and replies with a SandboxesSyncResponse
	// once the ledger has reconciled them (the inventories run every 30 s
	// and when a node connects anyway). 503 ErrCodeUnavailable when it
	// does not finish within the coordinator's limit (2 min).
	SubjectSandboxesSync = "tether.v1.sandboxes.sync"
	// SubjectSandboxEventPrefix prefixes the subjects of sandbox events:
	// SubjectSandboxEventPrefix + one of the Event* values, carrying a JSON
	// SandboxEvent. Subscribe to SubjectSandboxEventPrefix + ">" for all.
	SubjectSandboxEventPrefix = "tether.v1.events.sandbox."
)

// API error codes of the sandbox API (besides the shared ones in api.go).
const (
	// ErrCodeLeaseClosed: the run's lease was closed; a closed run cannot
	// be renewed or reopened (its sandboxes are being reaped).
	ErrCodeLeaseClosed = "lease_closed"
	// ErrCodeLeaseHeld: another holder holds the run's live lease; a
	// second holder would end the run for the first when it closes.
	ErrCodeLeaseHeld = "lease_held"
)

// Sandbox record states (SandboxInfo.State).
const (
	// SandboxLive: the sandbox exists on its gateway as far as anyone knows.
	SandboxLive = "live"
	// SandboxDeleting: a delete was forwarded or started and not confirmed.
	SandboxDeleting = "deleting"
	// SandboxDeleted: the gateway confirmed it gone, or a complete listing
	// of its gateway lacked it. Kept for a retention period, then purged.
	SandboxDeleted = "deleted"
	// SandboxLost: its node has been unreachable too long to know.
	SandboxLost = "lost"
	// SandboxLeaked: the reaper gave up deleting it; an operator must look.
	SandboxLeaked = "leaked"
)

// ValidSandboxState reports whether s is one of the Sandbox* states.
func ValidSandboxState(s string) bool {
	switch s {
	case SandboxLive, SandboxDeleting, SandboxDeleted, SandboxLost, SandboxLeaked:
		return true
	}
	return false
}

// Where a sandbox record came from (SandboxInfo.Source).
const (
	SourceFacade    = "facade"    // a create passed through a Tether facade
	SourceInventory = "inventory" // an agent's inventory listed it
	SourceRegister  = "register"  // a client registered it (SubjectSandboxesRegister)
)

// Reap reasons (ReapCandidate.Reason, SandboxEvent.Reason).
const (
	ReasonLeaseExpired = "lease_expired" // the owner lease was not renewed in time
	ReasonTTLExpired   = "ttl_expired"   // its Tether TTL or the gateway's expiry passed
	ReasonRunClosed    = "run_closed"    // its run's lease was closed
	ReasonUnowned      = "unowned"       // a managed sandbox with no lease, past the grace period
)

// Sandbox event names (SandboxEvent.Event and the subject's last token).
const (
	EventCreated    = "created"     // a record was created (any source)
	EventDeleted    = "deleted"     // a record became deleted
	EventLost       = "lost"        // a record became lost
	EventLeaked     = "leaked"      // the reaper gave up on a record
	EventReaped     = "reaped"      // the reaper deleted a sandbox
	EventReapFailed = "reap_failed" // one reaper delete attempt failed
)

// Limits and defaults of the sandbox API.
const (
	// MaxRunIDLen bounds a run (lease) id.
	MaxRunIDLen = 128
	// MaxSandboxIDLen bounds a sandbox id, name or workspace.
	MaxSandboxIDLen = 253
	// MaxHolderLen bounds a lease holder's description.
	MaxHolderLen = 256
	// MaxSandboxLabels bounds the labels of a registered sandbox.
	MaxSandboxLabels = 256
	// MaxRecordLabels, MaxRecordLabelBytes (keys plus values) and
	// MaxLabelValueLen bound the labels the ledger stores of a sandbox,
	// and those an agent sends of a sandbox too large for a frame
	// (BoundLabels). A label whose key is longer than MaxLabelKeyLen is
	// left out.
	MaxRecordLabels     = 64
	MaxRecordLabelBytes = 8 << 10
	MaxLabelValueLen    = 256
	MaxLabelKeyLen      = 256
	// DefaultLeaseTTL is a lease's TTL when the open request has none.
	DefaultLeaseTTL = time.Minute
	// MinLeaseTTL and MaxLeaseTTL bound a lease's TTL.
	MinLeaseTTL = time.Second
	MaxLeaseTTL = 24 * time.Hour
	// DefaultSandboxesLimit is the page size when a list request has none.
	DefaultSandboxesLimit = 500
	// MaxSandboxesLimit bounds SandboxesListRequest.Limit.
	MaxSandboxesLimit = 1000
)

// ValidRunID checks a run id, which is also its lease's id: 1 to
// MaxRunIDLen characters matching ^[A-Za-z0-9][A-Za-z0-9_.-]*$ (the syntax
// NeMo Gym's cleanup tooling accepts, wire-facts §4.4).
func ValidRunID(run string) error {
	if run == "" {
		return fmt.Errorf("run id is empty")
	}
	ok := len(run) <= MaxRunIDLen && isAlnum(run[0])
	for i := 1; ok && i < len(run); i++ {
		c := run[i]
		ok = isAlnum(c) || c == '_' || c == '.' || c == '-'
	}
	if !ok {
		return fmt.Errorf("run id %s: must be 1-%d characters of [A-Za-z0-9_.-], starting with a letter or digit", Clip(run), MaxRunIDLen)
	}
	return nil
}

// BoundLabels returns labels within the record bounds: the keys of keep
// that labels has, in keep's order, then the other keys in sorted order,
// each added while the labels stay within MaxRecordLabels labels and
// MaxRecordLabelBytes (a label that would pass the byte bound is left
// out), values clipped to MaxLabelValueLen bytes at a UTF-8 boundary and
// keys longer than MaxLabelKeyLen left out. It returns labels itself when
// they are within the bounds already, else a new map and true.
func BoundLabels(labels map[string]string, keep []string) (map[string]string, bool) {
	if within(labels) {
		return labels, false
	}
	out := make(map[string]string, MaxRecordLabels)
	size := 0
	add := func(k, v string) {
		if _, dup := out[k]; dup || len(out) == MaxRecordLabels || len(k) > MaxLabelKeyLen {
			return
		}
		v = clipValue(v)
		if size+len(k)+len(v) > MaxRecordLabelBytes {
			return
		}
		out[k] = v
		size += len(k) + len(v)
	}
	for _, k := range keep {
		if v, ok := labels[k]; ok {
			add(k, v)
		}
	}
	rest := make([]string, 0, len(labels))
	for k := range labels {
		if _, done := out[k]; !done {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		if len(out) == MaxRecordLabels {
			break
		}
		add(k, labels[k])
	}
	return out, true
}

// within reports whether labels are within BoundLabels' bounds.
func within(labels map[string]string) bool {
	if len(labels) > MaxRecordLabels {
		return false
	}
	size := 0
	for k, v := range labels {
		if len(k) > MaxLabelKeyLen || len(v) > MaxLabelValueLen {
			return false
		}
		size += len(k) + len(v)
	}
	return size <= MaxRecordLabelBytes
}

// clipValue cuts v to at most MaxLabelValueLen bytes, at a UTF-8
// boundary.
func clipValue(v string) string {
	if len(v) <= MaxLabelValueLen {
		return v
	}
	i := MaxLabelValueLen
	for i > 0 && !utf8.RuneStart(v[i]) {
		i--
	}
	return v[:i]
}

// SandboxInfo is one sandbox record of the ledger, as the NATS API returns
// it and as the ledger stores it (the value of its key in the KV bucket
// tether_sandboxes, with Revision 0). Times are UTC.
type SandboxInfo struct {
	Provider  string `json:"provider"`            // ProviderOpenShell or ProviderOpenSandbox
	Node      string `json:"node"`                // the node whose gateway holds it
	ID        string `json:"id"`                  // the gateway's id (OpenShell ObjectMeta.id, OpenSandbox id)
	Name      string `json:"name,omitempty"`      // OpenShell name; empty for OpenSandbox
	Workspace string `json:"workspace,omitempty"` // OpenShell workspace; empty for OpenSandbox
	// Team, User, Workload and Run are the attribution read from Labels
	// (wire-facts §4.2), or given at registration.
	Team     string `json:"team,omitempty"`
	User     string `json:"user,omitempty"`
	Workload string `json:"workload,omitempty"`
	Run      string `json:"run,omitempty"`
	// Labels are the gateway's labels (OpenShell) or metadata
	// (OpenSandbox), verbatim unless LabelsTruncated.
	Labels map[string]string `json:"labels,omitempty"`
	// LabelsTruncated says Labels is a bounded copy of the gateway's
	// labels (BoundLabels): the attribution keys and NeMo Gym's marker
	// first, then others in key order, up to MaxRecordLabels labels and
	// MaxRecordLabelBytes, values clipped to MaxLabelValueLen bytes.
	LabelsTruncated bool `json:"labels_truncated,omitempty"`
	// Managed: it carries NeMo Gym's marker label, or has an owning run
	// (given at a facade create or registration, or a run attribution
	// label), or was registered. Only managed sandboxes are reaped as
	// unowned.
	Managed bool `json:"managed,omitempty"`
	// Owner is the lease (run id) that owns it when set explicitly; when
	// empty, Run's lease owns it.
	Owner string `json:"owner,omitempty"`
	// CreatedAt is when the gateway created it (or when Tether first knew
	// of it, if the gateway did not say).
	CreatedAt time.Time `json:"created_at,omitzero"`
	// ExpiresAt is the gateway's expiry (OpenSandbox expiresAt); zero if
	// none.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// FirstSeen is when the ledger first recorded it.
	FirstSeen time.Time `json:"first_seen,omitzero"`
	// LastSeen is when a facade, a registration or an inventory last saw
	// it (refreshed at most once a minute by inventories).
	LastSeen time.Time `json:"last_seen,omitzero"`
	// TTLMS is Tether's TTL from CreatedAt, in milliseconds; 0 means none.
	TTLMS int64 `json:"ttl_ms,omitempty"`
	// State is one of the Sandbox* states; StateSince when it took it.
	State      string    `json:"state"`
	StateSince time.Time `json:"state_since,omitzero"`
	// Source is where the record came from first (Source* values).
	Source string `json:"source,omitempty"`
	// CreatedBy is the identity (KIND:NAME, as policy names it) that
	// created it through a facade or registered it; empty for a sandbox
	// known from an inventory only. A sandbox whose run has no lease
	// belongs to it.
	CreatedBy string `json:"created_by,omitempty"`
	// Attempts counts the reaper's failed delete attempts; LastError is
	// the last failure.
	Attempts  int    `json:"attempts,omitempty"`
	LastError string `json:"last_error,omitempty"`
	// Revision is the record's KV revision (in API replies only).
	Revision uint64 `json:"revision,omitempty"`
}

// LeaseOpenRequest is the body of a SubjectLeaseOpen request.
type LeaseOpenRequest struct {
	// Run is the run id (ValidRunID); the lease's key.
	Run string `json:"run"`
	// TTLMS is how long the lease lives without a renewal, in
	// milliseconds, MinLeaseTTL to MaxLeaseTTL; 0 means DefaultLeaseTTL.
	TTLMS int64 `json:"ttl_ms,omitempty"`
	// Holder describes who holds the lease (e.g. "host:pid"), for
	// operators; at most MaxHolderLen bytes.
	Holder string `json:"holder,omitempty"`
}

// Validate checks r.
func (r *LeaseOpenRequest) Validate() *APIError {
	if err := ValidRunID(r.Run); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "run: %v", err)
	}
	if r.TTLMS != 0 && (r.TTLMS < MinLeaseTTL.Milliseconds() || r.TTLMS > MaxLeaseTTL.Milliseconds()) {
		return NewAPIError(400, ErrCodeInvalid, "ttl_ms %d: must be 0 (default %d) or %d to %d", r.TTLMS,
			DefaultLeaseTTL.Milliseconds(), MinLeaseTTL.Milliseconds(), MaxLeaseTTL.Milliseconds())
	}
	if len(r.Holder) > MaxHolderLen {
		return NewAPIError(400, ErrCodeInvalid, "holder is %d bytes, over the %d byte limit", len(r.Holder), MaxHolderLen)
	}
	return nil
}

// LeaseRequest is the body of SubjectLeaseRenew and SubjectLeaseClose
// requests.
type LeaseRequest struct {
	Run string `json:"run"`
}

// Validate checks r.
func (r *LeaseRequest) Validate() *APIError {
	if err := ValidRunID(r.Run); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "run: %v", err)
	}
	return nil
}

// LeaseInfo is a run's lease, as the lease API replies with it and as the
// ledger stores it (the value of the run's key in the KV bucket
// tether_leases). Times are UTC.
type LeaseInfo struct {
	Run    string `json:"run"`
	Holder string `json:"holder,omitempty"`
	// TTLMS is the lease's TTL in milliseconds: each renewal sets
	// ExpiresAt to now + TTL.
	TTLMS     int64     `json:"ttl_ms"`
	ExpiresAt time.Time `json:"expires_at"`
	OpenedAt  time.Time `json:"opened_at,omitzero"`
	RenewedAt time.Time `json:"renewed_at,omitzero"`
	// Closed is set once the run's lease was closed; ClosedAt says when.
	Closed   bool      `json:"closed,omitempty"`
	ClosedAt time.Time `json:"closed_at,omitzero"`
	// OwnedBy is the identity (KIND:NAME, as policy names it) that opened
	// the lease: the run and its sandboxes are its, and policy decides
	// renewing, closing and reaping the run by it. Empty for a lease
	// opened before identities were recorded.
	OwnedBy string `json:"owned_by,omitempty"`
}

// SandboxesListRequest is the body of a SubjectSandboxesList request. Empty
// filter fields match everything. Records are sorted by their ledger key
// (provider, node, id); a page holds up to Limit records after the key
// After.
type SandboxesListRequest struct {
	Run      string `json:"run,omitempty"`
	Node     string `json:"node,omitempty"`
	State    string `json:"state,omitempty"` // one of the Sandbox* states
	Provider string `json:"provider,omitempty"`
	// Limit is the page size, 1 to MaxSandboxesLimit; 0 means
	// DefaultSandboxesLimit.
	Limit int `json:"limit,omitempty"`
	// After is the previous page's SandboxesListResponse.Next; empty for
	// the first page.
	After string `json:"after,omitempty"`
}

// Validate checks r.
func (r *SandboxesListRequest) Validate() *APIError {
	if r.Limit < 0 || r.Limit > MaxSandboxesLimit {
		return NewAPIError(400, ErrCodeInvalid, "limit %d: must be 0 (default %d) to %d", r.Limit, DefaultSandboxesLimit, MaxSandboxesLimit)
	}
	if r.State != "" && !ValidSandboxState(r.State) {
		return NewAPIError(400, ErrCodeInvalid, "state %s: want one of live, deleting, deleted, lost, leaked", Clip(r.State))
	}
	if r.Provider != "" && !ValidProvider(r.Provider) {
		return NewAPIError(400, ErrCodeInvalid, "provider %s: want %s or %s", Clip(r.Provider), ProviderOpenShell, ProviderOpenSandbox)
	}
	return nil
}

// SandboxesListResponse is the reply to SubjectSandboxesList.
type SandboxesListResponse struct {
	Sandboxes []SandboxInfo `json:"sandboxes"`
	// Next is the cursor of the next page (its request's After); empty on
	// the last page.
	Next string `json:"next,omitempty"`
}

// SandboxRegisterRequest is the body of a SubjectSandboxesRegister request:
// a client tells the ledger about a sandbox it created on a node's gateway
// directly.
type SandboxRegisterRequest struct {
	Provider  string `json:"provider"`
	Node      string `json:"node"`
	ID        string `json:"id"`
	Name      string `json:"name,omitempty"`
	Workspace string `json:"workspace,omitempty"`
	// Run is the owning run (ValidRunID); empty takes it from Labels.
	Run string `json:"run,omitempty"`
	// TTLMS is Tether's TTL in milliseconds from creation; 0 means none.
	TTLMS  int64             `json:"ttl_ms,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// Validate checks r.
func (r *SandboxRegisterRequest) Validate() *APIError {
	if !ValidProvider(r.Provider) {
		return NewAPIError(400, ErrCodeInvalid, "provider %s: want %s or %s", Clip(r.Provider), ProviderOpenShell, ProviderOpenSandbox)
	}
	if err := ValidNodeID(r.Node); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "node: %v", err)
	}
	for _, f := range []struct{ name, v string }{{"id", r.ID}, {"name", r.Name}, {"workspace", r.Workspace}} {
		if len(f.v) > MaxSandboxIDLen {
			return NewAPIError(400, ErrCodeInvalid, "%s is %d bytes, over the %d byte limit", f.name, len(f.v), MaxSandboxIDLen)
		}
		// Gateways' ids, names and workspaces are printable words (UUIDs,
		// DNS labels): anything else is a mistake that would also garble
		// listings.
		if i := strings.IndexFunc(f.v, func(c rune) bool { return c <= ' ' || c == 0x7f || c == '/' || c == '\\' }); i >= 0 {
			return NewAPIError(400, ErrCodeInvalid, "%s %s: character %q is not allowed (no spaces, control characters or slashes)", f.name, Clip(f.v), f.v[i])
		}
		if f.name == "id" && (f.v == "." || f.v == "..") {
			// The reaper deletes an OpenSandbox sandbox at /v1/sandboxes/ID.
			return NewAPIError(400, ErrCodeInvalid, "id %s is not a sandbox id", Clip(f.v))
		}
	}
	if r.ID == "" {
		return NewAPIError(400, ErrCodeInvalid, "id is required")
	}
	if r.Provider == ProviderOpenShell && r.Name == "" {
		return NewAPIError(400, ErrCodeInvalid, "name is required for an openshell sandbox")
	}
	if r.Run != "" {
		if err := ValidRunID(r.Run); err != nil {
			return NewAPIError(400, ErrCodeInvalid, "run: %v", err)
		}
	}
	if r.TTLMS < 0 {
		return NewAPIError(400, ErrCodeInvalid, "ttl_ms %d is negative", r.TTLMS)
	}
	if len(r.Labels) > MaxSandboxLabels {
		return NewAPIError(400, ErrCodeInvalid, "%d labels, over the limit of %d", len(r.Labels), MaxSandboxLabels)
	}
	return nil
}

// ReapRequest is the body of a SubjectSandboxesReap request.
type ReapRequest struct {
	// Run restricts the reap to one run's sandboxes; required unless
	// DryRun (reaping everything is the reaper's own job).
	Run    string `json:"run,omitempty"`
	DryRun bool   `json:"dry_run,omitempty"`
}

// Validate checks r.
func (r *ReapRequest) Validate() *APIError {
	if r.Run == "" {
		if !r.DryRun {
			return NewAPIError(400, ErrCodeInvalid, "run is required unless dry_run is set")
		}
		return nil
	}
	if err := ValidRunID(r.Run); err != nil {
		return NewAPIError(400, ErrCodeInvalid, "run: %v", err)
	}
	return nil
}

// ReapCandidate is one sandbox the reaper would delete.
type ReapCandidate struct {
	Sandbox SandboxInfo `json:"sandbox"`
	// Reason is one of the Reason* values.
	Reason string `json:"reason"`
	// Blocked, when set, says why the reaper waits instead of deleting it
	// now (e.g. its node is unreachable or its last inventory incomplete).
	Blocked string `json:"blocked,omitempty"`
}

// ReapResponse is the reply to SubjectSandboxesReap.
type ReapResponse struct {
	DryRun bool `json:"dry_run,omitempty"`
	// Candidates are the sandboxes that go (or would go), sorted by ledger
	// key.
	Candidates []ReapCandidate `json:"candidates"`
	// Queued is set when the run's lease was closed and the active reaper
	// deletes the candidates now; follow them with SubjectSandboxesList.
	Queued bool `json:"queued,omitempty"`
	// Omitted counts the candidates left out (the last ones by key) so
	// that the reply fits the server's max payload; list the run's
	// sandboxes (SubjectSandboxesList) for all of them.
	Omitted int `json:"omitted,omitempty"`
}

// SandboxesSyncResponse is the reply to SubjectSandboxesSync.
type SandboxesSyncResponse struct {
	// DurationMS is how long the inventories and their reconciliation
	// took, in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// Incomplete lists what could not be listed; the ledger keeps its
	// earlier view of those nodes and gateways.
	Incomplete []SyncProblem `json:"incomplete,omitempty"`
}

// SyncProblem is a node (Target empty) whose inventory failed, or one of
// its gateways whose listing was incomplete.
type SyncProblem struct {
	Node   string `json:"node"`
	Target string `json:"target,omitempty"`
	Error  string `json:"error"`
}

// SandboxEvent is the body of a sandbox event (SubjectSandboxEventPrefix +
// Event).
type SandboxEvent struct {
	Time    time.Time   `json:"time"`
	Event   string      `json:"event"` // one of the Event* values
	Sandbox SandboxInfo `json:"sandbox"`
	// Reason is the reap reason (reaped, reap_failed, leaked).
	Reason string `json:"reason,omitempty"`
	// Error is the failure (reap_failed, leaked).
	Error string `json:"error,omitempty"`
	// Coordinator is the id of the coordinator that recorded the event.
	Coordinator string `json:"coordinator,omitempty"`
}
