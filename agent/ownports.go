package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/tetherfleet/tether/agent/sshd"
	"github.com/tetherfleet/tether/internal/sockdiag"
	"github.com/tetherfleet/tether/protocol"
)

// Own ports (protocol.TargetOwnPorts): an SSH login granted the reserved
// target may forward to a loopback port whose listening socket belongs to
// the login's own uid — what VS Code Remote-SSH does to reach the server
// it started on 127.0.0.1:<random port>, and what a user's own dev server
// needs. The user could reach such a port with an exec anyway; a port of
// another uid (root's gateways, another user's services) stays refused.
//
// The check, with sock_diag (package internal/sockdiag):
//
//  1. before dialling, every TCP listener that serves the destination
//     (bound to its address, or to 0.0.0.0 or ::) must be the login's:
//     none is "nothing listens", one of another uid a refusal, so the
//     agent never even connects to another user's service;
//  2. after dialling, the accepted end of the new connection (the exact
//     4-tuple) must be the login's. The kernel names the owner of a
//     socket by its socket file, which an accepted connection only has
//     once the server called accept(2): until then it reports uid 0, and
//     the listeners are checked again instead (the connection was queued
//     on one of them). Another uid, or a connection already gone, closes
//     it and refuses.

// ownPortAddrs returns the loopback addresses that host names, or nil if
// it names none: "localhost" (127.0.0.1 then ::1), an address in
// 127.0.0.0/8, ::1 (bracketed or not) or an IPv4-mapped loopback address.
func ownPortAddrs(host string) []netip.Addr {
	if strings.EqualFold(host, "localhost") {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if err != nil || a.Zone() != "" {
		return nil
	}
	if a = a.Unmap(); !a.IsLoopback() {
		return nil
	}
	return []netip.Addr{a}
}

// dialOwnPort connects port on the first of addrs where every listener is
// login's, as the comment above describes. It returns the connection and
// protocol.TargetOwnPorts, or an error: sshd.ErrForwardRefused for a port
// of another uid, a local policy refusal or an owner that cannot be told;
// a plain error when nothing listens or the dial failed.
func (a *Agent) dialOwnPort(ctx context.Context, login *sshd.Login, addrs []netip.Addr, port uint32) (net.Conn, string, error) {
	const target = protocol.TargetOwnPorts
	if port == 0 || port > 65535 {
		return nil, target, fmt.Errorf("%w: node %s: port %d is not a TCP port", sshd.ErrForwardRefused, a.cfg.NodeID, port)
	}
	if lp := a.localPolicy(); lp != nil {
		if err := lp.AllowDial(target); err != nil {
			fi := a.forbidden(err)
			return nil, target, fmt.Errorf("%w: %s", sshd.ErrForwardRefused, fi.Message)
		}
	}
	ls, err := sockdiag.Listeners(uint16(port))
	if err != nil {
		return nil, target, fmt.Errorf("%w: node %s: cannot tell who listens on port %d: %v", sshd.ErrForwardRefused, a.cfg.NodeID, port, err)
	}
	var why []string
	refused := false
	for _, addr := range addrs {
		dst := netip.AddrPortFrom(addr, uint16(port))
		if err := ownListeners(ls, dst, login.UID); err != nil {
			refused = refused || !errors.Is(err, errNoListener)
			why = append(why, err.Error())
			continue
		}
		d := net.Dialer{Timeout: a.cfg.DialTimeout}
		conn, err := d.DialContext(ctx, "tcp", dst.String())
		if err != nil {
			var op *net.OpError
			if errors.As(err, &op) && op.Err != nil {
				err = op.Err
			}
			return nil, target, fmt.Errorf("node %s: dial your port %s: %v", a.cfg.NodeID, dst, err)
		}
		if err := verifyOwnPeer(conn, dst, login.UID); err != nil {
			conn.Close()
			return nil, target, fmt.Errorf("%w: node %s: %v", sshd.ErrForwardRefused, a.cfg.NodeID, err)
		}
		return conn, target, nil
	}
	err = fmt.Errorf("node %s: %s", a.cfg.NodeID, strings.Join(why, "; "))
	if refused {
		err = fmt.Errorf("%w: %v", sshd.ErrForwardRefused, err)
	}
	return nil, target, err
}

// errNoListener: no TCP listener serves the destination.
var errNoListener = errors.New("nothing listens there")

// ownListeners checks that at least one listener of ls serves dst and
// that every one that does belongs to uid.
func ownListeners(ls []sockdiag.Socket, dst netip.AddrPort, uid uint32) error {
	n := 0
	for _, l := range ls {
		if !l.Serves(dst) {
			continue
		}
		if l.UID != uid {
			return fmt.Errorf("%s is served by a listener (%s) of uid %d, not of your uid %d", dst, l.Local, l.UID, uid)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", dst, errNoListener)
	}
	return nil
}

// verifyOwnPeer checks that the accepted end of conn, a connection to
// dst, belongs to uid (see the comment at the top of this file).
func verifyOwnPeer(conn net.Conn, dst netip.AddrPort, uid uint32) error {
	la, ok1 := conn.LocalAddr().(*net.TCPAddr)
	ra, ok2 := conn.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return fmt.Errorf("connection to %s is not TCP", dst)
	}
	peer, found, err := sockdiag.Owner(ra.AddrPort(), la.AddrPort())
	switch {
	case err != nil:
		return fmt.Errorf("cannot tell who accepted the connection to %s: %v", dst, err)
	case !found:
		return fmt.Errorf("the connection to %s was closed before its owner could be checked", dst)
	case peer.UID == uid:
		return nil
	case peer.UID != 0:
		return fmt.Errorf("the connection to %s was accepted by uid %d, not your uid %d", dst, peer.UID, uid)
	}
	// Not accepted yet (or accepted by root): the listener it is queued
	// on must still be uid's.
	ls, err := sockdiag.Listeners(dst.Port())
	if err != nil {
		return fmt.Errorf("cannot tell who listens on %s: %v", dst, err)
	}
	if err := ownListeners(ls, dst, uid); err != nil {
		return fmt.Errorf("after connecting: %v", err)
	}
	return nil
}
