package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/protocol"
)

// ErrForwardRefused marks a Config.Dial error that refuses the destination
// (not a target the caller may reach), as opposed to a failed connection.
var ErrForwardRefused = errors.New("port forward refused")

// directTCPIPMsg is a direct-tcpip channel's extra data (RFC 4254 §7.2).
type directTCPIPMsg struct {
	Host     string
	Port     uint32
	OrigHost string
	OrigPort uint32
}

// serveForward serves a direct-tcpip channel: it connects the destination
// through Config.Dial and relays bytes both ways, half-closes included,
// until both directions ended or ctx is done.
func (c *conn) serveForward(ctx context.Context, nch ssh.NewChannel, n int, login *Login) {
	ev := &protocol.SSHChannelEvent{Channel: n, Type: protocol.SSHChannelForward, Login: login.Name, Start: time.Now()}
	var m directTCPIPMsg
	if err := ssh.Unmarshal(nch.ExtraData(), &m); err != nil {
		nch.Reject(ssh.ConnectionFailed, "malformed direct-tcpip request")
		ev.Result, ev.Error = protocol.AuditRefused, "malformed direct-tcpip request: "+err.Error()
		c.event(ev)
		return
	}
	dest := net.JoinHostPort(m.Host, fmt.Sprint(m.Port))
	tc, target, err := c.cfg.Dial(ctx, login, m.Host, m.Port)
	ev.Target = target
	if err != nil {
		reason, result := ssh.ConnectionFailed, protocol.AuditFailed
		if errors.Is(err, ErrForwardRefused) {
			reason, result = ssh.Prohibited, protocol.AuditRefused
		}
		c.log.Warn("ssh port forward refused", "channel", n, "destination", protocol.ClipUTF8(dest, 256), "err", err)
		nch.Reject(reason, err.Error())
		ev.Result, ev.Error = result, err.Error()
		c.event(ev)
		return
	}
	defer tc.Close()
	ch, reqs, err := nch.Accept()
	if err != nil {
		ev.Result, ev.Error = protocol.AuditFailed, "accept the channel: "+err.Error()
		c.event(ev)
		return
	}
	defer ch.Close()
	var in, out atomic.Int64
	reqsDone := make(chan struct{})
	go func() {
		defer close(reqsDone)
		ssh.DiscardRequests(reqs)
	}()
	var wg sync.WaitGroup
	wg.Add(2)
	stop := context.AfterFunc(ctx, func() {
		tc.Close()
		ch.Close()
	})
	defer stop()
	go func() { // client → target
		defer wg.Done()
		defer c.cfg.Guard.Recover("ssh forward relay", c.panicked)
		_, err := io.Copy(countWriter{tc, &in}, ch)
		if cw, ok := tc.(interface{ CloseWrite() error }); ok && err == nil {
			cw.CloseWrite()
		} else {
			tc.Close()
		}
	}()
	go func() { // target → client
		defer wg.Done()
		defer c.cfg.Guard.Recover("ssh forward relay", c.panicked)
		if _, err := io.Copy(countWriter{ch, &out}, tc); err != nil {
			ch.Close()
			return
		}
		ch.CloseWrite()
	}()
	// Both directions ended: close the channel (the client waits for
	// it), and its requests end once the client's close came back.
	wg.Wait()
	ch.Close()
	<-reqsDone
	ev.BytesIn, ev.BytesOut = in.Load(), out.Load()
	ev.Result = protocol.AuditOK
	c.log.Info("ssh port forward ended", "channel", n, "target", target, "bytes_in", ev.BytesIn, "bytes_out", ev.BytesOut)
	c.event(ev)
}
