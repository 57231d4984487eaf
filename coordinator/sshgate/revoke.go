package sshgate

import (
	"errors"
	"math"
	"slices"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/policy"
)

// Revocation of live connections and channels (Gate.Recheck). The node's
// SSH server decides the logins and forward targets of every session of a
// connection from the SSHParams the gate wrote at the channel's open, so a
// connection held open (an OpenSSH ControlMaster multiplexes every later
// ssh over its one channel) would keep the grants of its open for ever:
// the gate closes what a reload took away instead.

// track registers ch, joined to its node, for Recheck.
func (cs *connState) track(ch *channel) {
	cs.mu.Lock()
	if cs.live == nil {
		cs.live = map[*channel]struct{}{}
	}
	cs.live[ch] = struct{}{}
	cs.mu.Unlock()
}

func (cs *connState) untrack(ch *channel) {
	cs.mu.Lock()
	delete(cs.live, ch)
	cs.mu.Unlock()
}

// tracked returns the tracked channels.
func (cs *connState) tracked() []*channel {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := make([]*channel, 0, len(cs.live))
	for ch := range cs.live {
		out = append(out, ch)
	}
	return out
}

// revoke cuts the channel's splice, once, recording why; it reports
// whether this call cut it.
func (ch *channel) revoke(why string) bool {
	if !ch.revoked.CompareAndSwap(nil, &why) {
		return false
	}
	close(ch.cut)
	return true
}

// recheckConn decides cs again under the keys and policy in force: its key
// first (an untrusted key closes the connection), then each channel.
func (g *Gate) recheckConn(cs *connState) {
	if err := stillTrusted(g.keys.Load(), cs.proven.key, g.cfg.Now(), g.cfg.ClockSkew); err != nil {
		g.revokeConn(cs, err)
		return
	}
	for _, ch := range cs.tracked() {
		g.recheckChannel(ch)
	}
}

// revokeConn closes cs, whose key is no longer trusted (err, from
// stillTrusted), with its channels: one log line, one count.
func (g *Gate) revokeConn(cs *connState, err error) {
	if !cs.revoked.CompareAndSwap(false, true) {
		return
	}
	why := "the connection's key is no longer trusted: " + err.Error()
	var nodes []string
	for _, ch := range cs.tracked() {
		ch.revoke(why)
		nodes = append(nodes, ch.node.ID)
	}
	slices.Sort(nodes)
	reason := reasonUnknownKey
	var ae *authError
	if errors.As(err, &ae) {
		reason = ae.reason
	}
	g.m.revoked.WithLabelValues(reason).Inc()
	g.log.Warn("ssh connection closed: its key is no longer trusted", "identity", cs.proven.id.String(),
		"remote", cs.remote, "nodes", nodes, "reason", reason, "err", err)
	cs.conn.Close() // ends the handshake's conn: serve closes the channels (done)
}

// recheckChannel closes ch when the policy in force no longer grants what
// its stream was vouched.
func (g *Gate) recheckChannel(ch *channel) {
	why := g.channelRevoked(ch)
	if why == "" || !ch.revoke(why) {
		return
	}
	g.log.Warn("ssh channel closed: its grant was revoked", "identity", ch.ev.Identity, "node", ch.node.ID,
		"session", ch.ev.Session, "remote", ch.cs.remote, "why", why)
}

// channelRevoked returns why the policy in force no longer grants ch what
// its stream was vouched at its open (ssh on the node, each of its logins,
// each of its forward targets), or "". The node is decided with its labels
// now when it is still connected, with those of the open otherwise.
func (g *Gate) channelRevoked(ch *channel) string {
	id := ch.cs.proven.id
	node := ch.node
	if n, ok := g.cfg.Nodes.Node(node.ID); ok && n.ID == node.ID {
		node = n
	}
	return policy.SSHGrantLost(g.cfg.Policy.Peek, id, node, ch.logins, ch.targets)
}

// expiry arms the check of cs at its certificate's end (ValidBefore plus
// the clock skew), which closes the connection (recheckConn) without a
// reload; it returns the timer's stop, or nil for a plain key or a
// certificate valid for ever.
func (g *Gate) expiry(cs *connState) (stop func() bool) {
	cert, ok := cs.proven.key.(*ssh.Certificate)
	if !ok || cert.ValidBefore == ssh.CertTimeInfinity || cert.ValidBefore > math.MaxInt64 {
		return nil
	}
	at := time.Unix(int64(cert.ValidBefore), 0).Add(g.cfg.ClockSkew)
	t := time.AfterFunc(at.Sub(g.cfg.Now()), func() {
		defer g.guard.Recover("ssh certificate expiry", nil)
		g.recheckConn(cs)
	})
	return t.Stop
}
