package mirror

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// maxLinks bounds the symlinks one resolution follows (Linux's own limit).
const maxLinks = 40

// refusal is an error that says the copy is not allowed (a path outside
// the copy roots, the agent's own state): the peer is told bad_request.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

func refusef(format string, args ...any) error {
	return &refusal{msg: fmt.Sprintf(format, args...)}
}

// target is where a path lands: the directory dir holds the entry name,
// which may not exist; or, with name "", dir is itself the entry (an
// existing directory: a copy root, the working directory, a symlink's
// target reached through "." or "..").
type target struct {
	dir  *os.File
	name string
}

// resolver turns the path a copy names into a target, the way the kernel
// would, with symlinks followed at every step including the last one (the
// user named the path), but in user space, one component at a time on
// descriptors, so that the result can be confined to the copy roots: with
// roots set, every directory the walk holds is the root it started from or
// a descendant reached without leaving it ("..", a relative symlink), and
// an absolute symlink continues in the root that holds its target, or is
// refused. Without roots (the local end of `tether cp`) nothing is
// confined and a relative path starts at the working directory's
// descriptor, so a replaced or deleted working directory is never
// reopened by name.
type resolver struct {
	roots []copyRoot // nil: not confined
	names string     // the roots, for messages
	// prot, if set, are protected files (Options.Protected): the walk
	// creates no directory in or below one.
	prot *protection
}

// copyRoot is one copy root.
type copyRoot struct {
	conf    string   // as configured, cleaned
	aliases []string // paths naming it: conf and conf with its symlinks resolved
	// base, if set, is the configured root conf lies under (a Within
	// entry narrowing it): conf is then opened by resolving it beneath
	// the configured roots (in), never by name.
	base *copyRoot
	in   *resolver
}

// newResolver returns the resolver confined to roots, narrowed by within
// (Options.Within): see EffectiveRoots. With within set and nothing
// left, the resolver is still confined, to no root: it refuses every path.
func newResolver(roots, within []string) *resolver {
	base := &resolver{}
	for _, c := range roots {
		c = filepath.Clean(c)
		cr := copyRoot{conf: c, aliases: []string{c}}
		if ev, err := filepath.EvalSymlinks(c); err == nil && ev != c {
			cr.aliases = append(cr.aliases, ev)
		}
		base.roots = append(base.roots, cr)
	}
	base.names = strings.Join(roots, ", ")
	if len(within) == 0 {
		return base
	}
	if len(roots) == 0 {
		// Within alone: they are the roots.
		return newResolver(within, nil)
	}
	r := &resolver{roots: []copyRoot{}}
	var names []string
	for _, e := range effectiveRoots(roots, within) {
		cr := copyRoot{conf: e.root, aliases: []string{e.root}}
		if e.under >= 0 {
			cr.base, cr.in = &base.roots[e.under], base
		} else {
			cr = base.roots[e.agent]
		}
		r.roots = append(r.roots, cr)
		names = append(names, e.root)
	}
	r.names = strings.Join(names, ", ")
	if r.names == "" {
		r.names = "none: the granted paths (" + strings.Join(within, ", ") + ") are outside the copy roots (" + base.names + ")"
	}
	return r
}

// effective is one root of EffectiveRoots: a Within entry lying under the
// configured root roots[under], or the configured root roots[agent]
// (under -1) lying under a Within entry.
type effective struct {
	root         string
	under, agent int
}

func effectiveRoots(roots, within []string) []effective {
	var out []effective
	seen := map[string]bool{}
	add := func(e effective) {
		if !seen[e.root] {
			seen[e.root] = true
			out = append(out, e)
		}
	}
	for _, w := range within {
		w = filepath.Clean(w)
		best, bestLen := -1, -1
		for i, c := range roots {
			c = filepath.Clean(c)
			if underDir(w, c) && len(c) > bestLen {
				best, bestLen = i, len(c)
			}
		}
		if best >= 0 {
			add(effective{root: w, under: best, agent: -1})
		}
	}
	for i, c := range roots {
		c = filepath.Clean(c)
		for _, w := range within {
			if underDir(c, filepath.Clean(w)) && !seen[c] {
				add(effective{root: c, under: -1, agent: i})
			}
		}
	}
	return out
}

// EffectiveRoots returns the roots a copy confined to roots (a node's copy
// roots) and narrowed by within (the paths the coordinator's policy
// granted, Options.Within) resolves beneath: each within entry that lies
// under a root, and each root that lies under a within entry, cleaned and
// without repeats. Empty when they do not meet. The test is on the names
// (component boundaries); the resolver then opens each within entry
// beneath its root, so a symlink on the way cannot take it out.
func EffectiveRoots(roots, within []string) []string {
	var out []string
	for _, e := range effectiveRoots(roots, within) {
		out = append(out, e.root)
	}
	return out
}

// underDir reports whether the clean absolute path p is dir or below it.
func underDir(p, dir string) bool {
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// components splits p into its non-empty components other than ".".
func components(p string) []string {
	var out []string
	for c := range strings.SplitSeq(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// findRoot returns the root holding the absolute path comps (its
// components) and the components below it.
func (r *resolver) findRoot(comps []string) (*copyRoot, []string) {
	var best *copyRoot
	var rest []string
	bestLen := -1
	for i := range r.roots {
		for _, a := range r.roots[i].aliases {
			ac := components(a)
			if len(ac) > len(comps) || len(ac) <= bestLen || !slices.Equal(ac, comps[:len(ac)]) {
				continue
			}
			best, rest, bestLen = &r.roots[i], comps[len(ac):], len(ac)
		}
	}
	return best, rest
}

// openRoot opens a root's directory, creating it when create is set: a
// configured root by its configured name (the agent's administrator wrote
// it), a narrowed one (copyRoot.base) by resolving it beneath the
// configured roots, with their confinement, so that no symlink on its way
// can take it out of them.
func (r *resolver) openRoot(cr *copyRoot, create bool) (int, error) {
	if cr.base == nil {
		if create {
			if err := os.MkdirAll(cr.conf, 0o755); err != nil {
				return -1, err
			}
		}
		return openAt1(unix.AT_FDCWD, cr.conf, unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	in := *cr.in
	in.prot = r.prot
	t, err := in.walk(cr.conf, create)
	if err != nil {
		return -1, err
	}
	defer t.dir.Close()
	dfd := int(t.dir.Fd())
	if t.name == "" {
		return openAt1(dfd, ".", unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	fd, err := openBeneath(dfd, t.name, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == unix.ENOENT && create {
		if err := checkProtected(dfd, "", r.prot, "copy root "+cr.conf); err != nil {
			return -1, err
		}
		if err := unix.Mkdirat(dfd, t.name, 0o755); err != nil && err != unix.EEXIST {
			return -1, fmt.Errorf("create directory %q: %w", t.name, err)
		}
		fd, err = openBeneath(dfd, t.name, unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	return fd, err
}

// resolve finds where p lands. With create, missing directories on the way
// are created (mkdir -p, mode 0755 less the umask); the last component is
// never created. Errors that mean "not allowed" are *refusal; the others
// name p.
func (r *resolver) resolve(p string, create bool) (target, error) {
	t, err := r.walk(p, create)
	var rf *refusal
	if err != nil && !errors.As(err, &rf) {
		err = fmt.Errorf("%s: %w", p, err)
	}
	return t, err
}

func (r *resolver) walk(p string, create bool) (target, error) {
	if p == "" {
		return target{}, errors.New("empty path")
	}
	var stack []int    // directories held, the last one current; stack[0] is the anchor
	var names []string // names[i] is stack[i]'s name in stack[i-1]
	defer func() {
		for _, fd := range stack {
			unix.Close(fd)
		}
	}()
	var queue []string
	var root *copyRoot // the root the walk is in (confined)
	// whole, once set, is the walk's result: the path named a narrowed
	// root itself (see anchor).
	var whole *target
	// anchor starts the walk at the absolute path comps.
	anchor := func(comps []string, link string) error {
		for _, fd := range stack {
			unix.Close(fd)
		}
		stack, names = stack[:0], names[:0]
		if r.roots == nil {
			fd, err := openAt1(unix.AT_FDCWD, "/", unix.O_PATH|unix.O_DIRECTORY, 0)
			if err != nil {
				return err
			}
			stack, names = append(stack, fd), append(names, "")
			queue = append(slices.Clone(comps), queue...)
			return nil
		}
		cr, rest := r.findRoot(comps)
		if cr == nil {
			if link != "" {
				return refusef("copy path %s: symlink %s points to %s, which is not under a copy root (%s)", p, link, "/"+strings.Join(comps, "/"), r.names)
			}
			return refusef("copy path %s is not under a copy root (%s)", p, r.names)
		}
		if cr.base != nil && len(rest) == 0 && len(queue) == 0 {
			// The path is a narrowed root itself (a granted path, which
			// may be a file or not exist yet): it lands where resolving
			// it beneath the configured roots says, in its parent (which
			// then only holds the copy's stage), as it would without
			// the narrowing.
			in := *cr.in
			in.prot = r.prot
			t, err := in.walk(cr.conf, create)
			if err != nil {
				return err
			}
			whole = &t
			return nil
		}
		fd, err := r.openRoot(cr, create)
		if err != nil {
			return fmt.Errorf("copy root %s: %w", cr.conf, err)
		}
		root = cr
		stack, names = append(stack, fd), append(names, "")
		queue = append(slices.Clone(rest), queue...)
		return nil
	}
	switch {
	case strings.HasPrefix(p, "/"):
		if r.roots != nil {
			p = path.Clean(p)
		}
		if err := anchor(components(p), ""); err != nil {
			return target{}, err
		}
		if whole != nil {
			return *whole, nil
		}
	case r.roots != nil:
		return target{}, errors.New("not an absolute path")
	default:
		fd, err := openAt1(unix.AT_FDCWD, ".", unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return target{}, fmt.Errorf("open the working directory: %w", err)
		}
		stack, names = append(stack, fd), append(names, "")
		queue = components(p)
	}
	// where names the directory the walk is in, for messages.
	where := func() string {
		if root != nil {
			return root.conf
		}
		return p
	}
	links := 0
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		last := len(queue) == 0
		if c == "." {
			continue
		}
		top := stack[len(stack)-1]
		if c == ".." {
			switch {
			case len(stack) > 1:
				unix.Close(top)
				stack, names = stack[:len(stack)-1], names[:len(names)-1]
			case r.roots != nil:
				return target{}, refusef("copy path %s leads outside the copy root %s", p, where())
			default:
				up, err := openAt1(top, "..", unix.O_PATH|unix.O_DIRECTORY, 0)
				if err != nil {
					return target{}, err
				}
				unix.Close(top)
				stack[0], names[0] = up, ""
			}
			continue
		}
		fd, err := openBeneath(top, c, unix.O_PATH, 0)
		if err == unix.ENOENT && !last && create {
			if err := checkProtected(top, "", r.prot, "copy path "+p); err != nil {
				return target{}, err
			}
			if err := unix.Mkdirat(top, c, 0o755); err != nil && err != unix.EEXIST {
				return target{}, fmt.Errorf("create directory %q: %w", c, err)
			}
			fd, err = openBeneath(top, c, unix.O_PATH, 0)
		}
		if err == unix.ENOENT && last {
			return r.result(stack, c)
		}
		if err != nil {
			return target{}, fmt.Errorf("%q: %w", c, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return target{}, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			link, err := readlinkAt(fd, "")
			unix.Close(fd)
			if err != nil {
				return target{}, fmt.Errorf("readlink %q: %w", c, err)
			}
			if links++; links > maxLinks {
				return target{}, unix.ELOOP
			}
			if link == "" {
				return target{}, fmt.Errorf("symlink %q is empty", c)
			}
			comps := components(link)
			if strings.HasPrefix(link, "/") {
				if err := anchor(comps, c); err != nil {
					return target{}, err
				}
				if whole != nil {
					return *whole, nil
				}
			} else {
				queue = append(comps, queue...)
			}
		case unix.S_IFDIR:
			if last {
				unix.Close(fd)
				return r.result(stack, c)
			}
			stack, names = append(stack, fd), append(names, c)
		default:
			unix.Close(fd)
			if !last {
				return target{}, fmt.Errorf("%q: %w", c, unix.ENOTDIR)
			}
			return r.result(stack, c)
		}
	}
	// The walk ended on a directory it holds (through ".", "..", or a
	// symlink to a root): name it in its parent when the walk knows it.
	if n := len(stack); n > 1 {
		return r.result(stack[:n-1], names[n-1])
	}
	if r.roots == nil {
		if t, ok := parentOf1(stack[0]); ok {
			return t, nil
		}
	}
	return r.result(stack, "")
}

// parentOf1 finds the directory fd in its parent (not confined: the local
// working directory), by identity: the target is then the parent and the
// name, so that a copy onto it can stage beside it.
func parentOf1(fd int) (target, bool) {
	id, err := fdID(fd)
	if err != nil {
		return target{}, false
	}
	up, err := openAt1(fd, "..", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return target{}, false
	}
	d := os.NewFile(uintptr(up), "..")
	if uid, err := fdID(up); err != nil || uid == id {
		d.Close()
		return target{}, false // the root directory
	}
	ents, err := d.ReadDir(-1)
	if err == nil {
		for _, e := range ents {
			var st unix.Stat_t
			if e.IsDir() && unix.Fstatat(up, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW) == nil && idOf(&st) == id {
				return target{dir: d, name: e.Name()}, true
			}
		}
	}
	d.Close()
	return target{}, false
}

// result opens the current directory of the walk for the target.
func (r *resolver) result(stack []int, name string) (target, error) {
	top := stack[len(stack)-1]
	fd, err := openAt1(top, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == unix.EACCES {
		// Searchable but not readable: enough to create and rename in.
		fd, err = openAt1(top, ".", unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return target{}, err
	}
	return target{dir: os.NewFile(uintptr(fd), "."), name: name}, nil
}

// checkProtected refuses a copy whose end (the entry name in the directory
// dfd, or dfd itself when name is "") is one of the protected files or
// another name of one (protection.match), or lies below one. Identities
// are compared on descriptors.
func checkProtected(dfd int, name string, prot *protection, what string) error {
	if prot == nil {
		return nil
	}
	if name != "" {
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			switch k, p := prot.match(idOf(&st), st.Mode&unix.S_IFMT == unix.S_IFREG, uint64(st.Nlink)); k {
			case isProtected:
				return refusef("%s is the agent's own state (%s): never copied", what, p)
			case maybeProtected:
				return refusef("%s has other hard links, and cannot be told apart from the agent's own state (%s): never copied", what, p)
			}
		}
	}
	if name == "" {
		if id, err := fdID(dfd); err == nil && prot.byID(id) != "" {
			return refusef("%s is the agent's own state (%s): never copied", what, prot.byID(id))
		}
	}
	var found string
	if err := walkUp(dfd, func(id fileID) bool {
		found = prot.byID(id)
		return found != ""
	}); err != nil {
		return fmt.Errorf("%s: check its parents: %w", what, err)
	}
	if found != "" {
		return refusef("%s is inside the agent's own state (%s): never copied", what, found)
	}
	return nil
}
