package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// progressDelay is how long a copy runs before `tether cp` starts drawing
// its progress line: short copies print only the summary.
const progressDelay = time.Second

// exitPartial is `tether cp`'s exit code for a copy that skipped entries
// it cannot carry (named on stderr) and copied the rest: rsync's "partial
// transfer due to error".
const exitPartial = 23

// cpOptions are the flags of `tether cp`.
type cpOptions struct {
	// Delete removes destination entries the source lacks (rsync --delete).
	Delete bool
	// Checksum compares files by XXH3-128 instead of size and mtime.
	Checksum bool
	// Strict makes the copy all or nothing: an entry that cannot be
	// carried fails it instead of being skipped.
	Strict bool
	// Progress is "auto" (when stderr is a terminal), "always" or "never".
	Progress string
	// Quiet drops the summary line.
	Quiet bool
	// NATS says how to reach the API.
	NATS natsOptions
}

// copyEnd is one side of a copy: a local path, or a path on a node.
type copyEnd struct {
	node string // empty for a local path
	path string
	into bool // written with a trailing slash: names a directory
}

func (c copyEnd) String() string {
	if c.node == "" {
		return c.path
	}
	return c.node + ":" + c.path
}

// parseCopyEnd splits "NODE:PATH" from a local path, the way scp does: a
// colon before any slash, after a valid node id, names a node.
func parseCopyEnd(s string) (copyEnd, error) {
	if s == "" {
		return copyEnd{}, errors.New("empty path")
	}
	into := len(s) > 1 && strings.HasSuffix(s, "/")
	i := strings.IndexByte(s, ':')
	if i <= 0 || strings.Contains(s[:i], "/") {
		return copyEnd{path: s, into: into}, nil
	}
	node, p := s[:i], s[i+1:]
	if err := protocol.ValidNodeID(node); err != nil {
		return copyEnd{}, fmt.Errorf("%q: %w", s, err)
	}
	if !path.IsAbs(p) {
		return copyEnd{}, fmt.Errorf("%q: the path on the node must be absolute", s)
	}
	return copyEnd{node: node, path: path.Clean(p), into: into}, nil
}

// Validate checks the options and the two ends; exactly one end must be on
// a node.
func (o *cpOptions) Validate(src, dst string) (from, to copyEnd, err error) {
	var errs []error
	from, err = parseCopyEnd(src)
	if err != nil {
		errs = append(errs, fmt.Errorf("source: %w", err))
	}
	to, err = parseCopyEnd(dst)
	if err != nil {
		errs = append(errs, fmt.Errorf("destination: %w", err))
	}
	if len(errs) == 0 {
		switch {
		case from.node == "" && to.node == "":
			errs = append(errs, errors.New("one of SRC and DST must be NODE:PATH"))
		case from.node != "" && to.node != "":
			errs = append(errs, errors.New("copies between two nodes are not supported: copy to a local path first"))
		}
	}
	switch o.Progress {
	case "auto", "always", "never":
	default:
		errs = append(errs, fmt.Errorf("--progress %q: want auto, always or never", o.Progress))
	}
	return from, to, errors.Join(errs...)
}

func newCpCmd(e *env) *cobra.Command {
	o := cpOptions{Progress: "auto"}
	cmd := &cobra.Command{
		Use:   "cp [flags] SRC DST",
		Short: "Copy a file or directory tree to or from a node",
		Long: `Copy a file or directory tree to or from a node, through its tunnel. One of
SRC and DST is NODE:PATH (an absolute path on the node), the other a local
path.

A directory SRC is mirrored: DST becomes a copy of it (like
'rsync -a SRC/ DST', not 'cp -r SRC DST/'). A file SRC copied onto an
existing directory, or onto a DST written with a trailing slash, lands
inside it as DST/NAME, as with cp and scp; replacing a file with a
directory needs --delete. Modes, modification times and symlinks are kept,
symlinks inside the tree are copied as links and never followed (a SRC or
DST that is a symlink is followed, as cp follows it), and files whose size
and mtime match (or whose XXH3-128 checksum matches, with --checksum) are
not sent again. With --delete, entries of DST that SRC lacks are removed,
as NeMo Gym's copy does.

An existing DST directory is updated in place: it keeps its identity, so a
shell or a service working in it, open files, bind mounts and mount points
keep working. Nothing changes until everything arrived: every new or
changed entry is staged under a temporary name beside its final one and
verified by its XXH3-128 checksum, then all are renamed into place at the
end (like rsync --delay-updates). A copy that is interrupted or fails
before that leaves DST as it was. On the node, DST must lie under one of
the agent's copy roots, and the agent's own state is never copied.

Entries a copy cannot carry (special files, unreadable files) are named on
stderr and skipped, the rest is copied, and the exit code is 23 (as
rsync's); with --strict such an entry fails the copy instead and nothing
changes.`,
		Example: `  tether cp ./configs node-a:/srv/configs
  tether cp --delete ./staging gpu-07:/lustre/jobs/gym-job-20261130
  tether cp node-a:/var/log/tether ./logs`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usage(fmt.Errorf("want SRC and DST, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			from, to, err := o.Validate(args[0], args[1])
			if err != nil {
				return usage(err)
			}
			c, closeNC, err := o.NATS.connect(e.getenv)
			if err != nil {
				return err
			}
			defer closeNC()
			return runCp(cmd.Context(), &o, from, to, e, clientOpener{c})
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&o.Delete, "delete", false, "remove destination entries the source lacks")
	f.BoolVar(&o.Checksum, "checksum", false, "compare files by XXH3-128 instead of size and mtime")
	f.BoolVar(&o.Strict, "strict", false, "all or nothing: fail, changing nothing, if an entry cannot be copied (default: skip it, name it, exit 23)")
	f.StringVar(&o.Progress, "progress", o.Progress, "progress line on stderr: auto (when a terminal), always or never")
	f.BoolVarP(&o.Quiet, "quiet", "q", false, "print no summary")
	o.NATS.addFlags(cmd)
	return cmd
}

// runCp copies from → to through a copy stream opened with op.
func runCp(ctx context.Context, o *cpOptions, from, to copyEnd, e *env, op streamOpener) error {
	params := protocol.CopyParams{Delete: o.Delete, Checksum: o.Checksum, Into: to.into, Strict: o.Strict}
	node := to.node
	if node != "" {
		params.Direction, params.Path = protocol.CopyPush, to.path
		if _, err := os.Lstat(from.path); err != nil {
			return fmt.Errorf("cp %s: %w", from, err)
		}
	} else {
		node = from.node
		params.Direction, params.Path = protocol.CopyPull, from.path
	}
	st, err := op.OpenStream(ctx, node, protocol.KindCopy, &params)
	if err != nil {
		var ae *protocol.APIError
		if errors.As(err, &ae) {
			return fmt.Errorf("cp %s to %s: %s (%s)", from, to, ae.Message, ae.Code)
		}
		return fmt.Errorf("cp %s to %s: %w", from, to, err)
	}
	defer st.Close()

	pr := newCopyProgress(o.Progress, e)
	opts := mirror.Options{Delete: o.Delete, Checksum: o.Checksum, Into: to.into, Strict: o.Strict, Progress: pr.update}
	start := time.Now()
	var res *protocol.CopyResult
	if params.Direction == protocol.CopyPush {
		res, err = mirror.Send(ctx, from.path, st, opts)
	} else {
		res, err = mirror.Receive(ctx, to.path, st, opts)
	}
	pr.finish()
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: interruptCode(ctx), err: fmt.Errorf("cp %s to %s: interrupted; %s is unchanged", from, to, to)}
		}
		// The agent's own error says what failed on the node; the local
		// layers it travelled through (mirror, pipe) add nothing for users.
		var pe *mirror.PeerError
		if errors.As(err, &pe) {
			return fmt.Errorf("cp %s to %s: %s", from, to, pe.Info.Message)
		}
		return fmt.Errorf("cp %s to %s: %w", from, to, err)
	}
	// Skipped entries are named even with --quiet: they are not copied.
	for _, sk := range res.SkippedEntries {
		fmt.Fprintf(e.stderr, "tether: cp: skipped %s: %s\n", skippedPath(from, sk.Path), sk.Reason)
	}
	if n := res.Skipped - len(res.SkippedEntries); n > 0 {
		fmt.Fprintf(e.stderr, "tether: cp: skipped %d more %s\n", n, plural(n, "entry", "entries"))
	}
	if !o.Quiet {
		el := time.Since(start)
		fmt.Fprintf(e.stderr, "copied %s to %s: %d %s written (%s), %d unchanged, %d deleted in %s (%s/s)\n",
			from, to, res.FilesWritten, plural(res.FilesWritten, "file", "files"), humanBytes(res.BytesWritten), res.FilesKept, res.Deleted,
			el.Round(time.Millisecond), humanBytes(int64(float64(res.BytesWritten)/max(el.Seconds(), 1e-3))))
	}
	if res.Skipped > 0 {
		return &exitError{code: exitPartial, err: fmt.Errorf("cp %s to %s: partial copy: %d %s could not be copied (named above; what %s had there is kept); everything else was copied",
			from, to, res.Skipped, plural(res.Skipped, "entry", "entries"), to)}
	}
	return nil
}

// skippedPath shows a skipped entry's path (relative to the copy's
// source) below the source the user named, quoted when it holds bytes a
// terminal would not show as they are.
func skippedPath(from copyEnd, rel string) string {
	p := from.path
	if rel != "." {
		p = strings.TrimSuffix(p, "/") + "/" + rel
	}
	if q := strconv.Quote(p); q[1:len(q)-1] != p {
		p = q
	}
	if from.node != "" {
		return from.node + ":" + p
	}
	return p
}

// copyProgress draws a progress line on stderr once a copy ran for
// progressDelay, at most every 100 ms (mirror's own pace).
type copyProgress struct {
	mu      sync.Mutex
	w       io.Writer
	enabled bool
	start   time.Time
	drawn   bool
	width   int
}

func newCopyProgress(mode string, e *env) *copyProgress {
	p := &copyProgress{w: e.stderr, start: e.now()}
	switch mode {
	case "always":
		p.enabled = true
	case "auto":
		f, ok := e.stderr.(*os.File)
		p.enabled = ok && term.IsTerminal(int(f.Fd()))
	}
	return p
}

func (p *copyProgress) update(pg mirror.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	el := time.Since(p.start)
	if !p.enabled || el < progressDelay {
		return
	}
	line := fmt.Sprintf("%s / %s", humanBytes(pg.Bytes), humanBytes(pg.TotalBytes))
	if pg.TotalBytes > 0 {
		line += fmt.Sprintf("  %5.1f%%", 100*float64(pg.Bytes)/float64(pg.TotalBytes))
	}
	line += fmt.Sprintf("  %s/s  files %d/%d", humanBytes(int64(float64(pg.Bytes)/el.Seconds())), pg.Files, pg.TotalFiles)
	pad := ""
	if n := p.width - len(line); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%s", line, pad)
	p.drawn = true
}

// finish ends the progress line so later output starts on a fresh line.
func (p *copyProgress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// humanBytes formats n bytes with binary units: "512 B", "3.2 MiB".
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// plural picks the noun for n.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
