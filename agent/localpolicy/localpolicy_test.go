package localpolicy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const good = `version: 1
users:
  - name: alice
    copy_roots: [/home/alice/]
  - uid: 1001
  - group: builders
copy_roots: [/srv/shared]
exec: true
shell: false
forward: true
targets: [openshell]
`

func TestParseGood(t *testing.T) {
	p, err := Parse("p.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	uid := uint32(1001)
	want := &Policy{
		File: "p.yaml",
		Users: []UserRule{
			{Name: "alice", CopyRoots: []string{"/home/alice"}, Line: 3},
			{UID: &uid, Line: 5},
			{Group: "builders", Line: 6},
		},
		CopyRoots: []string{"/srv/shared"},
		Exec:      true, Forward: true,
		Targets: []string{"openshell"},
	}
	if d := cmp.Diff(want, p, cmp.AllowUnexported(Policy{})); d != "" {
		t.Errorf("policy (-want +got):\n%s", d)
	}
}

func TestParseErrorsNameLines(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string // substrings, each must appear
	}{
		{"unknown key", "version: 1\nexec: true\nshel: true\n", []string{`p.yaml:3:1: unknown key "shel"`}},
		{"duplicate key", "version: 1\nexec: true\nexec: false\n", []string{`p.yaml:3:1: duplicate key "exec" (first at line 2)`}},
		{"duplicate user key", "version: 1\nusers:\n  - name: a\n    name: b\n", []string{`p.yaml:4:5: users: duplicate key "name"`}},
		{"wrong type", "version: 1\nexec: yes please\n", []string{`p.yaml:2:7: exec: must be true or false`}},
		{"no version", "exec: true\n", []string{`p.yaml:1:1: version: missing`}},
		{"bad version", "version: 2\n", []string{`p.yaml:1:10: version: version 2 is not supported`}},
		{"relative root", "version: 1\ncopy_roots: [srv]\n", []string{`p.yaml:2:14: copy_roots: "srv" is not an absolute path`}},
		// As the coordinator's policy: a ".." component would silently name
		// another directory (/srv/../etc is /etc). Fresh-user pass.
		{"dotdot root", "version: 1\ncopy_roots: [/srv/../etc]\n", []string{`p.yaml:2:14: copy_roots: "/srv/../etc" has a ".." component (it names /etc; write that)`}},
		{"two of name uid", "version: 1\nusers:\n  - name: a\n    uid: 3\n", []string{`p.yaml:3:5: users: an entry names exactly one of name, uid and group`}},
		{"bad name", "version: 1\nusers:\n  - name: a/b\n", []string{`p.yaml:3:11: users: name: "a/b": not a user or group name`}},
		{"uid not number", "version: 1\nusers:\n  - uid: -4\n", []string{`p.yaml:3:10: users: uid: must be a number`}},
		{"two documents", "version: 1\n---\nversion: 1\n", []string{`p.yaml:2:1: a second YAML document`}},
		{"not a mapping", "- a\n", []string{`p.yaml:1:1: must be a mapping, not a list`}},
		{"syntax", "version: 1\nexec: [\n", []string{`p.yaml:2: did not find expected node content`}},
		{"empty", "", []string{`p.yaml: empty file`}},
		{"alias", "version: 1\ncopy_roots: &r [/a]\nusers:\n  - name: a\n    copy_roots: *r\n", []string{`p.yaml:2:13: anchor &r`, `p.yaml:5:17: alias *r`}},
		{"several", "version: 1\nfoo: 1\nbar: 2\n", []string{`p.yaml:2:1: unknown key "foo"`, `p.yaml:3:1: unknown key "bar"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tc.doc))
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestDecisions(t *testing.T) {
	p, err := Parse("/etc/p.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	p.lookupGroup = func(name string) (uint32, error) {
		if name == "builders" {
			return 500, nil
		}
		return 0, errors.New("no such group")
	}
	alice := Account{Name: "alice", UID: 1000, GID: 1000}
	bob := Account{Name: "bob", UID: 1002, GID: 1002}
	builder := Account{Name: "carol", UID: 1003, GID: 1003, Groups: []uint32{500}}
	byUID := Account{Name: "dave", UID: 1001, GID: 1001}
	for _, a := range []Account{alice, builder, byUID} {
		if err := p.AllowUser(a); err != nil {
			t.Errorf("AllowUser(%v): %v", a, err)
		}
	}
	err = p.AllowUser(bob)
	var r *Refusal
	if !errors.As(err, &r) || !errors.Is(err, ErrRefused) || r.File != "/etc/p.yaml" || !strings.Contains(err.Error(), "bob (uid 1002)") {
		t.Errorf("AllowUser(bob) = %v, want a refusal naming the file and bob", err)
	}
	if err := p.AllowExec(); err != nil {
		t.Error(err)
	}
	if err := p.AllowShell(); err == nil || !strings.Contains(err.Error(), `"shell: true"`) {
		t.Errorf("AllowShell = %v, want a refusal naming shell: true", err)
	}
	if err := p.AllowDial("openshell"); err != nil {
		t.Error(err)
	}
	if err := p.AllowDial("db"); err == nil || !strings.Contains(err.Error(), `"targets: db"`) {
		t.Errorf("AllowDial(db) = %v", err)
	}
	roots, err := p.CheckCopy(alice, "/home/alice/x")
	if err != nil || !cmp.Equal(roots, []string{"/srv/shared", "/home/alice"}) {
		t.Errorf("CheckCopy(alice) = %v, %v", roots, err)
	}
	if _, err := p.CheckCopy(byUID, "/home/alice/x"); err == nil || !strings.Contains(err.Error(), "its copy roots: /srv/shared") {
		t.Errorf("CheckCopy(dave, /home/alice/x) = %v", err)
	}
	if _, err := p.CheckCopy(alice, "/home/alicex"); err == nil {
		t.Error("/home/alicex is not under /home/alice")
	}
	if _, err := p.CheckCopy(bob, "/srv/shared/a"); err == nil {
		t.Error("bob may not copy at all")
	}
	var zero Policy
	if zero.AllowExec() == nil || zero.AllowDial("x") == nil || zero.AllowUser(alice) == nil {
		t.Error("the zero policy allows something")
	}
}

func TestLoadRefusesUnsafeFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("Load of a 0644 file we own: %v", err)
	}
	for _, mode := range []os.FileMode{0o666, 0o646, 0o664} {
		os.Chmod(path, mode)
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), "writable by its group or others") || !strings.Contains(err.Error(), path) {
			t.Errorf("Load of a %04o file = %v, want a refusal", mode, err)
		}
	}
	os.Chmod(path, 0o600)
	if os.Geteuid() == 0 {
		if err := os.Chown(path, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Errorf("Load of a file owned by nobody = %v, want a refusal", err)
		}
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file (a directory)") {
		t.Errorf("Load of a directory = %v", err)
	}
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := Load(fifo); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file (a named pipe)") {
			t.Errorf("Load of a FIFO = %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Load of a FIFO blocks (it blocked reloads until a writer came)")
	}
	big := filepath.Join(dir, "big.yaml")
	os.WriteFile(big, []byte("version: 1\n"+strings.Repeat("#", MaxFileSize)), 0o600)
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("Load of a big file = %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\nexec: true\nexce: true\n"), 0o600)
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad+":3:1: unknown key") {
		t.Errorf("Load of a bad file = %v", err)
	}
}

// FuzzParse checks that Parse never panics, and that what it accepts is
// well formed: absolute clean roots, one selector per user entry.
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("version: 1\nusers: &u\n  - name: a\nx: *u\n"))
	f.Add([]byte("version: 1\nusers:\n  - name: a\n  - name: a\n"))
	f.Add([]byte("version: 1\nusers:\n  - group: 5\n    copy_roots: [/a/../b]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("f.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, r := range append(cloneStrings(p.CopyRoots), userRoots(p)...) {
			if !filepath.IsAbs(r) || filepath.Clean(r) != r {
				t.Fatalf("root %q is not absolute and clean", r)
			}
		}
		for _, u := range p.Users {
			n := 0
			if u.Name != "" {
				n++
			}
			if u.UID != nil {
				n++
			}
			if u.Group != "" {
				n++
			}
			if n != 1 {
				t.Fatalf("entry %+v names %d selectors", u, n)
			}
		}
	})
}

func cloneStrings(s []string) []string { return append([]string(nil), s...) }

func userRoots(p *Policy) []string {
	var out []string
	for _, u := range p.Users {
		out = append(out, u.CopyRoots...)
	}
	return out
}

// TestExampleParses keeps deploy/agent-policy.example.yaml valid.
func TestExampleParses(t *testing.T) {
	path := filepath.Join("..", "..", "deploy", "agent-policy.example.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse(path, b)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Exec || p.Shell || len(p.Users) != 2 {
		t.Errorf("example policy: %+v", p)
	}
}
