package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// TestCopyRefusesExecRecords: through a copy root of / or of the data
// dir's parent, a push into DATA-DIR/execs (where a planted record would
// name a process group the next agent kills) is refused, with or without
// --delete, and no file appears there; a pull of the SSH host key is
// refused too, and a pull of the parent directory leaves both out.
func TestCopyRefusesExecRecords(t *testing.T) {
	for _, root := range []string{"/", "parent"} {
		t.Run(root, func(t *testing.T) {
			parent := t.TempDir()
			data := filepath.Join(parent, "agent")
			if root == "parent" {
				root = parent
			}
			h := newHarness(t, func(c *Config) { c.DataDir = data; c.CopyRoots = []string{root} })
			execs := h.a.execsDir()
			src := t.TempDir()
			writeTree(t, src, map[string]string{"slots-1-1-x": `{"v":1,"leader":{"pid":1,"start":1}}`})
			for _, dst := range []string{execs, filepath.Join(execs, "slots-1-1-x"), filepath.Join(execs, "sub", "deeper")} {
				for _, del := range []bool{false, true} {
					s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, Delete: del})
					_, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{})
					var pe *mirror.PeerError
					if !errors.As(err, &pe) || pe.Info.Code != protocol.CodeBadRequest || !strings.Contains(pe.Info.Message, execs) {
						t.Errorf("push onto %s (delete %v): %v, want a bad_request refusal naming %s", dst, del, err, execs)
					}
				}
			}
			if ents, _ := os.ReadDir(execs); len(ents) != 0 {
				t.Errorf("refused pushes left %v in %s", ents, execs)
			}
			key := h.a.cfg.SSHHostKeyFile
			if err := os.WriteFile(key, []byte("secret key"), 0o600); err != nil {
				t.Fatal(err)
			}
			s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: key})
			_, err := mirror.Receive(copyCtx(t), filepath.Join(t.TempDir(), "got"), s.st, mirror.Options{})
			var pe *mirror.PeerError
			if !errors.As(err, &pe) || pe.Info.Code != protocol.CodeBadRequest {
				t.Errorf("pull of the host key %s: %v, want a bad_request refusal", key, err)
			}
			if err := os.WriteFile(filepath.Join(execs, "slots-2-2-y"), []byte("record"), 0o600); err != nil {
				t.Fatal(err)
			}
			s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: parent})
			local := filepath.Join(t.TempDir(), "got")
			mirror.Receive(copyCtx(t), local, s.st, mirror.Options{})
			for p := range readTree(t, local) {
				if strings.HasPrefix(p, "agent/execs") || strings.HasSuffix(p, DefaultSSHHostKeyName) {
					t.Errorf("pull of %s carried the agent's state %s", parent, p)
				}
			}
		})
	}
}

// TestCopyProtectsAllAgentState: after an attached exec (a process group
// record), a detached job (its files) and the agent's start (identity,
// SSH host key), every entry the agent made in its data dir is one of the
// protected entries (copyProtected), so that a new kind of state kept
// there cannot be forgotten as DATA-DIR/execs once was.
func TestCopyProtectsAllAgentState(t *testing.T) {
	h := newHarness(t, nil)
	t.Cleanup(h.a.jobs.wg.Wait)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}})
	e.finish(t)
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Script: "echo out", Detach: true, JobID: "job-1"})
	e.finish(t)
	waitFor(t, testWait, "job exit", func() bool { return h.jobStatus(t, "job-1").State != protocol.JobRunning })
	if _, err := os.Stat(h.a.cfg.SSHHostKeyFile); err != nil {
		t.Logf("no host key yet (%v): made by the SSH server's start", err)
	}
	protected := map[string]bool{}
	for _, p := range h.a.copyProtected() {
		protected[p] = true
	}
	ents, err := os.ReadDir(h.a.cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range ents {
		if p := filepath.Join(h.a.cfg.DataDir, ent.Name()); !protected[p] {
			t.Errorf("the agent made %s in its data dir, which copies do not protect (copyProtected)", p)
		}
	}
}
