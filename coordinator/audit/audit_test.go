package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const defaultTestTimeout = 10 * time.Second

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type fixture struct {
	r   *Recorder
	nc  *nats.Conn
	reg *prometheus.Registry
	log *syncBuffer
}

func newFixture(t testing.TB, mutate func(*Config)) *fixture {
	t.Helper()
	nc := natstest.Run(t).Coordinator(t)
	f := &fixture{nc: nc, reg: prometheus.NewRegistry(), log: &syncBuffer{}}
	cfg := Config{
		NATS:        nc,
		Coordinator: "c1",
		Logger:      slog.New(slog.NewJSONHandler(f.log, nil)),
		Registerer:  f.reg,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	var err error
	f.r, err = New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		if err := f.r.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return f
}

func (f *fixture) query(t *testing.T, q protocol.AuditQueryRequest) *protocol.AuditQueryResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	resp, err := f.r.Query(ctx, q, 1<<20)
	if err != nil {
		t.Fatalf("Query(%+v): %v", q, err)
	}
	return resp
}

// waitStored waits until the stream holds n events.
func (f *fixture) waitStored(t testing.TB, n uint64) {
	t.Helper()
	deadline := time.Now().Add(defaultTestTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		info, err := f.r.stream.Info(ctx)
		cancel()
		if err == nil && info.State.Msgs == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream holds %v events (err %v), want %d", info.State.Msgs, err, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ids(evs []protocol.AuditEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.JobID
	}
	return out
}

func TestRecordPersistsAndQueries(t *testing.T) {
	f := newFixture(t, nil)
	type spec struct{ id, who, node, op, res string }
	first := []spec{
		{"j1", "nats:alice", "n1", "exec", protocol.AuditOK},
		{"j2", "nats:bob", "n2", "exec", protocol.AuditFailed},
		{"j3", "nats:alice", "n2", "cp.read", protocol.AuditRefused},
	}
	second := []spec{
		{"j4", "nats:bob", "n1", "shell", protocol.AuditOK},
		{"j5", "nats:alice", "n3", "exec", protocol.AuditError},
	}
	rec := func(ss []spec) {
		for _, s := range ss {
			f.r.Record(&protocol.AuditEvent{JobID: s.id, Identity: s.who, IdentityKey: "UKEY" + s.who[5:], Nodes: []string{s.node}, Operation: s.op, Result: s.res})
		}
	}
	rec(first)
	f.waitStored(t, 3)
	between := time.Now()
	rec(second)
	f.waitStored(t, 5)

	for _, tt := range []struct {
		name string
		q    protocol.AuditQueryRequest
		want []string
	}{
		{"all newest first", protocol.AuditQueryRequest{}, []string{"j5", "j4", "j3", "j2", "j1"}},
		{"all oldest first", protocol.AuditQueryRequest{Order: protocol.AuditOldestFirst}, []string{"j1", "j2", "j3", "j4", "j5"}},
		{"identity", protocol.AuditQueryRequest{Identity: "nats:alice"}, []string{"j5", "j3", "j1"}},
		{"identity by key", protocol.AuditQueryRequest{Identity: "nats:UKEYbob"}, []string{"j4", "j2"}},
		{"node", protocol.AuditQueryRequest{Node: "n2"}, []string{"j3", "j2"}},
		{"operation", protocol.AuditQueryRequest{Operation: "exec"}, []string{"j5", "j2", "j1"}},
		{"operation with a dot", protocol.AuditQueryRequest{Operation: "cp.read"}, []string{"j3"}},
		{"result", protocol.AuditQueryRequest{Result: protocol.AuditOK}, []string{"j4", "j1"}},
		{"operation and result", protocol.AuditQueryRequest{Operation: "exec", Result: protocol.AuditFailed}, []string{"j2"}},
		{"job", protocol.AuditQueryRequest{JobID: "j4"}, []string{"j4"}},
		{"since", protocol.AuditQueryRequest{Since: between}, []string{"j5", "j4"}},
		{"since oldest first", protocol.AuditQueryRequest{Since: between, Order: protocol.AuditOldestFirst}, []string{"j4", "j5"}},
		{"until", protocol.AuditQueryRequest{Until: between}, []string{"j3", "j2", "j1"}},
		{"until oldest first", protocol.AuditQueryRequest{Until: between, Order: protocol.AuditOldestFirst}, []string{"j1", "j2", "j3"}},
		{"identity and since", protocol.AuditQueryRequest{Identity: "nats:alice", Since: between}, []string{"j5"}},
		{"no match", protocol.AuditQueryRequest{Identity: "nats:carol"}, []string{}},
		{"limit", protocol.AuditQueryRequest{Limit: 2}, []string{"j5", "j4"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp := f.query(t, tt.q)
			if got := ids(resp.Events); strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			for _, e := range resp.Events {
				if e.Seq == 0 || e.Version != protocol.AuditVersion || e.Coordinator != "c1" || e.ID == "" || e.Time.IsZero() {
					t.Errorf("event %s lacks its stamps: %+v", e.JobID, e)
				}
			}
		})
	}

	// The subjects carry operation and result: a consumer may filter.
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	m, err := f.r.stream.GetMsg(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "tether.v1.audit.cp_read.refused" {
		t.Errorf("event 3 subject %s, want tether.v1.audit.cp_read.refused", m.Subject)
	}
	if got := testutil.ToFloat64(f.r.m.events.WithLabelValues("exec", protocol.AuditOK)); got != 1 {
		t.Errorf("tether_audit_events_total{exec,ok} = %v, want 1", got)
	}
	if !strings.Contains(f.log.String(), `"msg":"audit"`) || !strings.Contains(f.log.String(), `"job_id":"j3"`) {
		t.Errorf("the log lacks the events:\n%s", f.log.String())
	}
}

func TestQueryPages(t *testing.T) {
	f := newFixture(t, nil)
	const n = 700
	for i := range n {
		f.r.Record(&protocol.AuditEvent{JobID: fmt.Sprint(i), Operation: "exec", Result: protocol.AuditOK, Nodes: []string{fmt.Sprintf("n%d", i%3)}})
	}
	f.waitStored(t, n)

	for _, order := range []string{protocol.AuditNewestFirst, protocol.AuditOldestFirst} {
		for _, node := range []string{"", "n1"} {
			t.Run(order+" node="+node, func(t *testing.T) {
				want := n
				if node != "" {
					want = (n + 1) / 3
				}
				var seen []uint64
				q := protocol.AuditQueryRequest{Order: order, Limit: 90, Node: node}
				for pages := 0; ; pages++ {
					if pages > 100 {
						t.Fatal("no end after 100 pages")
					}
					resp := f.query(t, q)
					for _, e := range resp.Events {
						seen = append(seen, e.Seq)
					}
					if len(resp.Events) < q.Limit || (order == protocol.AuditNewestFirst && resp.Next == 0) {
						break
					}
					q.Cursor = resp.Next
				}
				if len(seen) != want {
					t.Fatalf("paged through %d events, want %d", len(seen), want)
				}
				for i := 1; i < len(seen); i++ {
					if order == protocol.AuditNewestFirst && seen[i] >= seen[i-1] || order == protocol.AuditOldestFirst && seen[i] <= seen[i-1] {
						t.Fatalf("sequence %d then %d: not in %s-first order", seen[i-1], seen[i], order)
					}
				}
			})
		}
	}

	// A follower: oldest first from the end sees nothing, then only what
	// comes later.
	resp := f.query(t, protocol.AuditQueryRequest{Order: protocol.AuditOldestFirst, Cursor: n + 1})
	if len(resp.Events) != 0 || resp.Next != n+1 {
		t.Fatalf("at the end: %d events, next %d; want none, next %d", len(resp.Events), resp.Next, n+1)
	}
	f.r.Record(&protocol.AuditEvent{JobID: "late", Operation: "exec", Result: protocol.AuditOK})
	f.waitStored(t, n+1)
	resp = f.query(t, protocol.AuditQueryRequest{Order: protocol.AuditOldestFirst, Cursor: resp.Next})
	if got := ids(resp.Events); len(got) != 1 || got[0] != "late" || resp.Next != n+2 {
		t.Fatalf("follow: got %v next %d, want [late] next %d", got, resp.Next, n+2)
	}

	// The reply's size is bounded: a page ends early, and the next page
	// starts with what did not fit.
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	small, err := f.r.Query(ctx, protocol.AuditQueryRequest{Limit: 1000}, 8<<10)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(small)
	if len(b) > 8<<10 || len(small.Events) == 0 || small.Next == 0 {
		t.Fatalf("bounded page: %d bytes, %d events, next %d", len(b), len(small.Events), small.Next)
	}
	more, err := f.r.Query(ctx, protocol.AuditQueryRequest{Limit: 1, Cursor: small.Next}, 8<<10)
	if err != nil {
		t.Fatal(err)
	}
	if last := small.Events[len(small.Events)-1].Seq; len(more.Events) != 1 || more.Events[0].Seq != last-1 {
		t.Fatalf("next page starts at %v, want sequence %d", more.Events, last-1)
	}
}

// TestQuerySource: the source filter matches an event's address: an IP
// every port of it (and a NATS request's source, which has none), IP:PORT
// that one; the log line names the source too.
func TestQuerySource(t *testing.T) {
	f := newFixture(t, nil)
	for _, ev := range []protocol.AuditEvent{
		{JobID: "a1", Source: "127.0.0.7:4001"},
		{JobID: "a2", Source: "127.0.0.7:4002"},
		{JobID: "a3", Source: "127.0.0.7"},
		{JobID: "b1", Source: "127.0.0.8:4001"},
		{JobID: "c1", Source: "[::1]:4001"},
		{JobID: "none"},
	} {
		ev.Operation, ev.Result = "exec", protocol.AuditRefused
		f.r.Record(&ev)
	}
	f.waitStored(t, 6)
	for _, tt := range []struct {
		q    string
		want []string
	}{
		{"127.0.0.7", []string{"a3", "a2", "a1"}},
		{"127.0.0.7:4001", []string{"a1"}},
		{"127.0.0.8", []string{"b1"}},
		{"::1", []string{"c1"}},
		{"[::1]:4001", []string{"c1"}},
		{"::ffff:127.0.0.8", []string{"b1"}},
		{"192.0.2.1", []string{}},
	} {
		resp := f.query(t, protocol.AuditQueryRequest{Source: tt.q})
		if got := ids(resp.Events); strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("source %s: got %v, want %v", tt.q, got, tt.want)
		}
	}
	if !strings.Contains(f.log.String(), `"source":"127.0.0.8:4001"`) {
		t.Errorf("the log lacks the source:\n%s", f.log.String())
	}
}

func TestQueryRefusesBadRequests(t *testing.T) {
	f := newFixture(t, nil)
	now := time.Now()
	for _, q := range []protocol.AuditQueryRequest{
		{Limit: protocol.MaxAuditLimit + 1},
		{Limit: -1},
		{Order: "sideways"},
		{Result: "maybe"},
		{Operation: "exec.>"},
		{Since: now, Until: now.Add(-time.Hour)},
		{Source: "example.com"},
		{Source: "127.0.0.7:port"},
		{Source: "1.2.3.4.5"}, // its characters pass Validate: Query parses it
	} {
		_, err := f.r.Query(context.Background(), q, 0)
		var e *protocol.APIError
		if !errors.As(err, &e) || e.Status != 400 {
			t.Errorf("Query(%+v) = %v, want a 400", q, err)
		}
	}
}

// A full queue drops events (counted, logged at a bounded rate) and never
// blocks Record, even while the stream does not take anything.
func TestFullQueueDropsWithoutBlocking(t *testing.T) {
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	f := newFixture(t, func(c *Config) { c.QueueSize = 4 })
	f.r.pubHook = func() {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	}
	f.r.Record(&protocol.AuditEvent{Operation: "exec", Result: protocol.AuditOK})
	select {
	case <-entered:
	case <-time.After(defaultTestTimeout):
		t.Fatal("the publisher did not take the first event")
	}
	// The publisher holds one event; four fit in the queue.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 999 {
			f.r.Record(&protocol.AuditEvent{Operation: "exec", Result: protocol.AuditOK})
		}
	}()
	select {
	case <-done:
	case <-time.After(defaultTestTimeout):
		t.Fatal("Record blocked on a full queue")
	}
	if got := testutil.ToFloat64(f.r.m.dropped); got != 995 {
		t.Errorf("tether_audit_dropped_total = %v, want 995", got)
	}
	if got := testutil.ToFloat64(f.r.m.events.WithLabelValues("exec", protocol.AuditOK)); got != 1000 {
		t.Errorf("tether_audit_events_total = %v, want 1000", got)
	}
	if n := strings.Count(f.log.String(), "audit queue full"); n != 1 {
		t.Errorf("%d log lines about the full queue, want 1 (rate limited)", n)
	}
	if n := strings.Count(f.log.String(), `"msg":"audit"`); n != 1000 {
		t.Errorf("%d events in the log, want all 1000", n)
	}
	close(release)
	f.waitStored(t, 5)
}

// Secrets never reach an event or the log: env values, stdin, the script
// and the arguments are not there, their digest is.
func TestNoSecretsInEventsOrLogs(t *testing.T) {
	f := newFixture(t, nil)
	const secret = "hunter2-DB-PASSWORD-value"
	params := []protocol.ExecParams{
		{Script: "mysql -p" + secret + " -e 'select 1'\necho done", Env: map[string]string{"DB_PASSWORD": secret}, Cwd: "/srv"},
		{Argv: []string{"/usr/bin/curl", "-H", "Authorization: " + secret}, Env: map[string]string{"TOKEN": secret}, Stdin: true},
		{Commands: []string{"true", "echo " + secret}},
	}
	for i := range params {
		f.r.Record(&protocol.AuditEvent{JobID: fmt.Sprint(i), Operation: "exec", Result: protocol.AuditOK, Command: protocol.AuditExecCommand(&params[i])})
	}
	f.r.Record(&protocol.AuditEvent{JobID: "pty", Operation: "shell", Result: protocol.AuditOK,
		Command: protocol.AuditPTYCommand(&protocol.PTYParams{Argv: []string{"bash", "-c", secret}, Env: map[string]string{"K": secret}})})
	f.waitStored(t, 4)
	resp := f.query(t, protocol.AuditQueryRequest{Order: protocol.AuditOldestFirst})
	body, _ := json.Marshal(resp)
	for where, text := range map[string]string{"events": string(body), "log": f.log.String()} {
		if strings.Contains(text, secret) || strings.Contains(text, "hunter2") {
			t.Errorf("the secret is in the %s:\n%s", where, text)
		}
	}
	ev := resp.Events[1].Command
	wantSum, _ := protocol.CommandDigest("", params[1].Argv)
	if ev.Mode != "argv" || ev.Program != "/usr/bin/curl" || ev.SHA256 != wantSum || ev.Count != 3 || !ev.Stdin ||
		len(ev.EnvKeys) != 1 || ev.EnvKeys[0] != "TOKEN" {
		t.Errorf("argv command = %+v", ev)
	}
	if s := resp.Events[0].Command; s.Mode != "script" || s.Program != "" || s.Cwd != "/srv" || len(s.SHA256) != 64 {
		t.Errorf("script command = %+v", s)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := Config{MaxAge: time.Second, MaxBytes: 10, Replicas: 9, QueueSize: -1, Stream: "a.b"}
	err := bad.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"NATS", "Coordinator", "MaxAge", "MaxBytes", "Replicas", "QueueSize", "Stream"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
}
