package natsauth_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
)

// wantRefused fails the test unless err is non-nil and names every want.
func wantRefused(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted", what)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: error %q does not name %q", what, err, w)
		}
	}
}

// Every file of a layout and its directory must be owned by root or the
// running uid and writable by the owner only; seeds also readable by the
// owner only. Load refuses anything else, naming the path, its mode or
// owner and the command that fixes it; symlinks are followed and the
// target is checked. The layout Load writes passes.
func TestLoadChecksLayoutPermissions(t *testing.T) {
	fresh := func(t *testing.T) string {
		l := natsauthtest.NewLayout(t)
		return l.Dir()
	}
	load := func(dir string) error {
		_, err := natsauth.Load(dir, natsauth.Config{})
		return err
	}
	t.Run("good", func(t *testing.T) {
		dir := fresh(t)
		if err := load(dir); err != nil {
			t.Fatalf("the layout Load wrote: %v", err)
		}
		// Group-readable is fine for the directory and the JWTs.
		if err := os.Chmod(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, "operator.jwt"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := load(dir); err != nil {
			t.Fatalf("a readable directory and JWT: %v", err)
		}
	})
	t.Run("group-writable directory", func(t *testing.T) {
		dir := fresh(t)
		if err := os.Chmod(dir, 0o770); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, "directory 0770", load(dir), dir, "0770", "chmod go-w "+dir)
	})
	t.Run("other-readable seed", func(t *testing.T) {
		dir := fresh(t)
		seed := filepath.Join(dir, "operator.nk")
		if err := os.Chmod(seed, 0o604); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, "seed 0604", load(dir), seed, "0604", "chmod 600 "+seed)
	})
	t.Run("group-writable JWT", func(t *testing.T) {
		dir := fresh(t)
		j := filepath.Join(dir, "account-CLIENTS.jwt")
		if err := os.Chmod(j, 0o620); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, "CLIENTS JWT 0620", load(dir), j, "0620", "chmod go-w "+j)
	})
	t.Run("symlinked directory to a world-writable target", func(t *testing.T) {
		dir := fresh(t)
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(t.TempDir(), "link")
		if err := os.Symlink(dir, link); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, "link to a 0777 directory", load(link), link, dir, "0777", "chmod go-w "+dir)
	})
	t.Run("symlinked seed to a world-readable target", func(t *testing.T) {
		dir := fresh(t)
		seed := filepath.Join(dir, "account-SYS.nk")
		target := filepath.Join(t.TempDir(), "sys.nk")
		if err := os.Rename(seed, target); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(target, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, seed); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, "link to a 0644 seed", load(dir), seed, target, "0644", "chmod 600 "+target)
		if err := os.Chmod(target, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := load(dir); err != nil {
			t.Errorf("link to a 0600 seed: %v", err)
		}
	})
	t.Run("foreign owner", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("chown to another uid needs root")
		}
		for _, name := range []string{"", "account-TETHER.nk", "account-TETHER.jwt"} {
			dir := fresh(t)
			p := filepath.Join(dir, name)
			if err := os.Chown(p, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			wantRefused(t, "owned by 65534: "+p, load(dir), p, "uid 65534", "chown 0 "+p)
		}
	})
}

// A layout file made loose while a process runs is refused when the
// revocations are reloaded, not read.
func TestReloadRevocationsChecksPermissions(t *testing.T) {
	l := natsauthtest.NewLayout(t)
	j := filepath.Join(l.Dir(), "account-CLIENTS.jwt")
	if err := os.Chmod(j, 0o666); err != nil {
		t.Fatal(err)
	}
	_, err := l.ReloadRevocations()
	wantRefused(t, "reload from a 0666 JWT", err, j, "0666", "chmod go-w "+j)
}

// A creds file (what --nats-creds names) must be owned by root or the
// running uid and readable by its owner only; a symlink's target is what
// is checked.
func TestReadCredsChecksPermissions(t *testing.T) {
	l := natsauthtest.NewLayout(t)
	path := natsauthtest.CredsFile(t, natsauthtest.ClientCreds(t, l, "bob"))
	if _, err := natsauth.ReadCreds(path); err != nil {
		t.Fatalf("a 0600 creds file: %v", err)
	}
	link := filepath.Join(t.TempDir(), "link.creds")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := natsauth.ReadCreds(link); err != nil {
		t.Fatalf("a link to a 0600 creds file: %v", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := natsauth.ReadCreds(link)
	wantRefused(t, "link to a 0644 creds file", err, link, path, "0644", "chmod 600 "+path)
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(path, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		_, err := natsauth.ReadCreds(path)
		wantRefused(t, "creds owned by 65534", err, path, "uid 65534", "chown 0 "+path)
	}
}
