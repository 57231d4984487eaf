package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// policyRootsCheck drives copies confined by CopyParams.Roots ([pub]) in
// the copy root base, as user (in process for ""): symlinks that leave
// pub, absolute or relative, are refused naming pub, for reads and for
// writes, and nothing is written outside pub; a path outside pub is
// refused before anything is resolved, naming the granted roots and the
// copy roots; a symlink inside pub, and a pub that does not exist yet
// (a push creates it), still work; a grant that does not meet the copy
// roots refuses everything.
func policyRootsCheck(t *testing.T, h *harness, base, user string, uid int) {
	t.Helper()
	pub := filepath.Join(base, "pub")
	outside := filepath.Join(base, "outside")
	writeTree(t, outside, map[string]string{"secret": "s"})
	writeTree(t, pub, map[string]string{"sub/ok": "ok"})
	for name, target := range map[string]string{"abs": outside, "rel": "../outside", "in": filepath.Join(pub, "sub")} {
		if err := os.Symlink(target, filepath.Join(pub, name)); err != nil {
			t.Fatal(err)
		}
	}
	if user != "" {
		chownTree(base, uid)
	}
	src := t.TempDir()
	writeTree(t, src, map[string]string{"planted": "x"})
	os.Chmod(src, 0o755)
	roots := []string{pub}
	copyErr := func(p protocol.CopyParams) error {
		p.User, p.Roots = user, roots
		s := h.open(t, protocol.KindCopy, p)
		var err error
		if p.Direction == protocol.CopyPull {
			_, err = mirror.Receive(copyCtx(t), filepath.Join(t.TempDir(), "got"), s.st, mirror.Options{})
		} else {
			_, err = mirror.Send(copyCtx(t), filepath.Join(src, "planted"), s.st, mirror.Options{})
		}
		return err
	}
	for _, tc := range []struct {
		name string
		p    protocol.CopyParams
		want string
	}{
		{"pull through an absolute symlink", protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(pub, "abs", "secret")}, "symlink abs points to " + outside + ", which is not under a copy root (" + pub + ")"},
		{"pull through a relative symlink", protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(pub, "rel", "secret")}, "leads outside the copy root " + pub},
		{"push through an absolute symlink", protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(pub, "abs") + "/", Into: true}, "symlink abs points to " + outside},
		{"push below a relative symlink", protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(pub, "rel", "x")}, "leads outside the copy root " + pub},
		{"path outside the grant", protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(outside, "secret")}, "is not under a path the coordinator's policy granted (" + pub + ")"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := copyErr(tc.p)
			var pe *mirror.PeerError
			if !errors.As(err, &pe) || pe.Info.Code != protocol.CodeBadRequest || !strings.Contains(pe.Info.Message, tc.want) {
				t.Fatalf("copy error = %v, want a bad_request containing %q", err, tc.want)
			}
		})
	}
	if got := readTree(t, outside); !equalMaps(got, map[string]string{"secret": "s"}) {
		t.Errorf("outside the grant changed: %v", got)
	}
	// Inside the grant, through a symlink that stays in it.
	if err := copyErr(protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(pub, "in", "ok")}); err != nil {
		t.Errorf("pull through pub/in: %v", err)
	}
	if err := copyErr(protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(pub, "in") + "/", Into: true}); err != nil {
		t.Errorf("push through pub/in: %v", err)
	} else if _, err := os.Stat(filepath.Join(pub, "sub", "planted")); err != nil {
		t.Errorf("push through pub/in: %v", err)
	}
	// A granted directory that does not exist yet: the push creates it,
	// beneath the copy root.
	roots = []string{filepath.Join(base, "new", "dir")}
	if err := copyErr(protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(base, "new", "dir", "f")}); err != nil {
		t.Errorf("push into a granted directory not there yet: %v", err)
	} else if _, err := os.Stat(filepath.Join(base, "new", "dir", "f")); err != nil {
		t.Errorf("push into a granted directory not there yet: %v", err)
	}
	// A granted file, not there yet: a push onto it creates the file (not
	// a directory), a pull reads it back; a path below it is not a
	// directory.
	conf := filepath.Join(base, "app.conf")
	roots = []string{conf}
	if err := copyErr(protocol.CopyParams{Direction: protocol.CopyPush, Path: conf}); err != nil {
		t.Errorf("push onto a granted file: %v", err)
	} else if b, err := os.ReadFile(conf); err != nil || string(b) != "x" {
		t.Errorf("push onto a granted file: %q, %v", b, err)
	}
	if err := copyErr(protocol.CopyParams{Direction: protocol.CopyPull, Path: conf}); err != nil {
		t.Errorf("pull of a granted file: %v", err)
	}
	// The granted directory itself, with --delete: mirrored as a whole.
	roots = []string{pub}
	st := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: pub, Delete: true, User: user, Roots: roots})
	if _, err := mirror.Send(copyCtx(t), src, st.st, mirror.Options{}); err != nil {
		t.Errorf("push --delete onto the granted directory itself: %v", err)
	} else if got := readTree(t, pub); !equalMaps(got, map[string]string{"planted": "x"}) {
		t.Errorf("push --delete onto the granted directory itself: it holds %v, want the source's tree", got)
	}
	// A granted directory reached through a symlink out of the copy roots
	// is not opened by name: its symlink is resolved beneath the roots.
	if err := os.Symlink(t.TempDir(), filepath.Join(base, "away")); err != nil {
		t.Fatal(err)
	}
	roots = []string{filepath.Join(base, "away", "pub")}
	if err := copyErr(protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(base, "away", "pub", "f")}); err == nil || !strings.Contains(err.Error(), "not under a copy root") {
		t.Errorf("push into a granted directory behind a symlink out of the copy roots: %v, want a refusal", err)
	}
	// The policy grants the whole file system, the copy roots do not: the
	// copy roots are named as what leaves the path out.
	// (As another user, the local policy's copy_roots refuse it first.)
	roots = []string{"/"}
	if err := copyErr(protocol.CopyParams{Direction: protocol.CopyPull, Path: "/proc/self/status"}); user == "" && (err == nil ||
		!strings.Contains(err.Error(), `copy path "/proc/self/status" is outside this node's copy roots (`) || !strings.Contains(err.Error(), "; the policy grants /")) {
		t.Errorf("copy granted by the policy, outside the copy roots: %v, want the copy roots named", err)
	}
	// A grant that does not meet the copy roots.
	roots = []string{"/nowhere/granted"}
	if err := copyErr(protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(base, "x")}); err == nil || !strings.Contains(err.Error(), "is not under a path the coordinator's policy granted") {
		t.Errorf("copy under a grant outside the copy roots: %v, want a refusal", err)
	}
}

// chownTree gives the tree at root (symlinks themselves included) to uid.
func chownTree(root string, uid int) {
	filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			os.Lchown(p, uid, uid)
		}
		return nil
	})
}

func TestCopyPolicyRoots(t *testing.T) {
	h := newHarness(t, nil)
	policyRootsCheck(t, h, h.a.cfg.DataDir, "", -1)
}

// TestCopyPolicyRootsAsUser: the same through the copy helper, which
// runs with the account's credentials.
func TestCopyPolicyRootsAsUser(t *testing.T) {
	u := newTestUser(t)
	h := newHarness(t, withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\n    copy_roots: [%s]\n", u.name, u.home)))
	policyRootsCheck(t, h, u.home, u.name, u.uid)
}
