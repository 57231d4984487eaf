//go:build !tetherclient

package cli

// The daemons' config file (--config FILE, $TETHER_CONFIG): one strict YAML
// file per role whose keys are the role's flag names, so the flags' help
// and the README's flag lists document the file too.
//
// Precedence, for every setting: a flag given on the command line, then
// the environment variable that stands for it (today only the secret
// ones: $TETHER_TOKEN for token-file, $TETHER_OPENSHELL_TOKEN for
// openshell-token-file, $TETHER_OPENSANDBOX_API_KEY for
// opensandbox-api-key-file), then the file, then the default. A file key
// that a flag or its environment variable overrides is ignored.
//
// Secrets never appear in the file: secret-bearing settings are file
// paths (token-file, nats-creds, facade-token-file, …), or the name of the
// environment variable that holds the secret (token: {env: VARIABLE},
// which the daemon reads and then unsets like $TETHER_TOKEN), or the
// environment variables above; a key that would hold a secret inline is
// refused.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/tetherfleet/tether/internal/yamlerr"
	"github.com/tetherfleet/tether/policy"
)

// configEnv names the config file when --config is not given.
const configEnv = "TETHER_CONFIG"

// configFlag is the flag naming the config file; it is no key of the file.
const configFlag = "config"

// addConfigFlag adds --config to a daemon command.
func addConfigFlag(cmd *cobra.Command) {
	cmd.Flags().String(configFlag, "", "YAML config file whose keys are this command's flag names; flags given here override it, SIGHUP re-reads it (default: $"+configEnv+"; see tether config example)")
}

// configRole is what differs between the roles' config files.
type configRole struct {
	// name is the role: "agent" or "coordinator".
	name string
	// newCmd builds the role's command with fresh defaults and returns it
	// with its options (a pointer to agentOptions or coordinatorOptions).
	newCmd func(e *env) (*cobra.Command, any)
	// validate checks opts as the command does before it starts; envSet
	// tells which of the role's environment variables were set.
	validate func(opts any, envSet func(string) bool) error
	// load, if set, loads the files opts name that the command loads at
	// start (a coordinator's policy), for tether config validate; cf is
	// the config file, whose keys its errors name. Nil when there are
	// none, or opts names none.
	load func(opts any, cf *configFile) error
	// envFirst maps a key to the environment variable that, when set,
	// overrides it.
	envFirst map[string]string
	// secrets maps a key that would hold a secret inline to what to use
	// instead.
	secrets map[string]string
	// secretEnv are the secrets the file may name an environment variable
	// for (token: {env: VARIABLE}), by key: the variable the daemon reads
	// when the file names none, and the key of the file that holds it
	// instead (only one of the two may be given).
	secretEnv map[string]secretRef
	// live are the keys a running daemon applies when SIGHUP re-reads
	// the file. A change of any other key refuses a coordinator's reload
	// (it cannot change at run time); an agent logs it, and it waits for
	// a restart.
	live map[string]bool
}

var agentConfigRole = &configRole{
	name: "agent",
	validate: func(opts any, envSet func(string) bool) error {
		tok := ""
		if envSet(tokenEnv) {
			tok = "set" // Validate only asks whether there is one
		}
		return opts.(*agentOptions).Validate(tok)
	},
	envFirst: map[string]string{
		"token-file":               tokenEnv,
		"openshell-token-file":     openShellTokenEnv,
		"opensandbox-api-key-file": openSandboxAPIKeyEnv,
	},
	secrets: map[string]string{
		"token":               "give token-file: FILE, or token: {env: VARIABLE}, or set $" + tokenEnv,
		"join-token":          "give token-file: FILE, or token: {env: VARIABLE}, or set $" + tokenEnv,
		"openshell-token":     "give openshell-token-file: FILE, or openshell-token: {env: VARIABLE}, or set $" + openShellTokenEnv,
		"opensandbox-api-key": "give opensandbox-api-key-file: FILE, or opensandbox-api-key: {env: VARIABLE}, or set $" + openSandboxAPIKeyEnv,
		"api-key":             "give opensandbox-api-key-file: FILE, or opensandbox-api-key: {env: VARIABLE}, or set $" + openSandboxAPIKeyEnv,
		"password":            "secrets are read from files (the *-file keys) or the environment",
	},
	secretEnv: map[string]secretRef{
		"token":               {tokenEnv, "token-file"},
		"openshell-token":     {openShellTokenEnv, "openshell-token-file"},
		"opensandbox-api-key": {openSandboxAPIKeyEnv, "opensandbox-api-key-file"},
	},
	live: map[string]bool{"local-policy": true, "log-level": true},
}

var coordinatorConfigRole = &configRole{
	name: "coordinator",
	validate: func(opts any, _ func(string) bool) error {
		return opts.(*coordinatorOptions).Validate()
	},
	load: func(opts any, cf *configFile) error {
		o := opts.(*coordinatorOptions)
		if o.Policy == "" {
			return nil // Validate says it is required
		}
		// As the coordinator loads it at start, and tether policy check.
		if _, err := policy.Load(o.Policy); err != nil {
			return cf.keyError("policy", errors.New(strings.TrimPrefix(err.Error(), "policy: ")))
		}
		return nil
	},
	envFirst:  map[string]string{"token-file": tokenEnv},
	secretEnv: map[string]secretRef{"token": {tokenEnv, "token-file"}},
	secrets: map[string]string{
		"token":         "give token-file: FILE (with allow-shared-token), or token: {env: VARIABLE}, or set $" + tokenEnv,
		"join-token":    "agents enroll with join tokens from `tether token create`; the coordinator keeps none in its config",
		"facade-token":  "give facade-token-file: FILE",
		"nats-password": "give nats-creds: FILE (a NATS credentials file)",
		"nats-token":    "give nats-creds: FILE (a NATS credentials file)",
		"nats-user":     "give nats-creds: FILE (a NATS credentials file)",
		"nats-seed":     "give nats-creds: FILE (a NATS credentials file)",
		"nats-nkey":     "give nats-creds: FILE (a NATS credentials file)",
		"tls-key-pem":   "give tls-key: FILE",
		"password":      "secrets are read from files (the *-file keys, nats-creds, tls-key) or the environment",
	},
	live: map[string]bool{
		"max-handshakes-per-source": true,
		"exec-timeout":              true,
		"drain-spread":              true,
		"admit-rate":                true,
		"log-level":                 true,
		"policy":                    true,
	},
}

// secretRef is a secret the config file may name an environment variable
// for.
type secretRef struct {
	env     string // the variable read when the file names none
	fileKey string // the key naming a file that holds the secret instead
}

// The commands refer to their roles, so the roles get their commands here
// (as initializers they would be an initialization cycle).
func init() {
	agentConfigRole.newCmd = func(e *env) (*cobra.Command, any) {
		o := defaultAgentOptions()
		return agentCommand(e, &o), &o
	}
	coordinatorConfigRole.newCmd = func(e *env) (*cobra.Command, any) {
		o := defaultCoordinatorOptions()
		return coordinatorCommand(e, &o), &o
	}
}

// configRoles are the roles with a config file, by name.
var configRoles = map[string]*configRole{"agent": agentConfigRole, "coordinator": coordinatorConfigRole}

// configValue is one setting of a config file.
type configValue struct {
	key    string   // as written: a flag name, or group.name
	flag   string   // the flag it sets
	line   int      // 1-based
	scalar string   // the value, for a flag of one value
	list   []string // the values, for a list flag
	isList bool
}

// configFile is a parsed config file.
type configFile struct {
	path   string
	role   string // the file's role: key, "" if none
	values []configValue
	// envRefs are the secrets' variables the file names (token: {env:
	// VARIABLE}), by the variable each stands for (secretRef.env).
	envRefs map[string]string
	// envRefKeys are the keys (as written) and lines of those {env:}
	// values, by the same variable.
	envRefKeys map[string]configKeyLine
	// refused are the flags whose key the file gives but whose value was
	// refused (parseFile's errors): the checks made before start do not
	// report them again from their defaults.
	refused map[string]bool
}

// configKeyLine is a key as the file wrote it and its line.
type configKeyLine struct {
	key  string
	line int
}

// keyError is err as the error of the key that set flag: each of its
// lines prefixed with "PATH:LINE: key KEY: ".
func (f *configFile) keyError(flag string, err error) error {
	where := f.path
	key := flag
	for _, v := range f.values {
		if v.flag == flag {
			where, key = fmt.Sprintf("%s:%d", f.path, v.line), v.key
			break
		}
	}
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = fmt.Sprintf("%s: key %s: %s", where, key, l)
	}
	return errors.New(strings.Join(lines, "\n"))
}

// line returns the line of the key that set flag, or 0.
func (f *configFile) line(flag string) int {
	v, _ := f.value(flag)
	return v.line
}

// value returns the setting of the key that set flag, if the file has one.
func (f *configFile) value(flag string) (configValue, bool) {
	for _, v := range f.values {
		if v.flag == flag {
			return v, true
		}
	}
	return configValue{}, false
}

// parseConfig decodes data, the config file path of role r, against fs,
// the role command's flags. It reports every problem, each as
// "PATH:LINE: key KEY: problem": an unknown key (with the nearest flag
// name), a value of the wrong type (naming the type wanted), a secret
// given inline, a key set twice, a role: other than r's. An empty file is
// a valid file that sets nothing.
func parseConfig(path string, data []byte, fs *pflag.FlagSet, r *configRole) (*configFile, error) {
	cf, err := parseFile(path, data, fs, r)
	if err != nil {
		return nil, err
	}
	return cf, nil
}

// parseFile is parseConfig that, when the file is YAML (one mapping
// document) of r's role, also returns the keys it accepted beside the
// errors of the others, so that the checks made before start can run on
// them and every problem is reported at once. cf is nil when there is
// nothing to go on (bad YAML, another role).
func parseFile(path string, data []byte, fs *pflag.FlagSet, r *configRole) (*configFile, error) {
	cf := &configFile{path: path, envRefs: map[string]string{}, envRefKeys: map[string]configKeyLine{}, refused: map[string]bool{}}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return cf, nil
		}
		return nil, yamlerr.Syntax(path, data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil { // the second document's own syntax error, at its line
			return nil, yamlerr.Syntax(path, data, err)
		}
		return nil, fmt.Errorf("%s:%d: one YAML document expected, found more (the --- line)", path, extra.Line)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return cf, nil
	}
	p := &configParser{cf: cf, fs: fs, r: r, seen: map[string]int{}}
	if root.Kind != yaml.MappingNode {
		p.errf(root, "", "the file must be a mapping of keys (flag names) to values")
	} else {
		p.mapping(root, "", "")
	}
	if len(p.errs) > 0 {
		if p.otherRole || root.Kind != yaml.MappingNode {
			return nil, errors.Join(p.errs...)
		}
		return cf, errors.Join(p.errs...)
	}
	return cf, nil
}

type configParser struct {
	cf   *configFile
	fs   *pflag.FlagSet
	r    *configRole
	seen map[string]int // flag -> line that set it
	errs []error
	// otherRole: the file's role: is not r's.
	otherRole bool
}

func (p *configParser) errf(n *yaml.Node, key, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if key != "" {
		msg = "key " + key + ": " + msg
	}
	p.errs = append(p.errs, fmt.Errorf("%s:%d: %s", p.cf.path, n.Line, msg))
}

// mapping walks a mapping whose keys are under the group prefix (flag
// name prefix "log-" for group "log") and keyPrefix ("log." as written).
func (p *configParser) mapping(n *yaml.Node, prefix, keyPrefix string) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			// It has no key name to give: say what it is, and where.
			under := ""
			if keyPrefix != "" {
				under = " under " + strings.TrimSuffix(keyPrefix, ".") + ":"
			}
			p.errf(k, "", "keys must be strings (flag names);%s this one is %s", under, nodeKind(k))
			continue
		}
		key := keyPrefix + k.Value
		name := prefix + k.Value
		if key == "role" {
			p.role(k, v)
			continue
		}
		if v.Kind == yaml.AliasNode {
			p.errf(k, key, "YAML aliases are not accepted: write the value")
			continue
		}
		if ref, ok := p.r.secretEnv[name]; ok && v.Kind == yaml.MappingNode {
			p.envRef(k, v, key, name, ref)
			continue
		}
		if hint, ok := p.r.secrets[name]; ok {
			p.errf(k, key, "a secret is not accepted inline in a config file: %s", hint)
			continue
		}
		f := p.fs.Lookup(name)
		if f == nil || name == configFlag || name == "help" {
			if v.Kind == yaml.MappingNode && p.hasFlagPrefix(name+"-") {
				// A group: log: {level: debug} is log-level: debug.
				p.mapping(v, name+"-", key+".")
				continue
			}
			p.errf(k, key, "unknown key for the %s%s", p.r.name, p.suggest(name))
			continue
		}
		if first, dup := p.seen[name]; dup {
			p.errf(k, key, "sets %s again (first set on line %d)", name, first)
			continue
		}
		if sk := p.secretKeyOf(name); sk != "" && p.seen[sk] > 0 {
			p.errf(k, key, "give %s or %s (line %d), not both", name, sk, p.seen[sk])
			continue
		}
		p.seen[name] = k.Line
		cv := configValue{key: key, flag: name, line: k.Line}
		if !p.value(&cv, f, v) {
			p.cf.refused[name] = true
			continue
		}
		p.cf.values = append(p.cf.values, cv)
	}
}

// envVarName is what an environment variable's name may be.
var envVarName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })

// envRef reads a secret's {env: VARIABLE}.
func (p *configParser) envRef(k, v *yaml.Node, key, name string, ref secretRef) {
	if len(v.Content) != 2 || v.Content[0].Value != "env" || v.Content[1].Kind != yaml.ScalarNode || v.Content[1].Tag != "!!str" || !envVarName().MatchString(v.Content[1].Value) {
		p.errf(v, key, "want {env: VARIABLE}: the name of the environment variable that holds the secret")
		return
	}
	if first, dup := p.seen[name]; dup {
		p.errf(k, key, "set again (first set on line %d)", first)
		return
	}
	if l, both := p.seen[ref.fileKey]; both {
		p.errf(k, key, "give %s or %s (line %d), not both", name, ref.fileKey, l)
		return
	}
	p.seen[name] = k.Line
	p.cf.envRefs[ref.env] = v.Content[1].Value
	p.cf.envRefKeys[ref.env] = configKeyLine{key, k.Line}
}

// role checks the role: key.
func (p *configParser) role(k, v *yaml.Node) {
	if line, ok := p.seen["role"]; ok {
		p.errf(k, "role", "sets role again (first set on line %d)", line)
		return
	}
	p.seen["role"] = k.Line
	if v.Kind != yaml.ScalarNode || v.Tag != "!!str" || configRoles[v.Value] == nil {
		p.errf(k, "role", "want agent or coordinator")
		return
	}
	p.cf.role = v.Value
	if v.Value != p.r.name {
		p.otherRole = true
		p.errf(k, "role", "this is %s config file, not %s", possessive(v.Value), possessive(p.r.name))
	}
}

// secretKeyOf is the secret key whose file flag is name, or "".
func (p *configParser) secretKeyOf(name string) string {
	for k, ref := range p.r.secretEnv {
		if ref.fileKey == name {
			return k
		}
	}
	return ""
}

// hasFlagPrefix reports whether some flag's name starts with prefix.
func (p *configParser) hasFlagPrefix(prefix string) bool {
	found := false
	p.fs.VisitAll(func(f *pflag.Flag) {
		found = found || strings.HasPrefix(f.Name, prefix)
	})
	return found
}

// suggest names the flag nearest to name, if one is near.
func (p *configParser) suggest(name string) string {
	best, bestD := "", 3
	p.fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == configFlag || f.Name == "help" {
			return
		}
		d := editDistance(name, f.Name)
		if strings.HasPrefix(name, f.Name+"-") || strings.HasPrefix(f.Name, name+"-") {
			d = min(d, 2) // listen-addr for listen
		}
		if d < bestD {
			best, bestD = f.Name, d
		}
	})
	if best == "" {
		return " (the keys are the flags of tether " + p.r.name + " --help, without the dashes)"
	}
	return "; did you mean " + best + "?"
}

// value checks v against the flag's type and fills cv; false after an error.
func (p *configParser) value(cv *configValue, f *pflag.Flag, v *yaml.Node) bool {
	typ := f.Value.Type()
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		p.errf(v, cv.key, "no value: want %s (delete the key for the default)", typeName(typ))
		return false
	}
	if _, ok := f.Value.(pflag.SliceValue); ok {
		if v.Kind != yaml.SequenceNode {
			p.errf(v, cv.key, "want %s, e.g. [a, b] or one \"- item\" a line", typeName(typ))
			return false
		}
		cv.isList = true
		for _, item := range v.Content {
			if item.Kind != yaml.ScalarNode || item.Tag != "!!str" {
				p.errf(item, cv.key, "want %s; this item is %s", typeName(typ), nodeKind(item))
				return false
			}
			cv.list = append(cv.list, item.Value)
		}
		return true
	}
	if v.Kind != yaml.ScalarNode {
		p.errf(v, cv.key, "want %s, got %s", typeName(typ), nodeKind(v))
		return false
	}
	ok := true
	switch {
	case typ == "bool":
		ok = v.Tag == "!!bool"
	case typ == "string":
		ok = v.Tag == "!!str"
	case typ == "duration":
		// As on the command line (durationFlag): "30s", or a bare number
		// of seconds ("30", "1.5"); scratchSet checks the value.
		ok = v.Tag == "!!str" || v.Tag == "!!int" || v.Tag == "!!float"
	case intTypes().MatchString(typ):
		ok = v.Tag == "!!int"
	case typ == "float64" || typ == "float32":
		if ok = v.Tag == "!!int" || v.Tag == "!!float"; ok {
			x, err := strconv.ParseFloat(v.Value, 64)
			// YAML's .nan and .inf (which ParseFloat does not read), or an overflow.
			if err != nil && v.Tag == "!!float" || err == nil && (math.IsNaN(x) || math.IsInf(x, 0)) {
				p.errf(v, cv.key, "want a finite number, got %s", v.Value)
				return false
			}
			ok = err == nil
		}
	}
	if !ok {
		p.errf(v, cv.key, "want %s, got %s", typeName(typ), nodeKind(v))
		return false
	}
	// Set checks what the tags cannot (an int's range, a custom type),
	// on a scratch copy so that a bad value leaves nothing behind.
	if err := scratchSet(f, v.Value); err != nil {
		// A duration flag's own error says what it wants, or what is
		// wrong with a value of the right kind (an overflow): no second
		// "want" before it.
		if typ == "duration" {
			p.errf(v, cv.key, "%v", err)
		} else {
			p.errf(v, cv.key, "want %s: %v", typeName(typ), err)
		}
		return false
	}
	cv.scalar = v.Value
	return true
}

// scratchSet checks that f's type accepts s, on a fresh value of its type
// so that f does not change. A type cloneValue does not know passes: Set
// on apply reports its errors.
func scratchSet(f *pflag.Flag, s string) error {
	c := cloneValue(f.Value)
	if c == nil {
		return nil
	}
	return c.Set(s)
}

// cloneValue returns a fresh value of v's type for the common pflag types,
// nil for others.
func cloneValue(v pflag.Value) pflag.Value {
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	switch v.Type() {
	case "bool":
		fs.Bool("x", false, "")
	case "string":
		fs.String("x", "", "")
	case "duration":
		if df, ok := v.(durationFlag); ok {
			return durationFlag{d: new(time.Duration), min: df.min, max: df.max}
		}
		fs.Duration("x", 0, "")
	case "int":
		fs.Int("x", 0, "")
	case "int64":
		fs.Int64("x", 0, "")
	case "uint16":
		fs.Uint16("x", 0, "")
	case "uint32":
		fs.Uint32("x", 0, "")
	case "float64":
		fs.Float64("x", 0, "")
	default:
		return nil
	}
	return fs.Lookup("x").Value
}

// nodeKind describes what a YAML node holds, for type errors.
func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	switch n.Tag {
	case "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	case "!!int":
		return "the whole number " + n.Value
	case "!!float":
		return "the number " + n.Value
	case "!!bool":
		return "the boolean " + n.Value
	case "!!null":
		return "no value"
	}
	return fmt.Sprintf("%q (%s)", n.Value, strings.TrimPrefix(n.Tag, "!!"))
}

// apply sets fs's flags from cf, except those for which skip returns a
// reason (given on the command line, overridden by the environment);
// skipped reports those. Set marks no flag as given on the command line.
func (cf *configFile) apply(fs *pflag.FlagSet, skip func(flag string) string) (skipped map[string]string, err error) {
	skipped = map[string]string{}
	var errs []error
	for _, v := range cf.values {
		if why := skip(v.flag); why != "" {
			skipped[v.flag] = why
			continue
		}
		f := fs.Lookup(v.flag)
		var serr error
		if v.isList {
			serr = f.Value.(pflag.SliceValue).Replace(v.list)
		} else {
			serr = f.Value.Set(v.scalar)
		}
		if serr != nil {
			errs = append(errs, fmt.Errorf("%s:%d: key %s: %v", cf.path, v.line, v.key, serr))
		}
	}
	return skipped, errors.Join(errs...)
}

// flagRef finds the flag an option error names (--name).
var flagRef = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`) })

// annotate prefixes each line of err (the options' Validate errors, which
// name flags) whose flag the file set with the file and the key's line.
func (cf *configFile) annotate(err error) error {
	if err == nil || cf == nil {
		return err
	}
	var out []error
	named := map[string]bool{}
	for _, line := range strings.Split(err.Error(), "\n") {
		if m := flagRef().FindStringSubmatch(line); m != nil {
			if cf.refused[m[1]] {
				continue // its own error says what is wrong with it
			}
			if v, ok := cf.value(m[1]); ok {
				// "--flag VALUE PROBLEM" or "--flag: PROBLEM" in the file's
				// terms: "key KEY: VALUE PROBLEM". A sentence about the flag
				// ("--tls-cert and --tls-key go together") stays as it is.
				if rest, ok := strings.CutPrefix(line, m[0]); ok && flagValueFollows(rest) {
					line = "key " + v.key + ": " + strings.TrimLeft(strings.TrimPrefix(rest, ":"), " ")
				}
				line = fmt.Sprintf("%s:%d: %s", cf.path, v.line, line)
			} else {
				line = cf.missingKey(line)
			}
		}
		out = append(out, errors.New(line))
		// An error that a secret is missing names its variable ($TETHER_TOKEN):
		// when the file named another variable for it, that one was empty
		// too (the secret would be there otherwise), and is what to set.
		for std, ref := range cf.envRefs {
			if kl := cf.envRefKeys[std]; !named[std] && regexp.MustCompile(`\b`+regexp.QuoteMeta(std)+`\b`).MatchString(line) {
				named[std] = true
				out = append(out, fmt.Errorf("%s:%d: key %s: $%s is not set or empty (it stands for $%s)", cf.path, kl.line, kl.key, ref, std))
			}
		}
	}
	return errors.Join(out...)
}

// requiredRef matches an option error that a required flag is missing:
// "--FLAG is required", "--FLAG FILE is required: why".
var requiredRef = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^--([a-z0-9][a-z0-9-]*)(?: [A-Z]+)? is required\b`)
})

// missingKey returns line, an option error about a value the file does
// not set, in the file's terms when it says that a required value is
// missing, so that the operator is told which key to add: "--coordinator
// is required" becomes "PATH: key coordinator: required (or
// --coordinator)", and the agent's join token error names token-file
// (unless the file names the token another way, whose own error follows).
// Any other line is returned as it is.
func (cf *configFile) missingKey(line string) string {
	if m := requiredRef().FindStringSubmatch(line); m != nil {
		return fmt.Sprintf("%s: key %s: required (or --%s)%s", cf.path, m[1], m[1], line[len(m[0]):])
	}
	if strings.HasPrefix(line, joinTokenRequired) {
		if _, named := cf.envRefKeys[tokenEnv]; !named {
			return fmt.Sprintf("%s: key token-file: %s", cf.path, line)
		}
	}
	return line
}

// flagValueFollows reports whether rest, what follows "--flag" in an
// option error, is ": PROBLEM" or " VALUE ..." with a value that starts
// with no letter (-3, -5s, "x"), rather than a sentence.
func flagValueFollows(rest string) bool {
	switch {
	case strings.HasPrefix(rest, ":"):
		return true
	case strings.HasPrefix(rest, " ") && len(rest) > 1:
		c := rest[1]
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z')
	}
	return false
}

// configSource is the config file a running daemon was started with, and
// what re-reading it needs.
type configSource struct {
	path string
	role *configRole
	e    *env
	// cmd is the running command: its flags hold the settings in force.
	cmd *cobra.Command
	// log are its logging options (nil: none to change).
	log *logOptions
	// cli are the flags given on the command line, by name, with their
	// values; they override the file on every re-read.
	cli map[string][]string
	// envSet are the role's environment variables (envFirst) that were
	// set at start: the daemon may have cleared them since.
	envSet map[string]bool
	// refSet are the secrets (by secretRef.env) whose variable, as the
	// file named it at start, was set.
	refSet map[string]bool
	// file is the file as last loaded (for lines in messages).
	file *configFile
}

// loadDaemonConfig applies the config file of cmd (--config, else
// $TETHER_CONFIG; none: nil, nil) to cmd's flags under the precedence
// above. Errors name the file and line. With an error in some keys it
// returns the source as well (the others applied), for the caller to add
// its own checks' errors (annotate) to the report. log are the running command's
// logging options, whose level a re-read may change.
func loadDaemonConfig(cmd *cobra.Command, e *env, r *configRole, log *logOptions) (*configSource, error) {
	path := cmd.Flags().Lookup(configFlag).Value.String()
	if path == "" {
		path = e.getenv(configEnv)
	}
	if path == "" {
		return nil, nil
	}
	s := &configSource{path: path, role: r, e: e, cmd: cmd, log: log, cli: map[string][]string{}, envSet: map[string]bool{}}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if f.Name == configFlag {
			return
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			s.cli[f.Name] = sv.GetSlice()
		} else {
			s.cli[f.Name] = []string{f.Value.String()}
		}
	})
	for _, v := range r.envFirst {
		s.envSet[v] = e.getenv(v) != ""
	}
	cf, err := s.read(cmd.Flags())
	if cf == nil {
		return nil, err
	}
	s.file = cf
	if err != nil {
		// The caller adds the checks it makes before start (annotate).
		return s, err
	}
	s.refSet = map[string]bool{}
	for std := range cf.envRefs {
		s.refSet[std] = s.getenv(e, std) != ""
	}
	return s, nil
}

// read parses the file and applies it to fs. On an error in some keys
// it still returns the file (nil: none to go on) with the others applied,
// for the checks made before start (configFile.annotate drops what they
// say of the refused keys).
func (s *configSource) read(fs *pflag.FlagSet) (*configFile, error) {
	data, err := readConfigFile(s.path)
	if err != nil {
		return nil, err
	}
	cf, perr := parseFile(s.path, data, fs, s.role)
	if cf == nil {
		return nil, perr
	}
	_, aerr := cf.apply(fs, s.skip)
	return cf, errors.Join(perr, aerr)
}

// skip is why the file's flag is not applied: given on the command line,
// or its environment variable set.
func (s *configSource) skip(flag string) string {
	if _, ok := s.cli[flag]; ok {
		return "--" + flag + " was given"
	}
	if v := s.role.envFirst[flag]; v != "" && s.envSet[v] {
		return "$" + v + " is set"
	}
	return ""
}

// getenv is the value of the secret variable name (secretRef.env) for the
// daemon: $name when set (the environment overrides the file), else the
// variable the file names for it, if any. s may be nil: then it is $name.
func (s *configSource) getenv(e *env, name string) string {
	if v := e.getenv(name); v != "" || s == nil {
		return v
	}
	if ref := s.file.envRefs[name]; ref != "" {
		return e.getenv(ref)
	}
	return ""
}

// envRefs lists the variables the file names for secrets; s may be nil.
func (s *configSource) envRefs() []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, v := range s.file.envRefs {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// annotate is configFile.annotate for the file as loaded; s may be nil.
func (s *configSource) annotate(err error) error {
	if s == nil {
		return err
	}
	return s.file.annotate(err)
}

// configChange is a setting whose value in the file differs from the one
// in force.
type configChange struct {
	key, from, to string
}

// reread reads the file again into a fresh command of the role with the
// command line's flags replayed, validates the result and compares it
// with the settings in force: live are the changes the role applies while
// running, fixed the others. opts are the fresh command's options. Any
// error leaves everything as it was.
func (s *configSource) reread() (fresh *cobra.Command, opts any, live, fixed []configChange, err error) {
	fresh, opts = s.role.newCmd(s.e)
	fs := fresh.Flags()
	for name, vals := range s.cli {
		f := fs.Lookup(name)
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			err = sv.Replace(vals)
		} else {
			err = f.Value.Set(vals[0])
		}
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("--%s: %w", name, err)
		}
		f.Changed = true
	}
	cf, err := s.read(fs)
	if cf == nil {
		return nil, nil, nil, nil, err
	}
	if err := errors.Join(err, cf.annotate(s.role.validate(opts, func(v string) bool { return s.envSet[v] || s.refSet[v] }))); err != nil {
		return nil, nil, nil, nil, err
	}
	s.cmd.Flags().VisitAll(func(old *pflag.Flag) {
		if old.Name == configFlag || old.Name == "help" {
			return
		}
		nf := fs.Lookup(old.Name)
		if nf == nil || nf.Value.String() == old.Value.String() {
			return
		}
		c := configChange{key: old.Name, from: old.Value.String(), to: nf.Value.String()}
		if s.role.live[old.Name] {
			live = append(live, c)
		} else {
			fixed = append(fixed, c)
		}
	})
	s.file = cf
	return fresh, opts, live, fixed, nil
}

// applyLogLevel puts a changed log-level of live in force (and commits
// it) and returns the other changes.
func (s *configSource) applyLogLevel(live []configChange) (rest []configChange) {
	for _, c := range live {
		if c.key != "log-level" || s.log == nil || s.log.level == nil {
			rest = append(rest, c)
			continue
		}
		var l slog.Level
		if l.UnmarshalText([]byte(c.to)) != nil {
			rest = append(rest, c) // Validate checked it: not reached
			continue
		}
		s.log.level.Set(l)
		s.commit([]configChange{c})
	}
	return rest
}

// commit records that the live changes are in force.
func (s *configSource) commit(live []configChange) {
	fs := s.cmd.Flags()
	for _, c := range live {
		fs.Lookup(c.key).Value.Set(c.to)
	}
}

// keys lists the changes' keys.
func keys(cs []configChange) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.key)
	}
	slices.Sort(out)
	return out
}

// maxConfigFileSize is the largest config file read, in bytes: the
// complete examples are under 10 KiB, and reading stops here, so that
// --config /dev/zero (or a log file named by mistake) fails at once
// instead of filling memory.
const maxConfigFileSize = 1 << 20

// readConfigFile reads the config file at path: a regular file of at most
// maxConfigFileSize bytes (readBounded: a FIFO opens without blocking, and
// is refused, so a SIGHUP reload cannot hang on one). Errors start with
// "config file: " and name the path.
func readConfigFile(path string) ([]byte, error) {
	data, err := readBounded(path, maxConfigFileSize)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	return data, nil
}

// possessive is "an agent's" or "a coordinator's".
func possessive(role string) string {
	if strings.IndexByte("aeiou", role[0]) >= 0 {
		return "an " + role + "'s"
	}
	return "a " + role + "'s"
}
