package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A huge slot file (sparse, 1 GiB) is read only up to max execs × slot
// size: the group its first slot names is still ended, the file removed,
// and the log names the file; readSlotFile never returns more than its
// limit.
func TestKillOrphanGroupsCapsSlotFile(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h := newHarness(t, func(c *Config) { c.Logger = testLogger(t, &logs) })
	a := h.a
	dead := procIdentity{PID: 1, Start: 1<<63 - 1}
	l, sid := startGroup(t, "sleep 300")
	b, _ := json.Marshal(groupRecord{Version: groupRecordVersion, Leader: l, SID: sid, Agent: dead})
	if err := os.MkdirAll(a.execsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(a.execsDir(), fmt.Sprintf("%s%d-%d-x", slotPrefix, dead.PID, dead.Start))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	slot := append(b, bytes.Repeat([]byte{' '}, slotSize-1-len(b))...)
	f.Write(append(slot, '\n'))
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got, size, err := readSlotFile(path, a.slotFileCap())
	if err != nil || int64(len(got)) != a.slotFileCap() || size != 1<<30 {
		t.Fatalf("readSlotFile: %d bytes of %d (%v), want %d of %d", len(got), size, err, a.slotFileCap(), 1<<30)
	}
	a.killOrphanGroups()
	if n := groupLive(l.PID); n != 0 {
		t.Errorf("group %d of the huge slot file's first slot has %d live members, want 0", l.PID, n)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the slot file is still there: %v", err)
	}
	if !strings.Contains(logs.String(), "larger than max execs") || !strings.Contains(logs.String(), path) {
		t.Errorf("no log naming the oversized file %s:\n%s", path, logs.String())
	}
}
