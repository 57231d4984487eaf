package ledger

import "time"

// keySet is a set of KV keys.
type keySet map[string]struct{}

// index holds every record of the sandboxes bucket by KV key, and the
// secondary indexes lookups and List use. The Ledger's mu guards it.
// Records are values, replaced whole on every change, and their Labels maps
// are never modified after they are stored: copies handed out share them
// safely.
type index struct {
	recs    map[string]Record
	byID    map[[2]string]keySet // provider, id
	byName  map[[3]string]keySet // provider, workspace, name
	byRun   map[string]keySet
	byOwner map[string]keySet // OwnerLease()
	byNode  map[string]keySet
	// counts are the records per provider, node and state (the
	// tether_sandboxes gauge); live the live records per node (LiveOn).
	counts map[gaugeKey]int
	live   map[string]int
}

type gaugeKey struct {
	provider, node string
	state          State
}

func newIndex() index {
	return index{
		recs:    map[string]Record{},
		byID:    map[[2]string]keySet{},
		byName:  map[[3]string]keySet{},
		byRun:   map[string]keySet{},
		byOwner: map[string]keySet{},
		byNode:  map[string]keySet{},
		counts:  map[gaugeKey]int{},
		live:    map[string]int{},
	}
}

func addKey[K comparable](m map[K]keySet, k K, key string) {
	s := m[k]
	if s == nil {
		s = keySet{}
		m[k] = s
	}
	s[key] = struct{}{}
}

func removeKey[K comparable](m map[K]keySet, k K, key string) {
	if s := m[k]; s != nil {
		delete(s, key)
		if len(s) == 0 {
			delete(m, k)
		}
	}
}

// put stores r under key, replacing any older version.
func (x *index) put(key string, r Record) {
	x.remove(key)
	x.recs[key] = r
	addKey(x.byID, [2]string{r.Provider, r.ID}, key)
	if r.Name != "" {
		addKey(x.byName, [3]string{r.Provider, r.Workspace, r.Name}, key)
	}
	if r.Run != "" {
		addKey(x.byRun, r.Run, key)
	}
	if o := r.OwnerLease(); o != "" {
		addKey(x.byOwner, o, key)
	}
	addKey(x.byNode, r.Node, key)
	x.count(r, 1)
}

// remove drops the record under key, if any.
func (x *index) remove(key string) {
	r, ok := x.recs[key]
	if !ok {
		return
	}
	delete(x.recs, key)
	removeKey(x.byID, [2]string{r.Provider, r.ID}, key)
	if r.Name != "" {
		removeKey(x.byName, [3]string{r.Provider, r.Workspace, r.Name}, key)
	}
	if r.Run != "" {
		removeKey(x.byRun, r.Run, key)
	}
	if o := r.OwnerLease(); o != "" {
		removeKey(x.byOwner, o, key)
	}
	removeKey(x.byNode, r.Node, key)
	x.count(r, -1)
}

func (x *index) count(r Record, d int) {
	gk := gaugeKey{r.Provider, r.Node, r.State}
	if x.counts[gk] += d; x.counts[gk] == 0 {
		delete(x.counts, gk)
	}
	if r.State == StateLive {
		if x.live[r.Node] += d; x.live[r.Node] == 0 {
			delete(x.live, r.Node)
		}
	}
}

// best picks from keys the record not deleted, then the one seen last.
func (x *index) best(keys keySet) (Record, bool) {
	var out Record
	found := false
	for k := range keys {
		r := x.recs[k]
		if !found || better(r, out) {
			out, found = r, true
		}
	}
	return out, found
}

func better(a, b Record) bool {
	if (a.State == StateDeleted) != (b.State == StateDeleted) {
		return b.State == StateDeleted
	}
	if !a.LastSeen.Equal(b.LastSeen) {
		return a.LastSeen.After(b.LastSeen)
	}
	return a.Key().kvKey() < b.Key().kvKey() // deterministic
}

// leaseIndex holds every lease by run id, and by the label form of the run
// id (sanitizeValue) for runs whose label differs from the id.
type leaseIndex struct {
	byRun       map[string]Lease
	bySanitized map[string]string
}

func newLeaseIndex() leaseIndex {
	return leaseIndex{byRun: map[string]Lease{}, bySanitized: map[string]string{}}
}

func (x *leaseIndex) put(ls Lease) {
	x.byRun[ls.Run] = ls
	if s := sanitizeValue(ls.Run); s != ls.Run {
		x.bySanitized[s] = ls.Run
	}
}

func (x *leaseIndex) remove(run string) {
	delete(x.byRun, run)
	if s := sanitizeValue(run); x.bySanitized[s] == run {
		delete(x.bySanitized, s)
	}
}

// get returns the lease of a run id as a record names it: the id itself,
// or the label form of a longer id.
func (x *leaseIndex) get(id string) (Lease, bool) {
	if ls, ok := x.byRun[id]; ok {
		return ls, true
	}
	if run, ok := x.bySanitized[id]; ok {
		ls, ok := x.byRun[run]
		return ls, ok
	}
	return Lease{}, false
}

// inventoryStatus is the value of a node's key in BucketInventory: how
// the node's last reconciled inventory went.
type inventoryStatus struct {
	Node string `json:"node"`
	// ListedAt is when the inventory started listing; At when the ledger
	// finished reconciling it.
	ListedAt time.Time `json:"listed_at"`
	At       time.Time `json:"at"`
	// Gateways are the agent's statuses, one per target.
	Gateways    []gatewayStatus `json:"gateways"`
	Coordinator string          `json:"coordinator,omitempty"`
	revision    uint64
}

type gatewayStatus struct {
	Target   string `json:"target"`
	Provider string `json:"provider"`
	Complete bool   `json:"complete"`
	Count    int    `json:"count"`
	Error    string `json:"error,omitempty"`
}

// complete reports whether the inventory listed provider's sandboxes
// completely: the node has a gateway of it and every one was complete. If
// not, it returns why.
func (s inventoryStatus) complete(provider string) (bool, string) {
	seen := false
	for _, g := range s.Gateways {
		if g.Provider != provider {
			continue
		}
		seen = true
		if !g.Complete {
			return false, "last inventory of target " + g.Target + " was incomplete: " + g.Error
		}
	}
	if !seen {
		return false, "last inventory listed no " + provider + " gateway"
	}
	return true, ""
}
