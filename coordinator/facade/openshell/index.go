package openshell

import (
	"slices"
	"sync"
	"time"
)

// Bounds of the facade's own index.
const (
	// maxIndexed bounds the sandboxes the index remembers; past it, the
	// oldest eighth is dropped.
	maxIndexed = 1 << 17
	// pendingTTL is how long a forwarded CreateSandbox remembers its node,
	// covering NeMo Gym's retries of the same name after an ambiguous
	// failure (wire-facts §1.5).
	pendingTTL = 15 * time.Minute
)

// wsName is a sandbox's (workspace, name), the gateway's unique key within
// one gateway; workspace is already resolved ("" → "default").
type wsName struct{ ws, name string }

// seen is what the index remembers of a sandbox that passed through.
type seen struct {
	node, id string
	key      wsName
	at       time.Time
}

// pendingCreate remembers where a CreateSandbox of a named sandbox went and
// what it asked for, so that a retry lands on the same node and a sandbox
// adopted later (ALREADY_EXISTS, then GetSandbox) is recorded as the
// facade's.
type pendingCreate struct {
	node   string
	owner  string
	ttl    time.Duration
	labels map[string]string
	at     time.Time
}

// index is the facade's memory of the sandboxes it saw in responses (id ↔
// (workspace, name) ↔ node) and of recent creates. It backs up the ledger:
// the ledger may be loading, failing, or behind a create that just
// returned. Entries are hints; a wrong one costs a fan-out, never a wrong
// answer. Safe for concurrent use.
type index struct {
	mu      sync.Mutex
	byID    map[string]*seen
	byName  map[wsName]*seen
	pending map[wsName]pendingCreate
	pruned  time.Time // when expired pending creates were last dropped
}

func newIndex() *index {
	return &index{byID: make(map[string]*seen), byName: make(map[wsName]*seen), pending: make(map[wsName]pendingCreate)}
}

// learn records that node's gateway holds sandbox id as (ws, name).
func (x *index) learn(node, id, ws, name string) {
	if id == "" || node == "" {
		return
	}
	now := time.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.byID[id]; ok {
		if cur, ok := x.byName[old.key]; ok && cur == old {
			delete(x.byName, old.key)
		}
		old.node, old.key, old.at = node, wsName{ws, name}, now
		if name != "" {
			x.byName[old.key] = old
		}
		return
	}
	if len(x.byID) >= maxIndexed {
		x.evictLocked()
	}
	s := &seen{node: node, id: id, key: wsName{ws, name}, at: now}
	x.byID[id] = s
	if name != "" {
		x.byName[s.key] = s
	}
}

// evictLocked drops the oldest eighth of the entries.
func (x *index) evictLocked() {
	ats := make([]time.Time, 0, len(x.byID))
	for _, s := range x.byID {
		ats = append(ats, s.at)
	}
	slices.SortFunc(ats, time.Time.Compare)
	cut := ats[len(ats)/8]
	for id, s := range x.byID {
		if !s.at.After(cut) {
			x.dropLocked(id, s)
		}
	}
}

func (x *index) dropLocked(id string, s *seen) {
	delete(x.byID, id)
	if cur, ok := x.byName[s.key]; ok && cur == s {
		delete(x.byName, s.key)
	}
}

// forget drops sandbox id (its gateway confirmed it gone).
func (x *index) forget(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if s, ok := x.byID[id]; ok {
		x.dropLocked(id, s)
	}
}

// byIDNode returns the node that holds id, if seen.
func (x *index) byIDNode(id string) (node string, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s, ok := x.byID[id]
	if !ok {
		return "", false
	}
	return s.node, true
}

// byNameNode returns the node and id of (ws, name), if seen.
func (x *index) byNameNode(k wsName) (node, id string, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s, ok := x.byName[k]
	if !ok {
		return "", "", false
	}
	return s.node, s.id, true
}

// addPending remembers a create of k forwarded to p.node.
func (x *index) addPending(k wsName, p pendingCreate) {
	if k.name == "" {
		return // the gateway names it; a retry cannot find it by name
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	now := time.Now()
	if now.Sub(x.pruned) > time.Minute {
		x.pruned = now
		for pk, pc := range x.pending {
			if now.Sub(pc.at) > pendingTTL {
				delete(x.pending, pk)
			}
		}
	}
	p.at = now
	x.pending[k] = p
}

// pendingFor returns the recent create of k, if any.
func (x *index) pendingFor(k wsName) (pendingCreate, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	p, ok := x.pending[k]
	if !ok || time.Since(p.at) > pendingTTL {
		return pendingCreate{}, false
	}
	return p, true
}

// dropPending forgets the recent create of k.
func (x *index) dropPending(k wsName) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.pending, k)
}
