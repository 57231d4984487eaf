package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/protocol"
)

// TestTokenCreateOutputCheckedBeforeMinting: `tether token create -o
// FILE` with a FILE it cannot write asks for no token (it minted one, then
// failed to save it, leaving a live token nobody has), and with a good
// FILE writes it 0600 (fresh-user pass).
func TestTokenCreateOutputCheckedBeforeMinting(t *testing.T) {
	s := startNATSServer(t, &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var minted atomic.Int32
	sub, err := nc.Subscribe(protocol.SubjectTokensCreate, func(m *nats.Msg) {
		minted.Add(1)
		b, _ := json.Marshal(protocol.TokenCreateResponse{ID: "jt1", Token: "tjt_secret", Uses: 1, ExpiresAt: time.Now().Add(time.Hour)})
		m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	nc.Flush()
	vars := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	dir := t.TempDir()
	roDir := filepath.Join(dir, "ro")
	if err := os.Mkdir(roDir, 0o500); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{
		"missing directory": filepath.Join(dir, "no", "such", "dir", "join-token"),
		"a directory":       dir,
		"under a file":      filepath.Join(os.Args[0], "join-token"),
	} {
		r := runCLI(testCtx(t), vars, "", "token", "create", "--nats-url", s.ClientURL(), "-o", out)
		if r.code == 0 || !strings.Contains(r.stderr, "--output") || !strings.Contains(r.stderr, "no token was minted") {
			t.Errorf("%s: exit %d, stderr %q; want a failure naming --output, before minting", name, r.code, r.stderr)
		}
		if n := minted.Load(); n != 0 {
			t.Fatalf("%s: %d token(s) minted for an --output that cannot be written", name, n)
		}
	}
	if os.Geteuid() != 0 { // root writes a 0500 directory
		r := runCLI(testCtx(t), vars, "", "token", "create", "--nats-url", s.ClientURL(), "-o", filepath.Join(roDir, "join-token"))
		if r.code == 0 || minted.Load() != 0 {
			t.Errorf("read-only directory: exit %d, %d minted, stderr %q; want a failure before minting", r.code, minted.Load(), r.stderr)
		}
	}
	out := filepath.Join(dir, "join-token")
	r := runCLI(testCtx(t), vars, "", "token", "create", "--nats-url", s.ClientURL(), "-o", out)
	if r.code != 0 || minted.Load() != 1 {
		t.Fatalf("good --output: exit %d, %d minted, stderr %q", r.code, minted.Load(), r.stderr)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "tjt_secret\n" {
		t.Errorf("token file: %q, %v", b, err)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode: %v, %v; want 0600", fi.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left a temporary file %s", e.Name())
		}
	}
}
