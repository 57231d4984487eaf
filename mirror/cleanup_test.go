package mirror

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
)

// cleanupTrees builds the source and the old destination of the cleanup
// tests: read-only old directories that get a new entry, lose one (with
// Delete) or are replaced, a new read-only directory (its mode is set
// after the renames), a kept file whose mode changes, and deletions.
func cleanupTrees(t *testing.T) (src, dst string) {
	t.Helper()
	src = filepath.Join(t.TempDir(), "src")
	writableOnCleanup(t, src)
	richTree(t, src)
	build(t, src, spec{"was-dir": "now a file", "was-file/x": "x", "keep": "new",
		"rodir/new": "n", "rodir/kept": "same", "newro/f": "f"})
	fatalIf(t, os.Chmod(filepath.Join(src, "rodir/kept"), 0o640))
	for _, d := range []string{"rodir", "newro"} {
		fatalIf(t, os.Chmod(filepath.Join(src, d), 0o555))
	}
	dst = filepath.Join(t.TempDir(), "dst")
	writableOnCleanup(t, dst)
	build(t, dst, spec{"keep": "older", "a.txt": "old a.txt", "was-dir/x": "x", "was-file": "f", "ro/": "",
		"link-rel": "-> keep", "gone": "g", "rodir/kept": "same", "rodir/gone": "g", "gonedir/sub/f": "f"})
	fatalIf(t, os.Chmod(filepath.Join(dst, "rodir/kept"), 0o600))
	for _, d := range []string{"was-dir", "ro", "rodir", "gonedir/sub", "gonedir"} {
		fatalIf(t, os.Chmod(filepath.Join(dst, d), 0o555))
	}
	return src, dst
}

// withoutMtimes is a digest without mtimes, whose restoring is not
// promised once a commit failed past its point of no return.
func withoutMtimes(d map[string]node) map[string]node {
	out := map[string]node{}
	for k, n := range d {
		n.Mtime = 0
		out[k] = n
	}
	return out
}

// testCommitFailuresCleanUp fails each step of a commit and of its
// rollback, at each of its calls in turn (stepHook, commitHook), and
// checks what is left:
//   - up to the point of no return (renames, making directories
//     writable, deletions, late modes) the commit is rolled back: the
//     destination is exactly as before, modes and mtimes included, and no
//     temporary entry or stage is left;
//   - past it (removing old versions, kept entries' and old directories'
//     metadata) the destination holds the new tree, every directory has
//     its requested mode, or its old one where setting it failed (never
//     the u+w the commit gave it), and the error says what failed;
//   - when the rollback itself stops part-way, nothing of the old tree is
//     lost (every old file's data is still there, at its name or under a
//     temporary one), the temporary entries of new entries not in place
//     are removed, and no directory keeps the u+w the commit gave it.
func testCommitFailuresCleanUp(t *testing.T) {
	injected := errors.New("injected failure")
	type plan struct {
		name  string
		step  string // failing step ("rename": commitHook)
		also  string // a step failing at its first call too (to start a rollback)
		final bool   // past the point of no return
	}
	plans := []plan{
		{name: "writable", step: stepWritable},
		{name: "rename", step: "rename"},
		{name: "delete", step: stepDelete},
		{name: "latemode", step: stepLateMode},
		{name: "undo after a late failure", step: stepUndo, also: stepLateMode},
		{name: "undo after a failed rename", step: stepUndo, also: "last rename"},
		{name: "remove", step: stepRemove, final: true},
		{name: "fix", step: stepFix, final: true},
		{name: "dirmeta", step: stepDirMeta, final: true},
	}
	for _, p := range plans {
		t.Run(p.name, func(t *testing.T) {
			// Each subtest its own source: runCopy makes it writable
			// when its test ends.
			src, _ := cleanupTrees(t)
			want := digest(t, src)
			for k := 1; ; k++ {
				_, dst := cleanupTrees(t)
				before := digest(t, dst)
				oldDirs := map[string]fs.FileMode{}
				for rel, n := range before {
					if n.Type == "dir" {
						oldDirs[rel] = n.Mode
					}
				}
				calls := map[string]int{}
				var failed []string // rels of the failing step's failures
				renames := 0
				// The number of renames, for "last rename".
				if p.also == "last rename" {
					_, d2 := cleanupTrees(t)
					commitHook = func(string) error { renames++; return nil }
					_, r, _ := runCopy(t, src, d2, Options{Delete: true})
					commitHook = nil
					fatalIf(t, r.err)
				}
				fail := func(step, rel string) error {
					calls[step]++
					if step == p.step && calls[step] == k {
						failed = append(failed, rel)
						return fmt.Errorf("%s %s: %w", step, rel, injected)
					}
					if step == p.also && calls[step] == 1 {
						return fmt.Errorf("%s %s: %w", step, rel, injected)
					}
					return nil
				}
				stepHook = fail
				commitHook = func(rel string) error {
					if p.also == "last rename" {
						calls["rename-all"]++
						if calls["rename-all"] == renames {
							return fmt.Errorf("rename %s: %w", rel, injected)
						}
						return nil
					}
					return fail("rename", rel)
				}
				_, r, _ := runCopy(t, src, dst, Options{Delete: true, Logger: testLogger(t)})
				stepHook, commitHook = nil, nil
				if len(failed) == 0 {
					// Past the last call of the step: the copy succeeds.
					if p.also == "" && r.err != nil {
						t.Fatalf("copy without a failure: %v", r.err)
					}
					if p.also == "" {
						copyEqual(t, src, dst)
					} else {
						// Every undo worked: as before.
						if r.err == nil || !errors.Is(r.err, injected) || !strings.Contains(r.err.Error(), "were put back") {
							t.Errorf("%s failing, every undo working: %v; want the failure, everything put back", p.also, r.err)
						}
						if diff := cmp.Diff(before, digest(t, dst)); diff != "" {
							t.Errorf("%s failing, every undo working, changed the destination (-before +after):\n%s", p.also, diff)
						}
					}
					noStage(t, filepath.Dir(dst))
					if k == 1 {
						t.Fatalf("step %s never ran: the test covers nothing", p.step)
					}
					break
				}
				if r.err == nil || !errors.Is(r.err, injected) {
					t.Fatalf("%s failing at call %d: %v, want the injected failure", p.step, k, r.err)
				}
				after := digest(t, dst)
				switch {
				case p.step == stepUndo:
					if !strings.Contains(r.err.Error(), "putting them back failed") {
						t.Errorf("undo failing at call %d: %v, want it to say the rollback failed", k, r.err)
					}
					keptData(t, before, filepath.Dir(dst))
					for rel, n := range after {
						if n.Type != "dir" {
							continue
						}
						if m, ok := oldDirs[rel]; ok && n.Mode != m && n.Mode != want[rel].Mode {
							t.Errorf("undo failing at call %d: directory %s has mode %v; want its old %v or its new %v", k, rel, n.Mode, m, want[rel].Mode)
						}
					}
				case !p.final:
					if diff := cmp.Diff(before, after); diff != "" {
						t.Fatalf("%s failing at call %d changed the destination (-before +after):\n%s", p.step, k, diff)
					}
					noStage(t, filepath.Dir(dst))
				default:
					got, wantNow := withoutMtimes(after), withoutMtimes(want)
					switch p.step {
					case stepRemove:
						if !strings.Contains(r.err.Error(), "remove the old version of") {
							t.Errorf("remove failing at call %d: %v, want it named", k, r.err)
						}
						// That old version stays under its temporary name.
						for rel := range got {
							if isTempName(filepath.Base(rel)) || strings.Contains(rel, "/"+tmpPrefix) || strings.HasPrefix(rel, tmpPrefix) {
								delete(got, rel)
							}
						}
					case stepFix:
						noStage(t, filepath.Dir(dst))
						for _, rel := range failed {
							n := wantNow[rel]
							n.Mode = before[rel].Mode // not changed
							wantNow[rel] = n
						}
					case stepDirMeta:
						noStage(t, filepath.Dir(dst))
						for _, rel := range failed {
							n := wantNow[rel]
							n.Mode = before[rel].Mode // put back, not left u+w
							wantNow[rel] = n
						}
					}
					if diff := cmp.Diff(wantNow, got); diff != "" {
						t.Errorf("%s failing at call %d: the destination is not the new tree (-want +got):\n%s", p.step, k, diff)
					}
				}
			}
		})
	}
}

// keptData fails unless every file of the old tree (before) still has its
// data somewhere under dir: a rollback that stopped part-way must not
// lose an old entry.
func keptData(t *testing.T, before map[string]node, dir string) {
	t.Helper()
	have := map[string]bool{}
	for _, n := range digest(t, dir) {
		if n.Type == "file" {
			have[n.Data] = true
		}
	}
	for rel, n := range before {
		if n.Type == "file" && !have[n.Data] {
			t.Errorf("the old file %s is lost", rel)
		}
	}
}

func TestCommitFailuresCleanUp(t *testing.T) { testCommitFailuresCleanUp(t) }

// TestCommitFailuresCleanUpAsNonRoot: the same as a normal user, for
// whom the read-only directories are what they say.
func TestCommitFailuresCleanUpAsNonRoot(t *testing.T) {
	if asNonRoot(t, "TestCommitFailuresCleanUpAsNonRoot") {
		testCommitFailuresCleanUp(t)
	}
}

// TestCommitFailureReachesSender: a commit that fails past its point of no
// return (removing an old version, a kept entry's or an old directory's
// metadata), or whose rollback stops part-way, is reported to the sender
// with FrameError (copy_failed), naming the entry and the cause and saying
// where the destination stands, as every other failure is: the receiver
// only logged it and ended the stream, which the sender (tether cp) took
// for the agent stopping (fresh21: exit 255, "the stream from the node
// ended before the copy did").
func TestCommitFailureReachesSender(t *testing.T) {
	injected := errors.New("injected failure")
	for _, tc := range []struct {
		name, step, also, want string
	}{
		{"remove", stepRemove, "", "the new tree is in place"},
		{"fix", stepFix, "", "the new tree is in place"},
		{"dirmeta", stepDirMeta, "", "the new tree is in place"},
		{"undo", stepUndo, stepLateMode, "putting them back failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := cleanupTrees(t)
			var rel string
			calls := map[string]int{}
			stepHook = func(step, r string) error {
				calls[step]++
				if step == tc.step && calls[step] == 1 {
					rel = r
				} else if step != tc.also || calls[step] != 1 {
					return nil
				}
				return fmt.Errorf("%s: %w", step, injected)
			}
			t.Cleanup(func() { stepHook = nil })
			s, r, _ := runCopy(t, src, dst, Options{Delete: true})
			stepHook = nil
			if rel == "" {
				t.Fatalf("step %s never ran", tc.step)
			}
			if !errors.Is(r.err, injected) {
				t.Fatalf("receive: %v; want the injected failure", r.err)
			}
			var pe *PeerError
			if !errors.As(s.err, &pe) {
				t.Fatalf("send: %v; want the receiver's error frame", s.err)
			}
			if pe.Info.Code != protocol.CodeCopyFailed || !strings.Contains(pe.Info.Message, fmt.Sprintf("%q", rel)) ||
				!strings.Contains(pe.Info.Message, injected.Error()) || !strings.Contains(pe.Info.Message, tc.want) ||
				strings.Contains(pe.Info.Message, "\n") {
				t.Errorf("error frame %+v; want one line, copy_failed, naming %q, the cause and %q", pe.Info, rel, tc.want)
			}
		})
	}
}
