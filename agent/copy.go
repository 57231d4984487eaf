package agent

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// serveCopy serves the copy stream st (see protocol/copy.go): it checks the
// params and the account it runs as (runAs: the local policy, the user),
// then receives (push) or sends (pull) with the mirror package, confined
// to its copy roots (copyRoots) and never touching the agent's own state
// (copyProtected), in process for the agent's own account and in a helper
// process with the account's credentials for any other (copyas.go). The
// path is resolved by mirror on descriptors, once: nothing here opens it
// by name. The session's ctx, a FrameCancel from the
// client and the stream's end all abort the copy; an aborted push leaves
// the destination as it was. It closes st.
func (a *Agent) serveCopy(ctx context.Context, st *yamux.Stream, h protocol.Header) {
	defer st.Close()
	// A copy's peer takes an error frame at any point (protocol/copy.go).
	defer a.guard.Recover("copy stream", a.answerPanic(st, nil))
	log := a.log.With("stream", st.StreamID())
	// Refusals, like mirror's errors, do not name the node: the client
	// opened the stream to it, and names it once in what it shows.
	var p protocol.CopyParams
	if err := h.DecodeParams(&p); err != nil {
		a.refuseCopy(st, err.Error())
		return
	}
	if err := p.Validate(); err != nil {
		a.refuseCopy(st, fmt.Sprintf("copy params: %v", err))
		return
	}
	path := p.Path
	log = log.With("direction", p.Direction, "path", path)
	// As the other refusals of a copy, without the node's name.
	refuse := func(info *protocol.ErrorInfo) {
		info.Message = strings.TrimPrefix(info.Message, "node "+a.cfg.NodeID+": ")
		a.refuseCopyInfo(st, info)
	}
	acct, refusal := a.runAs(p.User, "copy")
	if refusal != nil {
		refuse(refusal)
		return
	}
	roots, err := a.copyRoots(acct, path)
	if err != nil {
		refuse(a.forbidden(err))
		return
	}
	// The coordinator's grant (p.Roots) narrows the copy roots: the copy
	// resolves beneath their intersection, so a symlink cannot take it
	// out of what the policy granted.
	if len(p.Roots) > 0 {
		eff := mirror.EffectiveRoots(roots, p.Roots)
		if !localpolicy.Under(eff, path) {
			// Say which of the two leaves the path out.
			msg := fmt.Sprintf("copy path %s is not under a path the coordinator's policy granted (%s) within the copy roots (%s)",
				protocol.Clip(path), strings.Join(p.Roots, ", "), strings.Join(roots, ", "))
			switch granted, rooted := localpolicy.Under(p.Roots, path), localpolicy.Under(roots, path); {
			case granted && !rooted:
				msg = fmt.Sprintf("copy path %s is outside this node's copy roots (%s; the agent's --copy-root sets them); the policy grants %s",
					protocol.Clip(path), strings.Join(roots, ", "), strings.Join(p.Roots, ", "))
			case !granted && rooted:
				msg = fmt.Sprintf("copy path %s is not under a path the coordinator's policy granted (%s)", protocol.Clip(path), strings.Join(p.Roots, ", "))
			}
			a.refuseCopy(st, msg)
			return
		}
	}
	protected := a.copyProtected()
	// A first look, by name and as the agent: a clear refusal before any
	// helper starts, whichever account the copy runs as (one that cannot
	// search the state directory would otherwise be refused only by the
	// kernel, with an unrelated message). mirror's check on descriptors
	// stays what holds against races.
	if p := insideProtected(path, protected); p != "" {
		a.refuseCopy(st, fmt.Sprintf("copy path %s is the agent's own state or inside it (%s): never copied", protocol.Clip(path), p))
		return
	}
	log.Info("copy started", "user", acct.Name, "delete", p.Delete, "checksum", p.Checksum, "strict", p.Strict)
	start := time.Now()
	var res *protocol.CopyResult
	if !acct.self {
		res, err = a.copyAs(ctx, st, acct, &p, roots, protected, log)
	} else {
		opts := mirror.Options{
			Delete: p.Delete, Checksum: p.Checksum, Into: p.Into, Strict: p.Strict, Logger: log,
			Roots: roots, Within: p.Roots, Protected: protected,
		}
		if p.Direction == protocol.CopyPush {
			res, err = mirror.Receive(ctx, path, st, opts)
		} else {
			res, err = mirror.Send(ctx, path, st, opts)
		}
	}
	if err != nil {
		a.m.copies.WithLabelValues(p.Direction, "error").Inc()
		log.Warn("copy failed", "err", err, "duration", time.Since(start))
		return
	}
	a.m.copies.WithLabelValues(p.Direction, "ok").Inc()
	a.m.copyBytes.WithLabelValues(p.Direction).Add(float64(res.BytesWritten))
	log.Info("copy done", "entries", res.Entries, "files_written", res.FilesWritten, "files_kept", res.FilesKept,
		"bytes", res.BytesWritten, "deleted", res.Deleted, "skipped", res.Skipped, "duration", time.Since(start))
}

// copyProtected lists the agent's own state, which no copy may write or
// read whatever the copy roots: the detached jobs' directory, the exec
// process group records' directory (a record planted there would name a
// group the next agent kills at its start, orphans.go) and the identity
// directory (created now if missing, so that they are protected by
// identity before any copy could make them), the SSH host key and
// Config.SecretFiles. The data dir itself holds them, so a push onto it
// (or onto any directory above it) is refused too. stateDirs lists every
// entry the agent keeps in the data dir (TestCopyProtectsAllAgentState).
func (a *Agent) copyProtected() []string {
	for _, dir := range a.stateDirs() {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			a.log.Warn("cannot create a state directory", "dir", dir, "err", err)
		}
	}
	return append(append(a.stateDirs(), a.cfg.SSHHostKeyFile), a.cfg.SecretFiles...)
}

// stateDirs are the agent's state directories (see copyProtected).
func (a *Agent) stateDirs() []string {
	return []string{a.jobsDir(), a.execsDir(), a.cfg.IdentityDir}
}

// insideProtected returns the protected entry that path is or lies
// inside, by name: the path as given and with the symlinks of its existing
// part resolved (as the agent sees them), against each protected path and
// its own resolved form; "" when none.
func insideProtected(path string, protected []string) string {
	cands := []string{filepath.Clean(path)}
	if r := resolveExisting(path); r != cands[0] {
		cands = append(cands, r)
	}
	for _, p := range protected {
		if p == "" {
			continue
		}
		ps := []string{filepath.Clean(p)}
		if r := resolveExisting(p); r != ps[0] {
			ps = append(ps, r)
		}
		for _, c := range cands {
			for _, q := range ps {
				if c == q || strings.HasPrefix(c, strings.TrimSuffix(q, "/")+"/") {
					return p
				}
			}
		}
	}
	return ""
}

// resolveExisting is path with the symlinks of its longest existing
// prefix resolved, the rest appended as given.
func resolveExisting(path string) string {
	path = filepath.Clean(path)
	rest := ""
	for dir := path; ; dir = filepath.Dir(dir) {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(r, rest)
		}
		if dir == "/" || dir == "." {
			return path
		}
		rest = filepath.Join(filepath.Base(dir), rest)
	}
}

// copyRoots are the roots a copy of path as acct is confined to: with a
// local policy, the policy's roots for the account (the path must lie
// under one: a *localpolicy.Refusal otherwise); without, Config.CopyRoots.
func (a *Agent) copyRoots(acct *account, path string) ([]string, error) {
	if lp := a.localPolicy(); lp != nil {
		return lp.CheckCopy(acct.Account, path)
	}
	return a.cfg.CopyRoots, nil
}

// refuseCopyInfo is refuseCopy with the error frame's code and message.
func (a *Agent) refuseCopyInfo(st *yamux.Stream, info *protocol.ErrorInfo) {
	st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	protocol.WriteJSONFrame(st, protocol.FrameError, info)
	st.SetReadDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	io.Copy(io.Discard, st)
}

// refuseCopy answers a copy stream that cannot start with a bad_request
// error frame, then reads and drops what the client still sends (its
// manifest, in a pull) until it closes or the tunnel's write timeout, so
// that the client is never left blocked writing to a stream nobody reads.
func (a *Agent) refuseCopy(st *yamux.Stream, msg string) {
	a.refuseCopyInfo(st, &protocol.ErrorInfo{Code: protocol.CodeBadRequest, Message: msg})
}
