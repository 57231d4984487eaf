package coordinator_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
)

// logBuffer collects log lines for assertions, safe for concurrent writers.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The coordinator accepts no stream after the control stream: yamux must
// reset the streams an agent opens past a backlog of one instead of
// buffering a receive window for each.
func TestExtraAgentStreamsAreReset(t *testing.T) {
	h := newHarness(t, nil)
	a := h.dialAgent(t, agentOpts{id: "n1", heartbeat: true})
	if a.reject != nil {
		t.Fatal(a.reject)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	resets := 0
	const extra = 4
	for i := 0; i < extra; i++ {
		st, err := a.sess.Open(ctx, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}})
		if err != nil {
			if errors.Is(err, yamux.ErrConnectionReset) {
				resets++
			}
			continue
		}
		defer st.Close()
		st.SetReadDeadline(time.Now().Add(time.Second))
		_, err = st.Read(make([]byte, 1))
		if errors.Is(err, yamux.ErrConnectionReset) {
			resets++
		}
	}
	if resets < extra-1 {
		t.Errorf("%d of %d extra streams were reset, want at least %d (one may wait in the backlog)", resets, extra, extra-1)
	}
	select {
	case <-a.sess.Done():
		t.Error("the session was closed, want only the extra streams reset")
	default:
	}
}

// Connections past MaxHandshakes are closed unread and counted; a
// connection that closes before sending a byte (a health check) is not an
// auth failure.
func TestHandshakeLimitAndHealthChecks(t *testing.T) {
	var logs logBuffer
	h := newHarness(t, func(c *coordinator.Config) {
		c.MaxHandshakes = 1
		c.FirstByteTimeout = time.Minute // hold keeps its slot however slow the test
		c.HandshakeTimeout = time.Minute
		c.Logger = testLoggerTo(t, &logs)
	})
	// Holds the only handshake slot: TCP without TLS.
	hold, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	checkFor(t, defaultTestTimeout, func() error {
		extra, err := net.Dial("tcp", h.addr)
		if err != nil {
			return err
		}
		defer extra.Close()
		extra.SetReadDeadline(time.Now().Add(defaultTestTimeout))
		if _, err := extra.Read(make([]byte, 1)); isTimeoutErr(err) {
			t.Fatalf("extra connection: %v; want it closed at once", err)
		}
		if got := h.metric("tether_coordinator_auth_failures_total", "reason", "overload"); got < 1 {
			return fmt.Errorf("auth_failures{overload} = %v", got)
		}
		return nil
	})
	// The health check releases the slot without a trace in the metric.
	hold.Close()
	checkFor(t, defaultTestTimeout, func() error {
		if !strings.Contains(logs.String(), "connection closed before the TLS handshake began") {
			return errors.New("health check not logged yet")
		}
		return nil
	})
	for _, r := range []string{"protocol", "timeout"} {
		if got := h.metric("tether_coordinator_auth_failures_total", "reason", r); got != 0 {
			t.Errorf("auth_failures{%s} = %v after a health check, want 0", r, got)
		}
	}
	// And a real agent gets the slot.
	checkFor(t, defaultTestTimeout, func() error {
		a := h.dialAgent(t, agentOpts{id: "n1"})
		if a.reject != nil {
			return fmt.Errorf("rejected: %v", a.reject)
		}
		return nil
	})
}

// Agent-supplied strings are cut to 1 KiB: hello fields at registration,
// error messages in results.
func TestAgentStringsTruncated(t *testing.T) {
	h := newHarness(t, nil)
	long := strings.Repeat("é", 3000) // 6000 bytes
	h.dialAgent(t, agentOpts{id: "n1", agentVersion: long, handler: func(a *fakeAgent, st *yamux.Stream, _ protocol.ExecParams) {
		protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeStartFailed, Message: long})
	}})
	nodes := h.c.Nodes(protocol.Selector{})
	if len(nodes) != 1 || len(nodes[0].AgentVersion) > 1024 || !strings.HasPrefix(long, strings.TrimSuffix(nodes[0].AgentVersion, "...")) {
		t.Errorf("agent version kept as %d bytes, want at most 1024 and a prefix", len(nodes[0].AgentVersion))
	}
	r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"x"}})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if e := r.result.Results[0].Error; len(e) > 1100 || !strings.HasSuffix(e, "...") {
		t.Errorf("error of %d bytes, want about 1 KiB, cut", len(e))
	}
}

// giveUpAgent answers an exec stream with something the coordinator cannot
// accept, then reports whether a cancel frame came before the stream ended.
func giveUpAgent(misbehave func(st *yamux.Stream), cancelled chan<- bool) func(*fakeAgent, *yamux.Stream, protocol.ExecParams) {
	return func(_ *fakeAgent, st *yamux.Stream, _ protocol.ExecParams) {
		misbehave(st)
		fr := protocol.NewFrameReader(st)
		st.SetReadDeadline(time.Now().Add(defaultTestTimeout))
		for {
			f, err := fr.Next()
			if err != nil {
				cancelled <- false
				return
			}
			if f.Type == protocol.FrameCancel {
				cancelled <- true
				return
			}
		}
	}
}

// When the coordinator gives up on an exec stream without a final frame,
// it sends a cancel first (so the agent kills the job) and reports the
// protocol error as such.
func TestGiveUpSendsCancel(t *testing.T) {
	tests := []struct {
		name      string
		misbehave func(st *yamux.Stream)
		wantErr   string
	}{
		{"unexpected frame", func(st *yamux.Stream) {
			protocol.WriteJSONFrame(st, protocol.FrameHello, &protocol.Hello{})
		}, "protocol error: unexpected hello frame"},
		{"bad exit status", func(st *yamux.Stream) {
			protocol.WriteFrame(st, protocol.FrameExit, []byte("{not json"))
		}, "protocol error: exit status: protocol: malformed JSON payload"},
		{"truncated frame", func(st *yamux.Stream) {
			var hdr [5]byte
			hdr[0] = byte(protocol.FrameStdout)
			binary.BigEndian.PutUint32(hdr[1:], 100)
			st.Write(append(hdr[:], "only ten b"...))
			st.Close() // half-close: the agent still reads
		}, "protocol error: read stdout frame payload: unexpected EOF"},
		{"oversized frame", func(st *yamux.Stream) {
			var hdr [5]byte
			hdr[0] = byte(protocol.FrameStdout)
			binary.BigEndian.PutUint32(hdr[1:], protocol.MaxFrameSize+1)
			st.Write(hdr[:])
		}, "protocol error: read stdout frame of 1048577 bytes"},
	}
	h := newHarness(t, nil)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cancelled := make(chan bool, 1)
			id := fmt.Sprintf("g%d", i)
			h.dialAgent(t, agentOpts{id: id, handler: giveUpAgent(tt.misbehave, cancelled)})
			r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: id}, Argv: []string{"x"}})
			if r.err != nil {
				t.Fatal(r.err)
			}
			res := r.result.Results[0]
			wantPrefix := "exec stream "
			if res.ExitCode != -1 || !strings.HasPrefix(res.Error, wantPrefix) || !strings.Contains(res.Error, tt.wantErr) {
				t.Errorf("result = %+v, want an error %q...%q", res, wantPrefix, tt.wantErr)
			}
			select {
			case got := <-cancelled:
				if !got {
					t.Error("the stream ended without a cancel frame")
				}
			case <-time.After(defaultTestTimeout):
				t.Fatal("fake agent reported nothing")
			}
		})
	}
}

// A node is looked up when its run starts: one that left while the fan-out
// ran others gets its own error, not a failed stream open.
func TestFanOutNodeGoneBeforeItsRun(t *testing.T) {
	h := newHarness(t, nil)
	release := make(chan struct{})
	started := make(chan struct{})
	h.dialAgent(t, agentOpts{id: "a", handler: func(_ *fakeAgent, st *yamux.Stream, _ protocol.ExecParams) {
		close(started)
		<-release
		protocol.WriteJSONFrame(st, protocol.FrameExit, &protocol.ExitStatus{})
	}})
	b := h.dialAgent(t, agentOpts{id: "b"})
	ch := h.execAsync(protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"ok"}, MaxParallel: 1})
	select {
	case <-started:
	case <-time.After(defaultTestTimeout):
		t.Fatal("node a's run did not start")
	}
	b.close()
	checkFor(t, defaultTestTimeout, func() error {
		if n := len(h.c.Nodes(protocol.Selector{})); n != 1 {
			return fmt.Errorf("%d nodes registered, want 1", n)
		}
		return nil
	})
	close(release)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	res := r.result.Results
	if len(res) != 2 || !res[0].OK() {
		t.Fatalf("results = %+v", res)
	}
	if res[1].Node != "b" || res[1].ExitCode != -1 || res[1].Error != "disconnected before the job's run started there" {
		t.Errorf("b = %+v, want it disconnected before its run", res[1])
	}
}

func TestMaxJobs(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.MaxJobs = 1 })
	a := h.dialAgent(t, agentOpts{id: "n1"})
	ch := h.execAsync(protocol.ExecRequest{ID: "first", Target: protocol.Target{Node: "n1"}, Script: "hang"})
	checkFor(t, defaultTestTimeout, func() error {
		if a.execs.Load() != 1 {
			return errors.New("first job not running yet")
		}
		return nil
	})
	r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Script: "ok"})
	if r.err == nil || r.status != "503" || r.err.Code != protocol.ErrCodeUnavailable || r.err.Message != "coordinator coord-test has 1 jobs in flight" {
		t.Errorf("second job: status %q error %+v, want 503 unavailable", r.status, r.err)
	}
	h.request(protocol.SubjectCancel, protocol.CancelRequest{ID: "first"})
	if r := <-ch; r.err != nil || !r.result.Results[0].Cancelled {
		t.Errorf("first job = %+v %+v", r.err, r.result)
	}
}

// Output chunks larger than the server's max payload are split; a result
// that does not fit is replaced by a 413 error reply.
func TestRepliesFitMaxPayload(t *testing.T) {
	const maxPayload = 8 << 10
	h := newHarnessNATS(t, func(o *server.Options) { o.MaxPayload = maxPayload }, nil)
	big := bytes.Repeat([]byte("0123456789abcdef"), 20<<10/16) // 20 KiB
	h.dialAgent(t, agentOpts{id: "big", handler: func(_ *fakeAgent, st *yamux.Stream, _ protocol.ExecParams) {
		protocol.WriteFrame(st, protocol.FrameStdout, big)
		protocol.WriteJSONFrame(st, protocol.FrameExit, &protocol.ExitStatus{StdoutBytes: int64(len(big))})
	}})
	r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "big"}, Argv: []string{"x"}})
	if r.err != nil {
		t.Fatal(r.err)
	}
	checkSeq(t, r)
	var out []byte
	chunks := 0
	for _, m := range r.msgs {
		if m.Header.Get(protocol.HeaderType) == protocol.ReplyStdout {
			out = append(out, m.Data...)
			chunks++
		}
	}
	if !bytes.Equal(out, big) || chunks < 3 {
		t.Errorf("got %d bytes in %d replies, want the 20 KiB chunk split in at least 3", len(out), chunks)
	}

	// Ten nodes each failing with a 1 KiB message: the result is ~11 KiB.
	msg := strings.Repeat("x", 2000)
	for i := range 10 {
		h.dialAgent(t, agentOpts{id: fmt.Sprintf("f%d", i), labels: map[string]string{"role": "f"}, handler: func(_ *fakeAgent, st *yamux.Stream, _ protocol.ExecParams) {
			protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeStartFailed, Message: msg})
		}})
	}
	// The result does not fit: it carries counts only, and every node's
	// result arrived as a node-result reply.
	r = h.exec(protocol.ExecRequest{ID: "wide", Target: protocol.Target{Selector: "role=f"}, Argv: []string{"x"}})
	if r.err != nil {
		t.Fatal(r.err)
	}
	checkSeq(t, r)
	if !r.result.ResultsOmitted || len(r.result.Results) != 0 || r.result.Nodes != 10 || r.result.Failed != 10 || r.result.Succeeded != 0 {
		t.Errorf("wide job result = %+v, want results omitted and counts 10/0/10", r.result)
	}
	nodes := map[string]bool{}
	for _, m := range r.msgs {
		if m.Header.Get(protocol.HeaderType) != protocol.ReplyNodeResult {
			continue
		}
		var nr protocol.NodeResult
		if err := json.Unmarshal(m.Data, &nr); err != nil {
			t.Fatal(err)
		}
		if nr.Node != m.Header.Get(protocol.HeaderNode) || !strings.HasPrefix(nr.Error, msg[:100]) {
			t.Errorf("node result %+v (header node %q)", nr, m.Header.Get(protocol.HeaderNode))
		}
		nodes[nr.Node] = true
	}
	if len(nodes) != 10 {
		t.Errorf("node results for %d nodes, want 10", len(nodes))
	}
}

func TestNodesPaging(t *testing.T) {
	h := newHarness(t, nil)
	for _, id := range []string{"c", "a", "b"} {
		h.dialAgent(t, agentOpts{id: id})
	}
	tests := []struct {
		body string
		ids  []string
	}{
		{`{}`, []string{"a", "b", "c"}},
		{`{"limit":2}`, []string{"a", "b"}},
		{`{"limit":2,"offset":2}`, []string{"c"}},
		{`{"offset":5}`, nil},
	}
	for _, tt := range tests {
		m := h.request(protocol.SubjectNodes, tt.body)
		var resp protocol.NodesResponse
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, n := range resp.Nodes {
			ids = append(ids, n.ID)
		}
		if strings.Join(ids, ",") != strings.Join(tt.ids, ",") || resp.Total != 3 || resp.Nodes == nil {
			t.Errorf("%s: ids %v total %d, want %v total 3", tt.body, ids, resp.Total, tt.ids)
		}
	}
	m := h.request(protocol.SubjectNodes, `{"limit":1001}`)
	var e protocol.APIError
	json.Unmarshal(m.Data, &e)
	if e.Code != protocol.ErrCodeInvalid {
		t.Errorf("limit 1001: %+v, want invalid_request", e)
	}
}

func TestMetricsReasonsPreinitialised(t *testing.T) {
	h := newHarness(t, nil)
	n, err := testutil.GatherAndCount(h.reg, "tether_coordinator_auth_failures_total")
	if err != nil {
		t.Fatal(err)
	}
	if n != 16 {
		t.Errorf("%d auth failure reasons, want 16 (with overload, duplicate, source_limit and the 7 certificate reasons)", n)
	}
}

// testLoggerTo logs at debug level to the test's output and to w.
func testLoggerTo(t *testing.T, w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), w), &slog.HandlerOptions{Level: slog.LevelDebug}))
}
