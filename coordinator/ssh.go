package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/sshgate"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// SSH (protocol/ssh.go). The coordinator opens KindSSH streams to the
// agents' own SSH servers for two callers: its jump host (package
// coordinator/sshgate, through SSHNodes().OpenSSH, for ssh -J) and
// tether.v1.stream requests of kind "ssh" (tether ssh-proxy), whose
// SSHParams it writes itself from the caller's NATS identity and the
// policy. Every such stream's SSHParams.Session is remembered with the
// identity that opened it (sshSessions), so that the agents' per-channel
// reports (FrameSSHChannel) are audited under the identity the coordinator
// proved, never one an agent names.

// SSHHostCA certifies node host keys (sshgate's HostCA has these methods).
type SSHHostCA interface {
	// Certify returns a host certificate, in SSH wire form, for hostKey
	// (a node's Hello.SSHHostKey, SSH wire form) of the node id, naming
	// the id and the id + protocol.SSHHostSuffix as principals.
	Certify(node string, hostKey []byte) ([]byte, error)
	// KnownHostsLine returns the known_hosts line trusting the CA
	// ("@cert-authority *.tether ssh-ed25519 AAAA…"), without a newline.
	KnownHostsLine() string
}

// SSHConfig is Config.SSH.
type SSHConfig struct {
	// HostCA, if set, certifies the host key of the node of each ssh
	// stream the coordinator opens for tether.v1.stream
	// (SSHParams.HostCertificate), and gives SubjectSSHInfo its
	// @cert-authority line. Nil: no host certificates (clients then need
	// each node's plain host key).
	HostCA SSHHostCA
	// Jump, if set, reports the jump host for SubjectSSHInfo: the address
	// it listens on (--ssh-addr) and its host key in authorized_keys form.
	// Nil: no jump host.
	Jump func() (addr, hostKey string)
	// SessionGrace is how long the coordinator remembers an SSH
	// connection's identity after its stream ended, for the agent's last
	// channel reports. Default DefaultSSHSessionGrace.
	SessionGrace time.Duration
}

// DefaultSSHSessionGrace is the default SSHConfig.SessionGrace.
const DefaultSSHSessionGrace = time.Minute

// maxSSHSessions bounds the SSH connections the coordinator remembers at
// once (open ones, and ended ones for SessionGrace); an ssh stream past it
// is refused.
const maxSSHSessions = 1 << 16

// Outcomes of tether_coordinator_ssh_channel_events_total.
const (
	sshEventAudited        = "audited"
	sshEventMalformed      = "malformed"       // did not decode, or a field out of bounds
	sshEventUnknownSession = "unknown_session" // no SSH connection of this node has its session
)

// sshSession is what the coordinator knows of one SSH connection it
// opened a stream for.
type sshSession struct {
	identity, key, account string // the caller, as the audit log names it
	node                   string
	start                  time.Time // when the stream was opened
	// expires is zero while the stream is open, then the end of its grace.
	expires time.Time
	// forwarded: opened for another coordinator's jump host (fleet_dial.go);
	// never forwarded again.
	forwarded bool
	// source is where the connection came from (AuditEvent.Source): the
	// jump host's client (sshgate.SourceOf), or the NATS client an ssh
	// stream's request came from (natsauth.RequestHost).
	source string
}

// sshSessions maps SSHParams.Session to the connection's record. Safe for
// concurrent use; mu is a leaf lock.
type sshSessions struct {
	mu sync.Mutex
	m  map[string]*sshSession
}

// add records a new session, or fails when the id is taken or the table
// is full of sessions still open or in their grace.
func (s *sshSessions) add(id string, rec *sshSession) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*sshSession{}
	}
	if _, ok := s.m[id]; ok {
		return fmt.Errorf("ssh session %s is in use", id)
	}
	if len(s.m) >= maxSSHSessions {
		now := time.Now()
		for k, r := range s.m {
			if !r.expires.IsZero() && now.After(r.expires) {
				delete(s.m, k)
			}
		}
		if len(s.m) >= maxSSHSessions {
			return fmt.Errorf("%d SSH connections are open or just ended; try again later", maxSSHSessions)
		}
	}
	s.m[id] = rec
	return nil
}

// end starts a session's grace: it is forgotten grace from now.
func (s *sshSessions) end(id string, grace time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.m[id]; r != nil {
		r.expires = time.Now().Add(grace)
	}
}

// get returns the record of session id on node, or nil when there is none
// (never was, forgotten, or another node's).
func (s *sshSessions) get(id, node string) *sshSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.m[id]
	if r == nil {
		return nil
	}
	if !r.expires.IsZero() && time.Now().After(r.expires) {
		delete(s.m, id)
		return nil
	}
	if r.node != node {
		return nil
	}
	cp := *r
	return &cp
}

// newSSHSession returns a fresh SSHParams.Session: 32 lowercase hex digits.
func newSSHSession() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// SSHNodes is the coordinator's fleet as the SSH jump host sees it
// (sshgate.Nodes).
type SSHNodes struct{ c *Coordinator }

// SSHNodes returns the fleet for the SSH jump host.
func (c *Coordinator) SSHNodes() SSHNodes { return SSHNodes{c} }

// sshNode returns the connected node id (sshCanonical) whose agent serves
// SSH, or nil.
func (c *Coordinator) sshNode(id string) *node {
	id = c.sshCanonical(id)
	c.mu.Lock()
	n := c.nodes[id]
	c.mu.Unlock()
	if n == nil || !n.hello.HasFeature(protocol.FeatureSSH) {
		return nil
	}
	return n
}

// Node returns the node id as policy sees it (id and labels), and whether
// it is connected and its agent serves SSH. A known node's ID is its own,
// which differs from id in case when OpenSSH lowercased it (sshNode).
func (s SSHNodes) Node(id string) (policy.Node, bool) {
	id = s.c.sshCanonical(id)
	n := s.c.sshNode(id)
	if n == nil {
		if owner, info, _ := s.c.remoteSSH(id); owner != "" {
			return policy.Node{ID: id, Labels: info.Labels}, true
		}
		return policy.Node{ID: id}, false
	}
	return n.policyNode(), true
}

// HostKey returns the SSH host key (wire form) the node's current session
// reported, nil when it is not connected, serves no SSH or sent none.
func (s SSHNodes) HostKey(id string) []byte {
	id = s.c.sshCanonical(id)
	if n := s.c.sshNode(id); n != nil {
		return slices.Clone(n.hello.SSHHostKey)
	}
	if owner, _, key := s.c.remoteSSH(id); owner != "" {
		return slices.Clone(key)
	}
	return nil
}

// sshCanonical returns the id of the node an SSH client means by id.
// OpenSSH lowercases host names (and HostName, HostKeyAlias) before it
// uses them, so `ssh GPU-07.tether` asks for gpu-07: an id that no node of
// the fleet has exactly is matched without case, if exactly one node (held
// here or by another coordinator) matches; otherwise id is returned as it
// came.
func (c *Coordinator) sshCanonical(id string) string {
	c.mu.Lock()
	_, exact := c.nodes[id]
	c.mu.Unlock()
	if exact || c.remoteOwner(id) != "" {
		return id
	}
	found, several := "", false
	match := func(k string) {
		if strings.EqualFold(k, id) && k != found {
			several = several || found != ""
			found = k
		}
	}
	c.mu.Lock()
	for k := range c.nodes {
		match(k)
	}
	c.mu.Unlock()
	if c.fl != nil {
		c.fl.mu.Lock()
		for k := range c.fl.recs {
			match(k)
		}
		c.fl.mu.Unlock()
	}
	if found == "" || several {
		return id
	}
	return found
}

// OpenSSH opens a KindSSH stream to node with params and returns it once
// the agent answered FrameDialOK: from then on raw SSH bytes both ways.
// The agent's refusal is returned as an error wrapping its
// *protocol.ErrorInfo. The connection's identity (params.Identity, which
// the caller proved) is remembered for its channel events until
// SessionGrace after the conn was closed, and so is the client's address
// the jump host put in ctx (sshgate.SourceOf).
func (s SSHNodes) OpenSSH(ctx context.Context, node string, params protocol.SSHParams) (net.Conn, error) {
	return s.c.openSSH(ctx, node, &params, &sshSession{identity: params.Identity, source: sshgate.SourceOf(ctx)})
}

// openSSH opens the ssh stream (SSHNodes.OpenSSH) with rec as the
// session's record.
func (c *Coordinator) openSSH(ctx context.Context, id string, params *protocol.SSHParams, rec *sshSession) (net.Conn, error) {
	if err := params.Validate(); err != nil {
		return nil, fmt.Errorf("open ssh stream to node %s: params: %w", id, err)
	}
	n := c.sshNode(id)
	if n == nil {
		if owner, _, _ := c.remoteSSH(id); owner != "" && !rec.forwarded {
			return c.sshRemote(ctx, id, params, owner)
		}
		return nil, fmt.Errorf("open ssh stream: node %q is not connected to coordinator %s, or its agent serves no SSH", id, c.cfg.ID)
	}
	c.mu.Lock()
	closing := c.closing || c.life == nil
	c.mu.Unlock()
	if closing {
		return nil, c.unavailable()
	}
	rec.node, rec.start = n.id, time.Now()
	if err := c.ssh.add(params.Session, rec); err != nil {
		return nil, fmt.Errorf("open ssh stream to node %s: %w", n.id, err)
	}
	ended := func() { c.ssh.end(params.Session, c.cfg.SSH.SessionGrace) }
	st, err := c.openSSHStream(ctx, n, params)
	if err != nil {
		ended()
		return nil, err
	}
	return &sshConn{Stream: st, ended: ended}, nil
}

// openSSHStream opens the stream and reads the agent's answer, within
// ctx and the tunnel's write timeout each.
func (c *Coordinator) openSSHStream(ctx context.Context, n *node, params *protocol.SSHParams) (*yamux.Stream, error) {
	octx, cancel := context.WithTimeout(ctx, c.cfg.Tunnel.WriteTimeout)
	st, err := n.sess.Open(octx, protocol.KindSSH, params)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("open ssh stream to node %s: %w", n.id, context.Cause(ctx))
		}
		return nil, fmt.Errorf("open ssh stream to node %s: %w", n.id, err)
	}
	c.m.streamsOpened.WithLabelValues(protocol.KindSSH.String()).Inc()
	deadline := time.Now().Add(c.cfg.Tunnel.WriteTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	st.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { st.SetReadDeadline(time.Now()) })
	fr := protocol.NewFrameReader(st)
	fr.Max = maxKeptFrame
	f, err := fr.Next()
	if !stop() && err == nil {
		err = context.Cause(ctx) // ctx ended just as the answer came
	}
	st.SetReadDeadline(time.Time{})
	if err != nil {
		st.Close()
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		} else if errors.Is(err, io.EOF) {
			err = errors.New("the agent closed the stream without an answer")
		}
		return nil, fmt.Errorf("ssh stream to node %s: no answer from the agent: %w", n.id, err)
	}
	switch f.Type {
	case protocol.FrameDialOK:
		return st, nil
	case protocol.FrameError:
		st.Close()
		var ei protocol.ErrorInfo
		if err := protocol.DecodeJSON(f.Payload, &ei); err != nil {
			return nil, fmt.Errorf("ssh stream to node %s: the agent's error frame: %w", n.id, err)
		}
		ei.Message = truncateAgentString(ei.Message)
		return nil, fmt.Errorf("ssh stream to node %s refused by the agent: %w", n.id, &ei)
	default:
		st.Close()
		return nil, fmt.Errorf("ssh stream to node %s: got %s frame, want dial-ok or error: %w", n.id, f.Type, protocol.ErrUnexpected)
	}
}

// sshConn is an open ssh stream; its Close starts the session's grace.
type sshConn struct {
	*yamux.Stream
	once  sync.Once
	ended func()
}

// Close closes the stream (yamux: a half-close; the agent closes its end
// when its SSH connection ends) and starts the session's grace.
func (s *sshConn) Close() error {
	err := s.Stream.Close()
	s.once.Do(s.ended)
	return err
}

// sshStreamParams decides a tether.v1.stream request of kind ssh for node
// n: the policy must grant the caller ssh there (refused as any stream
// request is: 401, 403 naming identity, operation and node, 429), and the
// agent must serve SSH (501). The SSHParams vouch for the caller's NATS
// identity (Auth none: the agent asks the SSH client for no key), with
// the logins of every ssh grant, the targets of every forward grant on the
// node and, with a host CA, the node's host certificate.
func (c *Coordinator) sshStreamParams(req micro.Request, n *node) (*protocol.SSHParams, *protocol.APIError) {
	pn := n.policyNode()
	if _, e := c.authorizer().Authorize(req, policy.OpSSH, []policy.Node{pn}, policy.Object{}); e != nil {
		return nil, e
	}
	id, ok := caller.Of(req)
	if c.cfg.Policy == nil || !ok {
		return nil, protocol.NewAPIError(403, protocol.ErrCodeForbidden, "ssh to node %s: coordinator %s has no policy to name the logins from", n.id, c.cfg.ID)
	}
	p := c.cfg.Policy.Policy()
	grants, err := p.Grants(id, policy.OpSSH, pn)
	if err != nil {
		return nil, caller.RefusalError(err)
	}
	var logins []string
	for _, g := range grants {
		if g.RunAs != "" {
			logins = append(logins, g.RunAs)
		}
	}
	logins = sortedSet(logins, protocol.MaxSSHLogins)
	if len(logins) == 0 {
		return nil, protocol.NewAPIError(403, protocol.ErrCodeForbidden, "%s may not ssh to node %s: its ssh rules name no run_as login", id, n.id)
	}
	var targets []string
	if fw, err := p.Grants(id, policy.OpForward, pn); err == nil {
		for _, g := range fw {
			targets = append(targets, g.Targets...)
		}
	}
	targets = sortedSet(targets, protocol.MaxSSHTargets)
	if !n.hello.HasFeature(protocol.FeatureSSH) {
		return nil, protocol.NewAPIError(501, protocol.ErrCodeUnsupported, "node %s: its agent does not serve SSH", n.id)
	}
	sp := &protocol.SSHParams{
		Session:  newSSHSession(),
		Identity: protocol.ClipUTF8(id.String(), protocol.MaxSSHIdentityLen),
		Logins:   logins,
		Targets:  targets,
		Auth:     protocol.SSHAuthNone,
	}
	if ca := c.cfg.SSH.HostCA; ca != nil && len(n.hello.SSHHostKey) > 0 {
		cert, err := ca.Certify(n.id, n.hello.SSHHostKey)
		if err != nil {
			c.log.Warn("certify a node's SSH host key", "node_id", n.id, "err", err)
			return nil, protocol.NewAPIError(502, protocol.ErrCodeUnavailable, "node %s: its SSH host key cannot be certified: %v", n.id, err)
		}
		sp.HostCertificate = cert
	}
	if err := sp.Validate(); err != nil {
		return nil, protocol.NewAPIError(500, protocol.ErrCodeInternal, "ssh to node %s: %v", n.id, err)
	}
	return sp, nil
}

// sortedSet returns ss sorted, without repeats, at most max long.
func sortedSet(ss []string, max int) []string {
	slices.Sort(ss)
	ss = slices.Compact(ss)
	if len(ss) > max {
		ss = ss[:max]
	}
	return ss
}

// sshChannelEvent audits one FrameSSHChannel of node n's agent: under the
// identity of the coordinator's own record of its session (an event of a
// session this node's streams never had is counted and dropped, and
// whatever identity an agent might name is not read).
func (c *Coordinator) sshChannelEvent(n *node, payload []byte) {
	var ev protocol.SSHChannelEvent
	if err := protocol.DecodeJSON(payload, &ev); err != nil {
		c.m.sshEvents.WithLabelValues(sshEventMalformed).Inc()
		c.log.Debug("ssh channel event dropped", "node_id", n.id, "err", err)
		return
	}
	if err := checkSSHChannelEvent(&ev); err != nil {
		c.m.sshEvents.WithLabelValues(sshEventMalformed).Inc()
		c.log.Debug("ssh channel event dropped", "node_id", n.id, "err", err)
		return
	}
	rec := c.ssh.get(ev.Session, n.id)
	if rec == nil {
		c.m.sshEvents.WithLabelValues(sshEventUnknownSession).Inc()
		c.log.Debug("ssh channel event of an unknown session dropped", "node_id", n.id, "session", ev.Session)
		return
	}
	c.m.sshEvents.WithLabelValues(sshEventAudited).Inc()
	if c.cfg.Audit == nil {
		return
	}
	c.cfg.Audit.Record(sshAuditEvent(n.id, rec, &ev))
}

// sshChannelTypes are the values of SSHChannelEvent.Type.
var sshChannelTypes = []string{protocol.SSHChannelExec, protocol.SSHChannelShell, protocol.SSHChannelSubsystem, protocol.SSHChannelForward, protocol.SSHChannelAuth}

// checkSSHChannelEvent reports the first problem with an agent's event
// that makes it unusable; free-form fields are clipped later instead.
func checkSSHChannelEvent(ev *protocol.SSHChannelEvent) error {
	if len(ev.Session) != 32 || strings.Trim(ev.Session, "0123456789abcdef") != "" {
		return fmt.Errorf("session %s: want 32 lowercase hex digits", protocol.Clip(ev.Session))
	}
	if !slices.Contains(sshChannelTypes, ev.Type) {
		return fmt.Errorf("type %s: want one of %s", protocol.Clip(ev.Type), strings.Join(sshChannelTypes, ", "))
	}
	switch ev.Result {
	case protocol.AuditOK, protocol.AuditFailed, protocol.AuditRefused:
	default:
		return fmt.Errorf("result %s: want %s, %s or %s", protocol.Clip(ev.Result), protocol.AuditOK, protocol.AuditFailed, protocol.AuditRefused)
	}
	if ev.Channel < 0 || ev.BytesIn < 0 || ev.BytesOut < 0 {
		return errors.New("negative channel number or byte count")
	}
	return nil
}

// sshAuditEvent is the audit event of an agent's channel event, under
// rec's identity.
func sshAuditEvent(node string, rec *sshSession, ev *protocol.SSHChannelEvent) *protocol.AuditEvent {
	clip := func(s string, n int) string { return protocol.ClipUTF8(s, n) }
	out := &protocol.AuditEvent{
		Identity:    rec.identity,
		IdentityKey: rec.key,
		Account:     rec.account,
		Source:      rec.source,
		Operation:   policy.OpSSH.String(),
		Method:      ev.Type,
		Nodes:       []string{node},
		RunAs:       clip(ev.Login, protocol.MaxAuditProgramLen),
		Command:     sshAuditCommand(ev.Command),
		Target:      clip(ev.Target, protocol.MaxAuditProgramLen),
		ExitSignal:  clip(ev.ExitSignal, protocol.MaxAuditProgramLen),
		BytesIn:     ev.BytesIn,
		BytesOut:    ev.BytesOut,
		Session:     ev.Session,
		Result:      ev.Result,
		Error:       clip(ev.Error, protocol.MaxAuditErrorLen),
	}
	if ev.Type == protocol.SSHChannelSubsystem {
		out.Target = clip(ev.Subsystem, protocol.MaxAuditProgramLen)
	}
	if ev.ExitStatus != nil {
		code := *ev.ExitStatus
		out.ExitCode = &code
	}
	// The agent's clock bounds its channel; without a start (a login that
	// never happened), the connection's time on the coordinator's.
	if d := ev.End.Sub(ev.Start); !ev.Start.IsZero() && d > 0 {
		out.DurationMS = float64(d) / float64(time.Millisecond)
	} else if ev.Start.IsZero() && !rec.start.IsZero() {
		out.DurationMS = float64(time.Since(rec.start)) / float64(time.Millisecond)
	}
	// Only a refusal has a reason: a channel that failed (a start
	// failure, a channel closed before any request) was not refused.
	if ev.Result == protocol.AuditRefused {
		switch {
		case ev.Type != protocol.SSHChannelAuth:
			// The agent refuses a channel only by its local policy.
			out.Reason = protocol.AuditReasonLocalPolicy
		case ev.Reason == protocol.AuditReasonLoginNotGranted || ev.Reason == protocol.AuditReasonLocalPolicy:
			out.Reason = ev.Reason
		default:
			out.Reason = protocol.ErrCodeUnauthenticated
		}
	}
	return out
}

// sshAuditCommand bounds an agent's command description.
func sshAuditCommand(c *protocol.AuditCommand) *protocol.AuditCommand {
	if c == nil {
		return nil
	}
	out := &protocol.AuditCommand{
		Mode:    protocol.ClipUTF8(c.Mode, 32),
		Program: protocol.ClipUTF8(c.Program, protocol.MaxAuditProgramLen),
		Size:    max(c.Size, 0),
		Count:   max(c.Count, 0),
		Cwd:     protocol.ClipUTF8(c.Cwd, protocol.MaxAuditErrorLen),
		Stdin:   c.Stdin,
	}
	if len(c.SHA256) == 64 && strings.Trim(c.SHA256, "0123456789abcdef") == "" {
		out.SHA256 = c.SHA256
	}
	for i, k := range c.EnvKeys {
		if i == 64 {
			break
		}
		out.EnvKeys = append(out.EnvKeys, protocol.ClipUTF8(k, protocol.MaxAuditProgramLen))
	}
	return out
}

// handleSSHInfo serves SubjectSSHInfo: the jump host, the host CA's
// known_hosts line, and the connected SSH nodes the caller may list
// (nodes.list) and log in to (ssh), with its logins on each.
func (c *Coordinator) handleSSHInfo(req micro.Request) {
	var r protocol.SSHInfoRequest
	if !c.decodeValid(req, &r) {
		return
	}
	c.mu.Lock()
	var ns []*node
	held := make(map[string]bool, len(c.nodes))
	for _, n := range c.nodes {
		held[n.id] = true
		if n.hello.HasFeature(protocol.FeatureSSH) {
			ns = append(ns, n)
		}
	}
	c.mu.Unlock()
	// The whole fleet: every coordinator's jump host reaches every node.
	for _, info := range c.remoteNodes(protocol.Selector{}, held) {
		if owner, _, _ := c.remoteSSH(info.ID); owner != "" {
			ns = append(ns, remoteNode(info))
		}
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i].id < ns[j].id })
	pns := policyNodes(ns)
	visible, e := c.authorizer().Filter(req, policy.OpNodesList, pns, policy.Object{})
	if e != nil {
		c.replyError(req, e)
		return
	}
	info := protocol.SSHInfo{Coordinator: c.cfg.ID, Nodes: []protocol.SSHInfoNode{}}
	if c.cfg.SSH.Jump != nil {
		info.JumpAddr, info.JumpHostKey = c.cfg.SSH.Jump()
	}
	if c.cfg.SSH.HostCA != nil {
		info.KnownHostsCA = c.cfg.SSH.HostCA.KnownHostsLine()
	}
	id, identified := caller.Of(req)
	for _, k := range visible {
		var logins []string
		if c.cfg.Policy != nil {
			if !identified {
				break
			}
			// Asked quietly: a node the caller may not ssh to is left out,
			// not refused.
			gs, err := c.cfg.Policy.Policy().Grants(id, policy.OpSSH, pns[k])
			if err != nil {
				continue
			}
			for _, g := range gs {
				if g.RunAs != "" {
					logins = append(logins, g.RunAs)
				}
			}
			if logins = sortedSet(logins, protocol.MaxSSHLogins); len(logins) == 0 {
				continue
			}
		}
		info.NodesTotal++
		if len(info.Nodes) < protocol.MaxSSHInfoNodes {
			info.Nodes = append(info.Nodes, protocol.SSHInfoNode{ID: pns[k].ID, Alias: pns[k].ID + protocol.SSHHostSuffix, Logins: logins})
		}
	}
	c.replyJSON(req, info, fmt.Sprintf("%d SSH nodes", len(info.Nodes)), "ask the operator to narrow your nodes.list rules")
}

// sshRevoked returns why the policy in force no longer grants the caller
// of ssh relay r what its SSHParams were given at the open (ssh on the
// node, each login, each forward target), or "". The node is decided with
// its labels now when it is still connected, with those of the open
// otherwise.
func (c *Coordinator) sshRevoked(r *relay) string {
	id, ok := caller.Of(r.req)
	if c.cfg.Policy == nil || !ok {
		return "" // not reached: such a stream is refused at its open
	}
	return policy.SSHGrantLost(c.cfg.Policy.Peek, id, c.relayPolicyNode(r), r.ssh.Logins, r.ssh.Targets)
}
