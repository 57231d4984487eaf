package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/identity"
)

// TestParseErrors: each bad file is refused with FILE:LINE:COLUMN and the
// field's path.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		file string
		want []string
	}{
		{"empty", "", []string{"policy.yaml: the file is empty"}},
		{"comments only", "# nothing\n", []string{"policy.yaml: the file is empty"}},
		{"syntax", "version: 1\nidentities: [\n", []string{"policy.yaml:"}},
		{"two documents", "version: 1\nidentities: {}\n---\nversion: 1\n", []string{"policy.yaml:3:1: a second YAML document"}},
		{"top level list", "- a\n", []string{"policy.yaml:1:1: want a mapping, got a list"}},
		{"no version", "identities: {}\n", []string{`policy.yaml:1:1: version is missing: the file must start with "version: 1"`}},
		{"version 2", "version: 2\nidentities: {}\n", []string{"policy.yaml:1:10: version: version 2 is not supported"}},
		{"version string", "version: \"1\"\nidentities: {}\n", []string{`policy.yaml:1:10: version: want an integer, got the string "1"`}},
		{"no identities", "version: 1\n", []string{"policy.yaml:1:1: identities is missing"}},
		{"unknown top-level key", "version: 1\nidentity: {}\nidentities: {}\n", []string{`policy.yaml:2:1: unknown field "identity" (known: version, defaults, roles, identities)`}},
		{"not UTF-8", "version: 1\nidentities:\n  nats:\xffx: {}\n", []string{`policy.yaml:3:8: not UTF-8 text (byte 0xff)`}},
		{"tab indent", "version: 1\nidentities:\n\tnats:x: {}\n", []string{`(a tab: YAML indents with spaces only)`}},
		{"duplicate top-level key", "version: 1\nidentities: {}\nversion: 1\n", []string{`policy.yaml:3:1: key "version" appears twice (first at line 1, column 1)`}},
		{"duplicate identity", `version: 1
identities:
  nats:alice: {roles: []}
  nats:alice:
    rules: []
`, []string{`policy.yaml:4:3: identities: key "nats:alice" appears twice (first at line 3, column 3)`}},
		{"unknown kind", "version: 1\nidentities:\n  ssh:alice: {}\n", []string{`policy.yaml:3:3: identities: identity "ssh:alice": unknown kind "ssh": want one of nats, nats-account, cert, token`}},
		{"no kind", "version: 1\nidentities:\n  alice: {}\n", []string{`policy.yaml:3:3: identities: identity "alice": want KIND:VALUE`}},
		{"bad nats name", "version: 1\nidentities:\n  \"nats:al ice\": {}\n", []string{`policy.yaml:3:3: identities: identity "nats:al ice": name "al ice": character ' ' is not allowed`}},
		{"bad key checksum", "version: 1\nidentities:\n  nats:UDBEYJRDOFYTEW5TGTNPDPV53M74KESNMZXW2WD6GHEC4PIEXSVCZLHA: {}\n", []string{"has the shape of a NATS user public key but is not one"}},
		{"bad account key", "version: 1\nidentities:\n  nats-account:AAQBC37ULHFKDGDZHWOIAYJDAUFOF6II5TMBXW53ONMTRMGHK4V5LWHA: {}\n", []string{"NATS account public key but is not one"}},
		{"cert with control char", "version: 1\nidentities:\n  \"cert:a\\tb\": {}\n", []string{"unprintable character U+0009"}},
		{"cert with a zero-width space", "version: 1\nidentities:\n  \"cert:a\u200bb\": {}\n", []string{"unprintable character U+200B"}},
		{"cert with leading space", "version: 1\nidentities:\n  \"cert: ops\": {}\n", []string{"leading or trailing space"}},
		{"empty token name", "version: 1\nidentities:\n  \"token:\": {}\n", []string{"the name is empty"}},
		{"unknown entry key", "version: 1\nidentities:\n  nats:alice:\n    role: [x]\n", []string{`policy.yaml:4:5: identities["nats:alice"]: unknown field "role" (known: roles, rules, limits)`}},
		{"undefined role", "version: 1\nidentities:\n  nats:alice:\n    roles: [ops]\n", []string{`policy.yaml:4:13: identities["nats:alice"].roles[0]: role "ops" is not defined (roles: none)`}},
		{"role listed twice", "version: 1\nroles:\n  ops:\n    - operations: [admin]\nidentities:\n  nats:alice:\n    roles: [ops, ops]\n", []string{`policy.yaml:7:18: identities["nats:alice"].roles[1]: "ops" is listed twice (also at index 0)`}},
		{"bad role name", "version: 1\nroles:\n  -ops:\n    - operations: [admin]\nidentities: {}\n", []string{`policy.yaml:3:3: roles: role name "-ops" must start with a letter or digit`}},
		{"empty role", "version: 1\nroles:\n  ops: []\nidentities: {}\n", []string{"policy.yaml:3:8: roles.ops: no rules"}},
		{"role not a list", "version: 1\nroles:\n  ops:\n    operations: [admin]\nidentities: {}\n", []string{"policy.yaml:4:5: roles.ops: want a list, got a mapping"}},
		{"unknown rule key", oneRule("nodes: \"*\"\n      operation: [exec]\n      run_as: x"), []string{`policy.yaml:5:7: roles.r[0]: unknown field "operation" (known: operations, nodes, paths, targets, run_as, scope)`}},
		{"no operations", oneRule("nodes: \"*\""), []string{"policy.yaml:4:7: roles.r[0]: operations is missing"}},
		{"unknown operation", oneRule("operations: [exec, reboot]"), []string{`policy.yaml:4:26: roles.r[0].operations[1]: unknown operation "reboot": want one of exec,`}},
		{"operation twice", oneRule("operations: [admin, admin]"), []string{`roles.r[0].operations[1]: "admin" is listed twice`}},
		{"operations empty", oneRule("operations: []"), []string{"policy.yaml:4:19: roles.r[0].operations: the list is empty"}},
		{"operations a string", oneRule("operations: exec"), []string{`policy.yaml:4:19: roles.r[0].operations: want a list, got the string "exec"`}},
		{"nodes missing", oneRule("operations: [exec]\n      run_as: x"), []string{`policy.yaml:4:7: roles.r[0]: nodes is missing: exec runs on nodes: give a label selector, or "*" for every node`}},
		{"nodes where none runs", oneRule("nodes: \"*\"\n      operations: [admin]"), []string{"policy.yaml:4:14: roles.r[0].nodes: none of the rule's operations (admin) takes nodes"}},
		{"nodes empty", oneRule("nodes: \"\"\n      operations: [nodes.list]"), []string{`policy.yaml:4:14: roles.r[0].nodes: the selector is empty: write "*" for every node`}},
		{"nodes a boolean", oneRule("nodes: true\n      operations: [nodes.list]"), []string{"policy.yaml:4:14: roles.r[0].nodes: want a string, got the boolean true"}},
		{"nodes null", oneRule("nodes:\n      operations: [nodes.list]"), []string{"roles.r[0].nodes: want a string, got null"}},
		{"nodes a list", oneRule("nodes: [a]\n      operations: [nodes.list]"), []string{"roles.r[0].nodes: want a string, got a list"}},
		{"bad selector", oneRule("nodes: \"env=prod,\"\n      operations: [nodes.list]"), []string{`policy.yaml:4:14: roles.r[0].nodes: selector "env=prod,": empty term at offset 9`}},
		{"paths missing", oneRule("nodes: \"*\"\n      operations: [cp.read]\n      run_as: x"), []string{"roles.r[0]: paths is missing: cp.read copies files"}},
		{"paths where no cp", oneRule("nodes: \"*\"\n      operations: [exec]\n      paths: [/x]\n      run_as: x"), []string{"policy.yaml:6:14: roles.r[0].paths: none of the rule's operations (exec) takes paths"}},
		{"relative path", oneRule("nodes: \"*\"\n      operations: [cp.write]\n      paths: [srv]\n      run_as: x"), []string{`policy.yaml:6:15: roles.r[0].paths[0]: path prefix "srv" is not absolute`}},
		{"dot-dot path", oneRule("nodes: \"*\"\n      operations: [cp.write]\n      paths: [/srv/../etc]\n      run_as: x"), []string{`roles.r[0].paths[0]: path prefix "/srv/../etc" has a ".." component`}},
		{"path twice after cleaning", oneRule("nodes: \"*\"\n      operations: [cp.write]\n      paths: [/srv, /srv/]\n      run_as: x"), []string{`roles.r[0].paths[1]: "/srv" is listed twice`}},
		{"targets missing", oneRule("nodes: \"*\"\n      operations: [forward]"), []string{"roles.r[0]: targets is missing: forward dials targets"}},
		{"bad target", oneRule("nodes: \"*\"\n      operations: [forward]\n      targets: [Open_Shell]"), []string{"roles.r[0].targets[0]: target name"}},
		{"run_as missing", oneRule("nodes: \"*\"\n      operations: [exec, shell]"), []string{"roles.r[0]: run_as is missing: exec, shell runs as a local user"}},
		{"run_as an integer", oneRule("nodes: \"*\"\n      operations: [exec]\n      run_as: 1000"), []string{"policy.yaml:6:15: roles.r[0].run_as: want a string, got the integer 1000"}},
		{"run_as a quoted number", oneRule("nodes: \"*\"\n      operations: [exec]\n      run_as: \"1000\""), []string{`roles.r[0].run_as: user name "1000" must start with a letter or '_'`}},
		{"run_as an option", oneRule("nodes: \"*\"\n      operations: [exec]\n      run_as: \"-u\""), []string{"must start with a letter or '_'"}},
		{"run_as with a slash", oneRule("nodes: \"*\"\n      operations: [exec]\n      run_as: a/b"), []string{`character '/' is not allowed`}},
		{"run_as with a non-ASCII letter", oneRule("nodes: \"*\"\n      operations: [exec]\n      run_as: j\u00fcrgen"), []string{`user name "jürgen": character 'ü' is not allowed`}},
		{"nats name with a non-ASCII letter", "version: 1\nidentities:\n  \"nats:\u00e9lise\": {}\n", []string{`name "élise" must start with a letter or digit`}},
		{"nats name with a non-ASCII letter inside", "version: 1\nidentities:\n  \"nats:al\u00e9\": {}\n", []string{`name "alé": character 'é' is not allowed`}},
		{"run_as where nothing runs", oneRule("nodes: \"*\"\n      operations: [forward]\n      targets: [x]\n      run_as: x"), []string{"roles.r[0].run_as: none of the rule's operations (forward) takes run_as"}},
		{"scope where none scoped", oneRule("nodes: \"*\"\n      operations: [nodes.list]\n      scope: any"), []string{"policy.yaml:6:14: roles.r[0].scope: none of the rule's operations (nodes.list) has a scope"}},
		{"bad scope", oneRule("operations: [sandboxes.list]\n      scope: all"), []string{`policy.yaml:5:14: roles.r[0].scope: scope "all": want own or any`}},
		{"unknown limit", "version: 1\ndefaults:\n  limits:\n    max_jobs: 3\nidentities: {}\n", []string{`policy.yaml:4:5: defaults.limits: unknown field "max_jobs" (known: max_concurrent_jobs, requests_per_second, burst)`}},
		{"limit zero", "version: 1\ndefaults:\n  limits:\n    max_concurrent_jobs: 0\nidentities: {}\n", []string{"policy.yaml:4:26: defaults.limits.max_concurrent_jobs: 0 is out of range: want 1 to 1048576"}},
		{"limit a float", "version: 1\ndefaults:\n  limits:\n    burst: 1.5\nidentities: {}\n", []string{"defaults.limits.burst: want an integer, got the number 1.5"}},
		{"rate a word", "version: 1\ndefaults:\n  limits:\n    requests_per_second: yes\nidentities: {}\n", []string{`defaults.limits.requests_per_second: want a number, got the string "yes"`}},
		{"rate infinite", "version: 1\ndefaults:\n  limits:\n    requests_per_second: .inf\nidentities: {}\n", []string{"defaults.limits.requests_per_second: .inf is out of range"}},
		{"rate NaN", "version: 1\ndefaults:\n  limits:\n    requests_per_second: .nan\nidentities: {}\n", []string{"out of range"}},
		{"rate negative", "version: 1\ndefaults:\n  limits:\n    requests_per_second: -1\nidentities: {}\n", []string{"out of range"}},
		{"anchor and alias", "version: 1\nroles:\n  a: &r\n    - operations: [admin]\n  b: *r\nidentities: {}\n", []string{"policy.yaml:3:6: roles.a: anchors (&r) are not supported", "policy.yaml:5:6: roles.b: aliases (*r) are not supported"}},
		{"merge key", "version: 1\nidentities:\n  nats:alice:\n    <<: {roles: []}\n", []string{`policy.yaml:4:5: identities["nats:alice"]: merge keys (<<) are not supported`}},
		{"custom tag", "version: 1\nidentities: !secret {}\n", []string{"policy.yaml:2:13: identities: tag !secret is not supported"}},
		{"non-string key", "version: 1\nidentities:\n  123: {}\n", []string{"policy.yaml:3:3: identities: want a string key, got the integer 123"}},
		{"timestamp as user", oneRule("nodes: \"*\"\n      operations: [exec]\n      run_as: 2024-01-01"), []string{"run_as: want a string, got the timestamp 2024-01-01"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("policy.yaml", []byte(tt.file))
			if err == nil {
				t.Fatalf("accepted:\n%s\nas\n%s", tt.file, p.Marshal())
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n  %s\nlacks\n  %s", strings.ReplaceAll(err.Error(), "\n", "\n  "), w)
				}
			}
		})
	}
}

// oneRule is a file with one role r holding one rule whose body (indented for
// the rule's mapping) is body; the rule's first key is at line 4, column 7.
func oneRule(body string) string {
	return "version: 1\nroles:\n  r:\n    - " + body + "\nidentities:\n  nats:alice: {roles: [r]}\n"
}

// TestParseReportsEveryError: one Parse reports each problem of a file,
// each on its own line, in file order.
func TestParseReportsEveryError(t *testing.T) {
	_, err := Parse("p.yaml", []byte(`version: 1
roles:
  ops:
    - nodes: "*"
      operations: [exec]
identities:
  nats:alice:
    roles: [opz]
  bogus:x: {}
`))
	if err == nil {
		t.Fatal("accepted")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		"p.yaml:4:7: roles.ops[0]: run_as is missing",
		`p.yaml:8:13: identities["nats:alice"].roles[0]: role "opz" is not defined (roles: ops)`,
		`p.yaml:9:3: identities: identity "bogus:x": unknown kind "bogus"`,
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%s", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("error %d = %q, want prefix %q", i, lines[i], w)
		}
	}
}

// TestParseErrorsOfBrokenEntries: an entry whose key is wrong (repeated,
// of an unknown kind), a role of a bad name and a rule whose operations are
// all unknown still have their bodies checked, so one run reports every
// error (fresh-user pass: each hid the rest of its entry).
func TestParseErrorsOfBrokenEntries(t *testing.T) {
	_, err := Parse("p.yaml", []byte(`version: 1
roles:
  bad-:
    - operations: [exec]
      nodes: "a,,b"
      run_as: 1000
identities:
  nats:a:
    rules:
      - nodes: "a,,b"
        operations: [execc]
        run_as: 1000
  nats:a:
    roles: [nope]
    limits: {burst: -5}
  bogus:x:
    limits: {burst: -5}
`))
	if err == nil {
		t.Fatal("accepted")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		`p.yaml:3:3: roles: role name "bad-" must end with a letter or digit`,
		`p.yaml:5:14: roles.bad-[0].nodes: selector "a,,b": empty term`,
		`p.yaml:6:15: roles.bad-[0].run_as: want a string`,
		`p.yaml:10:16: identities["nats:a"].rules[0].nodes: selector "a,,b": empty term`,
		`p.yaml:11:22: identities["nats:a"].rules[0].operations[0]: unknown operation "execc"`,
		`p.yaml:12:17: identities["nats:a"].rules[0].run_as: want a string`,
		`p.yaml:13:3: identities: key "nats:a" appears twice (first at line 8, column 3)`,
		`p.yaml:14:13: identities["nats:a"].roles[0]: role "nope" is not defined`,
		`p.yaml:15:21: identities["nats:a"].limits.burst: -5 is out of range`,
		`p.yaml:16:3: identities: identity "bogus:x": unknown kind "bogus"`,
		`p.yaml:17:21: identities["bogus:x"].limits.burst: -5 is out of range`,
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%s", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("error %d = %q, want prefix %q", i, lines[i], w)
		}
	}
}

// TestParseErrorCap: a file with very many errors reports the first ones
// and a count of the rest.
func TestParseErrorCap(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\nidentities:\n")
	for i := range 80 {
		b.WriteString("  bad" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + ": {}\n")
	}
	_, err := Parse("p.yaml", []byte(b.String()))
	if err == nil {
		t.Fatal("accepted")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != maxErrors+1 || lines[maxErrors] != "p.yaml: 30 more errors" {
		t.Errorf("got %d lines, last %q", len(lines), lines[len(lines)-1])
	}
}

func TestParseTooLarge(t *testing.T) {
	_, err := Parse("big.yaml", make([]byte, MaxFileSize+1))
	if err == nil || !strings.Contains(err.Error(), "big.yaml: 1048577 bytes, over the 1048576 byte limit") {
		t.Errorf("err = %v", err)
	}
}

// TestRolesAfterIdentities: a role may be defined after the entries that
// use it.
func TestRolesAfterIdentities(t *testing.T) {
	p := mustParse(t, "version: 1\nidentities:\n  nats:alice: {roles: [ops]}\nroles:\n  ops:\n    - operations: [admin]\n")
	if _, err := p.Decide(alice, OpAdmin, Node{}, Object{}); err != nil {
		t.Error(err)
	}
}

func TestWarnings(t *testing.T) {
	p := mustParse(t, "version: 1\nroles:\n  spare:\n    - operations: [admin]\nidentities:\n  nats:alice: {}\n")
	got := strings.Join(p.Warnings(), "\n")
	for _, w := range []string{"policy.yaml:3:3: role spare is not used by any identity", `policy.yaml:6:3: identities["nats:alice"] grants nothing`} {
		if !strings.Contains(got, w) {
			t.Errorf("warnings\n%s\nlack %q", got, w)
		}
	}
	p = mustParse(t, "version: 1\nidentities: {}\n")
	if w := p.Warnings(); len(w) != 1 || !strings.Contains(w[0], "identities is empty: the policy refuses everything") {
		t.Errorf("warnings %q", w)
	}
	if _, err := p.Decide(alice, OpNodesList, nodeA, Object{}); err == nil {
		t.Error("an empty policy allowed nodes.list")
	}
}

// TestExampleFile: the shipped example parses without warnings, and
// decides as its comments say.
func TestExampleFile(t *testing.T) {
	// A copy of mode 0600: Load refuses a group-writable file, and a
	// checkout made under umask 002 has one.
	data, err := os.ReadFile(filepath.Join("..", "deploy", "policy.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "policy.example.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if w := p.Warnings(); len(w) != 0 {
		t.Errorf("warnings: %q", w)
	}
	prod := Node{ID: "p1", Labels: map[string]string{"env": "prod"}}
	gpu := Node{ID: "g1", Labels: map[string]string{"gpu": "true"}}
	ci := Identity{Kind: KindNATS, Name: "runner-7", Account: "CI"}
	if g, err := p.Decide(alice, OpExec, prod, Object{}); err != nil || g.RunAs != "deploy" {
		t.Errorf("alice exec on prod: %v %v", g, err)
	}
	if _, err := p.Decide(alice, OpCopyWrite, prod, Object{Path: "/var/log/app/x"}); err == nil {
		t.Error("alice may write the app's logs")
	}
	if _, err := p.Decide(ci, OpForward, gpu, Object{Target: "openshell"}); err != nil {
		t.Error(err)
	}
	if _, err := p.Decide(ci, OpExec, gpu, Object{}); err == nil {
		t.Error("CI may exec")
	}
	if l := p.Limits(alice); l.MaxConcurrentJobs != 4 || l.RequestsPerSecond != 20 {
		t.Errorf("alice's limits %+v", l)
	}
	// README "Running a fleet" mints nats:ops's credentials for token create.
	ops := Identity{Kind: KindNATS, Name: "ops", Account: "CLIENTS"}
	if _, err := p.Decide(ops, OpAdmin, Node{}, Object{}); err != nil {
		t.Errorf("ops admin: %v", err)
	}
	if _, err := p.Decide(alice, OpAdmin, Node{}, Object{}); err == nil {
		t.Error("alice may administer")
	}
}

// A file owned by another uid than root or the process's own is refused
// (checkFile with another euid stands in for running as someone else:
// only root may chown a file away).
func TestLoadRefusesForeignOwner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte("version: 1\nidentities: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	own := fi.Sys().(*syscall.Stat_t).Uid
	if err := checkFile(path, fi, own); err != nil {
		t.Errorf("owned by the euid %d: %v", own, err)
	}
	if own != 0 {
		if err := checkFile(path, fi, own+1); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("owned by uid %d (mode 0600)", own)) {
			t.Errorf("owned by uid %d, running as %d: %v", own, own+1, err)
		}
		return
	}
	// As root: a file root owns passes for any euid; one given away does not.
	if err := checkFile(path, fi, 4242); err != nil {
		t.Errorf("root-owned, running as 4242: %v", err)
	}
	if err := os.Chown(path, 4243, 4243); err != nil {
		t.Skipf("chown: %v", err)
	}
	_, err = Load(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "owned by uid 4243 (mode 0600)") || !strings.Contains(err.Error(), "must be owned by root") {
		t.Errorf("owned by uid 4243: %v", err)
	}
	if fi, err = os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if err := checkFile(path, fi, 4243); err != nil {
		t.Errorf("owned by the euid 4243: %v", err)
	}
}

func TestLoadRefusesWorldWritable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte("version: 1\nidentities: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("0600: %v", err)
	}
	if err := os.Chmod(path, 0o646); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "is writable by anyone (mode 0646)") || !strings.Contains(err.Error(), path) {
		t.Errorf("0646: %v", err)
	}
	// Group-writable: whoever is in its group could grant themselves
	// everything, as with the node's local policy.
	if err := os.Chmod(path, 0o620); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "is writable by its group (mode 0620)") || !strings.Contains(err.Error(), "chmod go-w") {
		t.Errorf("0620: %v", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Errorf("0644: %v", err)
	}
	if _, err := Load(filepath.Dir(path)); err == nil || !strings.Contains(err.Error(), "not a regular file (a directory)") {
		t.Errorf("directory: %v", err)
	}
	// A FIFO in the file's place is refused at once: opening it must not
	// wait for a writer (it blocked every later reload and the shutdown).
	fifo := filepath.Join(t.TempDir(), "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := Load(fifo); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file (a named pipe)") {
			t.Errorf("fifo: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Load of a FIFO blocks")
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing: %v", err)
	}
}

// TestReadmeExample: the README's policy parses, and its sample refusal is
// the one Decide gives.
func TestReadmeExample(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n### Policy\n")
	if !ok {
		t.Fatal("README has no Policy section")
	}
	sec, _, _ = strings.Cut(sec, "\n### ")
	_, yml, ok := strings.Cut(sec, "```yaml\n")
	if !ok {
		t.Fatal("the Policy section has no yaml block")
	}
	yml, _, _ = strings.Cut(yml, "```")
	p := mustParse(t, yml)
	if w := p.Warnings(); len(w) != 0 {
		t.Errorf("warnings: %q", w)
	}
	_, err = p.Decide(alice, OpExec, Node{ID: "node-b", Labels: map[string]string{"env": "dev"}}, Object{})
	if err == nil {
		t.Fatal("allowed")
	}
	flat := strings.Join(strings.Fields(sec), " ")
	if !strings.Contains(flat, "`"+err.Error()+"`") {
		t.Errorf("the README does not show the refusal\n  %s", err)
	}
}

// TestDocExample: the package doc's example parses without warnings, and
// its sample refusal is the one Decide gives.
func TestDocExample(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "// A complete example, every field used:\n//\n")
	if !ok {
		t.Fatal("doc.go has no example")
	}
	var yml strings.Builder
	for _, line := range strings.Split(rest, "\n") {
		if line != "//" && !strings.HasPrefix(line, "//\t") {
			break
		}
		yml.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "//"), "\t") + "\n")
	}
	p := mustParse(t, yml.String())
	if w := p.Warnings(); len(w) != 0 {
		t.Errorf("warnings: %q", w)
	}
	_, err = p.Decide(alice, OpExec, Node{ID: "node-b", Labels: map[string]string{"env": "dev"}}, Object{})
	if err == nil {
		t.Fatal("allowed")
	}
	flat := strings.Join(strings.Fields(strings.ReplaceAll(string(b), "//", "")), " ")
	if !strings.Contains(flat, err.Error()) {
		t.Errorf("the doc does not show the refusal\n  %s", err)
	}
}

// TestComposePolicyFile: deploy/compose/policy.yaml parses without
// warnings and grants what deploy/compose/test.sh relies on: compose-token
// may mint join tokens (admin) and nothing else; compose-admin may run
// jobs as root, the agents' only account.
func TestComposePolicyFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "deploy", "compose", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if w := p.Warnings(); len(w) != 0 {
		t.Errorf("warnings: %q", w)
	}
	node := Node{ID: "agent-1", Labels: map[string]string{"zone": "a", "role": "worker"}}
	tok := Identity{Kind: KindNATS, Name: "compose-token", Account: "CLIENTS"}
	adm := Identity{Kind: KindNATS, Name: "compose-admin", Account: "CLIENTS"}
	if _, err := p.Decide(tok, OpAdmin, Node{}, Object{}); err != nil {
		t.Errorf("compose-token admin: %v", err)
	}
	for _, op := range []Operation{OpExec, OpNodesList, OpShell} {
		if _, err := p.Decide(tok, op, node, Object{}); err == nil {
			t.Errorf("compose-token may %v", op)
		}
	}
	if g, err := p.Decide(adm, OpExec, node, Object{}); err != nil || g.RunAs != "root" {
		t.Errorf("compose-admin exec: %+v %v", g, err)
	}
	for _, op := range []Operation{OpAdmin, OpNodesList} {
		if _, err := p.Decide(adm, op, node, Object{}); err != nil {
			t.Errorf("compose-admin %v: %v", op, err)
		}
	}
	// The OpenSandbox facade's token (test.sh creates, reads and deletes a
	// sandbox on agent-1, labelled sandboxes=opensandbox by the test's
	// compose override): the opensandbox target there, nothing else.
	fac := Identity{Kind: KindToken, Name: "facade"}
	sbNode := Node{ID: "agent-1", Labels: map[string]string{"zone": "a", "role": "worker", "sandboxes": "opensandbox"}}
	if _, err := p.Decide(fac, OpForward, sbNode, Object{Target: "opensandbox"}); err != nil {
		t.Errorf("token:facade forward opensandbox on agent-1: %v", err)
	}
	self := Object{Owner: fac.String()}
	for _, op := range []Operation{OpSandboxesRegister, OpSandboxesReap} {
		if _, err := p.Decide(fac, op, sbNode, self); err != nil {
			t.Errorf("token:facade %v of its own run: %v", op, err)
		}
	}
	if _, err := p.Decide(fac, OpForward, node, Object{Target: "opensandbox"}); err == nil {
		t.Error("token:facade may forward on a node without sandboxes=opensandbox")
	}
	if _, err := p.Decide(fac, OpForward, sbNode, Object{Target: "openshell"}); err == nil {
		t.Error("token:facade may forward to openshell")
	}
	for _, op := range []Operation{OpExec, OpAdmin, OpShell} {
		if _, err := p.Decide(fac, op, sbNode, Object{}); err == nil {
			t.Errorf("token:facade may %v", op)
		}
	}
}

// TestKindNamesInProtocol: every kind protocol names parses to a Kind
// that writes it back, and every Kind is one of them, in order.
func TestKindNamesInProtocol(t *testing.T) {
	kinds := Kinds()
	if len(kinds) != len(identity.Kinds) {
		t.Fatalf("policy has %d kinds, identity.Kinds %d", len(kinds), len(identity.Kinds))
	}
	for i, name := range identity.Kinds {
		k, ok := parseKind(name)
		if !ok || k != kinds[i] || k.String() != name {
			t.Errorf("protocol kind %q: parseKind = %v, %v; want %v", name, k, ok, kinds[i])
		}
	}
}
