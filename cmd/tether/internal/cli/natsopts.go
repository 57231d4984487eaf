package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/protocol"
)

// Where client commands find NATS and their credentials when no flag says.
const (
	natsURLEnv     = "TETHER_NATS_URL"
	natsCredsEnv   = "TETHER_NATS_CREDS"
	defaultNATSURL = "nats://127.0.0.1:4222"
)

// natsOptions are the connection flags of the client commands.
type natsOptions struct {
	// URL is the NATS server URL (comma-separated for several). Empty means
	// $TETHER_NATS_URL, else the nats CLI context's url, else the one in
	// the file beside the credentials (credsURLFile: tether dev writes
	// it), else nats://127.0.0.1:4222.
	URL string
	// Creds is a NATS credentials file. Empty means $TETHER_NATS_CREDS,
	// else the nats CLI context's creds, else the file `tether dev` writes
	// (devCredsPath).
	Creds string
	// Context names a nats CLI context (~/.config/nats/context/NAME.json)
	// to take the url and creds from. Empty means the selected one
	// (~/.config/nats/context.txt), if any.
	Context string
}

func (o *natsOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.URL, "nats-url", o.URL, "NATS server URL (default: $"+natsURLEnv+", else the nats context's, else the .url file beside the credentials tether dev writes, else "+defaultNATSURL+")")
	cmd.Flags().StringVar(&o.Creds, "nats-creds", o.Creds, "NATS credentials file (default: $"+natsCredsEnv+", else the nats context's, else the one tether dev writes)")
	cmd.Flags().StringVar(&o.Context, "nats-context", o.Context, "nats CLI context to take the url and credentials from (default: the selected one)")
}

// natsTarget is where and as whom a client command connects, and where
// each came from (for error messages).
type natsTarget struct {
	url, urlFrom     string
	creds, credsFrom string // creds "" means none found
}

// resolve applies the precedence: for the URL --nats-url,
// $TETHER_NATS_URL, the nats context's url, the default; for the
// credentials --nats-creds, $TETHER_NATS_CREDS, the nats context's creds,
// the dev creds file if it exists.
func (o *natsOptions) resolve(getenv func(string) string) (natsTarget, error) {
	var t natsTarget
	ctx, ctxName, err := natsContext(o.Context, getenv)
	if err != nil {
		return t, err
	}
	switch {
	case o.Creds != "":
		t.creds, t.credsFrom = o.Creds, "--nats-creds"
	case getenv(natsCredsEnv) != "":
		t.creds, t.credsFrom = getenv(natsCredsEnv), "$"+natsCredsEnv
	case ctx != nil && ctx.Creds != "":
		t.creds, t.credsFrom = expandHome(ctx.Creds, getenv), "nats context "+ctxName
	default:
		if p := devCredsPath(getenv); p != "" {
			if _, err := os.Stat(p); err == nil {
				t.creds, t.credsFrom = p, "the dev credentials"
			}
		}
	}
	switch {
	case o.URL != "":
		t.url, t.urlFrom = o.URL, "--nats-url"
	case getenv(natsURLEnv) != "":
		t.url, t.urlFrom = getenv(natsURLEnv), "$"+natsURLEnv
	case ctx != nil && ctx.URL != "":
		t.url, t.urlFrom = ctx.URL, "nats context "+ctxName
	default:
		t.url, t.urlFrom = defaultNATSURL, "the default"
		if t.creds != "" {
			f := credsURLFile(t.creds)
			if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) != "" {
				t.url, t.urlFrom = strings.TrimSpace(string(b)), f
			}
		}
	}
	if err := checkNATSURL(t.url); err != nil {
		return t, usage(fmt.Errorf("%s: %w", t.urlFrom, err))
	}
	return t, nil
}

// natsSchemes are the URL schemes nats.go connects with: plain, TLS,
// WebSocket and WebSocket over TLS. It takes any other scheme as plain TCP,
// so a mistyped one would go unnoticed.
var natsSchemes = []string{"nats", "tls", "ws", "wss"}

// checkNATSURL checks each URL of a comma-separated NATS server list, as
// nats.go splits it, for a scheme nats.go knows (none, host:port, is
// nats). It returns an error naming the first bad URL.
func checkNATSURL(urls string) error {
	for _, s := range strings.Split(urls, ",") {
		s = strings.TrimSpace(s)
		if s == "" || !strings.Contains(s, "://") {
			continue
		}
		u, err := url.Parse(s)
		if err != nil {
			return err
		}
		if !slices.Contains(natsSchemes, u.Scheme) {
			return fmt.Errorf("unknown scheme %q in %s: want nats, tls, ws or wss", u.Scheme, protocol.QuoteName(s))
		}
	}
	return nil
}

// credsURLFile is the file beside the credentials file creds that names
// the NATS URL they are for: X.url for X.creds (for a name not ending in
// .creds, that name plus .url). tether dev writes it beside DATA-DIR/dev.creds and its
// config-home copy; a client command with no URL given otherwise (flag,
// $TETHER_NATS_URL, nats context) takes its URL from there, one line.
func credsURLFile(creds string) string {
	return strings.TrimSuffix(creds, ".creds") + ".url"
}

// connect opens the NATS connection of a client command, as the user of
// the resolved credentials with its private inbox prefix. The caller
// closes it.
//
// A permissions violation the server reports later (asynchronously: a
// subscription to the client's reply inbox refused, a publish refused) ends
// the command at once with a natsRefusedError (e.natsRefused), instead of
// nats.go's raw line on stderr and every request waiting for its timeout.
func (o *natsOptions) connect(e *env) (*client.Client, func(), error) {
	getenv := e.getenv
	// Before connecting: a mistyped $TETHER_DIRECT is a usage error, not
	// a mode nobody asked for.
	direct, err := directMode(getenv)
	if err != nil {
		return nil, nil, usage(err)
	}
	t, err := o.resolve(getenv)
	if err != nil {
		return nil, nil, err
	}
	opts := []nats.Option{nats.Name("tether-cli " + version), nats.Timeout(5 * time.Second),
		nats.ErrorHandler(func(nc *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) && e.natsRefused != nil {
				e.natsRefused(newNATSRefusedError(t, err))
				return
			}
			fmt.Fprintf(e.stderr, "tether: NATS at %s: %v\n", t.url, err)
		})}
	if t.creds != "" {
		c, err := natsauth.ReadCreds(t.creds)
		if err != nil {
			return nil, nil, credsFileError(err, t.credsFrom)
		}
		opts = append(opts, c.Options()...)
	}
	nc, err := nats.Connect(t.url, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrAuthorization) {
			if t.creds == "" {
				return nil, nil, fmt.Errorf("connect to NATS at %s (from %s): %w: no credentials found; give --nats-creds or $%s (`tether nats user create` mints them; `tether dev` writes %s)", t.url, t.urlFrom, err, natsCredsEnv, devCredsHint(getenv))
			}
			return nil, nil, fmt.Errorf("connect to NATS at %s (from %s) with the credentials from %s (%s): %w: they are not valid there (revoked, expired, or of another coordinator's layout)", t.url, t.urlFrom, t.credsFrom, t.creds, err)
		}
		return nil, nil, fmt.Errorf("connect to NATS at %s (from %s): %w (is a coordinator or `tether dev` running? set --nats-url or %s)", t.url, t.urlFrom, err, natsURLEnv)
	}
	c := client.New(nc)
	c.Direct = direct
	return c, func() { c.Close(); nc.Close() }, nil
}

// directEnv selects how client streams carry their bytes: unset, empty,
// auto, 1, true, on or yes (client.DirectAuto: the coordinator's tunnel
// listener when they can reach it, else relayed over NATS); 0, false, off
// or no (client.DirectOff: always relayed over NATS); only
// (client.DirectOnly: the listener or an error). Case and surrounding
// spaces do not matter; any other value is an error.
const directEnv = "TETHER_DIRECT"

// directValues is what directEnv accepts, for its error message.
const directValues = "auto, 1, true, on, yes (the default: direct, falling back to NATS); 0, false, off, no (relay over NATS); only (direct, no fallback)"

// directMode reads directEnv. An unknown value is an error naming the
// variable, the value and the accepted values: taking it for the default
// would hide a typo (TETHER_DIRECT=onlyy would fall back to NATS silently,
// the one thing "only" is there to prevent).
func directMode(getenv func(string) string) (client.DirectMode, error) {
	v := getenv(directEnv)
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "auto", "1", "true", "on", "yes":
		return client.DirectAuto, nil
	case "0", "false", "off", "no":
		return client.DirectOff, nil
	case "only":
		return client.DirectOnly, nil
	}
	return client.DirectAuto, fmt.Errorf("$%s %q: not a mode; want %s", directEnv, v, directValues)
}

// configHome is $XDG_CONFIG_HOME, else ~/.config ("" without a home).
func configHome(getenv func(string) string) string {
	if d := getenv("XDG_CONFIG_HOME"); d != "" {
		return d
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".config")
	}
	return ""
}

// devCredsPath is where `tether dev` writes its user's credentials and
// client commands look for them last: $XDG_CONFIG_HOME/tether/dev.creds,
// i.e. ~/.config/tether/dev.creds; "" without a home directory.
func devCredsPath(getenv func(string) string) string {
	h := configHome(getenv)
	if h == "" {
		return ""
	}
	return filepath.Join(h, "tether", "dev.creds")
}

func devCredsHint(getenv func(string) string) string {
	if p := devCredsPath(getenv); p != "" {
		return p
	}
	return "~/.config/tether/dev.creds"
}

func expandHome(p string, getenv func(string) string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok && getenv("HOME") != "" {
		return filepath.Join(getenv("HOME"), rest)
	}
	return p
}

// natsCLIContext is what client commands read of a nats CLI context file
// (natscli's context JSON: ~/.config/nats/context/NAME.json).
type natsCLIContext struct {
	URL   string `json:"url"`
	Creds string `json:"creds"`
}

// natsContext loads the nats CLI context name, or the selected one
// ($XDG_CONFIG_HOME/nats/context.txt) when name is empty; nil when none is
// selected. A named context that cannot be read is an error; so is a
// selected one (the user chose it).
func natsContext(name string, getenv func(string) string) (*natsCLIContext, string, error) {
	home := configHome(getenv)
	if home == "" {
		if name != "" {
			return nil, "", fmt.Errorf("--nats-context %s: no home directory to find it in", name)
		}
		return nil, "", nil
	}
	dir := filepath.Join(home, "nats")
	if name == "" {
		b, err := os.ReadFile(filepath.Join(dir, "context.txt"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", nil
		}
		if err != nil {
			return nil, "", fmt.Errorf("selected nats context: %w", err)
		}
		if name = strings.TrimSpace(string(b)); name == "" {
			return nil, "", nil
		}
	}
	if strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		return nil, "", fmt.Errorf("nats context %q: not a context name", name)
	}
	path := filepath.Join(dir, "context", name+".json")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("nats context %s: %w", name, err)
	}
	var c natsCLIContext
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, "", fmt.Errorf("nats context %s (%s): %w", name, path, err)
	}
	return &c, name, nil
}

// credsFileError is an error of natsauth.ReadCreds for the file that from
// (a flag, a variable, a nats context) named, in the user's terms: "NATS
// credentials file PATH (from --nats-creds): no such file or directory".
// Other errors are wrapped as "NATS credentials from FROM: ERR".
func credsFileError(err error, from string) error {
	var fe *natsauth.FileError
	if errors.As(err, &fe) {
		return fmt.Errorf("NATS credentials file %s (from %s): %w", fe.Path, from, fe.Err)
	}
	return fmt.Errorf("NATS credentials from %s: %w", from, err)
}

// minNATSServer is the oldest nats-server Tether works with: client users
// get their permissions from the CLIENTS account's scoped signing key,
// whose template grants each its reply inbox (natsauth.ClientSubscribeAllow,
// a template inside a subject token), and servers before 2.11.0 expand a
// template only when it is a whole token (nats-server #5981): they refuse
// every client its replies.
const minNATSServer = "2.11.0"

// natsRefusedError is a permissions violation the NATS server reported to a
// client command: what it refused, and why that may be.
type natsRefusedError struct {
	url, as string // the server, and the credentials (where from)
	what    string // "its replies" or "publishing to SUBJECT"
	err     error  // the violation (nats.ErrPermissionViolation)
}

// newNATSRefusedError describes err, a violation reported by t's server.
func newNATSRefusedError(t natsTarget, err error) *natsRefusedError {
	r := &natsRefusedError{url: t.url, as: "without credentials", what: "a subscription or publish", err: err}
	if t.creds != "" {
		r.as = fmt.Sprintf("with the credentials from %s (%s)", t.credsFrom, t.creds)
	}
	// The server's text: Permissions Violation for Subscription to "S"
	// (or Publish to "S"), the subject quoted.
	msg := err.Error()
	if i := strings.Index(msg, "\""); i >= 0 {
		if j := strings.Index(msg[i+1:], "\""); j >= 0 {
			subj := msg[i+1 : i+1+j]
			switch {
			case strings.Contains(msg, "for Subscription"):
				r.what = fmt.Sprintf("a subscription to %s", subj)
				if strings.HasPrefix(subj, "_INBOX") {
					r.what = "the subscription to its replies"
				}
			case strings.Contains(msg, "for Publish"):
				r.what = fmt.Sprintf("publishing to %s", subj)
			}
		}
	}
	return r
}

func (e *natsRefusedError) Error() string {
	return fmt.Sprintf("the NATS server at %s refused this client (connected %s) %s: a permissions violation. "+
		"The server may be older than nats-server %s, which Tether needs (its client permissions come from the CLIENTS account's signing key), "+
		"or the credentials lack the client permissions (`tether nats user create` mints ones that have them)",
		e.url, e.as, e.what, minNATSServer)
}

func (e *natsRefusedError) Unwrap() error { return e.err }
