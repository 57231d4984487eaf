package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/policy"
)

// What SIGHUP does with the config file: read it again under the same
// precedence (the command line's flags, then the environment as it was at
// start, then the file), validate the whole result, then apply the keys
// that can change without dropping a session (configRole.live) and log a
// warning naming each other key that changed: it waits for a restart, and
// the running value stays. Any error keeps the settings in force.
//
// Each step returns a one-line status (for systemd's STATUS= beside the
// log lines).

// reload is the coordinator's SIGHUP: the config file (when it runs with
// one), then the policy, the SSH jump host's keys and CAs. With a config
// file it is all or nothing: a policy file that would be refused keeps
// the config file's changes out, and a refused config file keeps the
// policy (and the SSH keys) as they are.
func (cs *coordinatorServer) reload() (status string) {
	if cs.config != nil {
		if _, err := policy.Load(cs.policy.Path()); err != nil {
			cs.log.Error("reload failed: the policy file is refused, so neither it nor the config file was applied; nothing changed",
				"policy", cs.policy.Path(), "config", cs.config.path, "err", err)
			return "reload failed (nothing changed): the policy file is refused: " + err.Error()
		}
		st, ok := cs.reloadConfig()
		if !ok {
			cs.log.Error("reload failed: the config file is refused, so the policy was not reloaded either; nothing changed",
				"config", cs.config.path, "policy", cs.policy.Path())
			return st + "; policy not reloaded (nothing changed)"
		}
		status = st + "; "
	}
	return status + cs.reloadPolicy()
}

// reloadConfig re-reads the coordinator's config file and applies the
// limits (coordinator.Limits) and the log level it changes: the limits
// first, so that a refusal of theirs leaves everything as it was.
// ok is false when the file was refused (and nothing changed).
func (cs *coordinatorServer) reloadConfig() (status string, ok bool) {
	src := cs.config
	fresh, opts, live, fixed, err := src.reread()
	if err != nil {
		cs.log.Error("config reload failed; the settings in force stay", "config", src.path, "err", err)
		return "config reload failed (the settings in force stay): " + err.Error(), false
	}
	logFixed(cs.log, src, fixed)
	if len(live) == 0 {
		cs.log.Info("config reloaded; no setting that applies live changed", "config", src.path)
		return reloadStatus(nil, fixed), true
	}
	o := opts.(*coordinatorOptions)
	l := coordinator.Limits{MaxHandshakesPerSource: o.MaxHandshakesPerSource, DefaultTimeout: o.ExecTimeout, DrainSpread: o.DrainSpread, AdmitRate: o.AdmitRate}
	if err := cs.coord.SetLimits(l); err != nil {
		err = src.limitsError(err, fresh.Flags())
		cs.log.Error("config reload failed; the settings in force stay", "config", src.path, "err", err)
		return "config reload failed (the settings in force stay): " + err.Error(), false
	}
	src.commit(src.applyLogLevel(live))
	l = cs.coord.Limits()
	cs.log.Info("config reloaded", "config", src.path, "applied", keys(live),
		"max_handshakes_per_source", l.MaxHandshakesPerSource, "exec_timeout", l.DefaultTimeout, "drain_spread", l.DrainSpread, "admit_rate", l.AdmitRate)
	return reloadStatus(live, fixed), true
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
