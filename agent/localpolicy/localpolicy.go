package localpolicy

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/tetherfleet/tether/internal/filetype"
)

// DefaultPath is where the agent looks for its local policy when no
// --local-policy flag names one; a missing file there means no local policy.
const DefaultPath = "/etc/tether/agent-policy.yaml"

// MaxFileSize bounds a local policy file, in bytes.
const MaxFileSize = 1 << 20

// Version is the only local policy file version.
const Version = 1

// Policy is a parsed local policy. It is immutable and safe for concurrent
// use. The zero value allows nothing.
type Policy struct {
	// File is the path the policy was read from, named in refusals.
	File string
	// Users are the entries of users, in file order.
	Users []UserRule
	// CopyRoots are the copy roots of every allowed user (absolute,
	// cleaned).
	CopyRoots []string
	// Exec, Shell and Forward say whether exec, pty and dial streams are
	// served.
	Exec, Shell, Forward bool
	// Targets are the dial targets that may be reached; nil (the key
	// omitted) means every target the agent has.
	Targets []string

	// lookupGroup resolves a group name to its gid; nil means os/user.
	lookupGroup func(name string) (uint32, error)
}

// UserRule is one entry of users: exactly one of Name, UID and Group is
// set.
type UserRule struct {
	Name  string
	UID   *uint32
	Group string // a group name or a decimal gid
	// CopyRoots are further copy roots of the accounts this entry matches.
	CopyRoots []string
	// Line is the entry's line in the file.
	Line int
}

// String spells the rule as the file does ("name: alice").
func (r UserRule) String() string {
	switch {
	case r.Name != "":
		return "name: " + r.Name
	case r.UID != nil:
		return fmt.Sprintf("uid: %d", *r.UID)
	default:
		return "group: " + r.Group
	}
}

// Account is a local account a job would run as, as the agent resolved it
// from the passwd and group databases.
type Account struct {
	Name string
	UID  uint32
	GID  uint32 // primary group
	// Groups are the supplementary groups' ids.
	Groups []uint32
}

// String is "alice (uid 1001)".
func (a Account) String() string { return fmt.Sprintf("%s (uid %d)", a.Name, a.UID) }

// Refusal is what the local policy refuses: it names the file, what was
// asked and the rule that would have allowed it.
type Refusal struct {
	// File is the local policy file.
	File string
	// What is the refused request ("run as bob (uid 1002)").
	What string
	// Rule is the missing rule, spelled as the file would spell it
	// ("users: name: bob", "shell: true").
	Rule string
	// Note, if set, says more ("its copy roots: /srv").
	Note string
}

func (r *Refusal) Error() string {
	msg := fmt.Sprintf("refused by the local policy %s: %s is not allowed (no %q rule)", r.File, r.What, r.Rule)
	if r.Note != "" {
		msg += "; " + r.Note
	}
	return msg
}

// ErrRefused matches every *Refusal with errors.Is.
var ErrRefused = errors.New("localpolicy: refused")

// Is makes errors.Is(err, ErrRefused) true for a *Refusal.
func (r *Refusal) Is(target error) bool { return target == ErrRefused }

func (p *Policy) refuse(what, rule string) error {
	return &Refusal{File: p.File, What: what, Rule: rule}
}

// AllowExec returns nil if exec streams are allowed, else a *Refusal.
func (p *Policy) AllowExec() error {
	if p.Exec {
		return nil
	}
	return p.refuse("exec (commands and detached jobs)", "exec: true")
}

// AllowShell returns nil if pty streams are allowed, else a *Refusal.
func (p *Policy) AllowShell() error {
	if p.Shell {
		return nil
	}
	return p.refuse("shell (pty)", "shell: true")
}

// AllowDial returns nil if a dial stream to target is allowed, else a
// *Refusal.
func (p *Policy) AllowDial(target string) error {
	if !p.Forward {
		return p.refuse("forward to target "+strconv.Quote(target), "forward: true")
	}
	if p.Targets != nil && !slices.Contains(p.Targets, target) {
		return p.refuse("forward to target "+strconv.Quote(target), "targets: "+target)
	}
	return nil
}

// AllowUser returns nil if jobs may run as acct, else a *Refusal.
func (p *Policy) AllowUser(acct Account) error {
	if len(p.matching(acct)) > 0 {
		return nil
	}
	return p.refuse("run as "+acct.String(), "users: - name: "+acct.Name)
}

// matching returns the entries of users that match acct.
func (p *Policy) matching(acct Account) []*UserRule {
	var out []*UserRule
	for i := range p.Users {
		r := &p.Users[i]
		switch {
		case r.Name != "":
			if r.Name == acct.Name {
				out = append(out, r)
			}
		case r.UID != nil:
			if *r.UID == acct.UID {
				out = append(out, r)
			}
		default:
			gid, err := p.groupID(r.Group)
			if err == nil && (gid == acct.GID || slices.Contains(acct.Groups, gid)) {
				out = append(out, r)
			}
		}
	}
	return out
}

// groupID resolves a group of a rule: a decimal gid, or a name looked up
// now (so a group created after the file was loaded is found).
func (p *Policy) groupID(g string) (uint32, error) {
	if n, err := strconv.ParseUint(g, 10, 32); err == nil {
		return uint32(n), nil
	}
	if p.lookupGroup != nil {
		return p.lookupGroup(g)
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(gr.Gid, 10, 32)
	return uint32(n), err
}

// CopyRootsFor returns the copy roots of acct: the global copy_roots and those
// of every entry of users that matches it. It refuses an account no entry
// matches, and one with no copy root at all.
func (p *Policy) CopyRootsFor(acct Account) ([]string, error) {
	rules := p.matching(acct)
	if len(rules) == 0 {
		return nil, p.AllowUser(acct)
	}
	roots := slices.Clone(p.CopyRoots)
	for _, r := range rules {
		for _, c := range r.CopyRoots {
			if !slices.Contains(roots, c) {
				roots = append(roots, c)
			}
		}
	}
	if len(roots) == 0 {
		return nil, p.refuse("copy as "+acct.String(), "copy_roots")
	}
	return roots, nil
}

// CheckCopy returns the copy roots of acct (CopyRootsFor) after checking
// that path, an absolute path, lies lexically under one of them; a refusal
// names the path. Symlinks are not followed here: the copy itself resolves
// the path on descriptors, confined to the same roots.
func (p *Policy) CheckCopy(acct Account, path string) ([]string, error) {
	roots, err := p.CopyRootsFor(acct)
	if err != nil {
		return nil, err
	}
	if !filepath.IsAbs(path) || !Under(roots, path) {
		return nil, &Refusal{File: p.File, What: fmt.Sprintf("copy of %s as %s", path, acct), Rule: "copy_roots: " + path,
			Note: "its copy roots: " + strings.Join(roots, ", ")}
	}
	return roots, nil
}

// Under reports whether the absolute path lies at or below one of roots
// (absolute, cleaned), comparing cleaned paths component by component.
func Under(roots []string, path string) bool {
	path = filepath.Clean(path)
	for _, r := range roots {
		if r == "/" || path == r || strings.HasPrefix(path, r+"/") {
			return true
		}
	}
	return false
}

// Load reads and parses the local policy at path. It refuses a file that is
// not a regular file, is owned by neither root nor the agent's own uid, or
// is writable by its group or by others (a user who could edit it could
// grant himself anything), and one larger than MaxFileSize. The checks are
// made on the open descriptor, so the file checked is the file read.
func Load(path string) (*Policy, error) {
	// O_NONBLOCK: a FIFO put in the file's place opens at once (and is
	// then refused as not regular) instead of blocking the reload, and
	// with it every later SIGHUP and the shutdown, until a writer comes.
	// It changes nothing for a regular file.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("local policy: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("local policy: %w", err)
	}
	if err := checkFileMode(path, fi, uint32(os.Geteuid())); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("local policy: read %s: %w", path, err)
	}
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("local policy %s: larger than %d bytes", path, MaxFileSize)
	}
	return Parse(path, b)
}

// checkFileMode refuses a file that is not regular, not owned by root or
// uid, or writable by group or others.
func checkFileMode(path string, fi os.FileInfo, uid uint32) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("local policy %s: not a regular file (%s)", path, filetype.Of(fi.Mode()))
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("local policy %s: cannot tell its owner", path)
	}
	if st.Uid != 0 && st.Uid != uid {
		return fmt.Errorf("local policy %s: owned by uid %d; it must be owned by root (or the agent's uid %d)", path, st.Uid, uid)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("local policy %s: mode %04o is writable by its group or others; it must not be (chmod go-w)", path, perm)
	}
	return nil
}
