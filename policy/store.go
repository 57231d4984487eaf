package policy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Store holds the policy in force for a long-lived owner (the coordinator)
// and the Limiter that enforces its limits. Decide, Allow and Acquire read
// the current policy with one atomic load; Reload swaps in a new one and
// keeps the old one when the file is bad, so a SIGHUP with a broken file
// changes nothing. Safe for concurrent use.
type Store struct {
	// path is the file the Store loads: the one NewStore loaded, or the
	// one the last ApplyPath named.
	path    atomic.Pointer[string]
	metrics *Metrics
	limiter *Limiter
	cur     atomic.Pointer[Policy]
	// mu serialises Reload: two concurrent reloads must not store their
	// results out of order.
	mu sync.Mutex
}

// NewStore loads the policy file at path (Load) and returns a Store
// holding it, counting refusals and reloads in m (nil: not counted).
func NewStore(path string, m *Metrics) (*Store, error) {
	p, err := Load(path)
	if err != nil {
		return nil, err
	}
	s := &Store{metrics: m, limiter: NewLimiter(m)}
	s.path.Store(&path)
	s.cur.Store(p)
	return s, nil
}

// Path returns the file the Store loads: the one NewStore loaded, or the
// one the last ApplyPath put in force.
func (s *Store) Path() string { return *s.path.Load() }

// Policy returns the policy in force.
func (s *Store) Policy() *Policy { return s.cur.Load() }

// Limiter returns the Store's Limiter (Allow and Acquire use it).
func (s *Store) Limiter() *Limiter { return s.limiter }

// Reload loads the file again. On success the new policy applies to every
// decision from then on (decisions already made stand; running jobs keep
// their slots, and the new limits apply to the next request) and Reload
// returns the new policy. On error the policy in force is kept and the
// error says so, with every problem of the file.
func (s *Store) Reload() (*Policy, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := Load(s.Path())
	s.metrics.reloaded(err == nil)
	if err != nil {
		return nil, fmt.Errorf("policy reload failed, the policy loaded before stays in force: %w", err)
	}
	s.cur.Store(p)
	return p, nil
}

// Check is the first half of a reload that the policy shares with other
// files (the coordinator's SIGHUP, with its config file and SSH keys):
// it reads and checks the file as Reload does (Load's errors), without
// putting it in force. Once every file checked, the caller puts the
// policy Check returned in force with Apply, or keeps the policy in
// force with Keep. The file is read once, so the policy applied is the
// one checked, whatever the file holds by then. The caller serialises
// its Check and Apply pairs (as Reload's are).
func (s *Store) Check() (*Policy, error) { return Load(s.Path()) }

// CheckPath is Check of the file at path instead of the Store's (the
// coordinator's config file names another policy file now). Its errors
// are Load's, naming path. Put the policy it returns in force with
// ApplyPath, or keep the one in force with Keep.
func (s *Store) CheckPath(path string) (*Policy, error) { return Load(path) }

// ApplyPath puts p, returned by CheckPath(path), in force, as Apply does,
// and makes path the Store's file (Path, Check, Reload) from then on.
func (s *Store) ApplyPath(path string, p *Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metrics.reloaded(true)
	s.path.Store(&path)
	s.cur.Store(p)
}

// Apply puts p, returned by Check, in force, as a Reload that succeeded.
func (s *Store) Apply(p *Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metrics.reloaded(true)
	s.cur.Store(p)
}

// Keep counts a reload that kept the policy in force (as a Reload that
// failed): the file, or another the reload needed, was refused.
func (s *Store) Keep() { s.metrics.reloaded(false) }

// Decide is Policy.Decide on the policy in force, counting refusals.
func (s *Store) Decide(id Identity, op Operation, node Node, obj Object) (Grant, error) {
	g, err := s.cur.Load().Decide(id, op, node, obj)
	if err != nil {
		var r *Refusal
		if errors.As(err, &r) {
			s.metrics.refused(op, r.Reason)
		}
	}
	return g, err
}

// Grants is Policy.Grants on the policy in force, counting refusals.
func (s *Store) Grants(id Identity, op Operation, node Node) ([]Grant, error) {
	gs, err := s.cur.Load().Grants(id, op, node)
	if err != nil {
		var r *Refusal
		if errors.As(err, &r) {
			s.metrics.refused(op, r.Reason)
		}
	}
	return gs, err
}

// Peek is Policy.Grants on the policy in force without counting a
// refusal, for grants that only add to an operation decided already (the
// forward targets an ssh connection may reach): their absence refuses no
// request.
func (s *Store) Peek(id Identity, op Operation, node Node) ([]Grant, error) {
	return s.cur.Load().Grants(id, op, node)
}

// Holds is Policy.Holds on the policy in force, counting refusals.
func (s *Store) Holds(id Identity, op Operation) error {
	err := s.cur.Load().Holds(id, op)
	if err != nil {
		var r *Refusal
		if errors.As(err, &r) {
			s.metrics.refused(op, r.Reason)
		}
	}
	return err
}

// Allow takes one request from id's budget under the policy in force
// (Limiter.Allow).
func (s *Store) Allow(id Identity, op Operation) error {
	return s.limiter.Allow(id, op, s.cur.Load().Limits(id))
}

// Acquire counts one running job of id under the policy in force
// (Limiter.Acquire); call release when the job ends.
func (s *Store) Acquire(id Identity, op Operation) (release func(), err error) {
	return s.limiter.Acquire(id, op, s.cur.Load().Limits(id))
}
