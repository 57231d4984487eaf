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
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/natspipe"
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

// String is the end as the user wrote it (its path cleaned, for a node),
// the path quoted when it holds what a terminal would not show as it is
// (quoteName).
func (c copyEnd) String() string {
	p := clipMiddle(protocol.QuoteName(c.path))
	if c.node == "" {
		return p
	}
	return c.node + ":" + p
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
'rsync -a SRC/ DST', not 'cp -r SRC DST/'), with or without a trailing
slash on either: 'tether cp NODE:/srv/app .' puts app's contents into the
current directory, merged with what is there (with --delete, the rest of
it is removed); give './app' to get a directory app. A file SRC copied
onto an existing directory, or onto a DST written with a trailing slash,
lands inside it as DST/NAME, as with cp and scp; replacing a file with a
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
changes. Names that hold control characters, bytes that are not UTF-8,
quotes or backslashes are printed quoted, as Go's strconv.Quote quotes.

Exit codes:
  0        copied
  1        the copy failed: a source missing, not permitted, not under a
           copy root or the agent's own state, a file system error on
           either end; DST is unchanged unless the final renames failed
  2        usage error: nothing was sent
  23       partial copy: the entries named on stderr were skipped, the
           rest was copied (rsync's code)
  130/143  interrupted by SIGINT/SIGTERM: the copy was cancelled and DST
           is unchanged
  255      Tether failed: no coordinator (NATS unreachable, nobody
           serving), node not connected, tunnel lost, coordinator shut
           down, the agent busy or failing internally`,
		Example: `  tether cp ./configs node-a:/srv/configs
  tether cp --delete ./staging gpu-07:/lustre/jobs/gym-job-20261130
  tether cp node-a:/var/log/tether ./logs`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usage(fmt.Errorf("want SRC and DST, got %d %s", len(args), plural(len(args), "argument", "arguments")))
			}
			return nil
		},
		RunE: e.runE(func(cmd *cobra.Command, args []string) error {
			from, to, err := o.Validate(args[0], args[1])
			if err != nil {
				return usage(err)
			}
			if err := checkLocalSource(from); err != nil {
				return err
			}
			c, closeNC, err := o.NATS.connect(e)
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

// checkLocalSource finds a push's missing or unreadable source before
// anything else is asked of the fleet: "cp: local source PATH: no such
// file or directory", exit 1. A pull's source is the node's: nil.
func checkLocalSource(from copyEnd) error {
	if from.node != "" {
		return nil
	}
	if _, err := os.Lstat(from.path); err != nil {
		return &exitError{code: exitFailure, err: errors.New("cp: " + localMessage(err, "local source"))}
	}
	return nil
}

// runCp copies from → to through a copy stream opened with op (a push's
// source checked already: checkLocalSource). Its errors
// carry their exit codes (see the --help text): cpError for a copy that
// failed (1), exitPartial, an interrupted copy's code, usage errors for
// params the agent would refuse, and exitTether for Tether's own failures
// (cpOutcome).
func runCp(ctx context.Context, o *cpOptions, from, to copyEnd, e *env, op streamOpener) error {
	params := protocol.CopyParams{Delete: o.Delete, Checksum: o.Checksum, Into: to.into, Strict: o.Strict}
	node := to.node
	if node != "" {
		params.Direction, params.Path = protocol.CopyPush, to.path
	} else {
		node = from.node
		params.Direction, params.Path = protocol.CopyPull, from.path
	}
	// What the agent would refuse is found before anything is sent.
	if err := params.Validate(); err != nil {
		return usage(fmt.Errorf("cp %s to %s: the path on the node: %s", from, to, clipWords(printable(strings.TrimPrefix(err.Error(), "path: ")))))
	}
	opened, err := op.OpenStream(ctx, node, protocol.KindCopy, &params)
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: interruptCode(ctx), err: fmt.Errorf("cp %s to %s: interrupted; nothing was copied", from, to)}
		}
		var ae *protocol.APIError
		if errors.As(err, &ae) {
			return cpError(exitTether, from, to, printable(ae.Message)+" ("+ae.Code+")")
		}
		return cpError(exitTether, from, to, printable(err.Error()))
	}
	st := &watchedStream{shellStream: opened}
	defer st.Close()

	pr := newCopyProgress(o.Progress, e)
	opts := mirror.Options{Delete: o.Delete, Checksum: o.Checksum, Into: to.into, Strict: o.Strict, Progress: pr.update}
	start := time.Now()
	var res *protocol.CopyResult
	local := "local source"
	if params.Direction == protocol.CopyPush {
		res, err = mirror.Send(ctx, from.path, st, opts)
	} else {
		local = "local destination"
		res, err = mirror.Receive(ctx, to.path, st, opts)
	}
	pr.finish()
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: interruptCode(ctx), err: fmt.Errorf("cp %s to %s: interrupted; %s is unchanged", from, to, to)}
		}
		code, msg := cpOutcome(err, st, node, local)
		return cpError(code, from, to, msg)
	}
	endCopy(st.shellStream)
	// Skipped entries are named even with --quiet: they are not copied.
	for _, sk := range res.SkippedEntries {
		fmt.Fprintf(e.stderr, "tether: cp: skipped %s: %s\n", skippedPath(from, sk.Path), printable(sk.Reason))
	}
	if n := res.Skipped - len(res.SkippedEntries); n > 0 {
		fmt.Fprintf(e.stderr, "tether: cp: skipped %d more %s\n", n, plural(n, "entry", "entries"))
	}
	if !o.Quiet {
		el := time.Since(start)
		replaced := ""
		if res.Replaced > 0 {
			replaced = fmt.Sprintf(", %d replaced by another type", res.Replaced)
		}
		fmt.Fprintf(e.stderr, "copied %s to %s: %d %s written (%s), %d unchanged, %d deleted%s in %s (%s/s)\n",
			from, to, res.FilesWritten, plural(res.FilesWritten, "file", "files"), humanBytes(res.BytesWritten), res.FilesKept, res.Deleted,
			replaced, el.Round(time.Millisecond), humanBytes(int64(float64(res.BytesWritten)/max(el.Seconds(), 1e-3))))
	}
	if res.Skipped > 0 {
		return &exitError{code: exitPartial, err: fmt.Errorf("cp %s to %s: partial copy: %d %s could not be copied (named above; what %s had there is kept); everything else was copied",
			from, to, res.Skipped, plural(res.Skipped, "entry", "entries"), to)}
	}
	return nil
}

// endCopy ends a committed copy's stream cleanly before it is closed: it
// sends this side's eof and reads to the agent's, for at most copyEndWait.
// A Close alone aborts the pipe and drops what the coordinator has not
// relayed yet, a pull's FrameCopyDone among it: the coordinator's audit
// would record the copy as cut off, not done.
func endCopy(st shellStream) {
	cw, ok := st.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(io.Discard, st) // ends at the agent's eof, or at the caller's Close
	}()
	t := time.NewTimer(copyEndWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// copyEndWait bounds how long endCopy waits for the agent's eof.
const copyEndWait = 5 * time.Second

// cpError is a failed copy's error: "cp SRC TO DST: msg", ending Run with
// code. msg must be printable already.
func cpError(code int, from, to copyEnd, msg string) error {
	return &exitError{code: code, err: fmt.Errorf("cp %s to %s: %s", from, to, clipWords(msg))}
}

// maxShown bounds a path (or any word) in cp's messages: a path of
// kilobytes (up to PATH_MAX, and named two or three times in one error)
// would fill the terminal. Its start and end are kept.
const maxShown = 200

// clipMiddle shortens s past maxShown bytes to its start, "…", and its
// end, cut at UTF-8 boundaries.
func clipMiddle(s string) string {
	if len(s) <= maxShown {
		return s
	}
	head, tail := maxShown*2/3, maxShown/4
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	t := len(s) - tail
	for t < len(s) && !utf8.RuneStart(s[t]) {
		t++
	}
	return s[:head] + "…(" + strconv.Itoa(len(s)) + " bytes)…" + s[t:]
}

// clipWords is clipMiddle of each space-separated word of msg (a node's
// message names paths inside it).
func clipWords(msg string) string {
	if len(msg) <= maxShown {
		return msg
	}
	words := strings.Split(msg, " ")
	for i, w := range words {
		words[i] = clipMiddle(w)
	}
	return strings.Join(words, " ")
}

// cpOutcome is the exit code and message of a copy that failed with err,
// a mirror error, on the stream st to node; local names this end's role
// ("local source" or "local destination", see localMessage). Who failed
// is in the code:
//   - the agent's error frame (*mirror.PeerError) says it by its code:
//     bad_request (not allowed: not under a copy root, the agent's own
//     state; or a stream that broke the copy protocol), forbidden and
//     unknown_user (the node's local policy refuses the copy, or the
//     account it would run as does not exist) and copy_failed (a path
//     missing or not permitted, a file system error) are the copy's
//     failures, 1; anything else (the coordinator's shutdown, the agent
//     busy or failing internally) is Tether's, 255;
//   - the agent's cancel (mirror.ErrCanceled: its session ended), a
//     failure of the stream itself (the tunnel lost, the coordinator shut
//     down or gone silent, NATS lost), or its end before the copy was
//     over, is Tether's, 255;
//   - anything else failed here, on this end's files: 1.
//
// The message is the agent's or the coordinator's own reason where there
// is one, without the layers it travelled through (mirror, the stream, the
// pipe). A failure on the node's files (copy_failed) is "node NODE: ..."
// as a local one is "local source ..." or "local destination ...", so that
// a full disk says which side is full; other messages do not repeat the
// node, which the cp prefix names.
func cpOutcome(err error, st *watchedStream, node, local string) (int, string) {
	var pe *mirror.PeerError
	if errors.As(err, &pe) {
		msg := printable(trimNodePrefix(node, pe.Info.Message))
		switch pe.Info.Code {
		case protocol.CodeCopyFailed:
			// A failure on the node's files: say whose they are, as a
			// local one says "local source" or "local destination".
			return exitFailure, "node " + node + ": " + msg
		case protocol.CodeBadRequest, protocol.CodeForbidden, protocol.CodeUnknownUser:
			return exitFailure, msg
		}
		return exitTether, msg + " (" + printable(pe.Info.Code) + ")"
	}
	if errors.Is(err, mirror.ErrCanceled) {
		return exitTether, "the agent cancelled the copy (is it shutting down?)"
	}
	if serr, eof := st.failure(); serr != nil {
		return exitTether, streamMessage(serr)
	} else if eof && errors.Is(err, io.ErrUnexpectedEOF) {
		return exitTether, "the stream from the node ended before the copy did (did the agent stop?)"
	}
	return exitFailure, localMessage(err, local)
}

// streamMessage says why a relayed stream failed (a *client.Stream's
// error): the coordinator's reason when it gave one ("tunnel to node X
// lost: ...", "coordinator X is shutting down"), else the pipe's failure
// without its inbox.
func streamMessage(err error) string {
	var pe *natspipe.Error
	if !errors.As(err, &pe) {
		return printable(err.Error())
	}
	if pe.Reason != "" {
		return printable(pe.Reason)
	}
	msg := pe.Msg
	if strings.HasPrefix(msg, "pipe to ") {
		if _, rest, ok := strings.Cut(msg, ": "); ok {
			msg = rest
		}
	}
	return "the stream through the coordinator failed: " + printable(msg)
}

// localMessage is a failure on this end's files (err, from mirror or the
// os package) in the user's terms: without mirror's "mirror: OP PATH:"
// layer, and an *os.PathError as "END PATH: reason" (end is "local source"
// or "local destination"; the path quoted as names are) instead of the
// system call's name ("lstat PATH: ...").
func localMessage(err error, end string) string {
	var me *mirror.Error
	if errors.As(err, &me) {
		err = me.Err
	}
	var we *mirror.WriteError
	if errors.As(err, &we) && err == error(we) {
		return end + " " + protocol.QuoteName(we.Path) + ": " + printable(we.Err.Error()) + " (the destination is unchanged)"
	}
	var pe *os.PathError
	if errors.As(err, &pe) && err == error(pe) {
		return end + " " + protocol.QuoteName(pe.Path) + ": " + printable(pe.Err.Error())
	}
	return printable(err.Error())
}

// trimNodePrefix drops the "node <id>: " an agent puts before its own
// messages, as the client and the coordinator do for exec results.
func trimNodePrefix(node, msg string) string {
	if rest, ok := strings.CutPrefix(msg, "node "+node+": "); ok {
		return rest
	}
	return msg
}

// watchedStream is the copy stream as mirror uses it, remembering how the
// stream itself ended, so that a failure of the stream (Tether's) is told
// from a failure of the copy.
type watchedStream struct {
	shellStream
	mu  sync.Mutex
	err error // the stream's first failure (not io.EOF)
	eof bool  // the agent's side ended (io.EOF)
}

func (s *watchedStream) Read(p []byte) (int, error) {
	n, err := s.shellStream.Read(p)
	s.note(err)
	return n, err
}

func (s *watchedStream) Write(p []byte) (int, error) {
	n, err := s.shellStream.Write(p)
	s.note(err)
	return n, err
}

func (s *watchedStream) note(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case errors.Is(err, io.EOF):
		s.eof = true
	case s.err == nil:
		s.err = err
	}
}

// failure returns the stream's first failure and whether it reached EOF.
func (s *watchedStream) failure() (error, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err, s.eof
}

// skippedPath shows a skipped entry's path (relative to the copy's
// source) below the source the user named, quoted when it holds bytes a
// terminal would not show as they are.
func skippedPath(from copyEnd, rel string) string {
	p := from.path
	if rel != "." {
		p = strings.TrimSuffix(p, "/") + "/" + rel
	}
	return copyEnd{node: from.node, path: p}.String()
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
