//go:build !tetherclient

package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/natsauth"
)

// The `tether nats` commands work on a coordinator's NATS layout in its
// data directory (natsAuthDir), with or without the coordinator running:
// minted users are valid at once (the server trusts the signing key), and
// a running coordinator applies a revocation within natsRevocationPoll
// (coordinatorServer.watchRevocations).

// natsUsersFile lists the client users minted by `tether nats user create`
// (one JSON object a line), so they can be listed and revoked by name.
const natsUsersFile = "users.jsonl"

// natsUserRecord is one line of natsUsersFile. It holds no secret.
type natsUserRecord struct {
	Name    string    `json:"name"`
	Key     string    `json:"key"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires,omitzero"`
}

// minUserTTL is the shortest --ttl of tether nats user create: less
// would expire before the file reached its user.
const minUserTTL = time.Minute

func newNATSCmd(e *env) *cobra.Command {
	dataDir := e.natsDataDir()
	cmd := &cobra.Command{
		Use:   "nats",
		Short: "Manage the coordinator's NATS layout: client users, server config",
		Long: `NATS admits no anonymous client. A coordinator keeps its NATS layout (an
operator, the accounts SYS, TETHER and CLIENTS, their keys; mode 0700) in
DATA-DIR/nats-auth, created on first start. Client users (CLIENTS account)
may publish API requests and read only their own replies; coordinators use
TETHER credentials.

These commands work on that directory, with the coordinator running or not:
a new user is valid at once; a running coordinator cuts off a revoked user
within 2 seconds (its embedded server is updated, and it refuses the user's
requests), otherwise from its next start. For a 'tether dev' layout, give
--data-dir ~/.local/state/tether/dev.`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			cmd.Help()
			return usage(errors.New("a subcommand is required: user, server-config"))
		}),
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", dataDir, "the coordinator's data directory (its layout is DATA-DIR/nats-auth)")

	user := &cobra.Command{
		Use:   "user",
		Short: "Create, list and revoke client users",
		Args:  cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			cmd.Help()
			return usage(errors.New("a subcommand is required: create, list, revoke"))
		}),
	}
	var ttl time.Duration
	var out string
	var force bool
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Mint a client user's credentials (.creds, 0600)",
		Long: `Create mints a client user named NAME (letters, digits and "._@+-"; what a
policy names it by) and writes its credentials, mode 0600, to --output
(default NAME.creds in the current directory; "-" prints them). Give the
file to the user: tether commands take it as --nats-creds or
$TETHER_NATS_CREDS; the stock nats CLI needs --creds FILE and the
--inbox-prefix printed here.`,
		Args: cobra.ExactArgs(1),
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			if ttl < 0 {
				return usage(fmt.Errorf("--ttl %s is negative", humanDuration(ttl)))
			}
			if ttl > 0 && ttl < minUserTTL {
				return usage(fmt.Errorf("--ttl %s is under the minimum, %s: the credentials would expire before they could be handed over; give e.g. --ttl 720h (0: no expiry)", humanDuration(ttl), humanDuration(minUserTTL)))
			}
			name := args[0]
			if err := natsauth.CheckUserName(name); err != nil {
				return usage(fmt.Errorf("user name: %w", err))
			}
			if out == "" {
				out = name + ".creds"
			}
			if out != "-" {
				if d := filepath.Dir(out); d != "" {
					if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
						return fmt.Errorf("--output %s: directory %s does not exist", out, d)
					}
				}
			}
			if out != "-" && !force {
				if _, err := os.Lstat(out); err == nil {
					return fmt.Errorf("%s exists: not overwritten (it may be another user's credentials); give another --output, or --force", out)
				}
			}
			return withNATSLayout(dataDir, mayCreateLayout(cmd), e.stderr, func(l *natsauth.Layout) error {
				if !force {
					recs, err := readNATSUsers(l.Dir())
					if err != nil {
						return err
					}
					revoked, err := revokedKeys(l)
					if err != nil {
						return err
					}
					for _, r := range recs {
						if r.Name == name && !revoked[r.Key] {
							return fmt.Errorf("a client user named %s exists (%s, created %s): a second one would hold every grant of nats:%s; revoke the first (tether nats user revoke %s), or pass --force to mint another key for the same person",
								name, r.Key, r.Created.Format(time.RFC3339), name, r.Key)
						}
					}
				}
				c, err := l.MintClient(name, ttl)
				if err != nil {
					return err
				}
				rec := natsUserRecord{Name: name, Key: c.PublicKey(), Created: time.Now().UTC()}
				if ttl > 0 {
					rec.Expires = rec.Created.Add(ttl)
				}
				if out == "-" {
					b, err := c.Bytes()
					if err != nil {
						return err
					}
					if _, err := e.stdout.Write(b); err != nil {
						return err
					}
				} else if force {
					if err := natsauth.WriteCreds(out, c); err != nil {
						return err
					}
				} else if err := natsauth.WriteNewCreds(out, c); err != nil {
					if errors.Is(err, fs.ErrExist) {
						return fmt.Errorf("%s exists: not overwritten (it may be another user's credentials); give another --output, or --force", out)
					}
					return err
				}
				if err := appendNATSUser(l.Dir(), rec); err != nil {
					return err
				}
				w := e.stdout
				if out == "-" {
					w = e.stderr
				}
				where := out
				if out == "-" {
					where = "stdout"
				}
				fmt.Fprintf(w, "client user %s (%s) written to %s\n  inbox prefix: %s\n", name, c.PublicKey(), where, c.InboxPrefix())
				if ttl > 0 {
					fmt.Fprintf(e.stderr, "tether: the credentials expire at %s (in %s)\n", rec.Expires.Format(time.RFC3339), humanDuration(ttl))
				}
				return nil
			})
		}),
	}
	durationVar(create.Flags(), &ttl, "ttl", 0, "how long the credentials are valid, at least 1m (0: no expiry)")
	create.Flags().BoolVar(&force, "force", false, "overwrite --output, and mint even if a user of that name exists (both then hold its grants)")
	create.Flags().StringVarP(&out, "output", "o", "", `credentials file to write, 0600 (default NAME.creds; "-": stdout)`)

	list := &cobra.Command{
		Use:   "list",
		Short: "List the client users minted here, and whether each is revoked",
		Args:  cobra.NoArgs,
		RunE: e.runE(func(*cobra.Command, []string) error {
			return withNATSLayout(dataDir, false, e.stderr, func(l *natsauth.Layout) error {
				recs, err := readNATSUsers(l.Dir())
				if err != nil {
					return err
				}
				revoked, err := revokedKeys(l)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tKEY\tCREATED\tEXPIRES\tREVOKED")
				for _, r := range recs {
					exp := "never"
					if !r.Expires.IsZero() {
						exp = r.Expires.Format(time.RFC3339)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\n", r.Name, r.Key, r.Created.Format(time.RFC3339), exp, revoked[r.Key])
				}
				return tw.Flush()
			})
		}),
	}

	revoke := &cobra.Command{
		Use:   "revoke NAME|KEY",
		Short: "Revoke a client user: every credential minted for NAME here, or the user KEY",
		Long: `Revoke revokes, in the CLIENTS account, the user with public key KEY
("U..."), or every user minted here under NAME (tether nats user list). A
running coordinator disconnects them and refuses their requests within 2
seconds; a stopped one from its next start. An external NATS server needs the
new layout: run 'tether nats server-config' again and reload the server.`,
		Args: cobra.ExactArgs(1),
		RunE: e.runE(func(_ *cobra.Command, args []string) error {
			return withNATSLayout(dataDir, false, e.stderr, func(l *natsauth.Layout) error {
				keys := []string{args[0]}
				if !nkeys.IsValidPublicUserKey(args[0]) {
					recs, err := readNATSUsers(l.Dir())
					if err != nil {
						return err
					}
					keys = keys[:0]
					for _, r := range recs {
						if r.Name == args[0] {
							keys = append(keys, r.Key)
						}
					}
					if len(keys) == 0 {
						return fmt.Errorf("no client user named %q was minted with this layout (%s); give its public key instead", args[0], l.Dir())
					}
				}
				for _, k := range keys {
					if err := l.Revoke(k); err != nil {
						return err
					}
					fmt.Fprintf(e.stdout, "revoked %s\n", k)
				}
				return nil
			})
		}),
	}
	user.AddCommand(create, list, revoke)

	serverConfig := &cobra.Command{
		Use:   "server-config",
		Short: "Print the nats-server configuration that gives an external server this layout",
		Long: `Server-config prints the block of nats-server configuration (operator JWT,
system account, a MEMORY resolver preloaded with the account JWTs) that makes
an external NATS server enforce this coordinator's layout: include it in the
server's config with listen, jetstream and TLS around it, and no
authorization, accounts or no_auth_user blocks. Run it again after a
revocation and reload the server (nats-server --signal reload). The
coordinator then connects with --nats-url and --nats-creds (a TETHER user:
'tether nats coordinator-creds').`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			return withNATSLayout(dataDir, mayCreateLayout(cmd), e.stderr, func(l *natsauth.Layout) error {
				_, err := fmt.Fprint(e.stdout, l.ServerConfig())
				return err
			})
		}),
	}
	var coordOut string
	coordCreds := &cobra.Command{
		Use:   "coordinator-creds NAME",
		Short: "Mint coordinator (TETHER account) credentials for a coordinator on an external NATS",
		Long: `Coordinator-creds mints a TETHER account user: no permission limits, the
service's queue group, JetStream and the KV buckets. Only coordinators hold
such credentials (tether coordinator --nats-url URL --nats-creds FILE);
never give them to a client.`,
		Args: cobra.ExactArgs(1),
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			if coordOut == "" {
				coordOut = args[0] + ".creds"
			}
			return withNATSLayout(dataDir, mayCreateLayout(cmd), e.stderr, func(l *natsauth.Layout) error {
				c, err := l.MintCoordinator(args[0])
				if err != nil {
					return err
				}
				if coordOut == "-" {
					b, err := c.Bytes()
					if err != nil {
						return err
					}
					if _, err := e.stdout.Write(b); err != nil {
						return err
					}
					fmt.Fprintf(e.stderr, "coordinator user %s (%s) written to stdout\n", args[0], c.PublicKey())
					return nil
				}
				if err := natsauth.WriteCreds(coordOut, c); err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "coordinator user %s (%s) written to %s\n", args[0], c.PublicKey(), coordOut)
				return nil
			})
		}),
	}
	coordCreds.Flags().StringVarP(&coordOut, "output", "o", "", `credentials file to write, 0600 (default NAME.creds; "-": stdout)`)
	cmd.AddCommand(user, serverConfig, coordCreds)
	return cmd
}

// withNATSLayout loads the layout of dataDir under an exclusive lock on
// its directory, so that two of these commands never lose each other's
// revocations, and runs f.
//
// A directory without a layout is refused unless create is set (minting
// credentials and server configs for a coordinator not started yet is the
// external NATS setup); creating one is said on w, since a mistyped
// --data-dir would otherwise mint credentials nobody's server trusts.
func withNATSLayout(dataDir string, create bool, w io.Writer, f func(*natsauth.Layout) error) error {
	dir := natsAuthDir(dataDir)
	_, err := os.Stat(filepath.Join(dir, "operator.nk"))
	if errors.Is(err, fs.ErrPermission) {
		// Not a missing layout (lockNATSDir would then say "mkdir ...
		// permission denied" of a directory that exists): one we may not read.
		return fmt.Errorf("cannot read the NATS layout in %s: permission denied reading %s; run this as the user the coordinator runs as (e.g. with sudo)",
			dir, unreadableDir(dir))
	}
	fresh := errors.Is(err, fs.ErrNotExist)
	if fresh && !create {
		return fmt.Errorf("no NATS layout in %s: check --data-dir (a coordinator creates its layout on first start; tether dev's is in %s; a --data-dir given explicitly may be a new one, for a coordinator not started yet)",
			dir, defaultDevOptions().DataDir)
	}
	unlock, err := lockNATSDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	l, err := natsauth.Load(dir, natsauth.Config{})
	if err != nil {
		return err
	}
	if fresh {
		fmt.Fprintf(w, "tether: created a new NATS layout in %s (operator %s)\n", dir, l.OperatorKey())
	}
	return f(l)
}

// unreadableDir is the directory on the way to path that this process may
// not search: the deepest ancestor of path it can stat (path's parent when
// path itself can be stat'ed).
func unreadableDir(path string) string {
	if _, err := os.Stat(path); err == nil {
		return path
	}
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil || p == filepath.Dir(p) {
			return p
		}
	}
}

// mayCreateLayout reports whether a layout command (cmd) may create a new
// layout where it finds none: only in a --data-dir given explicitly.
// Without one, the default directory holding no layout means the
// coordinator lives elsewhere (tether dev's, another --data-dir): a layout
// created there would mint credentials no server trusts.
func mayCreateLayout(cmd *cobra.Command) bool {
	f := cmd.Flag("data-dir")
	return f != nil && f.Changed
}

// natsDataDir is the default --data-dir of the nats commands: the
// coordinator's (e.natsDefaultDataDir in tests).
func (e *env) natsDataDir() string {
	if e.natsDefaultDataDir != "" {
		return e.natsDefaultDataDir
	}
	return defaultCoordinatorOptions().DataDir
}

// lockNATSDir creates the layout directory dir (0700) if needed and takes
// an exclusive lock on dir/.lock until unlock: every writer of the
// layout's files (Load, Revoke, ReloadRevocations) holds it, so none
// overwrites a revocation another just recorded.
func lockNATSDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("NATS layout: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("NATS layout: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		lf.Close()
		return nil, fmt.Errorf("NATS layout: lock %s: %w", dir, err)
	}
	return func() { lf.Close() }, nil
}

func appendNATSUser(dir string, r natsUserRecord) error {
	b, _ := json.Marshal(r)
	f, err := os.OpenFile(filepath.Join(dir, natsUsersFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("record client user: %w", err)
	}
	_, werr := f.Write(append(b, '\n'))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("record client user: %w", werr)
	}
	return nil
}

func readNATSUsers(dir string) ([]natsUserRecord, error) {
	path := filepath.Join(dir, natsUsersFile)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []natsUserRecord
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var r natsUserRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// revokedKeys is the set of user keys the layout's CLIENTS account revokes.
func revokedKeys(l *natsauth.Layout) (map[string]bool, error) {
	ac, err := jwt.DecodeAccountClaims(l.AccountJWT(natsauth.AccountClients))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for k := range ac.Revocations {
		out[k] = true
	}
	return out, nil
}
