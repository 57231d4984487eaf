package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/internal/countcopy"
	"github.com/tetherfleet/tether/internal/filetype"
	"github.com/tetherfleet/tether/protocol"
)

// sshJumpAlias is the Host (and HostKeyAlias) of the jump host in the
// config tether ssh-config writes.
const sshJumpAlias = "tether-jump"

// sshConfigOptions are the flags of `tether ssh-config`.
type sshConfigOptions struct {
	NATS natsOptions
	// Identity is the private key file OpenSSH offers (IdentityFile); empty
	// leaves OpenSSH's defaults and agent.
	Identity string
	// ProxyCommand reaches the nodes through `tether ssh-proxy` (over
	// NATS) instead of the jump host.
	ProxyCommand bool
	// KnownHosts is the known_hosts file written; default
	// CONFIG-HOME/tether/known_hosts.
	KnownHosts string
}

func newSSHConfigCmd(e *env) *cobra.Command {
	var o sshConfigOptions
	cmd := &cobra.Command{
		Use:   "ssh-config",
		Short: "Print an OpenSSH config block for the nodes you may ssh to",
		Long: `Ssh-config asks the coordinator which nodes you may log in to and prints an
OpenSSH config block for them: one "Host NODE.tether" per node (a node is
always NODE.tether, never a bare name that could be this machine's), and a
"Host *.tether" that reaches them through the coordinator's SSH jump host
(ProxyJump tether-jump) or, with --proxy-command or when the coordinator runs
no jump host, through "tether ssh-proxy" over NATS. It writes the host keys
to check them by (the fleet's host CA as an @cert-authority line, and the
jump host's key) to --known-hosts, so StrictHostKeyChecking yes works.

With the jump host, OpenSSH authenticates with your SSH key (--identity, or
your defaults and agent) to the jump host and again to the node; the policy
names the key (ssh-key:SHA256:...) or your certificate's principal
(ssh-principal:NAME). With ssh-proxy, your NATS identity is the one policy
decides by.

Examples:
  tether ssh-config >> ~/.ssh/config
  ssh NODE.tether
  tether ssh-config --proxy-command > ~/.ssh/tether.conf   # then: Include tether.conf`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			t, err := o.NATS.resolve(e.getenv)
			if err != nil {
				return err
			}
			// The paths first: what is refused about them is refused
			// before anything is asked.
			known, mkdir, err := o.knownHostsPath(e.getenv)
			if err != nil {
				return err
			}
			identity, err := o.identityPath(e.getenv)
			if err != nil {
				return err
			}
			if err := checkKnownHosts(known, mkdir); err != nil {
				return err
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			info, err := c.SSHInfo(cmd.Context())
			if err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("ssh-config: the path of this tether binary: %w", err)
			}
			sc := sshConfig{Info: info, NATSHost: natsHost(t.url), KnownHosts: known, Identity: identity,
				ProxyCommand: o.ProxyCommand, Tether: self, NATSFlags: o.NATS.flags()}
			text, knownText, err := sc.render()
			if err != nil {
				return err
			}
			if err := writeKnownHosts(known, knownText, mkdir); err != nil {
				return err
			}
			_, err = io.WriteString(e.stdout, text)
			return err
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.Identity, "identity", "", "private key file OpenSSH offers to the jump host and the nodes (IdentityFile, IdentitiesOnly)")
	f.BoolVar(&o.ProxyCommand, "proxy-command", false, "reach the nodes through tether ssh-proxy over NATS instead of the SSH jump host")
	f.StringVar(&o.KnownHosts, "known-hosts", "", "known_hosts file to write the fleet's host keys to (default: ~/.config/tether/known_hosts)")
	o.NATS.addFlags(cmd)
	return cmd
}

// knownHostsPath is the absolute path of the known_hosts file to write:
// --known-hosts, else CONFIG-HOME/tether/known_hosts (mkdir: its
// directory may be made). A path OpenSSH's config cannot name
// (configPath) is a usage error.
func (o *sshConfigOptions) knownHostsPath(getenv func(string) string) (path string, mkdir bool, err error) {
	path = o.KnownHosts
	if path == "" {
		mkdir = true // ~/.config/tether may not exist yet
		home := configHome(getenv)
		if home == "" {
			return "", false, errors.New("ssh-config: no home directory for the known_hosts file; give --known-hosts FILE")
		}
		path = filepath.Join(home, "tether", "known_hosts")
	} else if err := configPath("--known-hosts", o.KnownHosts, o.KnownHosts); err != nil {
		return "", false, err
	}
	if path, err = homePath(path, getenv); err != nil {
		return "", false, fmt.Errorf("ssh-config: --known-hosts: %w", err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return "", false, fmt.Errorf("ssh-config: --known-hosts: %w", err)
	}
	flag := "--known-hosts"
	if o.KnownHosts == "" {
		flag = "known_hosts (the default; give --known-hosts FILE)"
	}
	if err := configPath(flag, o.KnownHosts, path); err != nil {
		return "", false, err
	}
	return path, mkdir, nil
}

// identityPath is the absolute path of --identity ("" without it), a
// regular file whose path OpenSSH's config can name (configPath);
// otherwise a usage error.
func (o *sshConfigOptions) identityPath(getenv func(string) string) (string, error) {
	if o.Identity == "" {
		return "", nil
	}
	if err := configPath("--identity", o.Identity, o.Identity); err != nil {
		return "", err
	}
	identity, err := homePath(o.Identity, getenv)
	if err != nil {
		return "", usage(fmt.Errorf("--identity: %w", err))
	}
	if identity, err = filepath.Abs(identity); err != nil {
		return "", fmt.Errorf("ssh-config: --identity: %w", err)
	}
	if err := configPath("--identity", o.Identity, identity); err != nil {
		return "", err
	}
	// OpenSSH would only warn at every connection, then offer nothing
	// (IdentitiesOnly): say it now.
	if fi, err := os.Stat(identity); err != nil {
		return "", usage(fmt.Errorf("--identity: %w", err))
	} else if !fi.Mode().IsRegular() {
		return "", usage(fmt.Errorf("--identity %s: not a regular file but %s", identity, filetype.Of(fi.Mode())))
	}
	return identity, nil
}

// configPath refuses, as a usage error naming flag, a path (p: the flag's
// value given, or what it resolved to) with a control character: an
// OpenSSH config line cannot hold one (a quoted argument takes no
// escapes, so "\n" would name another file). The position is the
// character's 1-based byte in p.
func configPath(flag, given, p string) error {
	for i, r := range p {
		if !unicode.IsControl(r) {
			continue
		}
		what := fmt.Sprintf("%s %q", flag, given)
		switch {
		case given == "":
			what = fmt.Sprintf("%s %q", flag, p)
		case p != given:
			what = fmt.Sprintf("%s %q (%q)", flag, given, p)
		}
		return usage(fmt.Errorf("%s: a control character %q at byte %d: an ssh config cannot name such a path; rename it, or give a link to it from a path without one", what, r, i+1))
	}
	return nil
}

// homePath returns p with a leading "~" or "~/" replaced by the home
// directory ($HOME, else the user's), as OpenSSH reads IdentityFile: the
// shell leaves "--identity=~/KEY" unexpanded. Other paths are returned
// as they are. Errors: no home directory.
func homePath(p string, getenv func(string) string) (string, error) {
	rest, ok := strings.CutPrefix(p, "~")
	if !ok || rest != "" && rest[0] != '/' {
		return p, nil
	}
	home := getenv("HOME")
	if home == "" {
		var err error
		if home, err = os.UserHomeDir(); err != nil {
			return "", fmt.Errorf("%s: no home directory for ~: %w", p, err)
		}
	}
	return home + rest, nil
}

// flags returns the NATS flags given explicitly, for a ProxyCommand to
// connect as this command did.
func (o *natsOptions) flags() []string {
	var out []string
	for _, f := range []struct{ name, v string }{{"--nats-url", o.URL}, {"--nats-creds", o.Creds}, {"--nats-context", o.Context}} {
		if f.v != "" {
			out = append(out, f.name, f.v)
		}
	}
	return out
}

// natsHost is the host of the first server of a NATS URL list, "" when
// there is none.
func natsHost(urls string) string {
	first, _, _ := strings.Cut(urls, ",")
	first = strings.TrimSpace(first)
	if !strings.Contains(first, "://") {
		first = "nats://" + first
	}
	u, err := url.Parse(first)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// sshConfig is what tether ssh-config renders.
type sshConfig struct {
	Info *protocol.SSHInfo
	// NATSHost is the host NATS is reached at: the jump host's, when the
	// coordinator listens on every interface.
	NATSHost string
	// KnownHosts and Identity are absolute paths (Identity may be empty).
	KnownHosts, Identity string
	ProxyCommand         bool
	// Tether is the absolute path of the tether binary, and NATSFlags the
	// connection flags its ssh-proxy gets.
	Tether    string
	NATSFlags []string
}

// render returns the config text and the known_hosts file's text.
func (s *sshConfig) render() (config, knownHosts string, err error) {
	in := s.Info
	var b strings.Builder
	var known strings.Builder
	known.WriteString(knownHostsMarker + " " + in.Coordinator + "; rewritten by every run\n")
	if in.KnownHostsCA != "" {
		known.WriteString(in.KnownHostsCA + "\n")
	}
	if in.JumpAddr != "" && in.JumpHostKey != "" {
		// Written in every mode: one known_hosts serves the configs of
		// both (ssh-config and ssh-config --proxy-command).
		known.WriteString(sshJumpAlias + " " + in.JumpHostKey + "\n")
	}
	proxy := s.ProxyCommand
	var jumpHost, jumpPort string
	if !proxy {
		if in.JumpAddr == "" || in.JumpHostKey == "" {
			proxy = true
			fmt.Fprintf(&b, "# Coordinator %s runs no SSH jump host (--ssh-addr): the nodes are reached\n# through tether ssh-proxy over NATS.\n", in.Coordinator)
		} else {
			h, p, err := net.SplitHostPort(in.JumpAddr)
			if err != nil {
				return "", "", fmt.Errorf("ssh-config: the coordinator's jump address %q: %w", in.JumpAddr, err)
			}
			if ip := net.ParseIP(h); h == "" || ip != nil && ip.IsUnspecified() {
				h = s.NATSHost
			}
			if h == "" {
				return "", "", fmt.Errorf("ssh-config: the coordinator's jump host listens on %s, every interface, and the NATS URL names no host to reach it by; use --proxy-command", in.JumpAddr)
			}
			jumpHost, jumpPort = h, p
		}
	}
	fmt.Fprintf(&b, "# Written by tether ssh-config for coordinator %s: %d node(s).\n", in.Coordinator, len(in.Nodes))
	if in.NodesTotal > len(in.Nodes) {
		fmt.Fprintf(&b, "# %d more nodes are not listed (over %d); \"ssh NODE.tether\" reaches them too.\n", in.NodesTotal-len(in.Nodes), len(in.Nodes))
	}
	// OpenSSH lowercases the host name (and HostName and HostKeyAlias)
	// before it matches Host blocks or checks a host certificate, so
	// aliases are written lowercase: the jump host and ssh-proxy find
	// GPU-07 when asked for gpu-07, and its host certificate names both.
	// Two node ids equal but for case would share an alias; the one whose
	// id is the alias exactly keeps it (that is the one a lowercase
	// request reaches).
	taken := map[string]bool{}
	for _, n := range in.Nodes {
		if protocol.ValidNodeID(n.ID) == nil && n.ID == strings.ToLower(n.ID) {
			taken[n.ID] = true
		}
	}
	for _, n := range in.Nodes {
		if protocol.ValidNodeID(n.ID) != nil {
			continue // never written into a config
		}
		alias := strings.ToLower(n.ID) + protocol.SSHHostSuffix
		if n.ID != strings.ToLower(n.ID) {
			if taken[strings.ToLower(n.ID)] {
				fmt.Fprintf(&b, "\n# %s: not reachable with OpenSSH, which lowercases host names: node %s\n# takes %s; tether shell and tether exec reach it.\n", n.ID, strings.ToLower(n.ID), alias)
				continue
			}
			taken[strings.ToLower(n.ID)] = true
			fmt.Fprintf(&b, "\n# node %s (OpenSSH lowercases host names)", n.ID)
		}
		fmt.Fprintf(&b, "\nHost %s\n", alias)
		fmt.Fprintf(&b, "  HostKeyAlias %s\n", alias)
		if len(n.Logins) == 1 && sshToken(n.Logins[0]) {
			fmt.Fprintf(&b, "  User %s\n", n.Logins[0])
		} else if len(n.Logins) > 1 {
			fmt.Fprintf(&b, "  # logins: %s (ssh LOGIN@%s)\n", strings.Join(n.Logins, ", "), alias)
		}
	}
	fmt.Fprintf(&b, "\nHost *%s\n", protocol.SSHHostSuffix)
	if proxy {
		argv := append([]string{s.Tether, "ssh-proxy"}, s.NATSFlags...)
		for i, a := range argv {
			argv[i] = sshQuote(a)
		}
		fmt.Fprintf(&b, "  ProxyCommand %s %%n\n", strings.Join(argv, " "))
	} else {
		fmt.Fprintf(&b, "  ProxyJump %s\n", sshJumpAlias)
	}
	s.common(&b)
	if !proxy {
		fmt.Fprintf(&b, "\nHost %s\n", sshJumpAlias)
		fmt.Fprintf(&b, "  HostName %s\n", jumpHost)
		fmt.Fprintf(&b, "  Port %s\n", jumpPort)
		fmt.Fprintf(&b, "  HostKeyAlias %s\n", sshJumpAlias)
		s.common(&b)
	}
	return b.String(), known.String(), nil
}

// common writes the options every block shares.
func (s *sshConfig) common(b *strings.Builder) {
	fmt.Fprintf(b, "  UserKnownHostsFile %s\n", sshQuote(s.KnownHosts))
	fmt.Fprintf(b, "  StrictHostKeyChecking yes\n")
	// The client's order picks the cipher (RFC 4253 §7.1), and OpenSSH's
	// default puts chacha20-poly1305 and AES-CTR (with an HMAC) before
	// AES-GCM: the servers offer no chacha20, so without this line every
	// hop ran AES-CTR + HMAC-SHA2-256, whose MAC alone took 15% of the jump
	// host's CPU in a bulk copy. Offering the servers' own list, in their
	// order, makes each hop AES-GCM (AES-NI, no separate MAC).
	fmt.Fprintf(b, "  Ciphers %s\n", strings.Join(protocol.SSHCiphers, ","))
	if s.Identity != "" {
		fmt.Fprintf(b, "  IdentityFile %s\n", sshQuote(s.Identity))
		fmt.Fprintf(b, "  IdentitiesOnly yes\n")
	}
}

// sshToken reports whether s can be written into an ssh config unquoted.
func sshToken(s string) bool {
	return s != "" && !strings.ContainsAny(s, " \t\"'#%\\\n\r=")
}

// sshQuote quotes s for an ssh config line when it needs it (OpenSSH
// takes double quotes around an argument with spaces).
func sshQuote(s string) string {
	if sshToken(s) {
		return s
	}
	return strconv.Quote(s)
}

// knownHostsMarker starts every known_hosts file ssh-config writes: it
// replaces only a file that starts with it (or none), never a user's own
// known_hosts given by mistake.
const knownHostsMarker = "# Written by tether ssh-config for coordinator"

// writeKnownHosts writes text to path (0600), through a temporary file
// and a rename; a symlink's target is written, the link kept. With mkdir
// (the default path) a missing directory is created (0700); a path given
// with --known-hosts must be in a directory that exists, so a mistyped one
// makes no directories. An existing file is replaced only when ssh-config
// wrote it (it starts with knownHostsMarker); any other, and anything but a
// regular file, is refused, naming it.
func writeKnownHosts(path, text string, mkdir bool) error {
	if mkdir {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return fmt.Errorf("ssh-config: known_hosts: %w", err)
		}
	}
	if err := checkKnownHosts(path, mkdir); err != nil {
		return err
	}
	// A symlink is written through (the rename would replace the link
	// and leave its target stale); a dangling one is replaced.
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	if err := writeFileAtomic(path, []byte(text), 0o600); err != nil {
		return fmt.Errorf("ssh-config: write known_hosts %s: %w", path, err)
	}
	return nil
}

// checkKnownHosts is writeKnownHosts's refusals, before anything is
// written: with --known-hosts (!dflt) a path in a directory that does not
// exist; a path that is not a regular file; a file ssh-config did not
// write. Each is a usage error (exit 2) saying why and what to do.
func checkKnownHosts(path string, dflt bool) error {
	what := "--known-hosts " + path
	if dflt {
		what = "known_hosts " + path + " (the default)"
	} else if fi, err := os.Stat(filepath.Dir(path)); err != nil || !fi.IsDir() {
		return usage(fmt.Errorf("ssh-config: %s: its directory %s does not exist (a typo?); create it first", what, filepath.Dir(path)))
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return usage(fmt.Errorf("ssh-config: %s is not a regular file but %s; give a file", what, filetype.Of(fi.Mode())))
	}
	if f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
		head := make([]byte, len(knownHostsMarker))
		n, _ := io.ReadFull(f, head)
		f.Close()
		if string(head[:n]) != knownHostsMarker {
			how := "give another file, or remove it first"
			if dflt {
				how = "give another file with --known-hosts FILE, or remove it first"
			}
			return usage(fmt.Errorf("ssh-config: %s exists and was not written by tether ssh-config: it is not replaced (its host keys would be lost); %s", what, how))
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("ssh-config: known_hosts %s: %w", path, err)
	}
	return nil
}

func newSSHProxyCmd(e *env) *cobra.Command {
	var o forwardOptions
	cmd := &cobra.Command{
		Use:   "ssh-proxy NODE",
		Short: "Join stdin and stdout to a node's SSH server (an OpenSSH ProxyCommand)",
		Long: `Ssh-proxy joins stdin and stdout to NODE's own SSH server, through the
coordinator (NATS) and the node's tunnel, for OpenSSH's ProxyCommand when the
coordinator's SSH jump host is out of reach. NODE may be written NODE.tether.
Your NATS identity is vouched for: the policy must grant it ssh on the node,
and the login (ssh USER@...) must be one of the rule's run_as. It exits 0
when the SSH connection ended, 255 when Tether failed or refused (the
policy's message says why) and 2 for a usage error.

Example (~/.ssh/config; tether ssh-config --proxy-command writes it):
  Host *.tether
    ProxyCommand tether ssh-proxy %n`,
		Args: cobra.ExactArgs(1),
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			// c.SSH cuts the suffix itself: cutting it here too made
			// NODE.tether.tether (node id NODE.tether) node NODE.
			if err := checkNodeArg(strings.TrimSuffix(args[0], protocol.SSHHostSuffix)); err != nil {
				return usage(err)
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			s, err := c.SSH(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return joinStdio(cmd.Context(), e, s)
		}),
	}
	o.NATS.addFlags(cmd)
	return cmd
}

// joinStdio copies e's stdin to s (then half-closes it) and s to e's
// stdout until s ends, then closes s. It returns when s's bytes ended (the
// node closed), or ctx ended (exit 130/143). The copies are
// countcopy.CopyPooled, not io.Copy: io.Copy hands a pipe's bytes to
// os.File's WriteTo and ReadFrom, which copy through 32 KiB, so a bulk
// upload (ssh's ProxyCommand pipe) reached the stream in 32 KiB writes,
// each a yamux frame, TLS records and a system call of its own; stdin and
// stdout, when they are pipes, are grown to countcopy.BulkPipe so that
// reads of them take up to 256 KiB.
func joinStdio(ctx context.Context, e *env, s *client.Stream) error {
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	if f, ok := e.stdin.(*os.File); ok {
		countcopy.GrowPipe(f, countcopy.BulkPipe)
	}
	if f, ok := e.stdout.(*os.File); ok {
		countcopy.GrowPipe(f, countcopy.BulkPipe)
	}
	go func() {
		if _, err := stdioCopy(s, e.stdin); err == nil {
			s.CloseWrite()
		}
	}()
	_, err := stdioCopy(e.stdout, s)
	if ctx.Err() != nil {
		return &exitError{code: interruptCode(ctx)}
	}
	if err != nil {
		return onNode(s.Node(), err)
	}
	return nil
}

// stdioCopy is joinStdio's copy, one direction.
func stdioCopy(dst io.Writer, src io.Reader) (int64, error) {
	return countcopy.CopyPooled(dst, src, nil)
}
