//go:build !tetherclient

package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/sshgate"
	"github.com/tetherfleet/tether/policy"
)

// What SIGHUP does with the config file: read it again under the same
// precedence (the command line's flags, then the environment as it was at
// start, then the file), validate the whole result, then apply the keys
// that can change without dropping a session (configRole.live). A change
// of any other key refuses a coordinator's reload, naming the key (it
// cannot change at run time: restart), and is logged as a warning by an
// agent, which keeps the running value until a restart. Any error keeps
// the settings in force.
//
// Each step returns a one-line status (for systemd's STATUS= beside the
// log lines).

// reload is the coordinator's SIGHUP: the config file (when it runs with
// one), the policy, the SSH jump host's authorized keys and user CAs. It
// is all or nothing. First every file is read, once, and checked, and
// nothing changes: the config file (with the limits it sets, as the
// running coordinator would take them), the policy, the key files. If
// any is refused (a bad line, a file that is missing or unsafe), nothing
// is applied, and the status and the log name every problem at once, each
// with its file (and line where known). Otherwise what was checked is
// applied, the same bytes: a file edited after its read waits for the
// next SIGHUP. When the config file's policy key names another file, that
// file is the one read, checked and applied (and reloaded from then on);
// a change of a key that cannot apply at run time is a problem too.
// Once applied, the SSH connections and channels whose key or grant is
// gone are closed (Gate.SetKeys), and so are the attached jobs and
// streams whose caller lost the grant (Coordinator.RecheckCallers).
func (cs *coordinatorServer) reload() (status string) {
	var problems []error
	var cfg *configCheck
	if cs.config != nil {
		var err error
		if cfg, err = cs.checkConfig(); err != nil {
			cs.log.Error("config reload failed; nothing was reloaded (the settings, the policy and the SSH keys in force stay)", "config", cs.config.path, "err", err)
			problems = append(problems, err)
		}
	}
	policyPath := cs.policy.Path()
	var p *policy.Policy
	var err error
	if cfg != nil && cfg.policyPath != "" {
		policyPath = cfg.policyPath
		p, err = cs.policy.CheckPath(policyPath)
	} else {
		p, err = cs.policy.Check()
	}
	if err != nil {
		err = policyReloadError(policyPath, cs.policy.Path(), err)
		cs.log.Error("policy reload failed; nothing was reloaded (the policy loaded before, the settings and the SSH keys in force stay)", "policy", policyPath, "err", err)
		problems = append(problems, err)
	}
	var keys *sshgate.Keys
	if cs.gate != nil {
		if keys, err = cs.gate.ReadKeys(); err != nil {
			cs.log.Error("ssh key files reload failed; nothing was reloaded (the SSH keys, the settings and the policy in force stay)", "err", err)
			problems = append(problems, err)
		}
	}
	if len(problems) != 0 {
		cs.policy.Keep()
		return reloadFailed(problems)
	}

	// Apply what was checked. The limits first: SetLimits takes what
	// CheckLimits took, but should it refuse, nothing has changed yet.
	var parts []string
	if cfg != nil {
		st, err := cs.applyConfig(cfg)
		if err != nil {
			cs.log.Error("config reload failed; nothing was reloaded (the settings, the policy and the SSH keys in force stay)", "config", cs.config.path, "err", err)
			cs.policy.Keep()
			return reloadFailed([]error{err})
		}
		parts = append(parts, st)
	}
	if policyPath != cs.policy.Path() {
		cs.policy.ApplyPath(policyPath, p)
	} else {
		cs.policy.Apply(p)
	}
	logPolicy(cs.log, "policy reloaded", p)
	parts = append(parts, "policy reloaded from "+cs.policy.Path())
	if keys != nil {
		// After the policy's Apply: SetKeys rechecks the jump host's live
		// connections and channels under both (sshgate.Gate.Recheck).
		cs.gate.SetKeys(keys)
		users, cas := keys.Counts()
		parts = append(parts, fmt.Sprintf("SSH keys reloaded (%d authorized keys, %d user CAs)", users, cas))
	}
	// The jobs and streams (ssh-proxy's too) whose grant the new policy
	// took away end now, not when they would have.
	cs.coord.RecheckCallers()
	return strings.Join(parts, "; ")
}

// reloadFailed is the status of a reload that changed nothing: every
// problem, one after the other on one line.
func reloadFailed(problems []error) string {
	var b strings.Builder
	b.WriteString("reload failed (nothing changed: the settings, the policy and the SSH keys in force stay): ")
	for i, err := range problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return b.String()
}

// policyReloadError is the policy Store's Check error at reload, in the
// user's terms: a file that is gone is named as such. path is the file
// read, inForce the one the policy in force was loaded from (they differ
// when the config file's policy key names another file now).
func policyReloadError(path, inForce string, err error) error {
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if path != inForce {
		return fmt.Errorf("policy file %s does not exist (the config file's policy key names it now); the policy loaded before, from %s, stays in force", path, inForce)
	}
	return fmt.Errorf("policy file %s does not exist (deleted or renamed?); the policy loaded before stays in force until it is back", path)
}

// configCheck is a config file re-read and checked, not yet applied.
type configCheck struct {
	live   []configChange
	limits *coordinator.Limits // nil: no live change beyond the log level
	// policyPath is the policy file the policy key names now, when it
	// changed; empty when it did not.
	policyPath string
}

// checkConfig re-reads the coordinator's config file and checks it, the
// limits (coordinator.Limits) it sets included, changing nothing. Its
// errors name the file and the key's line.
func (cs *coordinatorServer) checkConfig() (*configCheck, error) {
	src := cs.config
	fresh, opts, live, fixed, err := src.reread()
	if err != nil {
		if _, serr := os.Stat(src.path); errors.Is(serr, fs.ErrNotExist) {
			err = fmt.Errorf("config file %s does not exist (deleted or renamed?); the settings in force stay until it is back", src.path)
		}
		return nil, err
	}
	if len(fixed) > 0 {
		errs := make([]error, len(fixed))
		for i, c := range fixed {
			errs[i] = src.file.keyError(c.key, fmt.Errorf("cannot change at run time; restart the coordinator (running: %s; now: %s)", c.from, c.to))
		}
		return nil, errors.Join(errs...)
	}
	c := &configCheck{live: live}
	if len(live) == 0 {
		return c, nil
	}
	o := opts.(*coordinatorOptions)
	for _, ch := range live {
		if ch.key == "policy" {
			c.policyPath = o.Policy
		}
	}
	l := coordinator.Limits{MaxHandshakesPerSource: o.MaxHandshakesPerSource, DefaultTimeout: o.ExecTimeout, DrainSpread: o.DrainSpread, AdmitRate: o.AdmitRate}
	if err := cs.coord.CheckLimits(l); err != nil {
		return nil, src.limitsError(err, fresh.Flags())
	}
	c.limits = &l
	return c, nil
}

// applyConfig puts a checked config file in force: the limits first, so
// that a refusal of theirs leaves everything as it was, then the log
// level. It returns the status line.
func (cs *coordinatorServer) applyConfig(c *configCheck) (status string, err error) {
	src := cs.config
	if len(c.live) == 0 {
		cs.log.Info("config reloaded; no setting that applies live changed", "config", src.path)
		return reloadStatus(nil, nil), nil
	}
	if c.limits != nil {
		if err := cs.coord.SetLimits(*c.limits); err != nil {
			return "", err // CheckLimits took them: not reached
		}
	}
	src.commit(src.applyLogLevel(c.live))
	l := cs.coord.Limits()
	cs.log.Info("config reloaded", "config", src.path, "applied", keys(c.live),
		"max_handshakes_per_source", l.MaxHandshakesPerSource, "exec_timeout", l.DefaultTimeout, "drain_spread", l.DrainSpread, "admit_rate", l.AdmitRate)
	return reloadStatus(c.live, nil), nil
}

// limitKeys are the config keys (flag names) that set each
// coordinator.Limits field.
var limitKeys = map[string]string{
	"MaxHandshakesPerSource": "max-handshakes-per-source",
	"DefaultTimeout":         "exec-timeout",
	"DrainSpread":            "drain-spread",
	"AdmitRate":              "admit-rate",
}

// limitsError is SetLimits's refusal err in the config file's terms:
// each *coordinator.LimitError becomes "PATH:LINE: key KEY: VALUE
// PROBLEM", the value as the file wrote it, or "PATH: key KEY (not set:
// VALUE) PROBLEM" for a key the file no longer sets (fs, the re-read
// flags, hold the value then). Other errors stay as they are.
func (s *configSource) limitsError(err error, fs *pflag.FlagSet) error {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		le := (*coordinator.LimitError)(nil)
		key := ""
		if errors.As(e, &le) {
			key = limitKeys[le.Field]
		}
		if key == "" {
			out = append(out, e)
			continue
		}
		if v, ok := s.file.value(key); ok {
			out = append(out, fmt.Errorf("%s:%d: key %s: %s %s", s.path, v.line, v.key, v.scalar, le.Problem))
			continue
		}
		val := "its default"
		if f := fs.Lookup(key); f != nil {
			val = f.Value.String()
		}
		out = append(out, fmt.Errorf("%s: key %s (not set: %s) %s", s.path, key, val, le.Problem))
	}
	return errors.Join(out...)
}

// reloadAgentConfig re-reads the agent's config file and returns the
// local-policy setting it names (cur when it fails), the changes to commit
// once that policy is loaded, and the status of the re-read.
func reloadAgentConfig(src *configSource, cur string, log *slog.Logger) (localPolicy string, live []configChange, status string) {
	_, opts, live, fixed, err := src.reread()
	if err != nil {
		log.Error("config reload failed; the settings in force stay", "config", src.path, "err", err)
		return cur, nil, "config reload failed (the settings in force stay): " + err.Error()
	}
	logFixed(log, src, fixed)
	if len(live) > 0 {
		log.Info("config reloaded", "config", src.path, "applied", keys(live))
	}
	return opts.(*agentOptions).LocalPolicy, src.applyLogLevel(live), reloadStatus(live, fixed)
}

// reloadStatus is the one-line outcome of a re-read that succeeded.
func reloadStatus(live, fixed []configChange) string {
	s := "config reloaded"
	if len(live) > 0 {
		s += ": applied " + strings.Join(keys(live), ", ")
	}
	if len(fixed) > 0 {
		s += fmt.Sprintf("; %d changed key(s) wait for a restart: %s", len(fixed), strings.Join(keys(fixed), ", "))
	}
	return s
}

// logFixed warns of each changed key that does not apply while running.
func logFixed(log *slog.Logger, src *configSource, fixed []configChange) {
	for _, c := range fixed {
		log.Warn("config key changed but does not apply to a running "+src.role.name+"; it keeps the running value until a restart",
			"config", src.path, "key", c.key, "running", c.from, "file", c.to)
	}
}
