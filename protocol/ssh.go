package protocol

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// SSH streams (KindSSH) carry the SSH protocol (RFC 4253) between a client
// and the agent's own SSH server, which listens on no socket: a tunnel
// stream is its only way in. The coordinator opens one stream per SSH
// connection — for its jump host's direct-tcpip to NODE:22 (ssh -J) and for
// tether.v1.stream requests of kind "ssh" (tether ssh-proxy) — after it
// authenticated the caller and its policy granted operation ssh on the
// node. The header's SSHParams are the coordinator's word for who the
// caller is and what they may do there; the agent believes them because
// they come over its mTLS tunnel from the coordinator, and the agent's
// local policy still decides the login user. (In ProxyJump the inner SSH
// handshake runs end to end between the client and the agent, so the
// coordinator cannot hand the client a certificate for it: it vouches for
// the key the client proved instead, and the client proves it again to the
// agent.)
//
// The agent answers FrameDialOK, then both directions carry raw SSH bytes
// until either end closes; or it answers FrameError (ErrorInfo: CodeBadRequest
// for params that fail Validate, CodeForbidden when its local policy allows
// none of Logins, CodeUnsupported when it serves no SSH) and closes. Only an
// agent whose Hello lists FeatureSSH is sent ssh streams.
//
// Per SSH channel the agent reports an SSHChannelEvent on the control
// stream (FrameSSHChannel, agent → coordinator) when the channel ends, so
// that the coordinator audits every session with what only the agent sees
// (the command, the exit status); the coordinator takes the identity from
// its own record of SSHParams.Session, not from the event.

// FeatureSSH in Hello.Features: the agent serves KindSSH streams, sends
// Hello.SSHHostKey, and may send FrameSSHChannel on the control stream.
const FeatureSSH = "ssh"

// Values of SSHParams.Auth.
const (
	// SSHAuthPublicKey: the agent accepts exactly SSHParams.PublicKey (a
	// plain key or a certificate, compared byte for byte in its wire
	// form), proved by a signature, and nothing else.
	SSHAuthPublicKey = "publickey"
	// SSHAuthNone: the stream's transport already proved the caller (a
	// NATS user through tether ssh-proxy); the agent accepts SSH "none"
	// authentication (RFC 4252 §5.2) for a login in Logins.
	SSHAuthNone = "none"
)

// SSHHostSuffix is appended to a node id to make its SSH host alias
// ("node-a" is reached as "node-a.tether"), so that an alias never equals a
// local host name (NeMo Gym's SSH executor takes a host equal to the local
// host name for the local machine). The coordinator accepts both forms as a
// jump host destination; host certificates name both.
const SSHHostSuffix = ".tether"

// SSHCiphers are the ciphers Tether's SSH servers (the agent's and the jump
// host) offer, in order (RFC 4253 §7.1 names; the client's first one the
// server offers wins). AES-GCM only and AES-CTR for old clients:
// chacha20-poly1305@openssh.com, OpenSSH's first choice, is left out
// because Go's implementation of it has no assembly on amd64 and ran bulk
// transfers at 0.45× sshd's rate against 0.70× with AES-GCM (AES-NI), on
// the two hops a jump takes (e2e BenchmarkSSH, make bench-ssh).
//
// Security: every cipher here is one OpenSSH offers by default; AES-GCM is
// an AEAD, AES-CTR is paired with the HMAC-SHA2 MACs x/crypto/ssh
// negotiates; none is weaker than chacha20-poly1305, and leaving it out
// only makes a client that offers nothing else (none in OpenSSH's
// defaults) fail to connect. The benchmark's baseline sshd is left at
// OpenSSH's defaults and so negotiates chacha20-poly1305 (OpenSSL's, with
// assembly) with the same client; SSHBENCH_CIPHERS=aes128-gcm@openssh.com
// makes every hop of both sides AES-GCM, the like-for-like comparison of
// the servers' own costs.
var SSHCiphers = []string{
	"aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
	"aes128-ctr", "aes192-ctr", "aes256-ctr",
}

// Bounds of SSHParams and SSHChannelEvent fields.
const (
	// MaxSSHKeySize bounds SSHParams.PublicKey, HostCertificate and
	// Hello.SSHHostKey, in bytes (an RSA-16384 certificate fits).
	MaxSSHKeySize = 16 << 10
	// MaxSSHLogins bounds SSHParams.Logins and MaxSSHTargets
	// SSHParams.Targets.
	MaxSSHLogins  = 64
	MaxSSHTargets = 256
	// MaxSSHIdentityLen bounds SSHParams.Identity, in bytes.
	MaxSSHIdentityLen = 512
)

// SSHParams are the params of an ssh stream's header.
type SSHParams struct {
	// Session identifies the SSH connection in the agent's logs and in
	// SSHChannelEvent.Session: 32 lowercase hex digits, random, chosen by
	// the coordinator.
	Session string `json:"session"`
	// Identity is the caller as policy names it ("ssh-key:SHA256:…",
	// "ssh-principal:alice", "nats:alice"), for the agent's logs. The agent
	// does not authorize by it.
	Identity string `json:"identity"`
	// Logins are the local accounts the caller may log in as on this
	// node: the run_as of every policy rule that grants ssh here, sorted,
	// without repeats, at least one. The user name the SSH client asks for
	// must be one of them, and the agent's local policy must allow it.
	Logins []string `json:"logins"`
	// Targets are the agent targets the caller may reach with direct-tcpip
	// (ssh -L) through this connection: the targets of the policy's
	// forward grants on this node, sorted. Empty: no port forwarding.
	Targets []string `json:"targets,omitempty"`
	// Auth is SSHAuthPublicKey or SSHAuthNone.
	Auth string `json:"auth"`
	// PublicKey is the key the caller proved to the coordinator, in SSH
	// wire form (ssh.PublicKey.Marshal; a certificate's whole blob for a
	// certificate). Required with SSHAuthPublicKey, empty with
	// SSHAuthNone.
	PublicKey []byte `json:"public_key,omitempty"`
	// HostCertificate is the agent's host key (Hello.SSHHostKey) certified
	// by the coordinator's SSH host CA, in wire form: a host certificate
	// whose principals are the node id and the id + SSHHostSuffix. The
	// agent offers it beside its plain host key after checking that it
	// certifies its own key; empty when the coordinator has no host CA.
	HostCertificate []byte `json:"host_certificate,omitempty"`
}

// Validate reports every problem with p, joined.
func (p *SSHParams) Validate() error {
	var errs []error
	if !isLowerHex(p.Session, 32) {
		errs = append(errs, fmt.Errorf("session %s: want 32 lowercase hex digits", Clip(p.Session)))
	}
	if p.Identity == "" {
		errs = append(errs, errors.New("identity is empty"))
	} else if len(p.Identity) > MaxSSHIdentityLen {
		errs = append(errs, fmt.Errorf("identity: longer than %d bytes: %w", MaxSSHIdentityLen, ErrTooLarge))
	}
	errs = append(errs, checkNoNUL("identity", p.Identity)...)
	switch {
	case len(p.Logins) == 0:
		errs = append(errs, errors.New("logins is empty: the caller may log in as nobody"))
	case len(p.Logins) > MaxSSHLogins:
		errs = append(errs, fmt.Errorf("logins: %d, over %d: %w", len(p.Logins), MaxSSHLogins, ErrTooLarge))
	}
	for i, l := range p.Logins {
		if l == "" {
			errs = append(errs, fmt.Errorf("logins[%d] is empty", i))
			continue
		}
		for _, err := range checkUser(l) {
			errs = append(errs, fmt.Errorf("logins[%d]: %w", i, err))
		}
	}
	if len(p.Targets) > MaxSSHTargets {
		errs = append(errs, fmt.Errorf("targets: %d, over %d: %w", len(p.Targets), MaxSSHTargets, ErrTooLarge))
	}
	for i, t := range p.Targets {
		if err := ValidTargetName(t); err != nil {
			errs = append(errs, fmt.Errorf("targets[%d]: %w", i, err))
		}
	}
	switch p.Auth {
	case SSHAuthPublicKey:
		if len(p.PublicKey) == 0 {
			errs = append(errs, errors.New("auth publickey without public_key"))
		}
	case SSHAuthNone:
		if len(p.PublicKey) != 0 {
			errs = append(errs, errors.New("auth none with a public_key"))
		}
	default:
		errs = append(errs, fmt.Errorf("auth %s: want %q or %q", Clip(p.Auth), SSHAuthPublicKey, SSHAuthNone))
	}
	if len(p.PublicKey) > MaxSSHKeySize {
		errs = append(errs, fmt.Errorf("public_key: %d bytes, over %d: %w", len(p.PublicKey), MaxSSHKeySize, ErrTooLarge))
	}
	if len(p.HostCertificate) > MaxSSHKeySize {
		errs = append(errs, fmt.Errorf("host_certificate: %d bytes, over %d: %w", len(p.HostCertificate), MaxSSHKeySize, ErrTooLarge))
	}
	return errors.Join(errs...)
}

// AllowsLogin reports whether user is one of p.Logins.
func (p *SSHParams) AllowsLogin(user string) bool { return slices.Contains(p.Logins, user) }

// AllowsTarget reports whether target is one of p.Targets.
func (p *SSHParams) AllowsTarget(target string) bool { return slices.Contains(p.Targets, target) }

// Values of SSHChannelEvent.Type: the SSH channel request that started
// what the event describes (RFC 4254 §6.5, §7.2).
const (
	SSHChannelExec      = "exec"         // an "exec" request: Command says what
	SSHChannelShell     = "shell"        // a "shell" request (with or without a pty)
	SSHChannelSubsystem = "subsystem"    // a "subsystem" request: Subsystem says which ("sftp")
	SSHChannelForward   = "direct-tcpip" // a port forward: Target says where
	// SSHChannelAuth: the connection ended without a login (the client
	// failed to authenticate or asked for a login it may not use); Result
	// is AuditRefused and Error says why.
	SSHChannelAuth = "auth"
)

// SSHChannelEvent is the payload of FrameSSHChannel: one SSH channel of a
// connection, reported by the agent when the channel ended (or was
// refused). At most MaxControlFrameSize bytes.
type SSHChannelEvent struct {
	// Session is SSHParams.Session of the connection.
	Session string `json:"session"`
	// Channel counts the connection's channels from 1, in the order the
	// client opened them; 0 for an SSHChannelAuth event.
	Channel int `json:"channel"`
	// Type is one of the SSHChannel* values.
	Type string `json:"type"`
	// Login is the local account the channel ran as (the SSH user name).
	Login string `json:"login,omitempty"`
	// Command describes an exec channel's command (Mode "argv" with the
	// command line as one element, hashed as AuditCommand says) or a
	// shell's (Mode "login-shell"); nil for the other types. A pty
	// request sets Command.Program to "pty".
	Command *AuditCommand `json:"command,omitempty"`
	// Subsystem is a subsystem channel's name ("sftp").
	Subsystem string `json:"subsystem,omitempty"`
	// Target is a port forward's target name.
	Target string `json:"target,omitempty"`
	// Start and End bound the channel, on the agent's clock.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// ExitStatus is the exit-status the agent sent (RFC 4254 §6.10); nil
	// when none (a signal, a forward). ExitSignal is the exit-signal's
	// name without "SIG" ("KILL").
	ExitStatus *int   `json:"exit_status,omitempty"`
	ExitSignal string `json:"exit_signal,omitempty"`
	// BytesIn counts the channel's bytes from the client (stdin, an
	// upload, a forward's upstream); BytesOut the bytes to it (stdout and
	// stderr, a download, downstream).
	BytesIn  int64 `json:"bytes_in"`
	BytesOut int64 `json:"bytes_out"`
	// Result is AuditOK, AuditFailed (a non-zero exit, a signal, a failed
	// forward) or AuditRefused (the agent refused the channel or the
	// login); Error says why for the last two, at most MaxAuditErrorLen
	// bytes.
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
	// Reason, for an SSHChannelAuth event, says which refusal it was:
	// AuditReasonLoginNotGranted (Login is not one of SSHParams.Logins),
	// AuditReasonLocalPolicy (the node's local policy refused Login), or
	// empty (the client failed to authenticate). Login is the login the
	// client asked for.
	Reason string `json:"reason,omitempty"`
}

// AuditReasonLoginNotGranted is the Reason of an SSH login the policy
// does not grant the caller (the user name is not one of
// SSHParams.Logins): its Result is AuditRefused, its RunAs the login
// asked for.
const AuditReasonLoginNotGranted = "login_not_granted"

// isLowerHex reports whether s is n lowercase hex digits.
func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
