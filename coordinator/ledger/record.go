package ledger

import (
	"context"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"strings"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// State is a sandbox record's state: one of the State* constants.
type State string

// Record states (protocol.Sandbox* values).
const (
	// StateLive: the sandbox exists on its gateway as far as anyone knows.
	StateLive State = protocol.SandboxLive
	// StateDeleting: a delete was forwarded (facade) or started (reaper)
	// and not confirmed yet.
	StateDeleting State = protocol.SandboxDeleting
	// StateDeleted: the gateway confirmed it gone, or a complete listing
	// lacked it. Purged after Config.Retention.
	StateDeleted State = protocol.SandboxDeleted
	// StateLost: its node has been unreachable, with no inventory, for
	// longer than ReaperConfig.LostAfter. The node's next complete
	// inventory decides (live or deleted).
	StateLost State = protocol.SandboxLost
	// StateLeaked: the reaper failed ReaperConfig.MaxAttempts times to
	// delete it.
	StateLeaked State = protocol.SandboxLeaked
)

// Sources of a record (Record.Source).
const (
	SourceFacade    = protocol.SourceFacade
	SourceInventory = protocol.SourceInventory
	SourceRegister  = protocol.SourceRegister
)

// Key names one sandbox: its provider, the node whose gateway holds it and
// the gateway's id for it (OpenShell ObjectMeta.id, OpenSandbox id).
type Key struct{ Provider, Node, ID string }

func (k Key) String() string { return k.Provider + " sandbox " + k.ID + " on node " + k.Node }

// Record is the ledger's view of one sandbox. Its JSON form in the KV
// bucket is protocol.SandboxInfo.
type Record struct {
	Provider, Node, Workspace, Name, ID string
	// Team, User, Workload and Run are the attribution the ledger extracts
	// from Labels (Config.Attribution), unless set explicitly.
	Team, User, Workload, Run string
	// Labels are the gateway's labels or metadata, verbatim unless
	// LabelsTruncated: the ledger stores a bounded copy
	// (protocol.BoundLabels: the marker and attribution keys first, then
	// others in key order).
	Labels map[string]string
	// LabelsTruncated says Labels were cut to the bounds (by the ledger,
	// or by the agent for a sandbox too large for a frame).
	LabelsTruncated bool
	// Managed: NeMo Gym's marker label (Config.MarkerLabel), or an owning
	// run (Owner or Run, given or read from the labels), or registered.
	// Only managed sandboxes are reaped as unowned; once managed, a record
	// stays managed.
	Managed bool
	// Owner is the lease id (= run id) owning it when set by a facade or a
	// registration; "" means the lease of Run, if any.
	Owner string
	// CreatedAt is the gateway's creation time (or when first known);
	// ExpiresAt the gateway's expiry (zero if none); LastSeen when a
	// facade, registration or inventory last saw it.
	CreatedAt, ExpiresAt, LastSeen time.Time
	// FirstSeen is when the ledger first recorded it.
	FirstSeen time.Time
	// TTL is Tether's own TTL from CreatedAt (OpenShell has none); 0 = none.
	TTL time.Duration
	// State and when it was entered.
	State      State
	StateSince time.Time
	// Source is where the record came from first: SourceFacade,
	// SourceInventory or SourceRegister.
	Source string
	// Attempts counts failed reaper deletes; LastError is the last one.
	Attempts  int
	LastError string
	// CreatedBy is the identity that created the sandbox through a facade
	// or registered it (kept from the first one); "" when known from an
	// inventory only. See Ledger.OwnerOf.
	CreatedBy string
	// Revision is the record's KV revision (read-only: writes ignore it).
	Revision uint64
}

// Key returns r's key.
func (r Record) Key() Key { return Key{r.Provider, r.Node, r.ID} }

// OwnerLease returns the id of the lease that owns r: Owner, else Run.
func (r Record) OwnerLease() string {
	if r.Owner != "" {
		return r.Owner
	}
	return r.Run
}

// Info returns r in its wire form.
func (r Record) Info() protocol.SandboxInfo {
	return protocol.SandboxInfo{
		Provider: r.Provider, Node: r.Node, ID: r.ID, Name: r.Name, Workspace: r.Workspace,
		Team: r.Team, User: r.User, Workload: r.Workload, Run: r.Run,
		Labels: r.Labels, LabelsTruncated: r.LabelsTruncated, Managed: r.Managed, Owner: r.Owner,
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, FirstSeen: r.FirstSeen, LastSeen: r.LastSeen,
		TTLMS: r.TTL.Milliseconds(), State: string(r.State), StateSince: r.StateSince,
		Source: r.Source, Attempts: r.Attempts, LastError: r.LastError, Revision: r.Revision,
		CreatedBy: r.CreatedBy,
	}
}

// recordFromInfo is Info's inverse.
func recordFromInfo(i protocol.SandboxInfo) Record {
	return Record{
		Provider: i.Provider, Node: i.Node, ID: i.ID, Name: i.Name, Workspace: i.Workspace,
		Team: i.Team, User: i.User, Workload: i.Workload, Run: i.Run,
		Labels: i.Labels, LabelsTruncated: i.LabelsTruncated, Managed: i.Managed, Owner: i.Owner,
		CreatedAt: i.CreatedAt, ExpiresAt: i.ExpiresAt, FirstSeen: i.FirstSeen, LastSeen: i.LastSeen,
		TTL: time.Duration(i.TTLMS) * time.Millisecond, State: State(i.State), StateSince: i.StateSince,
		Source: i.Source, Attempts: i.Attempts, LastError: i.LastError, Revision: i.Revision,
		CreatedBy: i.CreatedBy,
	}
}

// equalStored reports whether a and b store the same value, ignoring
// Revision.
func equalStored(a, b Record) bool {
	a.Revision, b.Revision = 0, 0
	if !maps.Equal(a.Labels, b.Labels) {
		return false
	}
	a.Labels, b.Labels = nil, nil
	return a.CreatedAt.Equal(b.CreatedAt) && a.ExpiresAt.Equal(b.ExpiresAt) && a.LastSeen.Equal(b.LastSeen) &&
		a.FirstSeen.Equal(b.FirstSeen) && a.StateSince.Equal(b.StateSince) &&
		withoutTimes(a) == withoutTimes(b)
}

// scalars is Record without its map and times, for ==.
type scalars struct {
	Provider, Node, Workspace, Name, ID string
	Team, User, Workload, Run           string
	LabelsTruncated, Managed            bool
	Owner                               string
	TTL                                 time.Duration
	State                               State
	Source                              string
	Attempts                            int
	LastError                           string
	CreatedBy                           string
}

func withoutTimes(r Record) scalars {
	return scalars{r.Provider, r.Node, r.Workspace, r.Name, r.ID, r.Team, r.User, r.Workload, r.Run,
		r.LabelsTruncated, r.Managed, r.Owner, r.TTL, r.State, r.Source, r.Attempts, r.LastError, r.CreatedBy}
}

// validKey checks the parts of a record's key.
func validKey(k Key) error {
	if !protocol.ValidProvider(k.Provider) {
		return fmt.Errorf("provider %s: want %s or %s", protocol.Clip(k.Provider), protocol.ProviderOpenShell, protocol.ProviderOpenSandbox)
	}
	if k.Node == "" || len(k.Node) > protocol.MaxNodeIDLen {
		return fmt.Errorf("node %s: want 1 to %d bytes", protocol.Clip(k.Node), protocol.MaxNodeIDLen)
	}
	if k.ID == "" || len(k.ID) > protocol.MaxSandboxIDLen {
		return fmt.Errorf("id %s: want 1 to %d bytes", protocol.Clip(k.ID), protocol.MaxSandboxIDLen)
	}
	return nil
}

// b32 is base32hex in lowercase without padding: its alphabet is valid in
// KV keys and sorts like the bytes it encodes.
var b32 = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// encodeToken makes s one valid KV key token: s itself when it is 1 or more
// of [A-Za-z0-9_-], else "=" followed by s in base32hex. A plain token never
// contains "=", so the two forms never collide.
func encodeToken(s string) string {
	plain := s != ""
	for i := 0; plain && i < len(s); i++ {
		c := s[i]
		plain = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	if plain {
		return s
	}
	return "=" + b32.EncodeToString([]byte(s))
}

// decodeToken is encodeToken's inverse. It accepts only what encodeToken
// writes, so that one string has one key: a plain token of [A-Za-z0-9_-],
// or "=" and the base32hex of a string that is not one (a foreign writer's
// "=" + base32 of "abc", or base32 with stray trailing bits, would
// otherwise alias the key "abc" under a second key).
func decodeToken(t string) (string, error) {
	var s string
	if rest, ok := strings.CutPrefix(t, "="); ok {
		b, err := b32.DecodeString(rest)
		if err != nil {
			return "", fmt.Errorf("token %s: %w", protocol.Clip(t), err)
		}
		s = string(b)
	} else {
		s = t
	}
	if encodeToken(s) != t {
		return "", fmt.Errorf("token %s is not in canonical form (want %s)", protocol.Clip(t), protocol.Clip(encodeToken(s)))
	}
	return s, nil
}

// decodeSandboxEntry decodes a sandboxes-bucket entry stored under key:
// the value is a protocol.SandboxInfo whose provider, node and id are
// valid and name that very key (a record stored under another key would
// be indexed under one key and written and purged under another), with a
// TTL that fits a time.Duration.
func decodeSandboxEntry(key string, value []byte) (Record, error) {
	var info protocol.SandboxInfo
	if err := json.Unmarshal(value, &info); err != nil {
		return Record{}, fmt.Errorf("decode: %w", err)
	}
	if info.TTLMS < 0 || info.TTLMS > math.MaxInt64/int64(time.Millisecond) {
		return Record{}, fmt.Errorf("ttl_ms %d: out of range", info.TTLMS)
	}
	r := recordFromInfo(info)
	if err := validKey(r.Key()); err != nil {
		return Record{}, err
	}
	if k := r.Key().kvKey(); k != key {
		return Record{}, fmt.Errorf("record of %s is stored under key %s, not its own %s", r.Key(), protocol.Clip(key), protocol.Clip(k))
	}
	return r, nil
}

// decodeLeaseEntry decodes a leases-bucket entry stored under key (the
// run's token): a protocol.LeaseInfo with a TTL that fits a
// time.Duration. The run is the key's (the value's own is not trusted).
func decodeLeaseEntry(key string, value []byte) (Lease, error) {
	run, err := decodeToken(key)
	if err != nil {
		return Lease{}, fmt.Errorf("key: %w", err)
	}
	var info protocol.LeaseInfo
	if err := json.Unmarshal(value, &info); err != nil {
		return Lease{}, fmt.Errorf("decode: %w", err)
	}
	if info.TTLMS < 0 || info.TTLMS > math.MaxInt64/int64(time.Millisecond) {
		return Lease{}, fmt.Errorf("ttl_ms %d: out of range", info.TTLMS)
	}
	ls := leaseFromInfo(info)
	ls.Run = run
	return ls, nil
}

// kvKey is the record's key in the bucket: <provider>.<node>.<id>, each
// token encoded by encodeToken.
func (k Key) kvKey() string {
	return k.Provider + "." + encodeToken(k.Node) + "." + encodeToken(k.ID)
}

// parseKVKey is kvKey's inverse.
func parseKVKey(s string) (Key, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return Key{}, fmt.Errorf("ledger key %s: want provider.node.id", protocol.Clip(s))
	}
	node, err := decodeToken(parts[1])
	if err != nil {
		return Key{}, fmt.Errorf("ledger key %s: node: %w", protocol.Clip(s), err)
	}
	id, err := decodeToken(parts[2])
	if err != nil {
		return Key{}, fmt.Errorf("ledger key %s: id: %w", protocol.Clip(s), err)
	}
	return Key{parts[0], node, id}, nil
}

// Attribution says which labels carry NeMo Gym's attribution (wire-facts
// §4.2, §8.2). Each field lists key names, tried in order, each first under
// every one of Prefixes and then bare.
type Attribution struct {
	// Prefixes go before each key name; default ["nemo-gym.nvidia.com/"]
	// (the OpenSandbox provider's default key_prefix).
	Prefixes []string
	// Team, User, Workload and Run list the key names of each field;
	// defaults ["team"], ["user"], ["workload"], ["run", "run-id"].
	Team, User, Workload, Run []string
}

// withDefaults fills empty fields.
func (a Attribution) withDefaults() Attribution {
	if a.Prefixes == nil {
		a.Prefixes = []string{"nemo-gym.nvidia.com/"}
	}
	if a.Team == nil {
		a.Team = []string{"team"}
	}
	if a.User == nil {
		a.User = []string{"user"}
	}
	if a.Workload == nil {
		a.Workload = []string{"workload"}
	}
	if a.Run == nil {
		a.Run = []string{"run", "run-id"}
	}
	return a
}

// keys returns every label key a holds attribution under: each name of
// each field under every prefix, then bare.
func (a *Attribution) keys() []string {
	var out []string
	for _, names := range [][]string{a.Run, a.Team, a.User, a.Workload} {
		for _, n := range names {
			for _, p := range a.Prefixes {
				out = append(out, p+n)
			}
			out = append(out, n)
		}
	}
	return out
}

// lookup returns the first non-empty value of names in labels, prefixed
// keys first.
func (a *Attribution) lookup(labels map[string]string, names []string) string {
	for _, n := range names {
		for _, p := range a.Prefixes {
			if v := strings.TrimSpace(labels[p+n]); v != "" {
				return v
			}
		}
		if v := strings.TrimSpace(labels[n]); v != "" {
			return v
		}
	}
	return ""
}

// attribute fills r's empty attribution fields from its labels.
func (a *Attribution) attribute(r *Record) {
	if len(r.Labels) == 0 {
		return
	}
	fill := func(f *string, names []string) {
		if *f == "" {
			*f = a.lookup(r.Labels, names)
		}
	}
	fill(&r.Team, a.Team)
	fill(&r.User, a.User)
	fill(&r.Workload, a.Workload)
	fill(&r.Run, a.Run)
}

// sanitizeValue is how NeMo Gym's OpenSandbox provider turns a metadata
// value into a label value (wire-facts §4.3): runs of characters outside
// [A-Za-z0-9_.-] become one '_', leading and trailing '.', '_', '-' are
// stripped, the result is cut to 63 bytes and stripped again, and an empty
// result becomes "metadata". A run id longer than 63 bytes therefore
// reaches the label cut, and the ledger matches leases by this form too.
func sanitizeValue(v string) string {
	var b strings.Builder
	under := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' {
			b.WriteByte(c)
			under = false
		} else if !under {
			b.WriteByte('_')
			under = true
		}
	}
	s := strings.Trim(b.String(), "._-")
	if len(s) > 63 {
		s = strings.Trim(s[:63], "._-")
	}
	if s == "" {
		s = "metadata"
	}
	return s
}

// Deleter deletes a sandbox on its node's gateway, through the node's
// tunnel. An error wrapping gateway.ErrNotFound means the sandbox is
// already gone, which counts as deleted.
type Deleter interface {
	Delete(ctx context.Context, r Record) error
}

// FleetView tells the reaper whether it may act on a node: its tunnel is up
// (and, as the coordinator implements it, an inventory taken over the
// current session was complete).
type FleetView interface {
	Reachable(node string) bool
}
