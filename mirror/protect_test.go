package mirror

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// protectedLinks lays out a protected directory state (the agent's state:
// identity/node.pem, jobs/j1/log) and a copy source work beside it holding
// an ordinary file a and node_hl, a hard link to state/identity/node.pem.
func protectedLinks(t *testing.T) (state, work, key string) {
	t.Helper()
	base := t.TempDir()
	state = filepath.Join(base, "state")
	work = filepath.Join(base, "work")
	key = filepath.Join(state, "identity", "node.pem")
	for _, d := range []string{filepath.Join(state, "identity"), filepath.Join(state, "jobs", "j1"), work} {
		fatalIf(t, os.MkdirAll(d, 0o755))
	}
	fatalIf(t, os.WriteFile(key, []byte("PRIVATE KEY"), 0o600))
	fatalIf(t, os.WriteFile(filepath.Join(state, "jobs", "j1", "log"), []byte("log"), 0o600))
	fatalIf(t, os.WriteFile(filepath.Join(work, "a"), []byte("a"), 0o644))
	fatalIf(t, os.Link(key, filepath.Join(work, "node_hl")))
	return state, work, key
}

// TestProtectedHardLinkSource: a hard link, outside a protected directory,
// to a file inside it is the agent's own state: pulled alone it is refused
// naming the protected file; in a tree it is skipped and named, the rest
// copied.
func TestProtectedHardLinkSource(t *testing.T) {
	state, work, key := protectedLinks(t)
	opts := Options{Protected: []string{state}, Logger: testLogger(t)}
	out := t.TempDir()

	s, r, _ := runCopy(t, filepath.Join(work, "node_hl"), filepath.Join(out, "n"), opts)
	if s.err == nil || !strings.Contains(s.err.Error(), "the agent's own state") || !strings.Contains(s.err.Error(), key) {
		t.Errorf("pull of the hard link: send error %v, want a refusal naming %s", s.err, key)
	}
	if r.err == nil {
		t.Errorf("pull of the hard link: receive succeeded")
	}
	if _, err := os.Lstat(filepath.Join(out, "n")); !os.IsNotExist(err) {
		t.Errorf("pull of the hard link left %s (lstat: %v)", filepath.Join(out, "n"), err)
	}

	res, _ := mustCopy(t, work, filepath.Join(out, "w"), opts)
	if res.Skipped != 1 || len(res.SkippedEntries) != 1 || res.SkippedEntries[0].Path != "node_hl" ||
		!strings.Contains(res.SkippedEntries[0].Reason, "the agent's own state") || !strings.Contains(res.SkippedEntries[0].Reason, key) {
		t.Errorf("tree pull: skipped %d %+v, want node_hl skipped naming %s", res.Skipped, res.SkippedEntries, key)
	}
	if got := listDir(t, filepath.Join(out, "w")); strings.Join(got, ",") != "a" {
		t.Errorf("tree pull copied %v, want [a]", got)
	}

	// Strict: the whole copy fails, naming the link.
	s, _, _ = runCopy(t, work, filepath.Join(out, "strict"), Options{Protected: []string{state}, Strict: true})
	if s.err == nil || !strings.Contains(s.err.Error(), "node_hl") {
		t.Errorf("strict tree pull: %v, want a failure naming node_hl", s.err)
	}
}

// TestProtectedHardLinkDestination: a destination that is, or holds, a hard
// link to a file inside a protected directory is refused, and the
// protected file is unchanged (content, mode, mtime).
func TestProtectedHardLinkDestination(t *testing.T) {
	state, work, key := protectedLinks(t)
	before := digest(t, state)
	opts := Options{Protected: []string{state}, Delete: true}
	src := t.TempDir()
	fatalIf(t, os.WriteFile(filepath.Join(src, "node_hl"), []byte("ATTACKER KEY"), 0o644))
	fatalIf(t, os.WriteFile(filepath.Join(src, "a"), []byte("a"), 0o644))

	_, r, _ := runCopy(t, filepath.Join(src, "node_hl"), filepath.Join(work, "node_hl"), opts)
	if r.err == nil || !strings.Contains(r.err.Error(), "the agent's own state") || !strings.Contains(r.err.Error(), key) {
		t.Errorf("push onto the hard link: receive error %v, want a refusal naming %s", r.err, key)
	}
	_, r, _ = runCopy(t, src, work, opts)
	if r.err == nil || !strings.Contains(r.err.Error(), "the agent's own state") || !strings.Contains(r.err.Error(), "node_hl") {
		t.Errorf("push onto a tree holding the hard link: receive error %v, want a refusal naming node_hl", r.err)
	}
	if b, err := os.ReadFile(key); err != nil || !bytes.Equal(b, []byte("PRIVATE KEY")) {
		t.Errorf("protected file now %q (%v)", b, err)
	}
	if got := digest(t, state); len(got) != len(before) {
		t.Errorf("protected state changed: %v, was %v", got, before)
	} else {
		for k, v := range before {
			if got[k] != v {
				t.Errorf("protected %s changed: %+v, was %+v", k, got[k], v)
			}
		}
	}
	if fi, err := os.Stat(filepath.Join(work, "node_hl")); err != nil || !os.SameFile(fi, mustStat(t, key)) {
		t.Errorf("the hard link was replaced or removed (%v)", err)
	}
}

// TestProtectedWalkOnlyForMultiLinkFiles: the protected directories are
// listed only when a copy meets a regular file with more than one link,
// and then once per copy end.
func TestProtectedWalkOnlyForMultiLinkFiles(t *testing.T) {
	state, _, _ := protectedLinks(t)
	src := t.TempDir()
	build(t, src, spec{"f1": "1", "d/f2": "2", "d/e/f3": "3"})
	opts := Options{Protected: []string{state}}
	start := protWalks.Load()
	mustCopy(t, src, filepath.Join(t.TempDir(), "dst"), opts)
	if n := protWalks.Load() - start; n != 0 {
		t.Errorf("a copy without multi-link files listed the protected directories %d times, want 0", n)
	}
	fatalIf(t, os.Link(filepath.Join(src, "f1"), filepath.Join(src, "d", "f1b")))
	start = protWalks.Load()
	res, _ := mustCopy(t, src, filepath.Join(t.TempDir(), "dst"), opts)
	if res.Skipped != 0 {
		t.Errorf("ordinary hard links skipped: %+v", res.SkippedEntries)
	}
	if n := protWalks.Load() - start; n != 1 {
		t.Errorf("a copy with two names of one file listed the protected directories %d times, want 1 (the sender's)", n)
	}
}

// TestProtectedWalkCapFailsClosed: when the protected directories hold
// more entries than the walk lists, a multi-link file cannot be told
// apart from the agent's state and is skipped, saying why.
func TestProtectedWalkCapFailsClosed(t *testing.T) {
	state, _, _ := protectedLinks(t)
	old := protWalkCap
	protWalkCap = 2
	t.Cleanup(func() { protWalkCap = old })
	src := t.TempDir()
	build(t, src, spec{"f1": "1", "f2": "2"})
	fatalIf(t, os.Link(filepath.Join(src, "f1"), filepath.Join(src, "f1b")))
	res, _ := mustCopy(t, src, filepath.Join(t.TempDir(), "dst"), Options{Protected: []string{state}})
	if res.Skipped != 2 || len(res.SkippedEntries) != 2 || !strings.Contains(res.SkippedEntries[0].Reason, "more than 2 entries") {
		t.Errorf("skipped %d %+v, want f1 and f1b skipped: the protected directories hold more than 2 entries", res.Skipped, res.SkippedEntries)
	}
}

func mustStat(t *testing.T, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(p)
	fatalIf(t, err)
	return fi
}

// TestProtectedLinkSwappedInAfterWalk: a source file replaced, between the
// walk and its reading, by a hard link to a file inside a protected
// directory is skipped, not sent (small files, read ahead, and big ones,
// streamed).
func TestProtectedLinkSwappedInAfterWalk(t *testing.T) {
	state, _, key := protectedLinks(t)
	src := t.TempDir()
	build(t, src, spec{"small": "s", "zbig": strings.Repeat("b", chunkSize+1), "other": "o"})
	swap := func(rel string) {
		p := filepath.Join(src, rel)
		fatalIf(t, os.Remove(p))
		fatalIf(t, os.Link(key, p))
	}
	smallIOHook = func(op, rel string) error {
		if op == "open" && rel == "small" {
			swap(rel)
		}
		return nil
	}
	t.Cleanup(func() { smallIOHook = nil })
	// The big file, sent last, is swapped once a file has been sent: the
	// walk is over and the sender has not opened it yet.
	var once sync.Once
	opts := Options{Protected: []string{state}, Progress: func(Progress) { once.Do(func() { swap("zbig") }) }}
	dst := filepath.Join(t.TempDir(), "dst")
	res, _ := mustCopy(t, src, dst, opts)
	var skipped []string
	for _, sk := range res.SkippedEntries {
		if strings.Contains(sk.Reason, "the agent's own state") {
			skipped = append(skipped, sk.Path)
		}
	}
	slices.Sort(skipped)
	if strings.Join(skipped, ",") != "small,zbig" {
		t.Errorf("skipped %+v, want small and zbig skipped as the agent's own state", res.SkippedEntries)
	}
	for _, n := range []string{"small", "zbig"} {
		if b, err := os.ReadFile(filepath.Join(dst, n)); err == nil && strings.Contains(string(b), "PRIVATE KEY") {
			t.Errorf("%s: the protected file's content was copied", n)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dst, "other")); err != nil || string(b) != "o" {
		t.Errorf("other: %q, %v", b, err)
	}
}

// TestProtectedLinkIntoState: a file outside that also has a name inside a
// protected directory (a hard link made in there) is part of the agent's
// state too: refused, naming the name inside.
func TestProtectedLinkIntoState(t *testing.T) {
	state, work, _ := protectedLinks(t)
	b := filepath.Join(work, "b")
	fatalIf(t, os.WriteFile(b, []byte("b"), 0o644))
	inside := filepath.Join(state, "jobs", "j1", "b_link")
	fatalIf(t, os.Link(b, inside))
	s, _, _ := runCopy(t, b, filepath.Join(t.TempDir(), "b"), Options{Protected: []string{state}})
	if s.err == nil || !strings.Contains(s.err.Error(), inside) {
		t.Errorf("pull of a file also named inside the state: %v, want a refusal naming %s", s.err, inside)
	}
}
