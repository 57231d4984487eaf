package fleettest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
	osh "github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
)

// The wire-facts vectors (reference/wire-facts.md §5) replayed through the
// fleet's facades and the real tunnel: every call below leaves the test
// over loopback to a facade, crosses a dial stream (yamux over TLS) to an
// agent, and reaches that node's fake gateway; the facade packages' own
// tests replay the same vectors over a fake Fleet that dials the gateways
// directly.

// facadeTimeout bounds every call of these tests.
const facadeTimeout = 30 * time.Second

// facadeCtx returns a context bounded by facadeTimeout carrying gRPC
// metadata kv.
func facadeCtx(t testing.TB, kv ...string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), facadeTimeout)
	t.Cleanup(cancel)
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	return ctx
}

// wantStatus checks err's gRPC code and that its message contains msg.
func wantStatus(t testing.TB, what string, err error, code codes.Code, msg string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("%s: got %v %q, want %v containing %q", what, st.Code(), st.Message(), code, msg)
	}
}

// invoke calls a unary method through cc and decodes the answer into a new
// R.
func invoke[R any, PR interface {
	*R
	proto.Message
}](ctx context.Context, cc grpc.ClientConnInterface, method string, req proto.Message) (PR, error) {
	resp := PR(new(R))
	if err := cc.Invoke(ctx, method, req, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// execEvents runs an ExecSandbox stream to its end and returns its events
// and final status (nil for OK).
func execEvents(ctx context.Context, cc grpc.ClientConnInterface, req *osh.ExecSandboxRequest) ([]*osh.ExecSandboxEvent, error) {
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, osh.MethodExecSandbox)
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(req); err != nil {
		return nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, err
	}
	var evs []*osh.ExecSandboxEvent
	for {
		ev := new(osh.ExecSandboxEvent)
		if err := cs.RecvMsg(ev); err != nil {
			if errors.Is(err, io.EOF) {
				return evs, nil
			}
			return evs, err
		}
		evs = append(evs, ev)
	}
}

// execSummary is what an exec stream delivered.
type execSummary struct {
	stdout, stderr []byte
	exits          int   // exit events
	code           int32 // the last exit event's code
	exitLast       bool  // the stream's last event is an exit event
}

func summarizeExec(evs []*osh.ExecSandboxEvent) execSummary {
	var s execSummary
	for i, ev := range evs {
		switch {
		case ev.GetStdout() != nil:
			s.stdout = append(s.stdout, ev.GetStdout().GetData()...)
		case ev.GetStderr() != nil:
			s.stderr = append(s.stderr, ev.GetStderr().GetData()...)
		case ev.GetExit() != nil:
			s.exits++
			s.code = ev.GetExit().GetExitCode()
			s.exitLast = i == len(evs)-1
		}
	}
	return s
}

// nemoGymSpec is the spec NeMo Gym's OpenShell provider always sends.
func nemoGymSpec() *osh.SandboxSpec { return &osh.SandboxSpec{Environment: map[string]string{}} }

// openShellRecords returns the ledger's OpenShell records named name.
func openShellRecords(f *fleettest.Fleet, name string) []ledger.Record {
	var out []ledger.Record
	for _, r := range f.Sandboxes.Ledger().List(ledger.Filter{Provider: protocol.ProviderOpenShell}) {
		if r.Name == name {
			out = append(out, r)
		}
	}
	return out
}

// TestFacadeOpenShellVectors replays the OpenShell vectors through the
// OpenShell facade and the tunnel on a two-node fleet.
func TestFacadeOpenShellVectors(t *testing.T) {
	f := sandboxFleet(t, nil)
	cc := openShellClient(t, f)

	t.Run("OS-3 NeMo Gym create retry after a lost answer", func(t *testing.T) {
		ctx := facadeCtx(t)
		// node-0 is busier, so least-loaded placement picks node-1 for
		// the first attempt, whose answer is lost after the commit.
		for i := range 2 {
			createOpenShell(t, cc, "node-0", fmt.Sprintf("ng-busy0-%d", i), "run-retry")
		}
		f.OpenShell("node-1").Inject(osh.MethodCreateSandbox, openshelltest.Fault{Err: status.Error(codes.Unavailable, "reset"), AfterCommit: true})
		req := &osh.CreateSandboxRequest{Spec: nemoGymSpec(), Name: "ng-00000000000000aa", Labels: map[string]string{"nemo-gym.sandbox": "1"}}
		_, err := invoke[osh.SandboxResponse](ctx, cc, osh.MethodCreateSandbox, req)
		wantStatus(t, "first create", err, codes.Unavailable, "reset")
		made, ok := f.OpenShell("node-1").Sandbox("", req.Name)
		if !ok {
			t.Fatal("the first create did not commit on node-1")
		}
		// Now node-1 is the busier one: the retry must still go there.
		for i := range 4 {
			createOpenShell(t, cc, "node-1", fmt.Sprintf("ng-busy1-%d", i), "run-retry")
		}
		_, err = invoke[osh.SandboxResponse](ctx, cc, osh.MethodCreateSandbox, req)
		wantStatus(t, "retry with the same name", err, codes.AlreadyExists, "sandbox '"+req.Name+"' already exists")
		if n := f.OpenShell("node-0").Creates("", req.Name); n != 0 {
			t.Fatalf("node-0 created %s %d times; the retry must go where the first attempt landed", req.Name, n)
		}
		got, err := invoke[osh.SandboxResponse](ctx, cc, osh.MethodGetSandbox, &osh.GetSandboxRequest{Name: req.Name, Workspace: "default"})
		if err != nil {
			t.Fatalf("GetSandbox after ALREADY_EXISTS: %v", err)
		}
		if id := got.GetSandbox().GetMetadata().GetId(); id != made.GetMetadata().GetId() {
			t.Fatalf("GetSandbox adopted %s, the first attempt made %s", id, made.GetMetadata().GetId())
		}
		if n := f.OpenShell("node-1").Creates("", req.Name); n != 1 {
			t.Errorf("node-1 created %s %d times, want 1", req.Name, n)
		}
		recs := openShellRecords(f, req.Name)
		if len(recs) != 1 || recs[0].Node != "node-1" || recs[0].ID != made.GetMetadata().GetId() || recs[0].State != ledger.StateLive {
			t.Fatalf("ledger records of %s: %+v; want exactly one, live on node-1 with id %s", req.Name, recs, made.GetMetadata().GetId())
		}
	})

	sb := createOpenShell(t, cc, "node-1", "ng-exec", "run-exec")
	id := sb.GetMetadata().GetId()

	t.Run("exec ends with exactly one exit event", func(t *testing.T) {
		evs, err := execEvents(facadeCtx(t), cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "echo hi; echo err >&2; exit 3"}})
		s := summarizeExec(evs)
		if err != nil || s.exits != 1 || !s.exitLast || s.code != 3 || string(s.stdout) != "hi\n" || string(s.stderr) != "err\n" {
			t.Fatalf("exec: stdout %q stderr %q, %d exit events (last: %v) code %d, status %v; want hi/err, one exit 3 last, OK",
				s.stdout, s.stderr, s.exits, s.exitLast, s.code, err)
		}
	})

	t.Run("OS-10 timeout", func(t *testing.T) {
		evs, err := execEvents(facadeCtx(t), cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "sleep 5"}, TimeoutSeconds: 1})
		s := summarizeExec(evs)
		if err != nil || s.exits != 1 || !s.exitLast || s.code != osh.ExecTimeoutExitCode {
			t.Fatalf("exec: %d exit events (last: %v) code %d, status %v; want one exit 124, then OK", s.exits, s.exitLast, s.code, err)
		}
	})

	t.Run("OS-11 512 KiB stdin round trip", func(t *testing.T) {
		stdin := make([]byte, 512<<10)
		for i := range stdin {
			stdin[i] = byte(i * 7)
		}
		evs, err := execEvents(facadeCtx(t), cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "cat"}, Stdin: stdin})
		s := summarizeExec(evs)
		if err != nil || s.exits != 1 || !s.exitLast || s.code != 0 {
			t.Fatalf("exec: %d exit events (last: %v) code %d, status %v", s.exits, s.exitLast, s.code, err)
		}
		if !bytes.Equal(s.stdout, stdin) {
			t.Fatalf("stdout: %d bytes differing from the %d bytes of stdin", len(s.stdout), len(stdin))
		}
	})

	t.Run("OS-13 exec unknown id", func(t *testing.T) {
		_, err := execEvents(facadeCtx(t), cc, &osh.ExecSandboxRequest{SandboxId: "00000000-0000-4000-8000-000000000000", Command: []string{"true"}})
		wantStatus(t, "exec", err, codes.NotFound, "sandbox not found")
	})

	t.Run("OS-15 delete missing", func(t *testing.T) {
		_, err := invoke[osh.DeleteSandboxResponse](facadeCtx(t), cc, osh.MethodDeleteSandbox, &osh.DeleteSandboxRequest{Name: "missing"})
		wantStatus(t, "delete", err, codes.NotFound, "sandbox not found")
	})

	t.Run("ListSandboxes merged and paged", func(t *testing.T) {
		want := map[string]string{} // name → node
		for i := range 9 {
			node := fmt.Sprintf("node-%d", i%2)
			name := fmt.Sprintf("ng-list-%d", i)
			req := &osh.CreateSandboxRequest{Spec: nemoGymSpec(), Name: name, Labels: map[string]string{"tether.node": node, "page": "1"}}
			if _, err := invoke[osh.SandboxResponse](facadeCtx(t), cc, osh.MethodCreateSandbox, req); err != nil {
				t.Fatal(err)
			}
			want[name] = node
		}
		var pages [][]*osh.Sandbox
		for offset := uint32(0); ; offset += 4 {
			resp, err := invoke[osh.ListSandboxesResponse](facadeCtx(t), cc, osh.MethodListSandboxes, &osh.ListSandboxesRequest{LabelSelector: "page=1", Limit: 4, Offset: offset})
			if err != nil {
				t.Fatalf("list offset %d: %v", offset, err)
			}
			pages = append(pages, resp.GetSandboxes())
			if len(resp.GetSandboxes()) < 4 {
				break
			}
		}
		if got := []int{len(pages[0]), len(pages[1]), len(pages[2])}; len(pages) != 3 || !slices.Equal(got, []int{4, 4, 1}) {
			t.Fatalf("pages of %v rows, want 4, 4, 1", got)
		}
		seen := map[string]bool{}
		var prev int64
		for _, page := range pages {
			for _, sb := range page {
				m := sb.GetMetadata()
				if _, ok := want[m.GetName()]; !ok || seen[m.GetName()] {
					t.Errorf("listed %s: unexpected or twice", m.GetName())
				}
				seen[m.GetName()] = true
				if m.GetCreatedAtMs() < prev {
					t.Errorf("%s listed out of created_at order", m.GetName())
				}
				prev = m.GetCreatedAtMs()
				if _, ok := f.OpenShell(want[m.GetName()]).Sandbox("", m.GetName()); !ok {
					t.Errorf("%s is not on %s's gateway", m.GetName(), want[m.GetName()])
				}
			}
		}
		if len(seen) != len(want) {
			t.Errorf("listed %d of %d sandboxes", len(seen), len(want))
		}
	})

	// The calls above crossed node-1's tunnel: with it cut they cannot be
	// served, and once it heals they are again.
	t.Run("through the tunnel", func(t *testing.T) {
		f.Partition(t, "node-1")
		eventually(t, 10*time.Second, "node-1 disconnected", func() bool { return len(f.Coordinator.Nodes(protocol.Selector{})) == 1 })
		_, err := execEvents(facadeCtx(t), cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}})
		wantStatus(t, "exec on a partitioned node", err, codes.Unavailable, "")
		_, err = invoke[osh.ListSandboxesResponse](facadeCtx(t), cc, osh.MethodListSandboxes, &osh.ListSandboxesRequest{})
		wantStatus(t, "list with a partitioned node", err, codes.Unavailable, "node-1")
		f.Heal(t, "node-1")
		f.WaitNodes(t, 2)
		evs, err := execEvents(facadeCtx(t), cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "printf back"}})
		if s := summarizeExec(evs); err != nil || string(s.stdout) != "back" || s.exits != 1 {
			t.Fatalf("exec after the heal: %+v, %v", s, err)
		}
	})
}

// TestFacadeOpenShellAuthorization replays OS-20 through the tunnel: every
// node's gateway wants a bearer token, which the caller's authorization
// metadata carries through the facade, the dial stream and the agent
// untouched (the agent's own token serves only its inventories).
func TestFacadeOpenShellAuthorization(t *testing.T) {
	const token = "s3cret"
	f := fleettest.Start(t, fleettest.Options{
		Agents:   2,
		Gateways: &fleettest.GatewayOptions{OpenShell: openshelltest.Options{Token: token}},
		Agent:    func(_ int, c *agent.Config) { c.OpenShell.Token = token },
	})
	cc := openShellClient(t, f)
	req := &osh.CreateSandboxRequest{Spec: nemoGymSpec(), Name: "ng-auth"}
	_, err := invoke[osh.SandboxResponse](facadeCtx(t), cc, osh.MethodCreateSandbox, req)
	wantStatus(t, "create without authorization", err, codes.Unauthenticated, "")
	_, err = invoke[osh.SandboxResponse](facadeCtx(t, "authorization", "Bearer wrong"), cc, osh.MethodCreateSandbox, req)
	wantStatus(t, "create with a wrong token", err, codes.Unauthenticated, "")
	h, err := invoke[osh.HealthResponse](facadeCtx(t), cc, osh.MethodHealth, &osh.HealthRequest{})
	if err != nil || h.GetStatus() != osh.ServiceStatus_SERVICE_STATUS_HEALTHY {
		t.Fatalf("Health without authorization: %v, %v", h, err)
	}

	ctx := facadeCtx(t, "authorization", "Bearer "+token)
	resp, err := invoke[osh.SandboxResponse](ctx, cc, osh.MethodCreateSandbox, req)
	if err != nil {
		t.Fatalf("create with authorization: %v", err)
	}
	id := resp.GetSandbox().GetMetadata().GetId()
	if _, err := invoke[osh.SandboxResponse](ctx, cc, osh.MethodGetSandbox, &osh.GetSandboxRequest{Name: req.Name}); err != nil {
		t.Fatalf("get with authorization: %v", err)
	}
	evs, err := execEvents(ctx, cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"/bin/sh", "-c", "printf ok"}})
	if s := summarizeExec(evs); err != nil || string(s.stdout) != "ok" || s.exits != 1 || s.code != 0 {
		t.Fatalf("exec with authorization: %+v, %v", s, err)
	}
	_, err = execEvents(facadeCtx(t), cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}})
	wantStatus(t, "exec without authorization", err, codes.Unauthenticated, "")
	// The agent's inventory uses its own token: the record stays live and
	// complete (no "incomplete" gateway holds the reaper back).
	if _, err := f.Coordinator.Sync(facadeCtx(t)); err != nil {
		t.Fatal(err)
	}
	if recs := openShellRecords(f, req.Name); len(recs) != 1 || recs[0].State != ledger.StateLive {
		t.Fatalf("ledger records of %s: %+v", req.Name, recs)
	}
	for _, node := range []string{"node-0", "node-1"} {
		if !f.Coordinator.Reachable(node) {
			t.Errorf("%s not reachable after a sync: its inventory with the agent's token was incomplete", node)
		}
	}
}

// osbDo sends one request to the OpenSandbox facade (url is absolute) and
// returns the status and body.
func osbDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(facadeCtx(t), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp.StatusCode, string(b)
}

// commandEvents parses execd's bare-JSON event stream (wire-facts §2.6).
func commandEvents(t *testing.T, body string) []osb.CommandEvent {
	t.Helper()
	var out []osb.CommandEvent
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var ev osb.CommandEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		out = append(out, ev)
	}
	return out
}

// ptySocket is one PTY WebSocket through the facade and the output it
// received per channel.
type ptySocket struct {
	t    *testing.T
	conn *websocket.Conn
	out  map[byte]*bytes.Buffer
}

// attachPTY opens session sid's WebSocket under the execd base URL base
// (http://...).
func attachPTY(t *testing.T, base, sid, query string) *ptySocket {
	t.Helper()
	u := "ws" + strings.TrimPrefix(base, "http") + osb.PTYPath + "/" + sid + osb.PTYWebSocketSuffix
	if query != "" {
		u += "?" + query
	}
	conn, resp, err := websocket.DefaultDialer.Dial(u, nil)
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("attach %s: %v (HTTP %d)", u, err, code)
	}
	t.Cleanup(func() { conn.Close() })
	return &ptySocket{t: t, conn: conn, out: map[byte]*bytes.Buffer{}}
}

// next reads one message, collecting output frames by channel.
func (s *ptySocket) next() (int, []byte, error) {
	s.conn.SetReadDeadline(time.Now().Add(facadeTimeout))
	typ, data, err := s.conn.ReadMessage()
	if err == nil && typ == websocket.BinaryMessage && len(data) > 0 {
		payload := data[1:]
		if data[0] == osb.ChannelReplay && len(data) >= osb.ReplayHeaderSize {
			payload = data[osb.ReplayHeaderSize:]
		}
		if s.out[data[0]] == nil {
			s.out[data[0]] = &bytes.Buffer{}
		}
		s.out[data[0]].Write(payload)
	}
	return typ, data, err
}

// control reads the next message, which must be a text frame.
func (s *ptySocket) control() osb.ControlFrame {
	s.t.Helper()
	typ, data, err := s.next()
	if err != nil || typ != websocket.TextMessage {
		s.t.Fatalf("want a text frame, got type %d %q, err %v", typ, data, err)
	}
	f, err := osb.DecodeControlFrame(data)
	if err != nil {
		s.t.Fatal(err)
	}
	return f
}

// until reads until channel ch's output contains want.
func (s *ptySocket) until(ch byte, want string) {
	s.t.Helper()
	for s.out[ch] == nil || !strings.Contains(s.out[ch].String(), want) {
		if _, _, err := s.next(); err != nil {
			s.t.Fatalf("waiting for %q on channel %d (have %q): %v", want, ch, s.out[ch], err)
		}
	}
}

// closed reads until the socket ends and returns its close frame.
func (s *ptySocket) closed() *websocket.CloseError {
	s.t.Helper()
	for {
		if _, _, err := s.next(); err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				s.t.Fatalf("socket ended without a close frame: %v", err)
			}
			return ce
		}
	}
}

func (s *ptySocket) stdin(text string) {
	s.t.Helper()
	frame := osb.EncodeBinaryFrame(osb.BinaryFrame{Channel: osb.ChannelStdin, Data: []byte(text)})
	if err := s.conn.WriteMessage(websocket.BinaryMessage, frame); err != nil {
		s.t.Fatal(err)
	}
}

// ptyCreate creates a PTY session under base (PTY-1).
func ptyCreate(t *testing.T, base, body string) string {
	t.Helper()
	code, resp := osbDo(t, "POST", base+osb.PTYPath, body)
	var cr osb.CreatePTYResponse
	if code != http.StatusCreated || json.Unmarshal([]byte(resp), &cr) != nil || cr.SessionID == "" {
		t.Fatalf("POST /pty: %d %s", code, resp)
	}
	return cr.SessionID
}

// ptyStatus reads session sid's status under base.
func ptyStatus(t *testing.T, base, sid string) osb.PTYStatus {
	t.Helper()
	code, resp := osbDo(t, "GET", base+osb.PTYPath+"/"+sid, "")
	var st osb.PTYStatus
	if code != http.StatusOK || json.Unmarshal([]byte(resp), &st) != nil {
		t.Fatalf("GET /pty/%s: %d %s", sid, code, resp)
	}
	return st
}

// TestFacadeOpenSandboxVectors replays the OpenSandbox and execd PTY
// vectors through the OpenSandbox facade and the tunnel: the endpoint
// lookup names the facade, and execd's command stream and PTY WebSockets
// (gorilla/websocket) pass through it byte for byte.
func TestFacadeOpenSandboxVectors(t *testing.T) {
	f := sandboxFleet(t, nil)
	id := createOpenSandbox(t, f, "node-1", "run-osb")
	if _, ok := f.OpenSandbox("node-1").Sandbox(id); !ok {
		t.Fatalf("sandbox %s is not on node-1's server", id)
	}
	facade := "http://" + f.OpenSandboxFacade

	// OSB-6 and §8.1: the endpoint points at the facade, not the node.
	code, body := osbDo(t, "GET", facade+"/v1/sandboxes/"+id+"/endpoints/44772?use_server_proxy=true", "")
	var ep osb.Endpoint
	if code != http.StatusOK || json.Unmarshal([]byte(body), &ep) != nil {
		t.Fatalf("endpoint lookup: %d %s", code, body)
	}
	if want := f.OpenSandboxFacade + "/sandboxes/" + id + "/proxy/44772"; ep.Endpoint != want {
		t.Fatalf("endpoint %q, want %q", ep.Endpoint, want)
	}
	base := "http://" + ep.Endpoint // as NeMo Gym's client prefixes it

	t.Run("OSB-12 command stream", func(t *testing.T) {
		code, body := osbDo(t, "POST", base+osb.CommandPath, `{"command":"echo hi","timeout":180000}`)
		evs := commandEvents(t, body)
		if code != http.StatusOK || len(evs) != 3 || evs[0].Type != osb.EventInit || evs[1].Type != osb.EventStdout ||
			evs[1].Text != "hi" || evs[2].Type != osb.EventExecutionComplete {
			t.Fatalf("POST /command: %d %+v", code, evs)
		}
	})

	t.Run("OSB-11 command exit 3", func(t *testing.T) {
		code, body := osbDo(t, "POST", base+osb.CommandPath, `{"command":"sh -c 'echo hi; exit 3'","timeout":180000}`)
		evs := commandEvents(t, body)
		if code != http.StatusOK || len(evs) != 3 || evs[1].Text != "hi" || evs[2].Type != osb.EventError ||
			evs[2].Error == nil || evs[2].Error.EName != "CommandExecError" || evs[2].Error.EValue != "3" {
			t.Fatalf("POST /command: %d %+v", code, evs)
		}
	})

	t.Run("PTY-2 3 8 9 attach, echo, exclusive, takeover", func(t *testing.T) {
		sid := ptyCreate(t, base, `{}`)
		first := attachPTY(t, base, sid, "")
		if fr := first.control(); fr != osb.ConnectedFrame(sid, osb.ModePTY) {
			t.Fatalf("PTY-2: first frame %+v, want connected", fr)
		}
		first.stdin("echo hi\n")
		first.until(osb.ChannelStdout, "hi\r\n")

		second := attachPTY(t, base, sid, "")
		if ce := second.closed(); ce.Code != osb.ClosePolicyViolation {
			t.Errorf("PTY-8: second attach closed %d %q, want 1008", ce.Code, ce.Text)
		}

		third := attachPTY(t, base, sid, "takeover=1")
		if ce := first.closed(); ce.Code != osb.CloseTakenOver || ce.Text != osb.ReasonTakenOver {
			t.Errorf("PTY-9: first socket closed %d %q, want 4001 TAKEN_OVER", ce.Code, ce.Text)
		}
		for {
			typ, data, err := third.next()
			if err != nil {
				t.Fatalf("PTY-9 takeover socket: %v", err)
			}
			if typ == websocket.TextMessage {
				if fr, _ := osb.DecodeControlFrame(data); fr != osb.ConnectedFrame(sid, osb.ModePTY) {
					t.Fatalf("PTY-9 takeover socket: %+v, want connected", fr)
				}
				break
			}
			if data[0] != osb.ChannelReplay {
				t.Fatalf("PTY-9 takeover socket: live output before connected: % x", data)
			}
		}
		third.stdin("echo two\n") // the same shell keeps running
		third.until(osb.ChannelStdout, "two\r\n")
	})

	t.Run("PTY-4 reattach with since replays before connected", func(t *testing.T) {
		sid := ptyCreate(t, base, `{"command":"printf ab; read x; printf cd; read y"}`)
		c := attachPTY(t, base, sid, "pty=0")
		if fr := c.control(); fr != osb.ConnectedFrame(sid, osb.ModePipe) {
			t.Fatalf("connected %+v", fr)
		}
		c.until(osb.ChannelStdout, "ab")
		c.stdin("\n")
		c.conn.Close() // dropped, as a network loss would
		deadline := time.Now().Add(facadeTimeout)
		for ptyStatus(t, base, sid).OutputOffset < 4 {
			if time.Now().After(deadline) {
				t.Fatal("the process never printed cd")
			}
			time.Sleep(10 * time.Millisecond)
		}
		r := attachPTY(t, base, sid, "takeover=1&since=2")
		typ, data, err := r.next()
		want := append([]byte{osb.ChannelReplay}, binary.BigEndian.AppendUint64(nil, 2)...)
		want = append(want, "cd"...)
		if err != nil || typ != websocket.BinaryMessage || !bytes.Equal(data, want) {
			t.Fatalf("PTY-4 first frame: type %d % x, err %v; want % x", typ, data, err, want)
		}
		if fr := r.control(); fr != osb.ConnectedFrame(sid, osb.ModePipe) {
			t.Fatalf("PTY-4 second frame %+v, want connected", fr)
		}
	})

	t.Run("PTY-14 exit 7", func(t *testing.T) {
		sid := ptyCreate(t, base, `{"command":"exit 7"}`)
		c := attachPTY(t, base, sid, "")
		if fr := c.control(); fr.Type != osb.TypeConnected {
			t.Fatalf("first frame %+v, want connected", fr)
		}
		exit := -2
		for {
			typ, data, err := c.next()
			if err != nil {
				var ce *websocket.CloseError
				if !errors.As(err, &ce) || ce.Code != osb.CloseNormal || ce.Text != osb.ReasonProcessExited {
					t.Fatalf("want close 1000 %q, got %v", osb.ReasonProcessExited, err)
				}
				break
			}
			if typ == websocket.TextMessage {
				fr, err := osb.DecodeControlFrame(data)
				if err == nil && fr.Type == osb.TypeExit && fr.ExitCode != nil {
					exit = *fr.ExitCode
				}
			}
		}
		if exit != 7 {
			t.Errorf("exit frame code %d before the close, want 7", exit)
		}
		if ptyStatus(t, base, sid).Running {
			t.Error("session still running after its exit")
		}
	})

	t.Run("delete", func(t *testing.T) {
		code, body := osbDo(t, "DELETE", facade+"/v1/sandboxes/"+id, "")
		if code != http.StatusNoContent {
			t.Fatalf("DELETE: %d %s", code, body)
		}
		if _, ok := f.OpenSandbox("node-1").Sandbox(id); ok {
			t.Error("the sandbox is still on node-1's server")
		}
		r, ok := f.Sandboxes.Ledger().ByID(protocol.ProviderOpenSandbox, id)
		if !ok || r.Node != "node-1" || (r.State != ledger.StateDeleting && r.State != ledger.StateDeleted) {
			t.Fatalf("ledger record after the delete: %+v, %v; want deleting or deleted on node-1", r, ok)
		}
	})
}
