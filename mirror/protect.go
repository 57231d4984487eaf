package mirror

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// protection is the agent's own state (Options.Protected), which no copy
// reads or writes, identified by device and inode.
//
// A hard link is another name of the same inode, so a Protected file is
// caught whatever names it. A file below a Protected directory is caught
// by its path (checkProtected walks up from the copy's directories), and
// its other names, hard links elsewhere, by identity: only a regular file
// with more than one link can be one, so the first such file a copy meets
// makes the protection list every regular file below the Protected
// directories (once per copy end: a file added there later is not seen by
// a copy already running). Ordinary copies, without multi-link files,
// never list them. The listing is bounded (protWalkCap entries); when it
// is cut short, or a directory there cannot be listed though this process
// could reach files below it, multi-link files fail closed: each is
// treated as possibly protected (refused, or skipped in a tree), saying
// why. A directory this process cannot even search is passed over: it can
// name nothing below it, so it could not have made a link to it either.
type protection struct {
	ids  map[fileID]string // each existing Protected entry -> its name
	dirs []protDir         // the Protected entries that are directories
	log  *slog.Logger

	mu     sync.Mutex
	listed bool
	files  map[fileID]string // regular files below dirs -> their names
	short  string            // set: the listing is incomplete, why
}

type protDir struct {
	path, name string // as given; for messages
	id         fileID
}

var (
	// protWalks counts the listings of protected directories (tests
	// assert ordinary copies make none).
	protWalks atomic.Int64
	// protWalkCap bounds the entries one listing visits.
	protWalkCap = 10000
)

// matchKind is what protection.match found.
type matchKind int

const (
	notProtected   matchKind = iota
	isProtected              // the name is the protected file's
	maybeProtected           // the name is why it cannot be told
)

// newProtection identifies paths; a missing one is ignored. It returns
// nil for no paths.
func newProtection(paths []string, log *slog.Logger) *protection {
	if len(paths) == 0 {
		return nil
	}
	p := &protection{ids: make(map[fileID]string, len(paths)), log: log}
	for _, pt := range paths {
		var st unix.Stat_t
		if err := unix.Stat(pt, &st); err != nil {
			continue
		}
		name := pt
		if strings.HasPrefix(pt, "/proc/self/fd/") {
			// The copy helper's descriptors: name what they are.
			if l, err := os.Readlink(pt); err == nil && strings.HasPrefix(l, "/") {
				name = l
			}
		}
		p.ids[idOf(&st)] = name
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			p.dirs = append(p.dirs, protDir{path: pt, name: name, id: idOf(&st)})
		}
	}
	return p
}

// byID is the name of the Protected entry with identity id, or "".
func (p *protection) byID(id fileID) string {
	if p == nil {
		return ""
	}
	return p.ids[id]
}

// match tells whether the entry with identity id (a regular file if reg,
// with nlink links) is protected: a Protected entry or another name of a
// file below a Protected directory (isProtected, with its name), or a
// multi-link file the incomplete listing cannot clear (maybeProtected,
// with why).
func (p *protection) match(id fileID, reg bool, nlink uint64) (matchKind, string) {
	if p == nil {
		return notProtected, ""
	}
	if n, ok := p.ids[id]; ok {
		return isProtected, n
	}
	if !reg || nlink <= 1 || len(p.dirs) == 0 {
		return notProtected, ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.listed {
		p.list()
		p.listed = true
	}
	if n, ok := p.files[id]; ok {
		return isProtected, n
	}
	if p.short != "" {
		return maybeProtected, p.short
	}
	return notProtected, ""
}

var errProtCap = errors.New("too many entries")

// list fills p.files, or sets p.short.
func (p *protection) list() {
	protWalks.Add(1)
	p.files = make(map[fileID]string)
	n := 0
	for _, d := range p.dirs {
		fd, err := unix.Open(d.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			if p.unlisted(d.name, d.path, unix.AT_FDCWD, err) {
				return
			}
			continue
		}
		if id, err := fdID(fd); err != nil || id != d.id {
			unix.Close(fd)
			p.short = fmt.Sprintf("%s changed since the copy started", d.name)
			p.log.Warn("protected directory changed since the copy started: multi-link files are not copied", "dir", d.name)
			return
		}
		w := walker{base: fd}
		w.entry = func(rel string, fi *statInfo) error {
			if n++; n > protWalkCap {
				return errProtCap
			}
			if fi.Mode().IsRegular() {
				p.files[fi.id] = path.Join(d.name, rel)
			}
			return nil
		}
		w.bad = func(rel string, err error) error {
			if p.unlisted(path.Join(d.name, rel), rel, fd, err) {
				return err
			}
			return nil
		}
		err = w.walk(".")
		unix.Close(fd)
		switch {
		case err == errProtCap:
			p.short = fmt.Sprintf("the protected directories hold more than %d entries", protWalkCap)
			p.log.Warn("protected directories too big to list: multi-link files are not copied", "max_entries", protWalkCap)
			return
		case err != nil && p.short == "":
			p.short = fmt.Sprintf("cannot list %s: %s", d.name, errText(err))
			p.log.Warn("cannot list a protected directory: multi-link files are not copied", "dir", d.name, "err", err)
			return
		case err != nil:
			return
		}
	}
}

// unlisted handles a protected directory (name, at rel in dfd) that
// cannot be listed (err): one this process cannot search is passed over
// (false); otherwise the listing is incomplete (p.short set, true).
func (p *protection) unlisted(name, rel string, dfd int, err error) bool {
	if errors.Is(err, unix.EACCES) && unix.Faccessat(dfd, rel, unix.X_OK, unix.AT_EACCESS) != nil {
		p.log.Debug("protected directory not searchable by this process: not listed", "dir", name)
		return false
	}
	p.short = fmt.Sprintf("cannot list %s: %s", name, errText(err))
	p.log.Warn("cannot list a protected directory: multi-link files are not copied", "dir", name, "err", err)
	return true
}
