package openshell

import (
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
)

// peerCreds wraps the server's transport credentials so that every
// connection's AuthInfo carries its peeruid.Peer: the owner of a caller's
// socket is looked up once per connection, at its first call that needs
// it (Config.Local), not per call.
type peerCreds struct {
	credentials.TransportCredentials
}

// peerAuth is a connection's AuthInfo: the inner one (TLS, or none) and
// the caller's socket owner.
type peerAuth struct {
	credentials.AuthInfo
	peer *peeruid.Peer
}

// GetCommonAuthInfo keeps the inner credentials' security level.
func (a peerAuth) GetCommonAuthInfo() credentials.CommonAuthInfo {
	if c, ok := a.AuthInfo.(interface {
		GetCommonAuthInfo() credentials.CommonAuthInfo
	}); ok {
		return c.GetCommonAuthInfo()
	}
	return credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}
}

func newPeerCreds(inner credentials.TransportCredentials) credentials.TransportCredentials {
	if inner == nil {
		inner = insecure.NewCredentials()
	}
	return peerCreds{inner}
}

func (c peerCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, info, err
	}
	return conn, peerAuth{AuthInfo: info, peer: peeruid.NewPeer(raw)}, nil
}

func (c peerCreds) Clone() credentials.TransportCredentials {
	return peerCreds{c.TransportCredentials.Clone()}
}

// tlsInfo returns a call's TLS state, looking through peerAuth.
func tlsInfo(info credentials.AuthInfo) (credentials.TLSInfo, bool) {
	if a, ok := info.(peerAuth); ok {
		info = a.AuthInfo
	}
	ti, ok := info.(credentials.TLSInfo)
	return ti, ok
}

// peerUID returns the uid owning the caller's socket of the call's
// connection (peeruid.Lookup), or why it is unknown.
func peerUID(info credentials.AuthInfo) (uint32, error) {
	a, ok := info.(peerAuth)
	if !ok {
		return 0, errNoPeer
	}
	return a.peer.UID()
}

var errNoPeer = errors.New("the connection's socket owner was not recorded")
