package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// serveCopy serves the copy stream st (see protocol/copy.go): it checks the
// params and the path against Config.CopyRoots, then receives (push) or
// sends (pull) with the mirror package. The session's ctx, a FrameCancel
// from the client and the stream's end all abort the copy; an aborted push
// leaves the destination as it was. It closes st.
func (a *Agent) serveCopy(ctx context.Context, st *yamux.Stream, h protocol.Header) {
	defer st.Close()
	// A copy's peer takes an error frame at any point (protocol/copy.go).
	defer a.guard.Recover("copy stream", a.answerPanic(st, nil))
	log := a.log.With("stream", st.StreamID())
	var p protocol.CopyParams
	if err := h.DecodeParams(&p); err != nil {
		a.refuseCopy(st, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	if err := p.Validate(); err != nil {
		a.refuseCopy(st, fmt.Sprintf("node %s: copy params: %v", a.cfg.NodeID, err))
		return
	}
	path, err := a.copyPath(&p)
	if err != nil {
		log.Warn("copy refused", "direction", p.Direction, "path", p.Path, "err", err)
		a.refuseCopy(st, err.Error())
		return
	}
	log = log.With("direction", p.Direction, "path", path)
	log.Info("copy started", "delete", p.Delete, "checksum", p.Checksum)
	opts := mirror.Options{Delete: p.Delete, Checksum: p.Checksum, Into: p.Into, Logger: log}
	start := time.Now()
	var res *protocol.CopyResult
	if p.Direction == protocol.CopyPush {
		res, err = mirror.Receive(ctx, path, st, opts)
	} else {
		res, err = mirror.Send(ctx, path, st, opts)
	}
	if err != nil {
		a.m.copies.WithLabelValues(p.Direction, "error").Inc()
		log.Warn("copy failed", "err", err, "duration", time.Since(start))
		return
	}
	a.m.copies.WithLabelValues(p.Direction, "ok").Inc()
	a.m.copyBytes.WithLabelValues(p.Direction).Add(float64(res.BytesWritten))
	log.Info("copy done", "entries", res.Entries, "files_written", res.FilesWritten, "files_kept", res.FilesKept,
		"bytes", res.BytesWritten, "deleted", res.Deleted, "duration", time.Since(start))
}

// refuseCopy answers a copy stream that cannot start with a bad_request
// error frame, then reads and drops what the client still sends (its
// manifest, in a pull) until it closes or the tunnel's write timeout, so
// that the client is never left blocked writing to a stream nobody reads.
func (a *Agent) refuseCopy(st *yamux.Stream, msg string) {
	st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeBadRequest, Message: msg})
	st.SetReadDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	io.Copy(io.Discard, st)
}

// copyPath checks a copy's path against the copy roots and returns the
// path to use: with the symlinks of its existing part resolved (all of it
// for a pull, whose source must exist; the parent for a push, whose last
// element is replaced and never followed). A push may not replace a root
// itself.
func (a *Agent) copyPath(p *protocol.CopyParams) (string, error) {
	clean := filepath.Clean(p.Path)
	var resolved string
	if p.Direction == protocol.CopyPull {
		r, err := filepath.EvalSymlinks(clean)
		if err != nil {
			return "", fmt.Errorf("node %s: copy source %s: %w", a.cfg.NodeID, clean, err)
		}
		resolved = r
	} else {
		parent, err := resolveExisting(filepath.Dir(clean))
		if err != nil {
			return "", fmt.Errorf("node %s: copy destination %s: %w", a.cfg.NodeID, clean, err)
		}
		resolved = filepath.Join(parent, filepath.Base(clean))
	}
	isRoot := false
	for _, root := range a.cfg.CopyRoots {
		root = filepath.Clean(root)
		if r, err := filepath.EvalSymlinks(root); err == nil {
			root = r
		}
		if resolved == root && p.Direction == protocol.CopyPull {
			return resolved, nil
		}
		isRoot = isRoot || resolved == root
		if resolved != root && (root == "/" || strings.HasPrefix(resolved, root+"/")) {
			return resolved, nil
		}
	}
	what := "inside"
	if p.Direction == protocol.CopyPull {
		what = "under"
	}
	shown := clean
	if resolved != clean {
		shown = fmt.Sprintf("%s (resolved to %s)", clean, resolved)
	}
	if isRoot {
		// A push replaces its destination whole, and a root cannot be
		// replaced: its parent is outside every root.
		return "", fmt.Errorf("node %s: copy destination %s is a copy root itself; copy to a path below it, e.g. %s", a.cfg.NodeID, shown, filepath.Join(clean, "NAME"))
	}
	return "", fmt.Errorf("node %s: copy path %s is not %s a copy root (%s)", a.cfg.NodeID, shown, what, strings.Join(a.cfg.CopyRoots, ", "))
}

// resolveExisting resolves the symlinks of dir's longest existing prefix
// and appends the rest unchanged (it will be created as directories).
func resolveExisting(dir string) (string, error) {
	rest := ""
	for {
		_, err := os.Lstat(dir)
		if err == nil {
			r, err := filepath.EvalSymlinks(dir)
			if err != nil {
				return "", err
			}
			return filepath.Join(r, rest), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", err
		}
		rest = filepath.Join(filepath.Base(dir), rest)
		dir = parent
	}
}
