// Package sshd is the agent's SSH server (RFC 4251-4254): it serves one SSH
// connection on a net.Conn that is a tunnel stream of kind ssh, for a
// caller the coordinator vouched for (protocol.SSHParams). It listens on no
// socket. It serves session channels (exec through the login's shell,
// shell, pty-req, window-change, signal, allow-listed env, exit-status and
// exit-signal, the sftp subsystem in a helper process with the login's
// credentials) and direct-tcpip channels to the targets the caller's
// params and the agent allow, many channels per connection, and reports
// each channel's end as a protocol.SSHChannelEvent.
//
// Processes, as under OpenSSH's sshd: each session's process is the
// leader of a session of its own (setsid), whose controlling terminal is
// the session's pty if it asked for one, and none otherwise. When the
// command exits, its background processes stay (nohup sleep 300 & echo $!
// leaves the sleep running); a pty session's process group is hung up,
// as the kernel does for a terminal's foreground group. The exit status
// follows all the output, which ends when every holder of the pipes or
// terminal closed it; unlike sshd, which then waits for ever, the server
// stops reading once Config.KillGrace passed since the command exited and
// nothing is left buffered (the command's own output is always relayed in
// full; a background job that keeps writing keeps the channel open), and
// closes the channel with the exit status, leaving whatever still holds
// the output running (its later writes fail). When the client closes the channel or
// the connection before the command exited, the command's whole process
// group is killed (SIGHUP and SIGTERM, SIGKILL KillGrace later): a client
// that went leaves no process behind, except what left the group.
//
// Everything about the local account (who it is, whether the local policy
// allows it, its credential and environment) is the agent's: Config.Login
// resolves a login into a Login, and the server starts processes exactly
// as it says.
package sshd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// Login is a local account a connection authenticated as, resolved by the
// agent (Config.Login).
type Login struct {
	// Name is the account's name (the SSH user name).
	Name string
	// UID and GID are the account's uid and primary gid, which a
	// terminal is given to (unless Self).
	UID, GID uint32
	// Credential is what processes of the login run with; nil means the
	// agent's own credentials (Self).
	Credential *syscall.Credential
	// Self is set when the account is the agent's own.
	Self bool
	// Home is the working directory of the login's processes (its home,
	// or "/").
	Home string
	// Shell is the login shell (an absolute path).
	Shell string
	// Env is the base environment of the login's processes (KEY=VALUE:
	// PATH, HOME, USER, LOGNAME, SHELL, ...); accepted env requests and
	// TERM are appended.
	Env []string
	// ExecErr, when not nil, is why the local policy refuses commands
	// (exec requests and the sftp subsystem); ShellErr why it refuses
	// shells (shell requests). At least one of them is nil.
	ExecErr, ShellErr error
}

// Config is one connection's configuration. Login, Dial and Event are
// called from the connection's goroutines, possibly at once.
type Config struct {
	// Params are what the coordinator vouched for (already validated).
	Params *protocol.SSHParams
	// HostKey is the agent's host key; HostCert, if not nil, is a signer
	// of its certificate (offered beside the plain key).
	HostKey  ssh.Signer
	HostCert ssh.Signer
	// Login resolves a user name the client authenticated as, which is in
	// Params.Logins, into a Login, or says why it may not log in
	// (a local policy refusal, an unknown user).
	Login func(user string) (*Login, error)
	// Dial connects a direct-tcpip channel's destination host:port for
	// login (the connection's authenticated login), which must be a
	// target the agent has and Params.Targets allows (or a loopback port
	// of login's own, protocol.TargetOwnPorts); it returns the target's
	// name, or an error saying why not (shown to the client).
	Dial func(ctx context.Context, login *Login, host string, port uint32) (net.Conn, string, error)
	// Event receives each channel's report when the channel ended, and the
	// auth event of a connection that ended without a login.
	Event func(*protocol.SSHChannelEvent)
	// AcceptEnv are the environment variable names env requests may set
	// beyond DefaultAcceptEnv; a name ending in "*" is a prefix.
	AcceptEnv []string
	// HandshakeTimeout bounds the key exchange and authentication.
	HandshakeTimeout time.Duration
	// KillGrace is the wait between SIGTERM and SIGKILL when a channel's
	// processes are killed (the channel or the connection closed before
	// the command exited), and how long, after a command exited, the
	// channel still relays output that its background processes hold
	// before it stops reading and closes (leaving them running).
	KillGrace time.Duration
	// Log receives the connection's logs; Serve adds ssh_session and
	// identity (Params.Session, Params.Identity) and, once logged in,
	// login to every line.
	Log *slog.Logger
	// NodeID names the node in messages to the client.
	NodeID string
	// Guard contains a panic of the connection's goroutines: the panic is
	// counted and logged, and the connection is closed (its processes
	// killed) while the agent keeps serving. Nil: not contained.
	Guard *panics.Guard
	// MaxChannels bounds the channels open at once on the connection (a
	// ControlMaster multiplexes every later ssh onto one); a channel past
	// it is rejected with "resource shortage". Zero means
	// DefaultMaxChannels.
	MaxChannels int
	// Acquire, if set, takes one of the agent's process slots before a
	// channel starts a process (exec, shell, subsystem); release gives it
	// back when the process ended. An error refuses the request, its text
	// shown to the client.
	Acquire func() (release func(), err error)
}

// DefaultMaxChannels is Config.MaxChannels' default.
const DefaultMaxChannels = 64

// DefaultAcceptEnv are the environment variables env requests may always
// set, as sshd's usual AcceptEnv; a trailing "*" is a prefix.
var DefaultAcceptEnv = []string{"LANG", "LC_*", "TERM", "TZ", "COLORTERM"}

// Extension keys of ssh.Permissions set by authentication.
const extLogin = "tether-login"

// CheckHostCert parses cert (SSH wire form) and checks that it is a host
// certificate of exactly hostKey, currently valid; it returns a signer
// offering it with hostKey.
func CheckHostCert(hostKey ssh.Signer, cert []byte) (ssh.Signer, error) {
	pk, err := ssh.ParsePublicKey(cert)
	if err != nil {
		return nil, fmt.Errorf("host certificate: %w", err)
	}
	c, ok := pk.(*ssh.Certificate)
	if !ok {
		return nil, fmt.Errorf("host certificate: a plain %s key, not a certificate", pk.Type())
	}
	if c.CertType != ssh.HostCert {
		return nil, fmt.Errorf("host certificate: a user certificate (type %d), want a host certificate", c.CertType)
	}
	if !bytes.Equal(c.Key.Marshal(), hostKey.PublicKey().Marshal()) {
		return nil, fmt.Errorf("host certificate: certifies %s %s, not this agent's host key %s",
			c.Key.Type(), ssh.FingerprintSHA256(c.Key), ssh.FingerprintSHA256(hostKey.PublicKey()))
	}
	now := uint64(time.Now().Unix())
	if c.ValidBefore != ssh.CertTimeInfinity && now >= c.ValidBefore {
		return nil, fmt.Errorf("host certificate: expired at %s", time.Unix(int64(c.ValidBefore), 0).UTC().Format(time.RFC3339))
	}
	s, err := ssh.NewCertSigner(c, hostKey)
	if err != nil {
		return nil, fmt.Errorf("host certificate: %w", err)
	}
	return s, nil
}

// conn is one SSH connection.
type conn struct {
	cfg      *Config
	nc       net.Conn
	log      *slog.Logger
	channels atomic.Int64 // channels opened so far
	open     atomic.Int64 // session and direct-tcpip channels open now (Config.MaxChannels)
	wg       sync.WaitGroup
	// sshClient and sshConnection are the values of SSH_CLIENT and
	// SSH_CONNECTION for the connection's processes.
	sshClient, sshConnection string
	// sconn is the connection once logged in.
	sconn *ssh.ServerConn
	// refusal is the last authentication refusal, for the auth event:
	// why, the login asked for, and the audit reason ("" for a failed
	// authentication).
	mu                    sync.Mutex
	refusal, refusedLogin string
	refusalReason         string
}

// Serve runs one SSH server connection on nc until it ends or ctx is done,
// and returns once every channel's processes and goroutines are gone; nc
// is closed. It returns the handshake's error when the client did not log
// in (after reporting an auth event), nil otherwise.
func Serve(ctx context.Context, nc net.Conn, cfg *Config) error {
	defer nc.Close()
	c := &conn{cfg: cfg, nc: nc, log: cfg.Log.With("ssh_session", cfg.Params.Session, "identity", cfg.Params.Identity)}
	c.setSSHEnv(nc.RemoteAddr(), nc.LocalAddr())
	start := time.Now()
	sc := &ssh.ServerConfig{
		Config: ssh.Config{Ciphers: protocol.SSHCiphers},
		// Only what the params vouch for: no passwords, no
		// keyboard-interactive.
		MaxAuthTries: 20,
		AuthLogCallback: func(md ssh.ConnMetadata, method string, err error) {
			if err != nil && method != "none" {
				c.log.Debug("ssh auth attempt failed", "user", md.User(), "method", method, "err", err)
			}
		},
	}
	sc.AddHostKey(cfg.HostKey)
	if cfg.HostCert != nil {
		sc.AddHostKey(cfg.HostCert)
	}
	switch cfg.Params.Auth {
	case protocol.SSHAuthNone:
		sc.NoClientAuth = true
		sc.NoClientAuthCallback = func(md ssh.ConnMetadata) (*ssh.Permissions, error) {
			return c.authorize(md.User())
		}
	case protocol.SSHAuthPublicKey:
		vouched := cfg.Params.PublicKey
		// PublicKeyCallback answers queries as well as signed
		// requests: it only compares, and records nothing. What the
		// connection logs in as is decided in VerifiedPublicKeyCallback,
		// which runs once the client proved the key with a signature.
		sc.PublicKeyCallback = func(md ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if !bytes.Equal(key.Marshal(), vouched) {
				c.refused(fmt.Sprintf("key %s %s is not the key the coordinator vouched for", key.Type(), ssh.FingerprintSHA256(key)), md.User(), "")
				return nil, errors.New("not the vouched key")
			}
			return &ssh.Permissions{}, nil
		}
		sc.VerifiedPublicKeyCallback = func(md ssh.ConnMetadata, key ssh.PublicKey, _ *ssh.Permissions, _ string) (*ssh.Permissions, error) {
			if !bytes.Equal(key.Marshal(), vouched) {
				// Cannot happen (x/crypto verifies the key that
				// PublicKeyCallback accepted); refuse all the same.
				return nil, errors.New("not the vouched key")
			}
			return c.authorize(md.User())
		}
	default:
		return fmt.Errorf("ssh session %s: auth %q", cfg.Params.Session, cfg.Params.Auth)
	}

	if cfg.HandshakeTimeout > 0 {
		nc.SetDeadline(time.Now().Add(cfg.HandshakeTimeout))
	}
	// Closing nc when ctx ends unblocks the handshake and everything after.
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	sconn, chans, reqs, err := ssh.NewServerConn(nc, sc)
	if err != nil {
		c.mu.Lock()
		why, login, reason := c.refusal, c.refusedLogin, c.refusalReason
		c.mu.Unlock()
		if why == "" {
			why = "handshake: " + err.Error()
		}
		if ctx.Err() != nil {
			why, reason = "the tunnel session ended during the handshake", ""
		}
		c.log.Warn("ssh login refused", "identity", cfg.Params.Identity, "reason", why, "err", err)
		cfg.Event(&protocol.SSHChannelEvent{
			Session: cfg.Params.Session, Type: protocol.SSHChannelAuth, Start: start, End: time.Now(),
			Login: protocol.ClipUTF8(login, protocol.MaxAuditProgramLen), Reason: reason,
			Result: protocol.AuditRefused, Error: protocol.ClipUTF8(why, protocol.MaxAuditErrorLen),
		})
		return fmt.Errorf("ssh session %s: %w", cfg.Params.Session, err)
	}
	nc.SetDeadline(time.Time{})
	c.sconn = sconn
	login := c.loginOf(sconn)
	c.log = c.log.With("login", login.Name)
	c.log.Info("ssh login", "client_version", string(sconn.ClientVersion()))
	cctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		sconn.Close()
		c.wg.Wait()
		c.log.Info("ssh connection closed", "channels", c.channels.Load())
	}()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for r := range reqs {
			// keepalive@openssh.com, no-more-sessions@openssh.com,
			// tcpip-forward (remote forwarding is not served).
			if r.WantReply {
				r.Reply(false, nil)
			}
		}
	}()
	maxChannels := int64(cfg.MaxChannels)
	if maxChannels <= 0 {
		maxChannels = DefaultMaxChannels
	}
	for nch := range chans {
		n := int(c.channels.Add(1))
		if t := nch.ChannelType(); (t == "session" || t == "direct-tcpip") && c.open.Add(1) > maxChannels {
			c.open.Add(-1)
			nch.Reject(ssh.ResourceShortage, fmt.Sprintf("node %s: %d channels are open on this connection, its limit", cfg.NodeID, maxChannels))
			c.log.Warn("ssh channel refused: at the limit of open channels", "channel", n, "max_channels", maxChannels)
			continue
		}
		switch nch.ChannelType() {
		case "session":
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				defer c.open.Add(-1)
				c.serveSession(cctx, nch, n, login)
			}()
		case "direct-tcpip":
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				defer c.open.Add(-1)
				defer c.cfg.Guard.Recover("ssh forward channel", c.panicked)
				c.serveForward(cctx, nch, n, login)
			}()
		default:
			msg := fmt.Sprintf("channel type %s is not served by the tether agent", protocol.Clip(nch.ChannelType()))
			nch.Reject(ssh.UnknownChannelType, msg)
			c.log.Info("ssh channel refused", "channel", n, "type", protocol.Clip(nch.ChannelType()))
		}
	}
	return nil
}

// authorize decides whether the connection may log in as user, which it
// proved (or, with SSHAuthNone, the tunnel proved): user must be one of
// the params' logins and the agent must resolve it.
func (c *conn) authorize(user string) (*ssh.Permissions, error) {
	p := c.cfg.Params
	if !p.AllowsLogin(user) {
		why := fmt.Sprintf("login %s is not one of the logins the policy grants %s on node %s (%s)",
			protocol.Clip(user), protocol.Clip(p.Identity), c.cfg.NodeID, strings.Join(p.Logins, ", "))
		c.refused(why, user, protocol.AuditReasonLoginNotGranted)
		c.log.Warn("ssh login refused", "identity", p.Identity, "user", protocol.Clip(user), "rule", "coordinator policy logins", "logins", p.Logins)
		return nil, &ssh.BannerError{Err: errors.New(why), Message: "tether: " + why + "\r\n"}
	}
	if _, err := c.cfg.Login(user); err != nil {
		why := fmt.Sprintf("login %s refused on node %s: %v", protocol.Clip(user), c.cfg.NodeID, err)
		c.refused(why, user, protocol.AuditReasonLocalPolicy)
		c.log.Warn("ssh login refused", "identity", p.Identity, "user", protocol.Clip(user), "rule", "local policy", "err", err)
		return nil, &ssh.BannerError{Err: errors.New(why), Message: "tether: " + why + "\r\n"}
	}
	return &ssh.Permissions{Extensions: map[string]string{extLogin: user}}, nil
}

// loginOf resolves the login sconn authenticated as. The decision was
// made in authorize; this resolves it again (Login is cached by the
// agent), and if it fails now every channel is refused with the reason.
func (c *conn) loginOf(sconn *ssh.ServerConn) *Login {
	name := sconn.Permissions.Extensions[extLogin]
	l, err := c.cfg.Login(name)
	if err != nil {
		return &Login{Name: name, ExecErr: err, ShellErr: err}
	}
	return l
}

// setSSHEnv sets SSH_CLIENT ("ADDR PORT LOCALPORT") and SSH_CONNECTION
// ("ADDR PORT LOCALADDR LOCALPORT") from the stream's addresses, which are
// the tunnel's: the agent never sees the client's own. sshd sets them, and
// Debian's bash reads ~/.bashrc for a command when SSH_CLIENT is set, which
// users' remote commands rely on (their PATH, their virtualenv).
func (c *conn) setSSHEnv(remote, local net.Addr) {
	split := func(a net.Addr) (string, string) {
		if a != nil {
			if h, p, err := net.SplitHostPort(a.String()); err == nil {
				return h, p
			}
		}
		return "0.0.0.0", "0"
	}
	rh, rp := split(remote)
	lh, lp := split(local)
	c.sshClient = rh + " " + rp + " " + lp
	c.sshConnection = rh + " " + rp + " " + lh + " " + lp
}

// panicked closes the connection after a contained panic: every channel
// and its processes end with it.
func (c *conn) panicked(*panics.Error) { c.nc.Close() }

// refused records an authentication refusal of login: why, and the
// audit reason (protocol.SSHChannelEvent.Reason).
func (c *conn) refused(why, login, reason string) {
	c.mu.Lock()
	c.refusal, c.refusedLogin, c.refusalReason = why, login, reason
	c.mu.Unlock()
}

// whyNoRequest says why a channel ended before any command was
// requested: the client closed it, or the connection broke, with the
// transport's error. The connection is probed with a global request
// (a live client answers it, as OpenSSH's answers a keepalive); without
// an answer within wait the client is taken to have closed the channel.
func (c *conn) whyNoRequest(wait time.Duration) string {
	const closed = "the channel was closed before any command was requested"
	if c.sconn == nil {
		return closed
	}
	probe := make(chan error, 1)
	go func() {
		_, _, err := c.sconn.SendRequest("keepalive@tether", true, nil)
		probe <- err
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-probe:
		if err == nil {
			return closed
		}
	case <-t.C:
		return closed
	}
	err := c.sconn.Wait()
	why := "the connection ended before any command was requested: " + err.Error()
	if msg := err.Error(); strings.Contains(msg, "packet too large") || strings.Contains(msg, "max packet length exceeded") {
		why += " (an SSH packet is at most 256 KiB, so a request such as a command line cannot be longer: pass long input on stdin)"
	}
	return why
}

// event fills the fields every channel event shares and sends ev.
func (c *conn) event(ev *protocol.SSHChannelEvent) {
	ev.Session = c.cfg.Params.Session
	if ev.End.IsZero() {
		ev.End = time.Now()
	}
	ev.Error = protocol.ClipUTF8(ev.Error, protocol.MaxAuditErrorLen)
	if b, err := protocol.MarshalJSON(ev); err == nil && len(b) > protocol.MaxControlFrameSize && ev.Command != nil {
		// Cannot happen with the bounds above; the frame must fit.
		ev.Command.EnvKeys = []string{"(dropped)"}
	}
	c.cfg.Event(ev)
}
