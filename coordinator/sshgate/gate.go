package sshgate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/ssh"
	"golang.org/x/time/rate"

	"github.com/tetherfleet/tether/internal/admission"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/internal/sshkey"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Decisions the contract left open, and why:
//
//   - authorized_keys options (from=, command=, restrict, no-pty...) are
//     refused at load with FILE:LINE errors, not ignored: the gate cannot
//     honour them (it runs nothing and only forwards), and ignoring one
//     would let a key do more than its line says. A CA file accepts the
//     cert-authority option only, so one line can serve both files. A
//     certificate in either file is an error. A file with no key (empty,
//     or comments only) is not: emptying it and reloading revokes every key
//     it held, live connections included; the gate warns when that leaves
//     no key and no CA, so that nobody can log in.
//   - Of a user certificate's critical options only source-address is
//     honoured (checked by the gate and again by the SSH library);
//     force-command, verify-required and unknown ones refuse the
//     certificate. Its extensions (permit-pty...) are ignored: the node
//     decides those. Principals that no policy entry could name
//     (identity.CheckSSHPrincipal) are dropped; a certificate left with none
//     is refused (no_principals).
//   - The SSH user name sent to the jump host is ignored; the login is
//     chosen on the inner connection among SSHParams.Logins.
//   - A direct-tcpip to an unknown node is decided as a node without
//     labels (see channel.run): callers who would not be granted ssh there
//     get the policy's refusal, so probing does not map the fleet; only
//     callers who may ssh there learn "unknown node". The destination must
//     be NODE or NODE.tether exactly as the node id is spelled, port 22.
//   - Audit: one event per direct-tcpip channel (operation ssh, method
//     connect; RunAs lists the logins granted; Target is HOST:PORT as
//     asked), and one per connection whose offered keys were all refused
//     (method auth, reason unauthenticated, the client's address in
//     Error). Connections that offered no key (scanners, timeouts, floods)
//     and session or other channel types are counted, not audited.
//   - A reload takes effect on live connections too (Recheck, which
//     SetKeys runs): a connection whose key is no longer trusted (removed
//     from the authorized keys, its CA removed, its certificate expired:
//     checked at ValidBefore too, without a reload) is closed with all its
//     channels; a channel whose node the policy no longer grants the
//     identity ssh on, or no longer as one of the logins (or forward
//     targets) its stream was vouched, is closed alone: the node's SSH
//     server holds the SSHParams of the open and would go on serving them,
//     every session an OpenSSH ControlMaster multiplexes included. Each is
//     logged, counted and audited (reason revoked).
//   - A node host key the CA cannot certify is logged and the stream opens
//     without a HostCertificate (clients that check by the CA then refuse
//     the node, which is what they should do).

// Files the gate keeps in Config.StateDir.
const (
	// HostKeyFile is the jump host's own ed25519 host key.
	HostKeyFile = "ssh_host_ed25519_key"
	// HostCAFile is the SSH host CA's ed25519 key (when Config.HostCA is
	// nil).
	HostCAFile = "ssh_host_ca_ed25519_key"
)

// Defaults of Config's zero values.
const (
	DefaultMaxConnections      = 1024
	DefaultMaxHandshakes       = 64
	DefaultMaxHandshakesSource = 8
	DefaultHandshakeTimeout    = 10 * time.Second
	DefaultMaxChannelsPerConn  = 64
	DefaultOpenTimeout         = 20 * time.Second
	DefaultClockSkew           = time.Minute
	DefaultMaxAuthTries        = 6
)

// Config configures a Gate. Zero values mean the documented default.
type Config struct {
	// StateDir is where the gate keeps its private keys (HostKeyFile, and
	// HostCAFile unless HostCA is set), created 0700 if missing; each key
	// is created on first use (ed25519, mode 0600) and loaded afterwards.
	// Required.
	StateDir string
	// HostCA certifies node host keys and the jump host's key. Nil: the
	// gate loads or creates one in StateDir/HostCAFile with
	// DefaultHostCertLifetime.
	HostCA *HostCA
	// HostNames are the names clients reach the jump host by (its DNS
	// name, or the HostKeyAlias of their ssh config): the principals of
	// the host certificate the gate offers beside its plain key, so that
	// one @cert-authority line (HostCA.KnownHostsLineFor) covers the jump
	// hop too. Empty: the gate offers its plain key only (JumpKnownHostsLine).
	HostNames []string
	// AuthorizedKeysFile is an OpenSSH authorized_keys file of the plain
	// keys that may authenticate (each is the identity
	// ssh-key:SHA256:FINGERPRINT). Options on its lines are refused, with
	// FILE:LINE errors (see parseKeyFile). Empty: no plain key is accepted.
	AuthorizedKeysFile string
	// UserCAFiles are files of user CA public keys (authorized_keys
	// format; the cert-authority option is allowed, no other): user
	// certificates they signed authenticate as ssh-principal:PRINCIPAL.
	// At least one of AuthorizedKeysFile and UserCAFiles is required.
	UserCAFiles []string
	// Nodes is the fleet; Policy decides; Auditor records. Required.
	Nodes   Nodes
	Policy  Policy
	Auditor Auditor
	// Logger receives the gate's logs. Nil: discarded.
	Logger *slog.Logger
	// Registerer registers the tether_ssh_* metrics. Nil: not registered.
	Registerer prometheus.Registerer
	// MaxConnections bounds the connections open at once, in their
	// handshake or authenticated; past it a new connection is closed
	// unread. Default DefaultMaxConnections.
	MaxConnections int
	// MaxHandshakes bounds the connections in their handshake at once, and
	// MaxHandshakesPerSource those from one source (an IPv4 address or an
	// IPv6 /64); see admission. Defaults DefaultMaxHandshakes,
	// DefaultMaxHandshakesSource.
	MaxHandshakes          int
	MaxHandshakesPerSource int
	// HandshakeTimeout bounds a connection's SSH handshake, from accept to
	// authenticated. Default DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxAuthTries bounds the keys a client may try on one connection
	// (ssh.ServerConfig.MaxAuthTries). Default DefaultMaxAuthTries.
	MaxAuthTries int
	// MaxChannelsPerConn bounds a connection's open channels; past it a
	// channel is rejected (ResourceShortage). Default
	// DefaultMaxChannelsPerConn.
	MaxChannelsPerConn int
	// OpenTimeout bounds Nodes.OpenSSH for one channel. Default
	// DefaultOpenTimeout.
	OpenTimeout time.Duration
	// ClockSkew is the tolerance on a user certificate's validity, both
	// ends. Default DefaultClockSkew; negative: none.
	ClockSkew time.Duration
	// Now is the clock (tests). Nil: time.Now.
	Now func() time.Time
}

// withDefaults returns c with its zero values replaced by the defaults.
func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.MaxConnections, DefaultMaxConnections)
	def(&c.MaxHandshakes, DefaultMaxHandshakes)
	def(&c.MaxHandshakesPerSource, DefaultMaxHandshakesSource)
	def(&c.MaxChannelsPerConn, DefaultMaxChannelsPerConn)
	def(&c.MaxAuthTries, DefaultMaxAuthTries)
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = DefaultOpenTimeout
	}
	switch {
	case c.ClockSkew == 0:
		c.ClockSkew = DefaultClockSkew
	case c.ClockSkew < 0:
		c.ClockSkew = 0
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c, joined.
func (c *Config) Validate() error {
	var errs []error
	if c.StateDir == "" {
		errs = append(errs, errors.New("ssh gate: StateDir is empty"))
	}
	if c.AuthorizedKeysFile == "" && len(c.UserCAFiles) == 0 {
		errs = append(errs, errors.New("ssh gate: neither AuthorizedKeysFile nor UserCAFiles is set: no client could authenticate"))
	}
	if c.Nodes == nil {
		errs = append(errs, errors.New("ssh gate: Nodes is nil"))
	}
	if c.Policy == nil {
		errs = append(errs, errors.New("ssh gate: Policy is nil"))
	}
	if c.Auditor == nil {
		errs = append(errs, errors.New("ssh gate: Auditor is nil"))
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"MaxConnections", c.MaxConnections}, {"MaxHandshakes", c.MaxHandshakes}, {"MaxHandshakesPerSource", c.MaxHandshakesPerSource},
		{"MaxChannelsPerConn", c.MaxChannelsPerConn}, {"MaxAuthTries", c.MaxAuthTries}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("ssh gate: %s %d is negative", n.name, n.v))
		}
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("ssh gate: HandshakeTimeout %v is negative", c.HandshakeTimeout))
	}
	if c.OpenTimeout < 0 {
		errs = append(errs, fmt.Errorf("ssh gate: OpenTimeout %v is negative", c.OpenTimeout))
	}
	for i, h := range c.HostNames {
		if h == "" || len(h) > 253 {
			errs = append(errs, fmt.Errorf("ssh gate: HostNames[%d] %s: want 1-253 bytes", i, clipString(h, 40)))
		}
	}
	return errors.Join(errs...)
}

// ErrClosed is returned by Serve after Close or Shutdown.
var ErrClosed = errors.New("ssh gate: closed")

// Gate is the SSH jump host. Create it with New, give it listeners with
// Serve, end it with Shutdown or Close. It is safe for concurrent use.
//
// Goroutines: one per Serve (the accept loop), one per connection (its
// handshake, then its channel loop), one for its global requests, per
// direct-tcpip channel one opening the stream and two copying bytes, and
// for a certificate's connection a timer at its expiry (recheckConn),
// stopped when the connection ends. Each
// connection's goroutines are contained by a panics.Guard: a panic costs
// that connection only. Locks: mu and each connection's connState.mu are
// leaves, never held together.
type Gate struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	guard   *panics.Guard
	hostKey ssh.Signer
	ca      *HostCA
	adm     *admission.Controller
	// preauthLog bounds the warnings about connections refused before
	// their handshake (a flood would otherwise flood the log too): a few
	// per 10 s; every one is counted.
	preauthLog *rate.Limiter
	keys       atomic.Pointer[keySet]
	jump       atomic.Pointer[jumpCert]

	ctx    context.Context // cancelled by Close: ends opens in progress
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool // Close or Shutdown began: no new connection
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]*connState
	wg        sync.WaitGroup
}

// jumpCert is the jump host's host certificate signer, renewed at
// renewAt.
type jumpCert struct {
	signer  ssh.Signer
	renewAt time.Time
}

// New builds a Gate from cfg: it validates cfg, loads (or creates) the
// jump host key and the host CA in cfg.StateDir, and loads the key files.
// Errors name the field or file at fault.
func New(cfg Config) (*Gate, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	g := &Gate{
		cfg:        cfg,
		log:        cfg.Logger.With("component", "sshgate"),
		listeners:  map[net.Listener]struct{}{},
		conns:      map[net.Conn]*connState{},
		adm:        admission.New(cfg.MaxHandshakes, cfg.MaxHandshakesPerSource),
		preauthLog: rate.NewLimiter(rate.Every(10*time.Second/3), 3),
	}
	var err error
	if g.hostKey, err = sshkey.LoadOrCreate(filepath.Join(cfg.StateDir, HostKeyFile), "tether-jump-host"); err != nil {
		return nil, fmt.Errorf("ssh gate: host key: %w", err)
	}
	g.ca = cfg.HostCA
	if g.ca == nil {
		if g.ca, err = LoadHostCA(filepath.Join(cfg.StateDir, HostCAFile), 0); err != nil {
			return nil, fmt.Errorf("ssh gate: %w", err)
		}
	}
	ks, err := loadKeySet(cfg.AuthorizedKeysFile, cfg.UserCAFiles)
	if err != nil {
		return nil, err
	}
	g.keys.Store(ks)
	g.warnIfLocked(ks)
	if len(cfg.HostNames) != 0 {
		if err := g.renewJumpCert(cfg.Now()); err != nil {
			return nil, err
		}
	}
	if g.m, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	g.guard = panics.New(cfg.Registerer, g.log, "sshgate")
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.log.Info("ssh jump host ready", "host_key", ssh.FingerprintSHA256(g.hostKey.PublicKey()),
		"host_ca", ssh.FingerprintSHA256(g.ca.PublicKey()), "authorized_keys", len(ks.users), "user_cas", len(ks.cas))
	return g, nil
}

// renewJumpCert certifies the jump host's key for cfg.HostNames.
func (g *Gate) renewJumpCert(now time.Time) error {
	cert, err := g.ca.certify(g.hostKey.PublicKey(), g.cfg.HostNames, "tether-jump-host", now)
	if err != nil {
		return fmt.Errorf("ssh gate: certifying the jump host key: %w", err)
	}
	signer, err := ssh.NewCertSigner(cert, g.hostKey)
	if err != nil {
		return fmt.Errorf("ssh gate: the jump host certificate: %w", err)
	}
	g.jump.Store(&jumpCert{signer: signer, renewAt: now.Add(g.ca.lifetime / 2)})
	return nil
}

// Reload rereads AuthorizedKeysFile and UserCAFiles. On an error the keys
// in force stay and the error names every bad line. Otherwise the new
// keys are put in force as SetKeys does, which closes the live
// connections whose key is no longer trusted (Recheck).
func (g *Gate) Reload() error {
	k, err := g.ReadKeys()
	if err != nil {
		g.log.Warn("ssh key files not reloaded; the previous keys stay in force", "err", err)
		return err
	}
	g.SetKeys(k)
	return nil
}

// Keys is the keys and user CAs of AuthorizedKeysFile and UserCAFiles,
// read and checked by ReadKeys, not yet in force.
type Keys struct{ ks *keySet }

// Counts returns the number of authorized keys and of user CAs in k.
func (k *Keys) Counts() (authorizedKeys, userCAs int) { return len(k.ks.users), len(k.ks.cas) }

// ReadKeys is the first half of Reload, for a caller that reloads the
// key files with others (the coordinator's SIGHUP, with its policy): it
// reads and checks AuthorizedKeysFile and UserCAFiles, changing nothing.
// The error names every problem, each with its file (and line). SetKeys
// puts the keys read in force; each file is read once, so the keys
// applied are the ones checked.
func (g *Gate) ReadKeys() (*Keys, error) {
	ks, err := loadKeySet(g.cfg.AuthorizedKeysFile, g.cfg.UserCAFiles)
	if err != nil {
		return nil, err
	}
	return &Keys{ks}, nil
}

// SetKeys puts k, from ReadKeys, in force (as Reload does), logs it, then
// runs Recheck: a connection whose key k no longer trusts is closed, as is
// a channel the policy in force no longer grants. A caller that reloads
// the policy too (the coordinator's SIGHUP) applies it first, so that one
// SetKeys rechecks both.
func (g *Gate) SetKeys(k *Keys) {
	g.keys.Store(k.ks)
	g.log.Info("ssh key files reloaded", "authorized_keys", len(k.ks.users), "user_cas", len(k.ks.cas))
	g.warnIfLocked(k.ks)
	g.Recheck()
}

// warnIfLocked warns when ks trusts no key and no CA: no one can log in
// at the jump host until a key file that holds one is loaded.
func (g *Gate) warnIfLocked(ks *keySet) {
	if len(ks.users) == 0 && len(ks.cas) == 0 {
		g.log.Warn("ssh key files hold no authorized key and no user CA: no one can log in at the jump host until one is added and the coordinator reloaded (SIGHUP)",
			"authorized_keys_file", g.cfg.AuthorizedKeysFile, "user_ca_files", g.cfg.UserCAFiles)
	}
}

// Recheck decides every live connection again under the keys and the
// policy in force now, for a caller that changed either (SetKeys runs
// it): a connection whose key is no longer trusted (stillTrusted: removed,
// its CA removed, its certificate expired) is closed with its channels;
// a direct-tcpip channel whose identity the policy no longer grants ssh on
// its node, or no longer as every login (or to every forward target) its
// stream was vouched at its open, is closed. Each closed connection and
// channel is logged (identity, node, why), counted
// (tether_ssh_connections_revoked_total, tether_ssh_channels_total
// result revoked) and its channels audited with reason revoked. The
// decisions are Peek's: they count no refusal. Recheck does not block on
// the connections; they end in their own goroutines. Safe for concurrent
// use.
func (g *Gate) Recheck() {
	g.mu.Lock()
	live := make([]*connState, 0, len(g.conns))
	for _, cs := range g.conns {
		if cs.authed {
			live = append(live, cs)
		}
	}
	g.mu.Unlock()
	for _, cs := range live {
		g.recheckConn(cs)
	}
}

// HostCA returns the host CA the gate certifies node keys with.
func (g *Gate) HostCA() *HostCA { return g.ca }

// HostKey returns the jump host's plain public host key.
func (g *Gate) HostKey() ssh.PublicKey { return g.hostKey.PublicKey() }

// JumpKnownHostsLine returns the known_hosts line for the jump host's
// plain key as reached at host and port ("[host]:port ssh-ed25519 AAAA…
// tether-jump-host"; just "host …" for port 22, or for a HostKeyAlias with
// port 0), without a newline.
func (g *Gate) JumpKnownHostsLine(host string, port int) string {
	name := host
	if port != 0 && port != 22 {
		name = "[" + host + "]:" + strconv.Itoa(port)
	}
	return name + " " + authorizedKey(g.hostKey.PublicKey()) + " tether-jump-host"
}

// KnownHosts returns a known_hosts file's text (lines ending in newlines)
// that lets a client check the nodes (KnownHostsLine of the host CA) and
// the jump host reached at host:port (its plain key, and the CA line for
// its HostNames when there are any).
func (g *Gate) KnownHosts(host string, port int) string {
	s := g.ca.KnownHostsLine() + "\n" + g.JumpKnownHostsLine(host, port) + "\n"
	if len(g.cfg.HostNames) != 0 {
		s += g.ca.KnownHostsLineFor(g.cfg.HostNames...) + "\n"
	}
	return s
}

// Serve accepts connections on l until l fails or the gate is closed, and
// serves each in its own goroutines. It closes l when it returns, and
// returns ErrClosed after Close or Shutdown, else the accept error.
// Several Serve calls may run at once on different listeners.
func (g *Gate) Serve(l net.Listener) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		l.Close()
		return ErrClosed
	}
	g.listeners[l] = struct{}{}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.listeners, l)
		g.mu.Unlock()
		l.Close()
	}()
	var backoff time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			g.mu.Lock()
			closed := g.closed
			g.mu.Unlock()
			if closed {
				return ErrClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				g.log.Warn("ssh accept failed; retrying", "err", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("ssh gate: accepting on %s: %w", l.Addr(), err)
		}
		backoff = 0
		g.accept(conn)
	}
}

// isTemporary reports accept errors worth retrying: out of file
// descriptors, a connection aborted before accept.
func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// accept registers conn and starts its goroutine, or closes it when the
// gate is closed or full.
func (g *Gate) accept(conn net.Conn) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		conn.Close()
		return
	}
	if len(g.conns) >= g.cfg.MaxConnections {
		g.mu.Unlock()
		conn.Close()
		g.m.connections.WithLabelValues(connLimit).Inc()
		g.log.Debug("ssh connection refused: at MaxConnections", "remote", conn.RemoteAddr(), "max", g.cfg.MaxConnections)
		return
	}
	cs := &connState{g: g, conn: conn, remote: conn.RemoteAddr(), done: make(chan struct{})}
	g.conns[conn] = cs
	g.wg.Add(1)
	g.mu.Unlock()
	g.m.open.Inc()
	go cs.serve()
}

// forget unregisters a connection whose goroutine ends.
func (g *Gate) forget(cs *connState) {
	g.mu.Lock()
	delete(g.conns, cs.conn)
	g.mu.Unlock()
	g.m.open.Dec()
}

// Close stops every Serve, closes every connection (cutting the channels
// they carry) and waits for the gate's goroutines. It returns nil, also
// when called again.
func (g *Gate) Close() error {
	g.mu.Lock()
	g.closed = true
	for l := range g.listeners {
		l.Close()
	}
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	if g.cancel != nil {
		g.cancel()
	}
	g.wg.Wait()
	return nil
}

// Shutdown stops every Serve and closes the connections still in their
// handshake, then waits until the authenticated connections end by
// themselves or ctx is done; then it closes what is left (Close) and
// returns ctx's error, or nil when all ended in time.
func (g *Gate) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	for l := range g.listeners {
		l.Close()
	}
	for c, cs := range g.conns {
		if !cs.authed {
			c.Close()
		}
	}
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
		return g.Close()
	case <-ctx.Done():
		g.Close()
		return ctx.Err()
	}
}

// serverConfig builds the ssh.ServerConfig of one connection: the
// callbacks close over cs to record what its handshake saw.
func (g *Gate) serverConfig(cs *connState) *ssh.ServerConfig {
	cfg := &ssh.ServerConfig{
		Config:       ssh.Config{Ciphers: protocol.SSHCiphers},
		MaxAuthTries: g.cfg.MaxAuthTries,
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			cs.triedKey.Store(true)
			perms, err := checkKey(g.keys.Load(), key, meta.RemoteAddr(), g.cfg.Now(), g.cfg.ClockSkew)
			if err != nil {
				var ae *authError
				if errors.As(err, &ae) {
					g.m.authFailures.WithLabelValues(ae.reason).Inc()
				}
				g.log.Debug("ssh key refused", "remote", meta.RemoteAddr(), "err", err)
				cs.lastRefusal = err.Error()
				return nil, err
			}
			return perms, nil
		},
		VerifiedPublicKeyCallback: verifiedKey,
		AuthLogCallback: func(meta ssh.ConnMetadata, method string, err error) {
			var ae *authError
			if method != "publickey" || err == nil || errors.As(err, &ae) {
				return
			}
			// A key the library refused before asking the callback: it did
			// not parse (a certificate signed by a certificate is refused
			// there) or its algorithm is not accepted.
			cs.triedKey.Store(true)
			g.m.authFailures.WithLabelValues(libraryReason(err)).Inc()
			cs.lastRefusal = "ssh gate: key refused: " + err.Error()
			g.log.Debug("ssh key refused by the SSH library", "remote", meta.RemoteAddr(), "err", err)
		},
		BannerCallback: nil,
	}
	cfg.AddHostKey(g.hostKey)
	if j := g.jump.Load(); j != nil {
		if !g.cfg.Now().Before(j.renewAt) {
			if err := g.renewJumpCert(g.cfg.Now()); err != nil {
				g.log.Error("jump host certificate not renewed", "err", err)
			}
			j = g.jump.Load()
		}
		cfg.AddHostKey(j.signer)
	}
	return cfg
}

// libraryReason classifies a key refusal of the SSH library itself.
func libraryReason(err error) string {
	if s := err.Error(); containsAny(s, "invalid for certificates", "cannot be used as authority") {
		return reasonCertByCert
	}
	return reasonBadKey
}

// isClosed reports whether err is the error of a closed or ended
// connection.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrClosedPipe)
}

// ensure *policy.Store satisfies Policy.
var _ Policy = (*policy.Store)(nil)
