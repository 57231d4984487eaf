package agent

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/protocol"
)

// Running as a user. An exec, pty or copy names the local account it runs
// as (ExecParams.User, PTYParams.User, CopyParams.User: a name or a decimal
// uid, set by the coordinator from its policy); empty means the agent's own
// account. The agent resolves it from the passwd and group databases
// (os/user), checks it against the local policy (localpolicy.go), and
// starts the process with that account's uid, primary gid and
// supplementary groups (SysProcAttr.Credential), HOME, USER, LOGNAME and
// SHELL from its passwd entry, in its home directory unless the params
// name a cwd (a relative cwd is taken from the home). An account whose home
// is unset or not a directory starts in "/", as sshd does. With no user
// named, everything is as before users existed: the agent's own
// environment, the data directory as the default cwd.
//
// The process's credentials are changed only when the account's uid is not
// the agent's own: an agent running as alice asked to run as alice runs
// the process as itself (it could not call setgroups anyway), and an agent
// that is not root cannot run as anyone else (the start fails with EPERM,
// which is reported).

// Error codes of refusals about users (protocol.ErrorInfo.Code).
const (
	codeUnknownUser = protocol.CodeUnknownUser
	codeForbidden   = protocol.CodeForbidden
)

// account is a resolved local account.
type account struct {
	localpolicy.Account
	home, shell string
	// named is set when the params named the account (User != "").
	named bool
	// self is set when the account's uid is the agent's own: processes
	// run with the agent's credentials.
	self bool
}

// accountTTL is how long a resolved account is reused: resolving one reads
// the passwd and group databases (getpwnam_r, getgrouplist, /etc/passwd
// again for the shell), which cost more per exec than everything
// authorization adds on the coordinator (BenchmarkExecAuth's profile). An
// account added, removed or given other groups is seen within it.
const accountTTL = 5 * time.Second

// accounts caches lookupAccount's results by user, at most maxAccounts.
var accounts struct {
	mu sync.Mutex
	m  map[string]cachedAccount
}

const maxAccounts = 256

type cachedAccount struct {
	acct account
	at   time.Time
}

// lookupAccount resolves u (a user name, a decimal uid, or "" for the
// agent's own account) on this node, reusing a resolution younger than
// accountTTL. The caller owns the result.
func lookupAccount(u string) (*account, error) {
	now := time.Now()
	accounts.mu.Lock()
	c, ok := accounts.m[u]
	accounts.mu.Unlock()
	if ok && now.Sub(c.at) < accountTTL {
		a := c.acct
		a.Groups = slices.Clone(a.Groups)
		return &a, nil
	}
	a, err := resolveAccount(u)
	if err != nil {
		return nil, err
	}
	accounts.mu.Lock()
	if accounts.m == nil || len(accounts.m) >= maxAccounts {
		accounts.m = make(map[string]cachedAccount)
	}
	c = cachedAccount{acct: *a, at: now}
	c.acct.Groups = slices.Clone(a.Groups)
	accounts.m[u] = c
	accounts.mu.Unlock()
	return a, nil
}

// resolveAccount is lookupAccount without the cache.
func resolveAccount(u string) (*account, error) {
	var pw *user.User
	var err error
	switch {
	case u == "":
		pw, err = user.Current()
		if err != nil {
			// A uid without a passwd entry (a container started with
			// --user 1234): the agent's own credentials and $HOME.
			uid := uint32(os.Geteuid())
			acct := &account{self: true, home: os.Getenv("HOME"), shell: os.Getenv("SHELL")}
			acct.Name, acct.UID, acct.GID = strconv.Itoa(int(uid)), uid, uint32(os.Getegid())
			return acct, nil
		}
	case isDecimal(u):
		pw, err = user.LookupId(u)
	default:
		pw, err = user.Lookup(u)
	}
	if err != nil {
		var unknownUser user.UnknownUserError
		var unknownID user.UnknownUserIdError
		if errors.As(err, &unknownUser) || errors.As(err, &unknownID) {
			return nil, errUnknownUser
		}
		return nil, err
	}
	uid, err1 := strconv.ParseUint(pw.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(pw.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("uid %q or gid %q is not a number", pw.Uid, pw.Gid)
	}
	acct := &account{named: u != "", home: pw.HomeDir, shell: loginShell(pw.Username)}
	acct.Name, acct.UID, acct.GID = pw.Username, uint32(uid), uint32(gid)
	acct.self = acct.UID == uint32(os.Geteuid())
	gids, err := pw.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("groups of %s: %w", pw.Username, err)
	}
	for _, g := range gids {
		n, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("groups of %s: gid %q is not a number", pw.Username, g)
		}
		if uint32(n) != acct.GID {
			acct.Groups = append(acct.Groups, uint32(n))
		}
	}
	return acct, nil
}

var errUnknownUser = errors.New("no such user")

func isDecimal(s string) bool {
	if s == "" || len(s) > 10 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// loginShell reads name's login shell from /etc/passwd (os/user does not
// expose it); "" when it cannot be read.
func loginShell(name string) string {
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) == 7 && f[0] == name {
			return f[6]
		}
	}
	return ""
}

// credential is the process credential for acct, or nil to run with the
// agent's own.
func (acct *account) credential() *syscall.Credential {
	if acct.self {
		return nil
	}
	return &syscall.Credential{Uid: acct.UID, Gid: acct.GID, Groups: acct.Groups}
}

// shellPath is the account's login shell, else /bin/bash.
func (acct *account) shellPath() string {
	if acct.shell != "" {
		return acct.shell
	}
	return "/bin/bash"
}

// baseDir is where a process of acct starts when its params name no cwd,
// and what a relative cwd is taken from: the data directory for the
// agent's own account (no user named), else the account's home, or "/"
// when it has none.
func (a *Agent) baseDir(acct *account) string {
	if !acct.named {
		return a.cfg.DataDir
	}
	if acct.home != "" {
		if fi, err := os.Stat(acct.home); err == nil && fi.IsDir() {
			return acct.home
		}
	}
	return "/"
}

// resolveDir is the working directory for cwd (see baseDir).
func (a *Agent) resolveDir(acct *account, cwd string) string {
	base := a.baseDir(acct)
	switch {
	case cwd == "":
		return base
	case filepath.IsAbs(cwd):
		return filepath.Clean(cwd)
	default:
		return filepath.Join(base, cwd)
	}
}

// userEnvKeep are the variables of the agent's environment a process of
// another account inherits; the rest (the agent's HOME, XDG and mail
// variables, sudo's, the service manager's) describe the agent's own
// account.
var userEnvKeep = map[string]bool{"PATH": true, "LANG": true, "LANGUAGE": true, "TZ": true}

// procEnv is the environment of a process of acct in dir: the agent's
// environment without its secrets (and, for another account, without
// anything but PATH, LANG, LC_*, TZ), then HOME, USER, LOGNAME and SHELL of
// a named account, PWD, and extra (sorted by name) last, so the params win.
func (a *Agent) procEnv(acct *account, extra map[string]string, dir string) []string {
	if !acct.named {
		return a.childEnv(extra, dir)
	}
	env := os.Environ()
	base := make([]string, 0, len(env)+6+len(extra)) // + PATH, HOME, USER, LOGNAME, SHELL, PWD; extra
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case secretEnvVars[k]:
		case k == "HOME" || k == "USER" || k == "LOGNAME" || k == "SHELL":
		case acct.self || userEnvKeep[k] || strings.HasPrefix(k, "LC_"):
			base = append(base, kv)
		}
	}
	if !acct.self && !hasEnv(base, "PATH") {
		base = append(base, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	home := acct.home
	if home == "" {
		home = "/"
	}
	base = append(base, "HOME="+home, "USER="+acct.Name, "LOGNAME="+acct.Name, "SHELL="+acct.shellPath())
	return a.childEnvFrom(base, extra, dir)
}

func hasEnv(env []string, k string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			return true
		}
	}
	return false
}

// runAs resolves user for an operation of kind op ("exec", "shell" or
// "copy") and checks it against the local policy: the operation itself
// (exec: true, shell: true) and the account (users). It returns the
// account, or the error frame to answer with: unknown_user naming the user
// and the node, forbidden naming the local policy file and the rule
// missing. Copy roots are checked by the copy itself (copyRootsFor).
func (a *Agent) runAs(u, op string) (*account, *protocol.ErrorInfo) {
	lp := a.localPolicy()
	if lp != nil {
		var err error
		switch op {
		case "exec":
			err = lp.AllowExec()
		case "shell":
			err = lp.AllowShell()
		}
		if err != nil {
			return nil, a.forbidden(err)
		}
	}
	acct, err := lookupAccount(u)
	if errors.Is(err, errUnknownUser) {
		return nil, &protocol.ErrorInfo{Code: codeUnknownUser, Message: fmt.Sprintf("node %s: user %s: no such user on this node", a.cfg.NodeID, protocol.Clip(u))}
	}
	if err != nil {
		return nil, &protocol.ErrorInfo{Code: protocol.CodeInternal, Message: fmt.Sprintf("node %s: look up user %s: %v", a.cfg.NodeID, protocol.Clip(u), err)}
	}
	if lp != nil {
		if err := lp.AllowUser(acct.Account); err != nil {
			return nil, a.forbidden(err)
		}
		return acct, nil
	}
	// No local policy: the agent's own account only, as before users
	// existed.
	if !acct.self {
		me := fmt.Sprintf("uid %d", os.Geteuid())
		if cur, err := user.Current(); err == nil {
			me = fmt.Sprintf("%s (uid %s)", cur.Username, cur.Uid)
		}
		hint := a.cfg.RunAsHint
		switch {
		case hint != "":
		case os.Geteuid() != 0:
			hint = fmt.Sprintf("only an agent running as root can run jobs as other users: run it as root with a local policy (%s, or --local-policy) that lists %s", localpolicy.DefaultPath, acct)
		default:
			hint = fmt.Sprintf("write a local policy that lists %s at %s, or pass --local-policy", acct, localpolicy.DefaultPath)
		}
		return nil, &protocol.ErrorInfo{Code: codeForbidden, Message: fmt.Sprintf(
			"node %s: run as %s refused: this agent has no local policy, so it runs jobs only as its own user %s (%s)",
			a.cfg.NodeID, acct, me, hint)}
	}
	return acct, nil
}

// forbidden is the error frame for a local policy refusal.
func (a *Agent) forbidden(err error) *protocol.ErrorInfo {
	a.m.localRefusals.Inc()
	return &protocol.ErrorInfo{Code: codeForbidden, Message: fmt.Sprintf("node %s: %v", a.cfg.NodeID, err)}
}
