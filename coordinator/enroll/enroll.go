// Package enroll keeps the coordinator's node-identity state in JetStream
// KV buckets, so that several coordinators on one NATS share it: join
// tokens (BucketTokens, stored only as the SHA-256 of the token, with
// expiry, remaining uses and labels) and one identity record per enrolled
// node (BucketNodes: the serials of its certificates that are still
// accepted, the labels its token bound, revocations).
//
// A certificate is accepted only while its serial is listed in its node's
// record: revoking a node empties the list, on every coordinator at once
// (each follows the bucket with a watcher and is told of every change
// through Config.OnChange), and a node id whose record lists a live serial
// cannot be enrolled again, so a join token never lets anyone take over an
// enrolled node's id.
//
// The Store runs one goroutine, the bucket watcher, which Close stops and
// waits for. It must not import package coordinator.
package enroll

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/coordinator/internal/jsreplicas"
)

// Buckets.
const (
	BucketTokens = "tether_join_tokens"
	BucketNodes  = "tether_node_identities"
)

// Errors; callers branch on them with errors.Is. Their messages hold no
// secret.
var (
	ErrTokenUnknown    = errors.New("join token is not valid")
	ErrTokenExpired    = errors.New("join token expired")
	ErrTokenUsed       = errors.New("join token was already used up")
	ErrAlreadyEnrolled = errors.New("node id is already enrolled")
	ErrRevokedNode     = errors.New("node was revoked after this join token was created")
	ErrNotEnrolled     = errors.New("node is not enrolled")
	ErrCertRevoked     = errors.New("certificate was revoked")
	ErrCertUnknown     = errors.New("certificate is not listed for its node")
	ErrClosed          = errors.New("enroll: store closed")
)

// casRetries bounds the compare-and-swap retries of one update: many
// agents enrolling with one multi-use token race for its record.
const casRetries = 64

// Config configures a Store.
type Config struct {
	// NATS is the connection the buckets are reached on. Required; the
	// caller owns it.
	NATS *nats.Conn
	// Replicas of each bucket, 1 to 5. Zero means min(3, cluster size),
	// tried from 3 down (package jsreplicas).
	Replicas int
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
	// Logger receives the store's logs. Nil discards them.
	Logger *slog.Logger
}

// Token is a join token's record (key: hex SHA-256 of the token).
type Token struct {
	// ID is the display id: the first 12 hex digits of the hash.
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// UsesLeft is how many enrollments remain; -1 is unlimited.
	UsesLeft int               `json:"uses_left"`
	Labels   map[string]string `json:"labels,omitempty"`
	// CreatedBy names the identity that created it (for audit).
	CreatedBy string `json:"created_by,omitempty"`
}

// Serial is one certificate of a node.
type Serial struct {
	Serial   string    `json:"serial"` // hex (tunnel.SerialHex)
	NotAfter time.Time `json:"not_after"`
}

// Node is a node's identity record (key: the node id).
type Node struct {
	Node string `json:"node"`
	// Serials are the certificates accepted for the node, oldest first
	// (after a renewal, the previous one stays until it expires).
	Serials []Serial `json:"serials"`
	// Revoked are the serials a revocation refused, kept until they
	// expire, so that a refusal can say "revoked".
	Revoked []Serial `json:"revoked,omitempty"`
	// Labels were bound by the join token; they win over the agent's own.
	Labels     map[string]string `json:"labels,omitempty"`
	EnrolledAt time.Time         `json:"enrolled_at"`
	// RevokedAt is the last revocation; an enrollment needs a token
	// created after it.
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	// TokenID is the join token the node enrolled with.
	TokenID string `json:"token_id,omitempty"`
}

// live returns whether any of n's serials is unexpired at now.
func (n *Node) live(now time.Time) bool {
	return slices.ContainsFunc(n.Serials, func(s Serial) bool { return now.Before(s.NotAfter) })
}

// prune drops the serials expired at now.
func (n *Node) prune(now time.Time) {
	keep := func(s []Serial) []Serial {
		return slices.DeleteFunc(s, func(s Serial) bool { return !now.Before(s.NotAfter) })
	}
	n.Serials, n.Revoked = keep(n.Serials), keep(n.Revoked)
}

// Store is the identity state. Its methods are safe for concurrent use.
type Store struct {
	cfg    Config
	log    *slog.Logger
	tokens jetstream.KeyValue
	nodes  jetstream.KeyValue
	w      jetstream.KeyWatcher
	done   chan struct{}

	mu       sync.Mutex
	recs     map[string]*Node  // the nodes bucket as the watcher delivered it, or as written here
	revs     map[string]uint64 // the revision of each entry of recs (and of deletes)
	onChange func(node string)
	closed   bool
}

// Open creates (or binds to) the buckets and loads every node record
// before it returns, so the first handshake already sees revocations.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.NATS == nil {
		return nil, errors.New("enroll: config: NATS connection is required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("enroll: jetstream: %w", err)
	}
	s := &Store{cfg: cfg, log: log.With("component", "enroll"), recs: map[string]*Node{}, revs: map[string]uint64{}, done: make(chan struct{})}
	for _, b := range []struct {
		kv   *jetstream.KeyValue
		name string
		desc string
	}{
		{&s.tokens, BucketTokens, "Tether join tokens (SHA-256 of each token)"},
		{&s.nodes, BucketNodes, "Tether node identities: accepted certificate serials, bound labels, revocations"},
	} {
		var kv jetstream.KeyValue
		_, err := jsreplicas.Create(ctx, jsreplicas.Store{Name: "enrollment bucket " + b.name, Replicas: cfg.Replicas, Log: s.log, Exists: jsreplicas.BucketExists(js, b.name, &kv)}, func(ctx context.Context, r int) error {
			var err error
			kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.name, Description: b.desc, History: 1, Replicas: r})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("enroll: bucket %s: %w", b.name, err)
		}
		*b.kv = kv
	}
	s.w, err = s.nodes.WatchAll(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("enroll: watch bucket %s: %w", BucketNodes, err)
	}
	// The initial values end with a nil entry.
	for loaded := false; !loaded; {
		select {
		case e, ok := <-s.w.Updates():
			if !ok {
				return nil, fmt.Errorf("enroll: watch bucket %s: watcher stopped during the initial load", BucketNodes)
			}
			if e == nil {
				loaded = true
				continue
			}
			s.apply(e)
		case <-ctx.Done():
			s.w.Stop()
			return nil, fmt.Errorf("enroll: load bucket %s: %w", BucketNodes, ctx.Err())
		}
	}
	go s.watch()
	return s, nil
}

// Close stops the watcher and waits for its goroutine. It does not close
// the NATS connection.
func (s *Store) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	s.w.Stop()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
}

// OnChange sets f, called (on the watcher's goroutine, one call at a
// time) with the node id of every record that changed after Open: the
// coordinator re-checks that node's session. f must not block for long.
func (s *Store) OnChange(f func(node string)) {
	s.mu.Lock()
	s.onChange = f
	s.mu.Unlock()
}

func (s *Store) watch() {
	defer close(s.done)
	for e := range s.w.Updates() {
		if e == nil {
			continue
		}
		node := s.apply(e)
		s.mu.Lock()
		f := s.onChange
		s.mu.Unlock()
		if f != nil && node != "" {
			f(node)
		}
	}
}

// apply updates the cache from e and returns its node id.
func (s *Store) apply(e jetstream.KeyValueEntry) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.Revision() < s.revs[e.Key()] {
		return "" // older than what this store wrote itself
	}
	s.revs[e.Key()] = e.Revision()
	if e.Operation() != jetstream.KeyValuePut {
		delete(s.recs, e.Key())
		return e.Key()
	}
	var n Node
	if err := json.Unmarshal(e.Value(), &n); err != nil {
		s.log.Error("undecodable node identity record; the node's certificates are refused", "node", e.Key(), "err", err)
		delete(s.recs, e.Key())
		return e.Key()
	}
	s.recs[e.Key()] = &n
	return e.Key()
}

// hashToken is the bucket key of a token.
func hashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// TokenPrefix starts every join token, so that one pasted in the wrong
// place is recognisable (and scanners can find leaked ones).
const TokenPrefix = "tjt_"

// CreateToken mints a join token valid for ttl and uses enrollments (-1
// unlimited) binding labels, and stores its record. The token itself is
// returned only here.
func (s *Store) CreateToken(ctx context.Context, ttl time.Duration, uses int, labels map[string]string, createdBy string) (string, Token, error) {
	token := TokenPrefix + rand.Text() + rand.Text() // 260 random bits
	key := hashToken(token)
	now := s.cfg.Now().UTC()
	t := Token{ID: key[:12], CreatedAt: now, ExpiresAt: now.Add(ttl), UsesLeft: uses, Labels: maps.Clone(labels), CreatedBy: createdBy}
	b, _ := json.Marshal(t)
	if _, err := s.tokens.Create(ctx, key, b); err != nil {
		return "", Token{}, fmt.Errorf("enroll: store join token %s: %w", t.ID, err)
	}
	return token, t, nil
}

// CheckToken returns token's record if it could be redeemed now, without
// taking a use. Errors as RedeemToken's.
func (s *Store) CheckToken(ctx context.Context, token string) (Token, error) {
	e, err := s.tokens.Get(ctx, hashToken(token))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Token{}, ErrTokenUnknown
	}
	if err != nil {
		return Token{}, fmt.Errorf("enroll: read join token: %w", err)
	}
	var t Token
	if err := json.Unmarshal(e.Value(), &t); err != nil {
		return Token{}, fmt.Errorf("enroll: join token: undecodable record: %w", err)
	}
	if !s.cfg.Now().Before(t.ExpiresAt) {
		return t, fmt.Errorf("%w (token %s, at %s)", ErrTokenExpired, t.ID, t.ExpiresAt.Format(time.RFC3339))
	}
	if t.UsesLeft == 0 {
		return t, fmt.Errorf("%w (token %s)", ErrTokenUsed, t.ID)
	}
	return t, nil
}

// RedeemToken takes one use of token and returns its record. Errors:
// ErrTokenUnknown, ErrTokenExpired, ErrTokenUsed, or a bucket failure.
func (s *Store) RedeemToken(ctx context.Context, token string) (Token, error) {
	key := hashToken(token)
	for range casRetries {
		e, err := s.tokens.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Token{}, ErrTokenUnknown
		}
		if err != nil {
			return Token{}, fmt.Errorf("enroll: read join token: %w", err)
		}
		var t Token
		if err := json.Unmarshal(e.Value(), &t); err != nil {
			return Token{}, fmt.Errorf("enroll: join token %s: undecodable record: %w", key[:12], err)
		}
		if !s.cfg.Now().Before(t.ExpiresAt) {
			return t, fmt.Errorf("%w (token %s, at %s)", ErrTokenExpired, t.ID, t.ExpiresAt.Format(time.RFC3339))
		}
		switch {
		case t.UsesLeft < 0:
			return t, nil
		case t.UsesLeft == 0:
			return t, fmt.Errorf("%w (token %s)", ErrTokenUsed, t.ID)
		}
		t.UsesLeft--
		b, _ := json.Marshal(t)
		if _, err := s.tokens.Update(ctx, key, b, e.Revision()); err != nil {
			if isCASConflict(err) {
				continue
			}
			return Token{}, fmt.Errorf("enroll: use join token %s: %w", t.ID, err)
		}
		return t, nil
	}
	return Token{}, fmt.Errorf("enroll: join token %s: too many concurrent uses, try again", key[:12])
}

func isCASConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// Record returns a copy of node's record as last seen by the watcher.
func (s *Store) Record(node string) (Node, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.recs[node]
	if !ok {
		return Node{}, false
	}
	c := *n
	c.Serials, c.Revoked, c.Labels = slices.Clone(n.Serials), slices.Clone(n.Revoked), maps.Clone(n.Labels)
	return c, true
}

// Enrolled reports whether node has a certificate that is accepted and
// unexpired: then only that certificate's holder may use the id.
func (s *Store) Enrolled(node string) bool {
	n, ok := s.Record(node)
	return ok && n.live(s.cfg.Now())
}

// CheckCert reports whether the certificate serial of node is accepted:
// nil, ErrCertRevoked or ErrCertUnknown (superseded, expired from the
// record, or never issued by a coordinator sharing these buckets).
func (s *Store) CheckCert(node, serial string) error {
	n, ok := s.Record(node)
	if !ok {
		return fmt.Errorf("%w: node %s has no identity record (serial %s)", ErrCertUnknown, node, serial)
	}
	has := func(l []Serial) bool {
		return slices.ContainsFunc(l, func(x Serial) bool { return x.Serial == serial })
	}
	switch {
	case has(n.Serials):
		return nil
	case has(n.Revoked):
		return fmt.Errorf("%w: node %s serial %s (revoked %s)", ErrCertRevoked, node, serial, n.RevokedAt.Format(time.RFC3339))
	}
	return fmt.Errorf("%w: node %s serial %s", ErrCertUnknown, node, serial)
}

// Enroll records a node's first certificate, from token: refused with
// ErrAlreadyEnrolled while the node has a live certificate, and with
// ErrRevokedNode when the node was revoked after token was created. The
// token's labels become the node's.
func (s *Store) Enroll(ctx context.Context, node string, cert Serial, token Token) error {
	return s.update(ctx, node, func(n *Node, exists bool) error {
		now := s.cfg.Now()
		if exists {
			if n.live(now) {
				return fmt.Errorf("%w: node %s holds a certificate until %s; revoke it first (tether node revoke %s)",
					ErrAlreadyEnrolled, node, n.Serials[len(n.Serials)-1].NotAfter.UTC().Format(time.RFC3339), node)
			}
			if !n.RevokedAt.IsZero() && !token.CreatedAt.After(n.RevokedAt) {
				return fmt.Errorf("%w: node %s revoked %s, token %s created %s; create a new token to re-admit it",
					ErrRevokedNode, node, n.RevokedAt.UTC().Format(time.RFC3339), token.ID, token.CreatedAt.UTC().Format(time.RFC3339))
			}
		}
		revoked, revokedAt := n.Revoked, n.RevokedAt
		*n = Node{Node: node, Serials: []Serial{cert}, Revoked: revoked, RevokedAt: revokedAt,
			Labels: maps.Clone(token.Labels), EnrolledAt: now.UTC(), TokenID: token.ID}
		n.prune(now)
		return nil
	})
}

// Renew adds a renewed certificate of node, whose current certificate is
// serial: refused (ErrCertRevoked, ErrCertUnknown) unless serial is still
// accepted. The current certificate stays accepted until it expires, so
// that an answer lost on the way does not lock the agent out.
func (s *Store) Renew(ctx context.Context, node, serial string, cert Serial) error {
	return s.update(ctx, node, func(n *Node, exists bool) error {
		if !exists {
			return fmt.Errorf("%w: node %s has no identity record", ErrCertUnknown, node)
		}
		if !slices.ContainsFunc(n.Serials, func(x Serial) bool { return x.Serial == serial }) {
			if slices.ContainsFunc(n.Revoked, func(x Serial) bool { return x.Serial == serial }) {
				return fmt.Errorf("%w: node %s serial %s", ErrCertRevoked, node, serial)
			}
			return fmt.Errorf("%w: node %s serial %s", ErrCertUnknown, node, serial)
		}
		n.Serials = append(n.Serials, cert)
		n.prune(s.cfg.Now())
		return nil
	})
}

// notEnrolledError is ErrNotEnrolled for one node, said once: "node N was
// never enrolled (...)", not "node is not enrolled: no node N was ever
// enrolled".
type notEnrolledError struct{ node string }

func (e *notEnrolledError) Error() string {
	return "node " + e.node + " was never enrolled (or its enrollment record expired)"
}
func (e *notEnrolledError) Is(target error) bool { return target == ErrNotEnrolled }

// Revoke refuses every certificate of node from now on and returns the
// serials it refused. ErrNotEnrolled if node has no record.
func (s *Store) Revoke(ctx context.Context, node string) ([]string, error) {
	var refused []string
	err := s.update(ctx, node, func(n *Node, exists bool) error {
		if !exists {
			return &notEnrolledError{node: node}
		}
		refused = refused[:0]
		for _, x := range n.Serials {
			refused = append(refused, x.Serial)
		}
		n.Revoked = append(n.Revoked, n.Serials...)
		n.Serials = nil
		n.RevokedAt = s.cfg.Now().UTC()
		n.prune(s.cfg.Now())
		return nil
	})
	return refused, err
}

// update applies f to node's record with compare-and-swap, retrying on
// conflicts. f sees exists=false and a zero Node when there is none; an
// error from f is returned as it is.
func (s *Store) update(ctx context.Context, node string, f func(n *Node, exists bool) error) error {
	for range casRetries {
		var n Node
		var rev uint64
		e, err := s.nodes.Get(ctx, node)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("enroll: read identity of node %s: %w", node, err)
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &n); err != nil {
				return fmt.Errorf("enroll: identity of node %s: undecodable record: %w", node, err)
			}
		}
		if err := f(&n, rev != 0); err != nil {
			return err
		}
		b, _ := json.Marshal(n)
		var nrev uint64
		if rev == 0 {
			nrev, err = s.nodes.Create(ctx, node, b)
		} else {
			nrev, err = s.nodes.Update(ctx, node, b, rev)
		}
		if err == nil {
			// The watcher will deliver it too; apply it now, so that
			// this coordinator's next handshake already sees it.
			s.mu.Lock()
			if nrev >= s.revs[node] {
				c := n
				s.recs[node] = &c
				s.revs[node] = nrev
			}
			s.mu.Unlock()
			return nil
		}
		if !isCASConflict(err) {
			return fmt.Errorf("enroll: write identity of node %s: %w", node, err)
		}
	}
	return fmt.Errorf("enroll: identity of node %s: too many concurrent updates, try again", node)
}
