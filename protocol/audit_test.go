package protocol_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tetherfleet/tether/protocol"
)

func TestAuditSubject(t *testing.T) {
	for _, tt := range []struct{ op, res, want string }{
		{"exec", protocol.AuditOK, "tether.v1.audit.exec.ok"},
		{"cp.read", protocol.AuditRefused, "tether.v1.audit.cp_read.refused"},
		{"", "", "tether.v1.audit.unknown.unknown"},
		{"a b>*", "x.y", "tether.v1.audit.a_b__.x_y"},
	} {
		if got := protocol.AuditSubject(tt.op, tt.res); got != tt.want {
			t.Errorf("AuditSubject(%q, %q) = %q, want %q", tt.op, tt.res, got, tt.want)
		}
	}
}

// The digest is reproducible with the shell: sha256sum of the script, or
// printf '%s\0' ARGS... | sha256sum.
func TestCommandDigest(t *testing.T) {
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	if got, n := protocol.CommandDigest("echo hi\n", nil); got != sum("echo hi\n") || n != 8 {
		t.Errorf("script digest %s (%d bytes)", got, n)
	}
	if got, n := protocol.CommandDigest("", []string{"uname", "-a"}); got != sum("uname\x00-a\x00") || n != 9 {
		t.Errorf("argv digest %s (%d bytes)", got, n)
	}
	// Argument boundaries count: ["ab"] and ["a", "b"] differ.
	a, _ := protocol.CommandDigest("", []string{"ab"})
	b, _ := protocol.CommandDigest("", []string{"a", "b"})
	if a == b {
		t.Error("argv [ab] and [a b] have the same digest")
	}
}

func TestAuditCommandKeepsNoText(t *testing.T) {
	const secret = "TOPSECRET"
	long := strings.Repeat("é", 200)
	c := protocol.AuditExecCommand(&protocol.ExecParams{Argv: []string{long, secret}, Env: map[string]string{"B": secret, "A": secret}})
	body, _ := json.Marshal(c)
	if strings.Contains(string(body), secret) {
		t.Errorf("command description holds an argument or env value: %s", body)
	}
	if len(c.Program) > protocol.MaxAuditProgramLen || !utf8.ValidString(c.Program) || !strings.HasSuffix(c.Program, "…") {
		t.Errorf("program not clipped at a rune boundary: %q (%d bytes)", c.Program, len(c.Program))
	}
	if strings.Join(c.EnvKeys, ",") != "A,B" {
		t.Errorf("env keys %v, want [A B]", c.EnvKeys)
	}
	if p := protocol.AuditPTYCommand(&protocol.PTYParams{}); p.Mode != "login-shell" || p.SHA256 != "" {
		t.Errorf("login shell: %+v", p)
	}
}

// An audit query's job id follows the job id rule (ValidJobID): one no
// job can have is refused, not answered with no events.
func TestAuditQueryJobID(t *testing.T) {
	for id, ok := range map[string]bool{"job-1.a_b": true, "bad id!": false, "-x": false, strings.Repeat("a", protocol.MaxJobIDLen+1): false} {
		q := protocol.AuditQueryRequest{JobID: id}
		if e := q.Validate(); (e == nil) != ok || (e != nil && !strings.Contains(e.Message, "job_id: job id")) {
			t.Errorf("job id %q: %v", id, e)
		}
	}
}

// An audit query's node follows the node id rule (ValidNodeID), as
// job.list's does: one no node can have is refused.
func TestAuditQueryNode(t *testing.T) {
	for node, ok := range map[string]bool{"node-0": true, "gpu.07_a": true, "bad node": false, "-x": false, strings.Repeat("n", protocol.MaxNodeIDLen+1): false} {
		q := protocol.AuditQueryRequest{Node: node}
		if e := q.Validate(); (e == nil) != ok || (e != nil && !strings.Contains(e.Message, "node: node id")) {
			t.Errorf("node %q: %v", node, e)
		}
	}
}

// FuzzAuditQuery: a query body is decoded strictly and validated; what is
// accepted is a valid query that survives a round trip, what is refused
// gets a short 400 or 413.
func FuzzAuditQuery(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `{"since":"2026-12-01T00:00:00Z","until":"2026-12-02T00:00:00Z"}`,
		`{"identity":"nats:alice","node":"n1","operation":"cp.read","result":"refused","limit":10,"order":"oldest","cursor":7}`,
		`{"limit":-1}`, `{"order":"up"}`, `{"result":"maybe"}`, `{"operation":"exec.>"}`, `{"since":"yesterday"}`,
		`{"limit":1,"limit":2}`, `{"Limit":1}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var q protocol.AuditQueryRequest
		e := protocol.DecodeRequest(data, &q)
		if e == nil {
			e = q.Validate()
		}
		if e != nil {
			if e.Status != 400 && e.Status != 413 {
				t.Fatalf("refused with %d: %v", e.Status, e)
			}
			checkProblems(t, "audit query", e)
			return
		}
		b, err := json.Marshal(&q)
		if err != nil {
			t.Fatal(err)
		}
		var back protocol.AuditQueryRequest
		if e := protocol.DecodeRequest(b, &back); e != nil {
			t.Fatalf("round trip of %s: %v", b, e)
		}
		if e := back.Validate(); e != nil {
			t.Fatalf("round trip of %s: %v", b, e)
		}
	})
}

// TestAuditSourceCompatible: an event stored before AuditEvent.Source
// decodes (Source empty), and an event without a source encodes as
// before (no "source" key), so old and new coordinators share one stream.
func TestAuditSourceCompatible(t *testing.T) {
	old := `{"v":1,"id":"e1","time":"2026-01-02T03:04:05Z","coordinator":"c1","identity":"nats:alice","operation":"exec","result":"ok","duration_ms":1.5}`
	var ev protocol.AuditEvent
	if err := json.Unmarshal([]byte(old), &ev); err != nil {
		t.Fatalf("an event without source: %v", err)
	}
	if ev.Source != "" || ev.Identity != "nats:alice" || ev.Operation != "exec" {
		t.Errorf("decoded %+v", ev)
	}
	b, err := json.Marshal(&ev)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"source"`) {
		t.Errorf("an event without a source encodes a source key: %s", b)
	}
	ev.Source = "127.0.0.7:40000"
	b, _ = json.Marshal(&ev)
	var back protocol.AuditEvent
	if err := json.Unmarshal(b, &back); err != nil || back.Source != ev.Source {
		t.Errorf("round trip of %s: source %q, %v", b, back.Source, err)
	}
}

// TestAuditPath: an event keeps a copy path's bytes (they said U+FFFD for
// every byte not UTF-8, so the audit could not tell which file was
// touched): a path that needs it is quoted as strconv.Quote quotes, and
// only such a path starts with a double quote.
func TestAuditPath(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"/srv/app/a.txt", "/srv/app/a.txt"},
		{"/srv/café/日本", "/srv/café/日本"},
		{"/srv/caf\xe9", `"/srv/caf\xe9"`},
		{"/srv/caf\xc3", `"/srv/caf\xc3"`},
		{"/srv/a\nb\x1b[2J\u202e", `"/srv/a\nb\x1b[2J\u202e"`},
		{`/srv/"q"`, `"/srv/\"q\""`},
		{`/srv/a\xe9`, `"/srv/a\\xe9"`}, // a backslash: not to be read as the byte
	} {
		got := protocol.AuditPath(tt.in)
		if got != tt.want {
			t.Errorf("AuditPath(%q) = %q, want %q", tt.in, got, tt.want)
			continue
		}
		back := got
		if strings.HasPrefix(got, `"`) {
			var err error
			if back, err = strconv.Unquote(got); err != nil {
				t.Errorf("AuditPath(%q) = %q: %v", tt.in, got, err)
			}
		}
		if back != tt.in {
			t.Errorf("AuditPath(%q) = %q reads back as %q", tt.in, got, back)
		}
	}
	long := "/srv/" + strings.Repeat("\xff", 4000)
	if got := protocol.AuditPath(long); len(got) > protocol.MaxAuditErrorLen || !strings.HasPrefix(got, `"/srv/\xff`) || !strings.HasSuffix(got, "…") {
		t.Errorf("AuditPath of a long path = %q (%d bytes), want at most %d, ending in …", got, len(got), protocol.MaxAuditErrorLen)
	}
}
