package ledger

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/protocol"
)

// State is a sandbox record's state.
type State string

// Record states.
const (
	StateLive     State = "live"
	StateDeleting State = "deleting"
	StateDeleted  State = "deleted"
	StateLost     State = "lost"
	StateLeaked   State = "leaked"
)

// Sources of a record.
const (
	SourceFacade    = "facade"
	SourceInventory = "inventory"
	SourceRegister  = "register"
)

// Key names one sandbox: its provider, the node whose gateway holds it and
// the gateway's id for it.
type Key struct{ Provider, Node, ID string }

// Record is the ledger's view of one sandbox.
type Record struct {
	Provider, Node, Workspace, Name, ID string
	Team, User, Workload, Run           string
	Labels                              map[string]string
	Managed                             bool
	Owner                               string
	CreatedAt, ExpiresAt, LastSeen      time.Time
	TTL                                 time.Duration
	State                               State
	Source                              string
	Revision                            uint64
}

// Key returns r's key.
func (r Record) Key() Key { return Key{r.Provider, r.Node, r.ID} }

// Filter selects records; empty fields match all.
type Filter struct{ Run, Node, State, Provider string }

// Deleter deletes a sandbox on its node's gateway.
type Deleter interface {
	Delete(ctx context.Context, r Record) error
}

// FleetView tells the reaper whether a node's tunnel is up.
type FleetView interface {
	Reachable(node string) bool
}

// Config configures Open.
type Config struct {
	NATS       *nats.Conn
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Ledger is the sandbox ledger.
type Ledger struct{ cfg Config }

var errSkeleton = errors.New("ledger: not implemented yet")

// Open opens the ledger.
func Open(ctx context.Context, cfg Config) (*Ledger, error) { return nil, errSkeleton }

// Close stops the ledger.
func (l *Ledger) Close() error { return nil }

// Ready reports whether the initial load finished.
func (l *Ledger) Ready() bool { return false }

// Created records a create.
func (l *Ledger) Created(ctx context.Context, r Record) error { return errSkeleton }

// Deleting records a forwarded delete.
func (l *Ledger) Deleting(ctx context.Context, k Key) error { return errSkeleton }

// Deleted records a confirmed delete.
func (l *Ledger) Deleted(ctx context.Context, k Key) error { return errSkeleton }

// ByID finds a record by provider and id.
func (l *Ledger) ByID(provider, id string) (Record, bool) { return Record{}, false }

// ByName finds a record by provider, workspace and name.
func (l *Ledger) ByName(provider, workspace, name string) (Record, bool) { return Record{}, false }

// List lists records.
func (l *Ledger) List(f Filter) []Record { return nil }

// LiveOn counts live sandboxes on node.
func (l *Ledger) LiveOn(node string) int { return 0 }

// Reconcile merges a node's inventory.
func (l *Ledger) Reconcile(ctx context.Context, node string, inv []protocol.Sandbox, gw []protocol.GatewayStatus) error {
	return errSkeleton
}
