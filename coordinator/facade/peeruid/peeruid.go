package peeruid

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"github.com/tetherfleet/tether/policy"
)

// IdentityPrefix starts the token name of a loopback caller named by its
// uid (Identity).
const IdentityPrefix = "loopback-uid-"

// Identity is how policy names the local user uid calling a facade on
// loopback without credentials: token:loopback-uid-UID (e.g.
// token:loopback-uid-1000), a name no facade token may take.
func Identity(uid uint32) policy.Identity {
	return policy.Identity{Kind: policy.KindToken, Name: IdentityPrefix + strconv.FormatUint(uint64(uid), 10)}
}

// ErrNotLoopback is Lookup's error for a connection that is not between
// two loopback addresses.
var ErrNotLoopback = errors.New("not a loopback TCP connection")

// Lookup returns the uid owning the caller's socket of the TCP connection
// whose local end (ours) is local and remote end (the caller's) is
// remote. It fails with ErrNotLoopback unless both are loopback TCP
// addresses, and with an error naming what was not found or readable
// otherwise (not Linux, no such socket: the caller hung up).
func Lookup(local, remote net.Addr) (uint32, error) {
	l, err := addrPort(local)
	if err != nil {
		return 0, err
	}
	r, err := addrPort(remote)
	if err != nil {
		return 0, err
	}
	if !l.Addr().IsLoopback() || !r.Addr().IsLoopback() {
		return 0, fmt.Errorf("peer uid of %s: %w", remote, ErrNotLoopback)
	}
	uid, err := lookup(l, r)
	if err != nil {
		return 0, fmt.Errorf("peer uid of %s: %w", remote, err)
	}
	return uid, nil
}

func addrPort(a net.Addr) (netip.AddrPort, error) {
	t, ok := a.(*net.TCPAddr)
	if !ok || t == nil {
		return netip.AddrPort{}, fmt.Errorf("peer uid of %v: %w", a, ErrNotLoopback)
	}
	ap := t.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// Peer is one connection's caller uid, looked up at most once.
type Peer struct {
	local, remote net.Addr
	once          sync.Once
	uid           uint32
	err           error
}

// NewPeer returns the Peer of conn (its local and remote addresses); the
// lookup happens at the first UID.
func NewPeer(conn net.Conn) *Peer {
	return &Peer{local: conn.LocalAddr(), remote: conn.RemoteAddr()}
}

// UID returns the caller's uid (Lookup), looking it up on the first call.
// Safe for concurrent use.
func (p *Peer) UID() (uint32, error) {
	p.once.Do(func() { p.uid, p.err = Lookup(p.local, p.remote) })
	return p.uid, p.err
}

type peerKey struct{}

// ConnContext is an http.Server.ConnContext: it puts the connection's
// Peer in its requests' contexts (FromContext). Connections that are not
// TCP (or TLS over TCP) still get one; its lookup fails.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, peerKey{}, NewPeer(c))
}

// FromContext returns the uid of the caller of a request served with
// ConnContext, or an error when it is unknown.
func FromContext(ctx context.Context) (uint32, error) {
	p, ok := ctx.Value(peerKey{}).(*Peer)
	if !ok {
		return 0, errors.New("peer uid: the connection was not recorded (no peeruid.ConnContext)")
	}
	return p.UID()
}
