package cli

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/protocol"
)

// tokenEnv is the environment variable holding a join token.
const tokenEnv = "TETHER_TOKEN"

// joinTokenFile is the token a coordinator generates in its data directory
// when it is given none.
const joinTokenFile = "join-token"

// readTokenFile reads a join token file, trimming whitespace. An error
// names the setting (--token-file, token-file in a config file) and the
// file; a missing file (errors.Is os.ErrNotExist) says how to make one; an
// empty token is an error too.
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("--token-file %s: %w: copy the join token there (tether token create -o FILE writes one)", path, os.ErrNotExist)
	}
	if err != nil {
		return "", fmt.Errorf("--token-file %s: %w", path, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// resolveToken picks a join token: the file if named, else envValue if set,
// else (when genDir is not empty) genDir/join-token, generated on first use.
// It returns the token and where it came from (a path, or "$TETHER_TOKEN").
func resolveToken(file, envValue, genDir string) (token, source string, err error) {
	switch {
	case file != "":
		tok, err := readTokenFile(file)
		return tok, file, err
	case strings.TrimSpace(envValue) != "":
		return strings.TrimSpace(envValue), "$" + tokenEnv, nil
	case genDir == "":
		return "", "", fmt.Errorf("no join token: give --token-file or set %s", tokenEnv)
	}
	path := filepath.Join(genDir, joinTokenFile)
	tok, err := loadOrCreateSecret(path)
	return tok, path, err
}

// loadOrCreateSecret reads the secret (one line) in path, or creates path
// (0600) with 32 random bytes in hex when it does not exist.
func loadOrCreateSecret(path string) (string, error) {
	tok, err := readTokenFile(path)
	if err == nil {
		return tok, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var b [32]byte
	rand.Read(b[:])
	tok = hex.EncodeToString(b[:])
	// O_EXCL: two processes starting on one data dir must not each write
	// a different secret.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return readTokenFile(path)
	}
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	_, werr := f.WriteString(tok + "\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return "", fmt.Errorf("write %s: %w", path, werr)
	}
	return tok, nil
}

// tokenCreateOptions are the flags of `tether token create`.
type tokenCreateOptions struct {
	// TTL is how long the token may be used. Default protocol.DefaultTokenTTL.
	TTL time.Duration
	// Uses is how many agents may enroll with it; 0 means unlimited
	// within TTL. Default 1.
	Uses int
	// Labels are bound to every node enrolled with it ("k=v,k2=v2"); they
	// override the labels the agent declares.
	Labels string
	// JSON prints the API's response instead of the bare token.
	JSON bool
	// Output is a file to write the token (or, with JSON, the response)
	// to instead of stdout: mode 0600, checked before the token is asked
	// for (a temporary file beside it), written only once the coordinator
	// has minted it, replacing the file atomically. Empty: stdout.
	Output string
	// NATS says how to reach the API.
	NATS natsOptions

	labels map[string]string // Labels, parsed by Validate
}

// Validate reports every invalid option.
func (o *tokenCreateOptions) Validate() error {
	var errs []error
	if o.TTL <= 0 || o.TTL > protocol.MaxTokenTTL || o.TTL%time.Second != 0 {
		errs = append(errs, fmt.Errorf("--ttl %s: want whole seconds, more than 0 and at most %s", humanDuration(o.TTL), humanDuration(protocol.MaxTokenTTL)))
	}
	if o.Uses < 0 {
		errs = append(errs, fmt.Errorf("--uses %d: want 1 or more, or 0 for unlimited", o.Uses))
	}
	labels, err := protocol.ParseLabels(o.Labels)
	if err != nil {
		errs = append(errs, fmt.Errorf("--labels: %w", err))
	}
	o.labels = labels
	return errors.Join(errs...)
}

func newTokenCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Manage join tokens (tether token create)",
		Args:  cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			cmd.Help()
			return usage(errors.New("a subcommand is required"))
		}),
	}
	o := tokenCreateOptions{TTL: protocol.DefaultTokenTTL, Uses: protocol.DefaultTokenUse}
	create := &cobra.Command{
		Use:   "create [--ttl D] [--uses N] [--labels k=v,...] [-o FILE]",
		Short: "Mint a join token for enrolling agents (shown once)",
		Long: `Mint a join token. An agent given it (tether agent --token-file FILE)
generates a key, sends a certificate request and receives a certificate
naming its node id from the coordinator's node CA; from then on it
authenticates by that certificate only. The token is printed once, on
stdout; the coordinator keeps only its hash, expiry, remaining uses and
labels. With --output FILE it is written to FILE (0600) instead, only
once minted, so a refused request leaves no empty file; a FILE that
cannot be written (no such directory, a directory, no permission) is
refused before any token is minted. Needs the admin right in the
coordinator's policy.`,
		Args: cobra.NoArgs,
		RunE: e.runE(func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return usage(err)
			}
			// The file is checked (a 0600 temporary beside it is created)
			// before anything is minted: a token minted for a path that
			// cannot be written would live on, unused, with nobody holding
			// it (fresh-user pass).
			var pending *pendingFile
			if o.Output != "" {
				p, err := newPendingFile(o.Output, 0o600)
				if err != nil {
					return fmt.Errorf("--output %s: %w; no token was minted", o.Output, err)
				}
				pending = p
				defer pending.abort()
			}
			c, closeNC, err := o.NATS.connect(e)
			if err != nil {
				return err
			}
			defer closeNC()
			uses := o.Uses
			if uses == 0 {
				uses = -1
			}
			resp, err := c.CreateToken(cmd.Context(), protocol.TokenCreateRequest{TTLSeconds: int64(o.TTL / time.Second), Uses: uses, Labels: o.labels})
			if err != nil {
				return err
			}
			var out []byte
			if o.JSON {
				var b bytes.Buffer
				if err := writeJSON(&b, resp); err != nil {
					return err
				}
				out = b.Bytes()
			} else {
				out = []byte(resp.Token + "\n")
			}
			n := fmt.Sprintf("%d use(s)", resp.Uses)
			if resp.Uses < 0 {
				n = "unlimited uses"
			}
			if o.Output != "" {
				// Only now, with the token minted: a failed request
				// leaves no empty or partial file behind.
				if err := pending.commit(out); err != nil {
					return fmt.Errorf("join token %s minted but not saved: write --output %s: %w", resp.ID, o.Output, err)
				}
				if !o.JSON {
					fmt.Fprintf(e.stderr, "join token %s: expires %s, %s, labels %s; written to %s (0600) for tether agent --token-file\n",
						resp.ID, resp.ExpiresAt.Local().Format(time.RFC3339), n, formatLabels(resp.Labels), o.Output)
				}
				return nil
			}
			if !o.JSON {
				fmt.Fprintf(e.stderr, "join token %s: expires %s, %s, labels %s; shown only now: save it to a file (0600) for tether agent --token-file, or use --output FILE\n",
					resp.ID, resp.ExpiresAt.Local().Format(time.RFC3339), n, formatLabels(resp.Labels))
			}
			_, err = e.stdout.Write(out)
			return err
		}),
	}
	f := create.Flags()
	boundedDurationVar(f, &o.TTL, "ttl", o.TTL, 0, protocol.MaxTokenTTL, "how long the token may be used (whole seconds, at most "+humanDuration(protocol.MaxTokenTTL)+")")
	f.IntVar(&o.Uses, "uses", o.Uses, "how many agents may enroll with it (0: unlimited within --ttl)")
	f.StringVar(&o.Labels, "labels", o.Labels, "labels bound to the nodes enrolled with it, k=v,k2=v2 (override the agents' own)")
	f.BoolVar(&o.JSON, "json", false, "print the API's JSON response")
	f.StringVarP(&o.Output, "output", "o", "", "write the token to FILE (0600, only once it is minted: a failed request leaves no file) instead of stdout")
	o.NATS.addFlags(create)
	cmd.AddCommand(clientCommand(create))
	return cmd
}

// pendingFile is a file to be replaced atomically, its temporary created
// up front (newPendingFile) so that a path that cannot be written is
// known before the work whose result it is to hold.
type pendingFile struct {
	path string
	tmp  *os.File
}

// newPendingFile creates a temporary file of mode beside path; it fails
// when path is a directory or its directory cannot be written.
func newPendingFile(path string, mode os.FileMode) (*pendingFile, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, err
	}
	return &pendingFile{path: path, tmp: tmp}, nil
}

// commit writes data to the temporary file and renames it onto the path.
func (p *pendingFile) commit(data []byte) error {
	if _, err := p.tmp.Write(data); err != nil {
		return err
	}
	if err := p.tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(p.tmp.Name(), p.path); err != nil {
		return err
	}
	p.tmp = nil
	return nil
}

// abort removes the temporary file unless commit renamed it; safe to call
// after commit.
func (p *pendingFile) abort() {
	if p.tmp == nil {
		return
	}
	p.tmp.Close()
	os.Remove(p.tmp.Name())
	p.tmp = nil
}
