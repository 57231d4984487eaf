package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/agent/sshd"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/internal/sshkey"
	"github.com/tetherfleet/tether/protocol"
)

// SSH streams (protocol.KindSSH) reach the agent's SSH server (package
// sshd), which listens on no socket. The coordinator vouches for the
// caller in the stream's protocol.SSHParams; the agent checks them, asks
// its local policy whether any of the logins may run anything here
// (runAs with "exec" or "shell"), answers FrameDialOK and serves the SSH
// connection on the rest of the stream. A login may then run commands
// (exec, the sftp subsystem) if runAs allows "exec" and shells if it
// allows "shell". Each channel's end is reported on the control stream as
// a FrameSSHChannel.

// DefaultSSHHostKeyName is Config.SSHHostKeyFile's default, under DataDir.
const DefaultSSHHostKeyName = "ssh_host_ed25519_key"

// sshHostKey returns the host key, loading or creating it
// (Config.SSHHostKeyFile) on the first call.
func (a *Agent) sshHostKey() (ssh.Signer, error) {
	a.hostKeyMu.Lock()
	defer a.hostKeyMu.Unlock()
	if a.hostKey != nil {
		return a.hostKey, nil
	}
	s, err := sshkey.LoadOrCreate(a.cfg.SSHHostKeyFile, "tether agent host key")
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", a.cfg.NodeID, err)
	}
	a.hostKey = s
	return s, nil
}

// serveSSH serves the ssh stream st. It returns when the SSH connection
// ended; st is closed.
func (a *Agent) serveSSH(ctx context.Context, st *yamux.Stream, h protocol.Header) {
	// After FrameDialOK the stream carries SSH, where no frame may
	// follow: a panic then only closes it.
	raw := false
	defer a.guard.Recover("ssh stream", func(e *panics.Error) {
		if !raw {
			a.answerPanic(st, nil)(e)
		}
		st.Close()
	})
	streamLog := a.log.With("stream", st.StreamID())
	log := streamLog
	var p protocol.SSHParams
	err := h.DecodeParams(&p)
	if err == nil {
		err = p.Validate()
	}
	if err != nil {
		log.Warn("ssh stream refused: bad params", "err", err)
		a.refuse(st, protocol.CodeBadRequest, fmt.Sprintf("node %s: ssh stream params: %v", a.cfg.NodeID, err))
		return
	}
	log = log.With("ssh_session", p.Session, "identity", p.Identity)
	key, err := a.sshHostKey()
	if err != nil {
		log.Error("ssh stream refused: no host key", "err", err)
		a.refuse(st, protocol.CodeInternal, err.Error())
		return
	}
	// Refused up front when nobody of Logins could log in: the client
	// then learns it from the coordinator instead of an SSH failure.
	var why []string
	allowed := false
	for _, l := range p.Logins {
		if _, err := a.sshLogin(l); err != nil {
			why = append(why, err.Error())
			continue
		}
		allowed = true
		break
	}
	if !allowed {
		log.Warn("ssh stream refused: the local policy allows none of the logins", "logins", p.Logins, "reasons", why)
		a.refuse(st, protocol.CodeForbidden, fmt.Sprintf("node %s: no login of %s may log in here: %s",
			a.cfg.NodeID, strings.Join(p.Logins, ", "), strings.Join(why, "; ")))
		return
	}
	var cert ssh.Signer
	if len(p.HostCertificate) > 0 {
		if cert, err = sshd.CheckHostCert(key, p.HostCertificate); err != nil {
			log.Warn("ssh host certificate refused; offering the plain host key only", "err", err)
		}
	}
	st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	if err := protocol.WriteFrame(st, protocol.FrameDialOK, nil); err != nil {
		log.Warn("ssh: write dial-ok", "err", err)
		st.Close()
		return
	}
	st.SetWriteDeadline(time.Time{})
	raw = true
	sshd.Serve(ctx, st, &sshd.Config{
		Params:   &p,
		HostKey:  key,
		HostCert: cert,
		Login:    a.sshLogin,
		Dial: func(ctx context.Context, login *sshd.Login, host string, port uint32) (net.Conn, string, error) {
			return a.sshDial(ctx, &p, login, host, port)
		},
		Event:            a.sshEvent,
		AcceptEnv:        a.cfg.SSHAcceptEnv,
		HandshakeTimeout: a.cfg.HandshakeTimeout,
		KillGrace:        a.cfg.KillGrace,
		Log:              streamLog, // sshd.Serve adds the session and the identity
		NodeID:           a.cfg.NodeID,
		Guard:            a.guard,
		// An SSH command is an exec like any other: it takes one of the
		// node's MaxExecs slots while its process runs.
		Acquire: a.acquireExecSlot,
	})
}

// acquireExecSlot takes one of the Config.MaxExecs slots that exec
// streams also take, for a process an SSH channel starts.
func (a *Agent) acquireExecSlot() (func(), error) {
	if n := a.running.Add(1); n > int64(a.cfg.MaxExecs) {
		a.running.Add(-1)
		a.log.Warn("ssh command refused: at the limit of concurrent execs", "max_execs", a.cfg.MaxExecs)
		return nil, fmt.Errorf("node %s is running %d execs, its limit", a.cfg.NodeID, a.cfg.MaxExecs)
	}
	a.m.execsRunning.Inc()
	return func() {
		a.running.Add(-1)
		a.m.execsRunning.Dec()
	}, nil
}

// sshLogin resolves login for an SSH connection: the account, as runAs
// resolves it for an exec and for a shell. It fails when the local policy
// allows neither.
func (a *Agent) sshLogin(login string) (*sshd.Login, error) {
	acctE, errE := a.runAs(login, "exec")
	acctS, errS := a.runAs(login, "shell")
	if errE != nil && errS != nil {
		if errE.Message == errS.Message {
			return nil, errors.New(errE.Message)
		}
		return nil, fmt.Errorf("%s; %s", errE.Message, errS.Message)
	}
	acct := acctE
	if acct == nil {
		acct = acctS
	}
	home := a.baseDir(acct)
	// A login's environment, as sshd's is, never the daemon's own: even
	// for the agent's own account only PATH, LANG, LC_* and TZ of the
	// agent's environment pass, then HOME, USER, LOGNAME and SHELL (as
	// for any other account; see procEnv).
	reduced := *acct
	reduced.self = false
	l := &sshd.Login{
		Name: acct.Name, UID: acct.UID, GID: acct.GID, Credential: acct.credential(), Self: acct.self,
		Home: home, Shell: acct.shellPath(), Env: a.procEnv(&reduced, nil, home),
	}
	if errE != nil {
		l.ExecErr = errors.New(errE.Message)
	}
	if errS != nil {
		l.ShellErr = errors.New(errS.Message)
	}
	return l, nil
}

// sshDial connects a direct-tcpip destination host:port for an SSH
// connection with params p and its login: it must name one of the agent's
// targets that p allows, by the target's configured address or by its
// name (any port), or, when p allows protocol.TargetOwnPorts, a loopback
// port that login listens on (dialOwnPort); the local policy must allow
// dialling the target.
func (a *Agent) sshDial(ctx context.Context, p *protocol.SSHParams, login *sshd.Login, host string, port uint32) (net.Conn, string, error) {
	dest := net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
	target := ""
	for _, t := range p.Targets {
		if addr, ok := a.targets[t]; ok && (host == t || addr == dest) {
			target = t
			break
		}
	}
	ownPorts := slices.Contains(p.Targets, protocol.TargetOwnPorts)
	if target == "" && ownPorts {
		if addrs := ownPortAddrs(host); addrs != nil {
			return a.dialOwnPort(ctx, login, addrs, port)
		}
	}
	if _, ok := a.targets[host]; target == "" && !ok && slices.Contains(p.Targets, host) {
		// The policy grants it; this node has no such target.
		serves := "no targets"
		if len(a.targetNames) > 0 {
			serves = strings.Join(a.targetNames, ", ")
		}
		return nil, "", fmt.Errorf("%w: node %s has no target %s (it serves: %s)", sshd.ErrForwardRefused, a.cfg.NodeID, protocol.Clip(host), serves)
	}
	if target == "" {
		allowed := []string{}
		for _, t := range p.Targets {
			if addr, ok := a.targets[t]; ok {
				allowed = append(allowed, t+" ("+addr+")")
			}
		}
		if ownPorts {
			allowed = append(allowed, protocol.TargetOwnPorts+" (loopback ports you listen on)")
		}
		mine := "none"
		if len(allowed) > 0 {
			mine = strings.Join(allowed, ", ")
		}
		hint := ""
		if !ownPorts && ownPortAddrs(host) != nil {
			hint = "; a loopback port of your own needs a forward grant of target " + protocol.TargetOwnPorts
		}
		return nil, "", fmt.Errorf("%w: node %s: %s is not a target you may forward to (yours here: %s)%s",
			sshd.ErrForwardRefused, a.cfg.NodeID, protocol.Clip(dest), mine, hint)
	}
	if lp := a.localPolicy(); lp != nil {
		if err := lp.AllowDial(target); err != nil {
			fi := a.forbidden(err)
			return nil, target, fmt.Errorf("%w: %s", sshd.ErrForwardRefused, fi.Message)
		}
	}
	addr := a.targets[target]
	d := net.Dialer{Timeout: a.cfg.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Err != nil {
			err = op.Err
		}
		return nil, target, fmt.Errorf("node %s: dial target %s at %s: %v", a.cfg.NodeID, target, addr, err)
	}
	return conn, target, nil
}

// sshEvent sends ev on the current session's control stream.
func (a *Agent) sshEvent(ev *protocol.SSHChannelEvent) {
	a.hook("ssh-event", ev)
	ctl := a.ctl.Load()
	if ctl == nil {
		a.log.Debug("ssh channel event not sent: no control stream", "ssh_session", ev.Session, "channel", ev.Channel)
		return
	}
	if err := a.writeControl(ctl, protocol.FrameSSHChannel, ev); err != nil {
		a.log.Warn("ssh channel event not sent", "ssh_session", ev.Session, "channel", ev.Channel, "err", err)
	}
}

// writeControl writes one frame on the control stream ctl within the
// tunnel's write timeout. Every writer of the control stream after the
// handshake (heartbeats, renewals, SSH events, job exit reports) goes
// through it, so that their deadlines and frames never interleave.
func (a *Agent) writeControl(ctl *yamux.Stream, t protocol.FrameType, v any) error {
	a.ctlMu.Lock()
	defer a.ctlMu.Unlock()
	ctl.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	defer ctl.SetWriteDeadline(time.Time{})
	return protocol.WriteJSONFrame(ctl, t, v)
}

// sshHostKeyFile is the host key path for cfg.
func sshHostKeyFile(cfg *Config) string {
	if cfg.SSHHostKeyFile != "" {
		return cfg.SSHHostKeyFile
	}
	return filepath.Join(cfg.DataDir, DefaultSSHHostKeyName)
}
