package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeSlotRecord writes rec as the only slot of a slot file of a dead
// agent in the harness's execs directory, with mode, and returns its path.
func writeSlotRecord(t *testing.T, a *Agent, rec groupRecord, name string, mode os.FileMode) string {
	t.Helper()
	b, _ := json.Marshal(rec)
	if err := os.MkdirAll(a.execsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(a.execsDir(), name)
	slot := append(b, bytes.Repeat([]byte{' '}, slotSize-1-len(b))...)
	if err := os.WriteFile(path, append(slot, '\n'), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOrphanRecordsUntrustedNotKilled plants records naming a live group
// that is no exec's (a sleep in its own process group, with its true
// start time and session): in a file group- or world-writable, owned by
// another uid, in an execs directory others may write, of another boot,
// or with the wrong start time. None is killed; each planted record is
// logged as a warning naming it, and the file removed (an untrusted
// directory is left as it is). A genuine record (the agent's uid, 0600,
// this boot) still has its group killed.
func TestOrphanRecordsUntrustedNotKilled(t *testing.T) {
	dead := procIdentity{PID: 1, Start: 1<<63 - 1}
	boot := bootID()
	if boot == "" {
		t.Fatal("no boot id")
	}
	cases := []struct {
		name string
		mode os.FileMode
		dir  os.FileMode // of execs/; 0 leaves 0700
		uid  int         // chown the record to it; -1 leaves it
		edit func(*groupRecord)
		want string // in the warning
		kill bool
	}{
		{name: "genuine", mode: 0o600, uid: -1, kill: true},
		{name: "v1 genuine", mode: 0o600, uid: -1, edit: func(r *groupRecord) { r.Version, r.Boot = 1, "" }, kill: true},
		{name: "world-writable", mode: 0o666, uid: -1, want: "writable"},
		{name: "group-writable", mode: 0o620, uid: -1, want: "writable"},
		{name: "other owner", mode: 0o600, uid: 65534, want: "owned by uid 65534"},
		{name: "open dir", mode: 0o600, dir: 0o777, uid: -1, want: "writable"},
		{name: "other boot", mode: 0o600, uid: -1, edit: func(r *groupRecord) { r.Boot = "00000000-0000-0000-0000-000000000000" }, want: "boot"},
		{name: "wrong start", mode: 0o600, uid: -1, edit: func(r *groupRecord) { r.Leader.Start-- }, want: "start"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs syncBuffer
			h := newHarness(t, func(cfg *Config) { cfg.Logger = testLogger(t, &logs) })
			a := h.a
			l, sid := startGroup(t, "sleep 300")
			rec := groupRecord{Version: groupRecordVersion, Leader: l, SID: sid, Agent: dead, Boot: boot}
			if c.edit != nil {
				c.edit(&rec)
			}
			path := writeSlotRecord(t, a, rec, fmt.Sprintf("%s%d-%d-x", slotPrefix, dead.PID, dead.Start), c.mode)
			if c.uid >= 0 {
				if err := os.Chown(path, c.uid, c.uid); err != nil {
					t.Skipf("chown: %v", err)
				}
			}
			if c.dir != 0 {
				os.Chmod(a.execsDir(), c.dir)
			}
			a.killOrphanGroups()
			live := groupLive(l.PID)
			if c.kill {
				if live != 0 {
					t.Errorf("genuine record: group %d has %d live members, want 0", l.PID, live)
				}
				return
			}
			if live == 0 {
				t.Fatalf("planted record (%s): group %d was killed", c.name, l.PID)
			}
			out := logs.String()
			if !strings.Contains(out, "level=WARN") || !strings.Contains(out, c.want) || !strings.Contains(out, path) && !strings.Contains(out, a.execsDir()) {
				t.Errorf("no warning naming the record %s and %q:\n%s", path, c.want, out)
			}
			if c.dir == 0 {
				if _, err := os.Lstat(path); err == nil {
					t.Errorf("planted record %s is still there", path)
				}
			}
		})
	}
}
