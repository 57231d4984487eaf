package repocheck

import (
	"bufio"
	"bytes"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// moduleRoot is the module's root relative to this package's directory,
// which is the working directory of its tests.
const moduleRoot = "../../.."

// modulePath reads the module path from go.mod.
func modulePath(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot, "go.mod"))
	if err != nil {
		t.Fatalf("read go.mod: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	t.Fatal("go.mod has no module line")
	return ""
}

// TestPackageDocs checks that every package directory has exactly one
// package doc comment among its non-test files.
func TestPackageDocs(t *testing.T) {
	docs := map[string][]string{} // dir -> files with a package doc
	pkgDirs := map[string]bool{}
	err := filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != moduleRoot && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return fmt.Errorf("parse %s: %w", path, err)
		}
		dir := filepath.Dir(path)
		pkgDirs[dir] = true
		if f.Doc != nil {
			docs[dir] = append(docs[dir], name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgDirs) == 0 {
		t.Fatal("found no Go packages: is the working directory cmd/internal/repocheck?")
	}
	for dir := range pkgDirs {
		rel, _ := filepath.Rel(moduleRoot, dir)
		switch n := len(docs[dir]); {
		case n == 0:
			t.Errorf("%s: no package doc comment (add one, in doc.go for anything non-trivial)", rel)
		case n > 1:
			t.Errorf("%s: %d package doc comments (in %s); keep exactly one", rel, n, strings.Join(docs[dir], ", "))
		}
	}
}

// rule forbids packages under From (relative to the module; "" is the module
// root) from depending on the packages matched by Deny.
type rule struct {
	From string
	Why  string
	Deny func(dep string) bool
}

// under reports whether path is prefix or inside it.
func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// isStd reports whether an import path belongs to the standard library: its
// first element has no dot (the go command's own rule; this also covers the
// standard library's own "vendor/..." packages).
func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// isTestDouble reports whether pkg is a test-double package (its last
// element ends in "test", like protocol/openshell/openshelltest): fakes of
// the peers' servers, which need sockets, live beside the wire format they
// serve and are exempt from protocol's purity rules.
func isTestDouble(pkg string) bool {
	return strings.HasSuffix(pkg[strings.LastIndex(pkg, "/")+1:], "test")
}

// rules returns the dependency rules for module mod.
func rules(mod string) []rule {
	p := func(rel string) string { return mod + "/" + rel }
	nats := func(dep string) bool {
		return under(dep, "github.com/nats-io/nats.go") || under(dep, "github.com/nats-io/nats-server")
	}
	return []rule{
		{"agent", "the agent must not know the coordinator or NATS", func(dep string) bool {
			return under(dep, p("coordinator")) || nats(dep)
		}},
		{"agent/localpolicy", "the local policy is a file format: the standard library, the YAML parser and the stdlib-only internal/filetype and internal/yamlerr only", func(dep string) bool {
			return !isStd(dep) && !under(dep, p("agent/localpolicy")) && !under(dep, "go.yaml.in/yaml/v3") && dep != p("internal/filetype") && dep != p("internal/yamlerr")
		}},
		{"protocol", "protocol is pure encode/decode: the standard library (and the protobuf runtime) only", func(dep string) bool {
			return !isStd(dep) && !under(dep, p("protocol")) && !under(dep, "google.golang.org/protobuf")
		}},
		{"protocol", "protocol opens no sockets and starts no processes", func(dep string) bool {
			return under(dep, "net") || dep == "os/exec" || dep == "crypto/tls"
		}},
		{"tunnel", "tunnel carries streams; it knows no jobs, no NATS", func(dep string) bool {
			return under(dep, p("agent")) || under(dep, p("coordinator")) || under(dep, p("client")) || nats(dep)
		}},
		{"coordinator", "the coordinator must not know how an agent runs a process", func(dep string) bool {
			return under(dep, p("agent"))
		}},
		{"coordinator/audit", "the audit log knows events, not the coordinator's handlers or tunnels", func(dep string) bool {
			return dep == p("coordinator") || under(dep, p("tunnel")) || under(dep, p("agent"))
		}},
		{"gateway", "gateway clients speak to node-local gateways only; agent and coordinator both use them", func(dep string) bool {
			return under(dep, p("agent")) || under(dep, p("coordinator")) || under(dep, p("tunnel")) || under(dep, p("client")) || nats(dep)
		}},
		// The client speaks the NATS API, and the tunnel (a yamux session
		// over TLS) for the direct data path of its streams; it knows
		// neither side's internals.
		{"client", "a job submitter needs only the NATS API and the tunnel's transport", func(dep string) bool {
			return under(dep, p("agent")) || under(dep, p("coordinator"))
		}},
	}
}

// violations checks a dependency graph (package -> its transitive non-test
// dependencies) against the rules and returns one line per forbidden edge.
func violations(mod string, graph map[string][]string) []string {
	var out []string
	pkgs := make([]string, 0, len(graph))
	for pkg := range graph {
		pkgs = append(pkgs, pkg)
	}
	slices.Sort(pkgs)
	for _, r := range rules(mod) {
		for _, pkg := range pkgs {
			if !under(pkg, mod+"/"+r.From) || r.From == "protocol" && isTestDouble(pkg) {
				continue
			}
			for _, dep := range graph[pkg] {
				if r.Deny(dep) {
					out = append(out, fmt.Sprintf("%s imports %s: %s", pkg, dep, r.Why))
				}
			}
		}
	}
	return out
}

// depGraph lists every package of the module with its transitive non-test
// dependencies.
func depGraph(t testing.TB) map[string][]string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not found")
	}
	cmd := exec.Command("go", "list", "-e", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...")
	cmd.Dir = moduleRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	graph := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 {
			graph[f[0]] = f[1:]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return graph
}

func TestDependencyDirection(t *testing.T) {
	mod := modulePath(t)
	graph := depGraph(t)
	if _, ok := graph[mod+"/protocol"]; !ok {
		t.Fatalf("go list did not list %s/protocol; got %d packages", mod, len(graph))
	}
	for _, v := range violations(mod, graph) {
		t.Error(v)
	}
}

// TestRulesCatchViolations checks the checker on a made-up graph, so a rule
// that silently matches nothing is noticed.
func TestRulesCatchViolations(t *testing.T) {
	const mod = "example.com/m"
	graph := map[string][]string{
		mod + "/agent":            {"context", mod + "/tunnel", mod + "/coordinator/internal/x", "github.com/nats-io/nats.go/micro"},
		mod + "/agent/sub":        {"github.com/nats-io/nats-server/v2/server"},
		mod + "/protocol":         {"encoding/json", "vendor/golang.org/x/crypto/cryptobyte", mod + "/protocol/openshell", "google.golang.org/protobuf/proto", "github.com/hashicorp/yamux"},
		mod + "/protocol/sub":     {"net"},
		mod + "/tunnel":           {mod + "/protocol", "github.com/hashicorp/yamux", mod + "/client"},
		mod + "/coordinator":      {mod + "/tunnel", "github.com/nats-io/nats.go", mod + "/agent"},
		mod + "/client":           {mod + "/protocol", "github.com/nats-io/nats.go", mod + "/tunnel", mod + "/coordinator/caller"},
		mod + "/cmd/tether":       {mod + "/agent", mod + "/coordinator", mod + "/client"},
		mod + "/agentish":         {mod + "/coordinator"},
		mod + "/gateway":          {mod + "/protocol", "google.golang.org/grpc", mod + "/coordinator/ledger"},
		mod + "/protocol/x/xtest": {"net", "google.golang.org/grpc"},
		mod + "/coordinatorextra": {mod + "/agent"},
	}
	want := []string{
		mod + "/agent imports " + mod + "/coordinator/internal/x",
		mod + "/agent imports github.com/nats-io/nats.go/micro",
		mod + "/agent/sub imports github.com/nats-io/nats-server/v2/server",
		mod + "/protocol imports github.com/hashicorp/yamux",
		mod + "/protocol/sub imports net",
		mod + "/tunnel imports " + mod + "/client",
		mod + "/coordinator imports " + mod + "/agent",
		mod + "/gateway imports " + mod + "/coordinator/ledger",
		mod + "/client imports " + mod + "/coordinator/caller",
	}
	var got []string
	for _, v := range violations(mod, graph) {
		edge, _, _ := strings.Cut(v, ":")
		got = append(got, edge)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("violations (-want +got):\n%s", diff)
	}
}
