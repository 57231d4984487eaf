package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// writeTree creates files (path -> content) under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// readTree returns the regular files under root (path -> content).
func readTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = string(b)
		return nil
	})
	return out
}

func copyCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestCopyPushAndPull(t *testing.T) {
	h := newHarness(t, nil)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "alpha", "sub/b": "beta"})
	dst := filepath.Join(h.a.cfg.DataDir, "gym", "gym-job-1")
	writeTree(t, dst, map[string]string{"extra": "x"})

	// Push with --delete: the extra file goes (NeMo Gym's copy).
	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, Delete: true})
	res, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.FilesWritten != 2 || res.Deleted != 1 {
		t.Errorf("push result %+v", res)
	}
	want := map[string]string{"a": "alpha", "sub/b": "beta"}
	if got := readTree(t, dst); !equalMaps(got, want) {
		t.Errorf("pushed tree %v, want %v", got, want)
	}

	// Pull it back.
	local := filepath.Join(t.TempDir(), "back")
	s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: dst})
	if _, err := mirror.Receive(copyCtx(t), local, s.st, mirror.Options{}); err != nil {
		t.Fatal(err)
	}
	if got := readTree(t, local); !equalMaps(got, want) {
		t.Errorf("pulled tree %v, want %v", got, want)
	}
	waitFor(t, testWait, "copy metrics", func() bool {
		return testutil.ToFloat64(h.a.m.copies.WithLabelValues("pull", "ok")) == 1
	})
	if got := testutil.ToFloat64(h.a.m.copyBytes.WithLabelValues("push")); got != 9 {
		t.Errorf("push bytes metric = %v, want 9", got)
	}
	if got := testutil.ToFloat64(h.a.m.copyBytes.WithLabelValues("pull")); got != 9 {
		t.Errorf("pull bytes metric = %v, want 9", got)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestCopyRefusesPathsOutsideRoots(t *testing.T) {
	outside := t.TempDir()
	writeTree(t, outside, map[string]string{"secret": "s"})
	h := newHarness(t, nil)
	data := h.a.cfg.DataDir
	if err := os.Symlink(outside, filepath.Join(data, "escape")); err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	writeTree(t, src, map[string]string{"pwned": "x"})

	cases := []struct {
		name string
		p    protocol.CopyParams
		want string
	}{
		{"push outside", protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(outside, "x")}, "is not under a copy root"},
		{"push through a symlinked parent", protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(data, "escape", "x")}, "symlink escape points to " + outside + ", which is not under a copy root"},
		{"push onto the symlink", protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(data, "escape")}, "symlink escape points to " + outside},
		{"push onto the data dir", protocol.CopyParams{Direction: protocol.CopyPush, Path: data}, "holds the agent's own state"},
		{"push dotdot", protocol.CopyParams{Direction: protocol.CopyPush, Path: data + "/../x"}, "is not under a copy root"},
		{"pull outside", protocol.CopyParams{Direction: protocol.CopyPull, Path: outside}, "is not under a copy root"},
		{"pull through a symlink", protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(data, "escape")}, "symlink escape points to " + outside},
		{"pull below a symlink", protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(data, "escape", "secret")}, "symlink escape points to " + outside},
		{"relative path", protocol.CopyParams{Direction: protocol.CopyPush, Path: "x"}, "must be absolute"},
		{"bad direction", protocol.CopyParams{Direction: "sideways", Path: data + "/x"}, "direction"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := h.open(t, protocol.KindCopy, tc.p)
			var err error
			if tc.p.Direction == protocol.CopyPull {
				_, err = mirror.Receive(copyCtx(t), filepath.Join(t.TempDir(), "local"), s.st, mirror.Options{})
			} else {
				_, err = mirror.Send(copyCtx(t), src, s.st, mirror.Options{})
			}
			var pe *mirror.PeerError
			if !errors.As(err, &pe) || pe.Info.Code != protocol.CodeBadRequest || !strings.Contains(pe.Info.Message, tc.want) {
				t.Fatalf("copy error = %v, want a bad_request containing %q", err, tc.want)
			}
			if tc.name == "push outside" && !strings.Contains(pe.Info.Message, data) {
				t.Errorf("refusal %q does not name the copy roots", pe.Info.Message)
			}
		})
	}
	if got := readTree(t, outside); !equalMaps(got, map[string]string{"secret": "s"}) {
		t.Errorf("outside directory changed: %v", got)
	}
}

func TestCopyRootsConfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.CopyRoots = []string{"relative/dir", "/ok"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "relative/dir") {
		t.Errorf("Validate = %v, want an error naming the relative root", err)
	}
	cfg.CopyRoots = []string{"/srv/../etc"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `"/srv/../etc" has a ".." component (it names /etc`) {
		t.Errorf("Validate = %v, want an error naming the root with \"..\"", err)
	}
	cfg = testConfig(t)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.cfg.CopyRoots) != 1 || a.cfg.CopyRoots[0] != cfg.DataDir {
		t.Errorf("default CopyRoots = %v, want [%s]", a.cfg.CopyRoots, cfg.DataDir)
	}
	// An extra root is honoured.
	extra := t.TempDir()
	h := newHarness(t, func(c *Config) { c.CopyRoots = []string{extra} })
	src := t.TempDir()
	writeTree(t, src, map[string]string{"f": "1"})
	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(extra, "new", "d")})
	if _, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{}); err != nil {
		t.Fatal(err)
	}
}

func TestCopyAbortLeavesDestination(t *testing.T) {
	h := newHarness(t, nil)
	dst := filepath.Join(h.a.cfg.DataDir, "dst")
	writeTree(t, dst, map[string]string{"old": "o"})

	// The client stops mid-copy: a cancel frame, then the stream closed.
	for _, how := range []string{"cancel", "close"} {
		s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, Delete: true})
		for {
			f, err := s.fr.Next()
			if err != nil {
				t.Fatal(err)
			}
			if f.Type == protocol.FrameManifestEnd {
				break
			}
		}
		protocol.WriteJSONFrame(s.st, protocol.FrameEntry, protocol.CopyEntry{Path: ".", Type: "dir", Mode: 0o755})
		protocol.WriteJSONFrame(s.st, protocol.FrameEntry, protocol.CopyEntry{Path: "new", Type: "file", Size: 10, Mode: 0o644})
		protocol.WriteFrame(s.st, protocol.FrameFileData, []byte("12345"))
		if how == "cancel" {
			protocol.WriteFrame(s.st, protocol.FrameCancel, nil)
		} else {
			s.st.Close()
		}
		want := float64(1)
		if how == "close" {
			want = 2
		}
		waitFor(t, testWait, "failed copy", func() bool {
			return testutil.ToFloat64(h.a.m.copies.WithLabelValues("push", "error")) == want
		})
		if got := readTree(t, dst); !equalMaps(got, map[string]string{"old": "o"}) {
			t.Errorf("%s: destination changed: %v", how, got)
		}
		ents, _ := os.ReadDir(h.a.cfg.DataDir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tether-stage-") {
				t.Errorf("%s: stage %s left", how, e.Name())
			}
		}
	}
}

// TestCopyNeverTouchesAgentState pushes onto and pulls from the agent's own
// state (its data dir and the detached jobs' files under DataDir/jobs):
// pushes are refused and change nothing, a pull of the jobs is refused and
// a pull of the data dir leaves them out.
func TestCopyNeverTouchesAgentState(t *testing.T) {
	h := newHarness(t, nil)
	data := h.a.cfg.DataDir
	jobs := filepath.Join(data, "jobs")
	writeTree(t, jobs, map[string]string{"j1/status.json": `{"state":"running"}`, "j1/stdout": "out"})
	writeTree(t, data, map[string]string{"user/f": "user data"})
	src := t.TempDir()
	writeTree(t, src, map[string]string{"j1/status.json": "forged", "pwned": "x"})
	before := readTree(t, data)

	for _, dst := range []string{jobs, filepath.Join(jobs, "j1"), filepath.Join(jobs, "j2"), filepath.Join(jobs, "new", "deeper"), data} {
		for _, del := range []bool{false, true} {
			s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, Delete: del})
			_, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{})
			var pe *mirror.PeerError
			if !errors.As(err, &pe) || pe.Info.Code != protocol.CodeBadRequest {
				t.Errorf("push onto %s (delete %v): %v, want a bad_request refusal", dst, del, err)
			}
		}
	}
	if got := readTree(t, data); !equalMaps(got, before) {
		t.Errorf("refused pushes changed the data dir: %v, was %v", got, before)
	}
	if ents, _ := os.ReadDir(jobs); len(ents) != 1 || ents[0].Name() != "j1" {
		t.Errorf("refused pushes changed the jobs directory: %v", ents)
	}

	for _, p := range []string{jobs, filepath.Join(jobs, "j1"), filepath.Join(jobs, "j1", "stdout")} {
		s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: p})
		local := filepath.Join(t.TempDir(), "got")
		_, err := mirror.Receive(copyCtx(t), local, s.st, mirror.Options{})
		var pe *mirror.PeerError
		if !errors.As(err, &pe) || pe.Info.Code != protocol.CodeBadRequest {
			t.Errorf("pull of %s: %v, want a bad_request refusal", p, err)
		}
	}
	// A pull of the whole data dir carries the user's files, not the jobs.
	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: data})
	local := filepath.Join(t.TempDir(), "got")
	mirror.Receive(copyCtx(t), local, s.st, mirror.Options{})
	got := readTree(t, local)
	if got["user/f"] != "user data" {
		t.Errorf("pull of the data dir: %v, want user/f", got)
	}
	for p := range got {
		if strings.HasPrefix(p, "jobs") {
			t.Errorf("pull of the data dir carried the agent's job state %s", p)
		}
	}
}

// TestCopyPushKeepsDestinationDirectory pushes onto a directory a process
// runs in: the directory keeps its identity, so the process's working
// directory (here a held descriptor) sees the new files.
func TestCopyPushKeepsDestinationDirectory(t *testing.T) {
	h := newHarness(t, nil)
	dst := filepath.Join(h.a.cfg.DataDir, "srv")
	writeTree(t, dst, map[string]string{"old": "o", "conf/a": "a1"})
	held, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	before, _ := held.Stat()
	src := t.TempDir()
	writeTree(t, src, map[string]string{"conf/a": "a2-longer", "new": "n"})
	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, Delete: true})
	if _, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{}); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(dst)
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the destination directory was replaced (%v)", err)
	}
	names, err := held.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	if want := []string{"conf", "new"}; !slices.Equal(names, want) {
		t.Errorf("the held directory lists %v, want %v", names, want)
	}
}

// TestCopyPathNotUTF8 pushes to and pulls from a node path whose name is
// not UTF-8 (Linux allows any bytes but '/' and NUL), holding such names:
// the bytes survive the stream header's JSON and the copy stream.
func TestCopyPathNotUTF8(t *testing.T) {
	h := newHarness(t, nil)
	dst := filepath.Join(h.a.cfg.DataDir, "caf\xe9")
	src := t.TempDir()
	writeTree(t, src, map[string]string{"\xff\xfe": "x", "d\x80/f": "y"})
	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst})
	if _, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"\xff\xfe": "x", "d\x80/f": "y"}
	if got := readTree(t, dst); !equalMaps(got, want) {
		t.Errorf("pushed to %q: %q, want %q", dst, got, want)
	}
	local := filepath.Join(t.TempDir(), "back")
	s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: dst})
	if _, err := mirror.Receive(copyCtx(t), local, s.st, mirror.Options{}); err != nil {
		t.Fatal(err)
	}
	if got := readTree(t, local); !equalMaps(got, want) {
		t.Errorf("pulled %q, want %q", got, want)
	}
}

// TestCopyRefusesHardLinksToAgentState: a hard link under a copy root to a
// file inside the agent's identity directory is the agent's own state: a
// pull of it is refused naming the file, a pull of a tree holding it skips
// it, a push onto it is refused, and the file is unchanged.
func TestCopyRefusesHardLinksToAgentState(t *testing.T) {
	h := newHarness(t, nil)
	data := h.a.cfg.DataDir
	key := filepath.Join(h.a.cfg.IdentityDir, "node.pem")
	if err := os.MkdirAll(h.a.cfg.IdentityDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, []byte("PRIVATE KEY"), 0o600); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(data, "work")
	writeTree(t, work, map[string]string{"a": "a"})
	if err := os.Link(key, filepath.Join(work, "node_hl")); err != nil {
		t.Fatal(err)
	}

	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(work, "node_hl")})
	_, err := mirror.Receive(copyCtx(t), filepath.Join(t.TempDir(), "n"), s.st, mirror.Options{})
	var pe *mirror.PeerError
	if !errors.As(err, &pe) || !strings.Contains(pe.Info.Message, "the agent's own state") || !strings.Contains(pe.Info.Message, key) {
		t.Errorf("pull of the hard link: %v, want a refusal naming %s", err, key)
	}

	out := filepath.Join(t.TempDir(), "w")
	s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: work})
	res, err := mirror.Receive(copyCtx(t), out, s.st, mirror.Options{})
	if err != nil {
		t.Fatalf("pull of the tree: %v", err)
	}
	if res.Skipped != 1 || len(res.SkippedEntries) != 1 || res.SkippedEntries[0].Path != "node_hl" {
		t.Errorf("pull of the tree skipped %+v, want node_hl", res.SkippedEntries)
	}
	if got := readTree(t, out); !equalMaps(got, map[string]string{"a": "a"}) {
		t.Errorf("pull of the tree copied %v, want only a", got)
	}

	src := t.TempDir()
	writeTree(t, src, map[string]string{"node_hl": "ATTACKER KEY"})
	s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(work, "node_hl")})
	_, err = mirror.Send(copyCtx(t), filepath.Join(src, "node_hl"), s.st, mirror.Options{})
	if !errors.As(err, &pe) || !strings.Contains(pe.Info.Message, "the agent's own state") {
		t.Errorf("push onto the hard link: %v, want a refusal naming the agent's own state", err)
	}
	if b, err := os.ReadFile(key); err != nil || string(b) != "PRIVATE KEY" {
		t.Errorf("identity file now %q (%v)", b, err)
	}
}
