package openshell_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osh "github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// defaultTestTimeout bounds every wait of a test.
const defaultTestTimeout = 30 * time.Second

// fleet is a fake Fleet: node ids mapped to the addresses of fake gateways
// (or any gRPC server), dialled over loopback TCP.
type fleet struct {
	mu      sync.Mutex
	nodes   map[string]*protocol.NodeInfo
	addrs   map[string]string
	dials   map[string]int
	session int
}

func newFleet() *fleet {
	return &fleet{nodes: map[string]*protocol.NodeInfo{}, addrs: map[string]string{}, dials: map[string]int{}}
}

// add connects node id, whose "openshell" target is addr.
func (f *fleet) add(id, addr string, labels map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.session++
	if labels == nil {
		labels = map[string]string{}
	}
	f.nodes[id] = &protocol.NodeInfo{ID: id, Labels: labels, SessionID: fmt.Sprintf("s%d", f.session),
		Targets: []string{protocol.TargetOpenShell}}
	f.addrs[id] = addr
}

// setAddr points node id's "openshell" target at addr, in the same session
// (the agent's gateway came back).
func (f *fleet) setAddr(id, addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addrs[id] = addr
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// remove disconnects node id.
func (f *fleet) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.nodes, id)
}

// reconnect gives node id a new session.
func (f *fleet) reconnect(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.session++
	f.nodes[id].SessionID = fmt.Sprintf("s%d", f.session)
}

// setExecs sets node id's running exec count.
func (f *fleet) setExecs(id string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes[id].RunningExecs = n
}

func (f *fleet) dialCount(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dials[id]
}

func (f *fleet) Nodes(sel protocol.Selector) []protocol.NodeInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []protocol.NodeInfo
	for _, n := range f.nodes {
		if sel.Matches(n.Labels) {
			c := *n
			c.Labels = maps.Clone(n.Labels)
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b protocol.NodeInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (f *fleet) DialTarget(ctx context.Context, node, target string) (net.Conn, error) {
	f.mu.Lock()
	n, ok := f.nodes[node]
	if !ok {
		f.mu.Unlock()
		return nil, fmt.Errorf("dial %s on node %s: node is not connected", target, node)
	}
	if !slices.Contains(n.Targets, target) {
		f.mu.Unlock()
		return nil, fmt.Errorf("dial %s on node %s: target is not configured on the node", target, node)
	}
	f.dials[node]++
	addr := f.addrs[node]
	f.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// fakeLedger is an in-memory Ledger.
type fakeLedger struct {
	mu       sync.Mutex
	recs     map[ledger.Key]ledger.Record
	failWith error // every write fails with it when set
	ops      []string
}

func newFakeLedger() *fakeLedger { return &fakeLedger{recs: map[ledger.Key]ledger.Record{}} }

func (l *fakeLedger) write(op string, k ledger.Key, f func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, op+" "+k.Node+" "+k.ID)
	if l.failWith != nil {
		return l.failWith
	}
	f()
	return nil
}

func (l *fakeLedger) Created(_ context.Context, r ledger.Record) error {
	return l.write("created", r.Key(), func() {
		r.State = ledger.StateLive
		l.recs[r.Key()] = r
	})
}

func (l *fakeLedger) setState(k ledger.Key, s ledger.State) {
	r, ok := l.recs[k]
	if !ok {
		r = ledger.Record{Provider: k.Provider, Node: k.Node, ID: k.ID}
	}
	r.State = s
	l.recs[k] = r
}

func (l *fakeLedger) Deleting(_ context.Context, k ledger.Key) error {
	return l.write("deleting", k, func() { l.setState(k, ledger.StateDeleting) })
}

func (l *fakeLedger) Deleted(_ context.Context, k ledger.Key) error {
	return l.write("deleted", k, func() { l.setState(k, ledger.StateDeleted) })
}

func (l *fakeLedger) ByID(provider, id string) (ledger.Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.Provider == provider && r.ID == id {
			return r, true
		}
	}
	return ledger.Record{}, false
}

func (l *fakeLedger) ByName(provider, ws, name string) (ledger.Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found ledger.Record
	ok := false
	for _, r := range l.recs {
		if r.Provider == provider && r.Workspace == ws && r.Name == name && (!ok || found.State == ledger.StateDeleted) {
			found, ok = r, true
		}
	}
	return found, ok
}

// RunClosed is false: the fake keeps no leases.
func (l *fakeLedger) RunClosed(string) bool { return false }

func (l *fakeLedger) LiveOn(node string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Node == node && r.State == ledger.StateLive {
			n++
		}
	}
	return n
}

func (l *fakeLedger) List(f ledger.Filter) []ledger.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ledger.Record
	for _, r := range l.recs {
		if (f.Run == "" || r.Run == f.Run) && (f.Node == "" || r.Node == f.Node) &&
			(f.State == "" || string(r.State) == f.State) && (f.Provider == "" || r.Provider == f.Provider) {
			out = append(out, r)
		}
	}
	return out
}

// seed adds a live record.
func (l *fakeLedger) seed(r ledger.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.State = ledger.StateLive
	l.recs[r.Key()] = r
}

// record returns the record of sandbox id.
func (l *fakeLedger) record(id string) (ledger.Record, bool) {
	return l.ByID(protocol.ProviderOpenShell, id)
}

// env is a facade in front of fake gateways, and a client of it.
type env struct {
	t      testing.TB
	fleet  *fleet
	ledger *fakeLedger
	gws    map[string]*openshelltest.Gateway
	srv    *facade.Server
	reg    *prometheus.Registry
	addr   string
	cc     *grpc.ClientConn
}

// envConfig shapes newEnv.
type envConfig struct {
	nodes    []string              // node ids, each with a fake gateway; default ["node-a"]
	gw       openshelltest.Options // options of every gateway
	noLedger bool                  // Config.Ledger nil
	cfg      func(*facade.Config)  // adjusts the facade's config
}

func newEnv(t testing.TB, ec envConfig) *env {
	t.Helper()
	if ec.nodes == nil {
		ec.nodes = []string{"node-a"}
	}
	e := &env{t: t, fleet: newFleet(), ledger: newFakeLedger(), gws: map[string]*openshelltest.Gateway{}, reg: prometheus.NewRegistry()}
	for _, id := range ec.nodes {
		e.addGateway(id, ec.gw, nil)
	}
	cfg := facade.Config{
		Fleet:      e.fleet,
		Ledger:     e.ledger,
		Logger:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer: e.reg,
		DefaultTTL: time.Hour,
	}
	if ec.noLedger {
		cfg.Ledger = nil
	}
	if ec.cfg != nil {
		ec.cfg(&cfg)
	}
	srv, err := facade.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.srv = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	e.cc = dialFacade(t, e.addr)
	return e
}

// addGateway starts a fake gateway and connects it as node id.
func (e *env) addGateway(id string, opts openshelltest.Options, labels map[string]string) *openshelltest.Gateway {
	e.t.Helper()
	gw := openshelltest.New(opts)
	addr, err := gw.Start()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(gw.Close)
	e.gws[id] = gw
	e.fleet.add(id, addr, labels)
	return gw
}

func dialFacade(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// ctx returns a context bounded by defaultTestTimeout with metadata kv.
func testCtx(t testing.TB, kv ...string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	return ctx
}

// unary calls method with req through cc and decodes the answer into a new
// R.
func unary[R any, PR interface {
	*R
	proto.Message
}](ctx context.Context, cc grpc.ClientConnInterface, method string, req proto.Message, opts ...grpc.CallOption) (PR, error) {
	resp := PR(new(R))
	if err := cc.Invoke(ctx, method, req, resp, opts...); err != nil {
		return nil, err
	}
	return resp, nil
}

func (e *env) create(ctx context.Context, req *osh.CreateSandboxRequest) (*osh.Sandbox, error) {
	resp, err := unary[osh.SandboxResponse](ctx, e.cc, osh.MethodCreateSandbox, req)
	if err != nil {
		return nil, err
	}
	return resp.GetSandbox(), nil
}

func (e *env) get(ctx context.Context, ws, name string) (*osh.Sandbox, error) {
	resp, err := unary[osh.SandboxResponse](ctx, e.cc, osh.MethodGetSandbox, &osh.GetSandboxRequest{Name: name, Workspace: ws})
	if err != nil {
		return nil, err
	}
	return resp.GetSandbox(), nil
}

func (e *env) del(ctx context.Context, ws, name string) (bool, error) {
	resp, err := unary[osh.DeleteSandboxResponse](ctx, e.cc, osh.MethodDeleteSandbox, &osh.DeleteSandboxRequest{Name: name, Workspace: ws})
	if err != nil {
		return false, err
	}
	return resp.GetDeleted(), nil
}

func (e *env) list(ctx context.Context, req *osh.ListSandboxesRequest) ([]*osh.Sandbox, error) {
	resp, err := unary[osh.ListSandboxesResponse](ctx, e.cc, osh.MethodListSandboxes, req)
	if err != nil {
		return nil, err
	}
	return resp.GetSandboxes(), nil
}

// exec runs an ExecSandbox stream to its end and returns its events and
// final status (nil for OK).
func execStream(ctx context.Context, cc grpc.ClientConnInterface, req *osh.ExecSandboxRequest) ([]*osh.ExecSandboxEvent, error) {
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

// execResult sums an exec's events: stdout, stderr, the exit code and how
// many exit events came (and whether anything followed the first).
type execResult struct {
	stdout, stderr string
	exits          int
	code           int32
	afterExit      bool
}

func summarize(evs []*osh.ExecSandboxEvent) execResult {
	var r execResult
	for _, ev := range evs {
		if r.exits > 0 {
			r.afterExit = true
		}
		switch p := ev.GetPayload().(type) {
		case *osh.ExecSandboxEvent_Stdout:
			r.stdout += string(p.Stdout.GetData())
		case *osh.ExecSandboxEvent_Stderr:
			r.stderr += string(p.Stderr.GetData())
		case *osh.ExecSandboxEvent_Exit:
			r.exits++
			r.code = p.Exit.GetExitCode()
		}
	}
	return r
}

// checkFor polls cond until it holds or d passes.
func checkFor(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
