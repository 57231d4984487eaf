package openshelltest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/protocol/openshell"
)

// DefaultImage is the image a sandbox gets when its spec names none (the
// image of OpenShell's docker-compose deployment).
const DefaultImage = "ghcr.io/nvidia/openshell-community/sandboxes/base:latest"

// Options configures a fake gateway. The zero value is a plaintext gateway
// without auth whose sandboxes are READY from the first call after their
// create and gone from the first call after their delete.
type Options struct {
	// Token, when set, is the bearer token every sandbox RPC must carry as
	// gRPC metadata "authorization: Bearer <Token>"; others get
	// UNAUTHENTICATED. Health never needs it (wire-facts §1.1, OS-20).
	Token string
	// DefaultImage fills spec.template.image when a create leaves it empty;
	// "" means the package's DefaultImage.
	DefaultImage string
	// Version is HealthResponse.version; "" means "openshelltest".
	Version string
	// ReadyAfter is how long a new sandbox stays PROVISIONING before it is
	// READY. 0: READY from the first call after the create returned (the
	// create response itself says PROVISIONING). Negative: it stays
	// PROVISIONING until SetPhase.
	ReadyAfter time.Duration
	// DeleteLinger is how long a deleted sandbox stays visible in phase
	// DELETING (with deletion_timestamp_ms set) before it disappears.
	// 0: gone from the first call after the delete returned. Negative: it
	// stays DELETING until Drop.
	DeleteLinger time.Duration
	// Exec runs ExecSandbox and ExecSandboxInteractive commands; nil means
	// DefaultExec, which runs them on the host.
	Exec ExecFunc
	// Dir holds one private directory per sandbox that execs run in; ""
	// means a temporary directory made on first use and removed by Close.
	Dir string
}

// Fault is a failure injected into the next calls of one method.
type Fault struct {
	// Err is what the call returns, normally a status error such as
	// status.Error(codes.Unavailable, "connection reset").
	Err error
	// Times is how many calls fail; 0 means 1.
	Times int
	// AfterCommit runs the method first and then fails it: a create that
	// committed but whose response was lost (NeMo Gym then retries with the
	// same name and gets ALREADY_EXISTS). Streams send their events first.
	AfterCommit bool
	// Delay, for a unary method with AfterCommit, holds the response that
	// long after the method committed (then fails it with Err, or answers
	// normally when Err is nil): a slow gateway, so a test can kill the
	// caller between the commit and the answer.
	Delay time.Duration
}

// delayed is the after-commit fault of a Fault with a Delay.
type delayed struct {
	d   time.Duration
	err error
}

func (d *delayed) Error() string { return fmt.Sprintf("delayed %v then %v", d.d, d.err) }

// record is one sandbox; the *openshell.Sandbox is never handed out, only
// clones of it.
type record struct {
	sb       *openshell.Sandbox
	seq      uint64    // creation order, for stable listing
	readyAt  time.Time // pending PROVISIONING -> READY; zero if none
	goneAt   time.Time // pending removal of a DELETING record; zero if none
	vanished bool      // compute gone: the next delete answers deleted=false
	dir      string    // exec directory, "" until the first exec
}

type workspace struct {
	sandboxes map[string]*record // by name
	providers map[string]bool
}

// Gateway is a fake OpenShell gateway. Its methods are safe for concurrent
// use.
type Gateway struct {
	opts Options

	mu         sync.Mutex
	workspaces map[string]*workspace
	byID       map[string]*record
	pending    map[*record]struct{} // records with a readyAt or goneAt
	seq        uint64
	changed    chan struct{} // closed and replaced on every sandbox change
	calls      map[string]int
	creates    map[[2]string]int
	faults     map[string]*Fault
	srv        *grpc.Server
	ln         *acceptor
	dir        string // exec root made by us, removed by Close; "" if none
	closed     bool

	life sync.Mutex     // serialises Restart and Close; taken before mu
	wg   sync.WaitGroup // Serve loops, the accept loop, interactive input readers
}

// New returns a gateway that serves nothing until Serve or Start.
func New(opts Options) *Gateway {
	if opts.DefaultImage == "" {
		opts.DefaultImage = DefaultImage
	}
	if opts.Version == "" {
		opts.Version = "openshelltest"
	}
	if opts.Exec == nil {
		opts.Exec = DefaultExec
	}
	return &Gateway{
		opts:       opts,
		workspaces: map[string]*workspace{openshell.DefaultWorkspace: newWorkspace()},
		byID:       map[string]*record{},
		pending:    map[*record]struct{}{},
		changed:    make(chan struct{}),
		calls:      map[string]int{},
		creates:    map[[2]string]int{},
		faults:     map[string]*Fault{},
	}
}

func newWorkspace() *workspace {
	return &workspace{sandboxes: map[string]*record{}, providers: map[string]bool{}}
}

// Serve serves gRPC on ln until Close, and returns ln's address at once.
// The gateway owns ln from then on: Close closes it. Serve may be called
// once.
func (g *Gateway) Serve(ln net.Listener) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln != nil || g.closed {
		panic("openshelltest: Serve called twice or after Close")
	}
	g.ln = newAcceptor(ln)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.ln.run()
	}()
	g.startServerLocked()
	return ln.Addr().String()
}

// Start serves on a new loopback TCP port and returns its address
// ("127.0.0.1:port").
func (g *Gateway) Start() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("openshelltest: listen: %w", err)
	}
	return g.Serve(ln), nil
}

// startServerLocked makes a grpc server and serves it on a new generation
// of the acceptor. g.mu is held.
func (g *Gateway) startServerLocked() {
	// WaitForHandlers: Stop returns only once every handler has, so no
	// handler adds to g.wg after Close started waiting on it.
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(openshell.MaxMessageSize), grpc.WaitForHandlers(true))
	srv.RegisterService(&serviceDesc, g)
	g.srv = srv
	l := g.ln.generation()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		_ = srv.Serve(l) // returns when Stop closes l
	}()
}

// Restart simulates a gateway restart: every connection and in-flight RPC
// is cut (clients see UNAVAILABLE, running execs are killed), then the
// gateway accepts again on the same listener. Sandboxes, workspaces,
// counters and injected faults survive, as the real gateway keeps its
// records in a database. Restart before Serve is a no-op.
func (g *Gateway) Restart() {
	g.life.Lock()
	defer g.life.Unlock()
	g.mu.Lock()
	if g.srv == nil || g.closed {
		g.mu.Unlock()
		return
	}
	old := g.srv
	g.startServerLocked()
	g.mu.Unlock()
	old.Stop()
}

// Close stops serving (cutting every connection), closes the listener,
// waits for every goroutine of the gateway and removes the exec directory
// it made. It waits for running execs to end, which they do when their
// context is cancelled. Close is idempotent.
func (g *Gateway) Close() {
	g.life.Lock()
	defer g.life.Unlock()
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	srv, ln, dir := g.srv, g.ln, g.dir
	g.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	if ln != nil {
		ln.close()
	}
	g.wg.Wait()
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// AddWorkspace creates workspace name (idempotent).
func (g *Gateway) AddWorkspace(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.workspaces[name] == nil {
		g.workspaces[name] = newWorkspace()
	}
}

// AddProvider registers a credential provider in a workspace, so creates
// whose spec.providers name it succeed (unknown names fail with
// FAILED_PRECONDITION "provider '<name>' not found").
func (g *Gateway) AddProvider(ws, name string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	w, err := g.workspaceLocked(ws)
	if err != nil {
		return err
	}
	w.providers[name] = true
	return nil
}

// SetPhase sets a sandbox's phase (and cancels a pending READY). Setting
// DELETING marks a deletion without scheduling the record's removal.
func (g *Gateway) SetPhase(ws, name string, phase openshell.SandboxPhase) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	r, err := g.lookupLocked(ws, name)
	if err != nil {
		return err
	}
	r.readyAt, r.goneAt = time.Time{}, time.Time{}
	delete(g.pending, r)
	if phase == openshell.SandboxPhase_SANDBOX_PHASE_DELETING && r.sb.Metadata.DeletionTimestampMs == 0 {
		r.sb.Metadata.DeletionTimestampMs = time.Now().UnixMilli()
	}
	g.setPhaseLocked(r, phase)
	return nil
}

// Drop removes a sandbox's record at once, as when a delete finished or
// the gateway lost it.
func (g *Gateway) Drop(ws, name string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	r, err := g.lookupLocked(ws, name)
	if err != nil {
		return err
	}
	g.removeLocked(r)
	return nil
}

// VanishCompute makes a sandbox's compute resource disappear behind the
// gateway's back: its record stays, and the next DeleteSandbox answers
// deleted=false and drops the record (OS-16).
func (g *Gateway) VanishCompute(ws, name string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	r, err := g.lookupLocked(ws, name)
	if err != nil {
		return err
	}
	r.vanished = true
	return nil
}

// Inject makes the next f.Times calls of method (a full path such as
// openshell.MethodCreateSandbox) fail with f.Err, after authentication.
// It replaces an earlier fault of the same method.
func (g *Gateway) Inject(method string, f Fault) {
	if f.Times <= 0 {
		f.Times = 1
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.faults[method] = &f
}

// Calls returns how many requests of method (a full path) the gateway
// received, failed ones included.
func (g *Gateway) Calls(method string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[method]
}

// Creates returns how many sandboxes CreateSandbox made under (ws, name)
// ("" = "default"): successful creates only, so a retry answered
// ALREADY_EXISTS does not count.
func (g *Gateway) Creates(ws, name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.creates[[2]string{openshell.Workspace(ws), name}]
}

// Sandbox returns a copy of sandbox (ws, name) as GetSandbox would.
func (g *Gateway) Sandbox(ws, name string) (*openshell.Sandbox, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	r, err := g.lookupLocked(ws, name)
	if err != nil {
		return nil, false
	}
	return clone(r.sb), true
}

// Sandboxes returns copies of every sandbox of workspace ws ("" = all
// workspaces) in creation order.
func (g *Gateway) Sandboxes(ws string) []*openshell.Sandbox {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	var out []*openshell.Sandbox
	for _, r := range g.sortedLocked(ws, ws == "") {
		out = append(out, clone(r.sb))
	}
	return out
}

// Create makes a sandbox exactly as the CreateSandbox RPC would (same
// validation, same status errors), without a connection: handy to seed
// thousands of sandboxes.
func (g *Gateway) Create(req *openshell.CreateSandboxRequest) (*openshell.Sandbox, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	return g.createLocked(req)
}

func clone(sb *openshell.Sandbox) *openshell.Sandbox {
	return proto.Clone(sb).(*openshell.Sandbox)
}

// --- state, all with g.mu held ---

// settleLocked applies the transitions that are due: PROVISIONING -> READY
// at readyAt, removal of DELETING records at goneAt.
func (g *Gateway) settleLocked() {
	if len(g.pending) == 0 {
		return
	}
	now := time.Now()
	for r := range g.pending {
		switch {
		case !r.readyAt.IsZero() && !now.Before(r.readyAt):
			r.readyAt = time.Time{}
			delete(g.pending, r)
			if r.sb.Status.Phase == openshell.SandboxPhase_SANDBOX_PHASE_PROVISIONING {
				g.setPhaseLocked(r, openshell.SandboxPhase_SANDBOX_PHASE_READY)
			}
		case !r.goneAt.IsZero() && !now.Before(r.goneAt):
			g.removeLocked(r)
		}
	}
}

// nextDeadlineLocked returns the earliest pending transition, zero if none.
func (g *Gateway) nextDeadlineLocked() time.Time {
	var next time.Time
	for r := range g.pending {
		for _, t := range []time.Time{r.readyAt, r.goneAt} {
			if !t.IsZero() && (next.IsZero() || t.Before(next)) {
				next = t
			}
		}
	}
	return next
}

func (g *Gateway) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *Gateway) setPhaseLocked(r *record, phase openshell.SandboxPhase) {
	r.sb.Status.Phase = phase
	r.sb.Metadata.ResourceVersion++
	ready := "False"
	if phase == openshell.SandboxPhase_SANDBOX_PHASE_READY {
		ready = "True"
	}
	r.sb.Status.Conditions = []*openshell.SandboxCondition{{
		Type: "Ready", Status: ready, Reason: phase.String(),
		LastTransitionTime: time.Now().UTC().Format(time.RFC3339),
	}}
	g.notifyLocked()
}

func (g *Gateway) removeLocked(r *record) {
	ws := g.workspaces[r.sb.Metadata.Workspace]
	if ws != nil && ws.sandboxes[r.sb.Metadata.Name] == r {
		delete(ws.sandboxes, r.sb.Metadata.Name)
	}
	delete(g.byID, r.sb.Metadata.Id)
	delete(g.pending, r)
	if r.dir != "" {
		os.RemoveAll(r.dir)
	}
	g.notifyLocked()
}

func (g *Gateway) workspaceLocked(name string) (*workspace, error) {
	name = openshell.Workspace(name)
	w := g.workspaces[name]
	if w == nil {
		return nil, status.Errorf(codes.NotFound, "workspace '%s' not found", name)
	}
	return w, nil
}

func (g *Gateway) lookupLocked(ws, name string) (*record, error) {
	w, err := g.workspaceLocked(ws)
	if err != nil {
		return nil, err
	}
	r := w.sandboxes[name]
	if r == nil {
		return nil, status.Error(codes.NotFound, "sandbox not found")
	}
	return r, nil
}

// sortedLocked returns the records of ws (all workspaces when all is set)
// in creation order.
func (g *Gateway) sortedLocked(ws string, all bool) []*record {
	var rs []*record
	if all {
		rs = slices.Collect(maps.Values(g.byID))
	} else if w := g.workspaces[openshell.Workspace(ws)]; w != nil {
		rs = slices.Collect(maps.Values(w.sandboxes))
	}
	slices.SortFunc(rs, func(a, b *record) int { return cmp.Compare(a.seq, b.seq) })
	return rs
}

func (g *Gateway) createLocked(req *openshell.CreateSandboxRequest) (*openshell.Sandbox, error) {
	if req.GetSpec() == nil {
		return nil, status.Error(codes.InvalidArgument, "spec is required")
	}
	wsName := openshell.Workspace(req.GetWorkspace())
	w, err := g.workspaceLocked(wsName)
	if err != nil {
		return nil, err
	}
	name := req.GetName()
	if name == "" {
		name = g.petnameLocked(w)
	} else if err := openshell.ValidateName(name); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := openshell.ValidateSpec(req.GetSpec()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := openshell.ValidateLabels(req.GetLabels()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	for _, k := range slices.Sorted(maps.Keys(req.GetAnnotations())) {
		if err := openshell.ValidateLabelKey(k); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "annotation: %v", err)
		}
	}
	for _, p := range req.GetSpec().GetProviders() {
		if !w.providers[p] {
			return nil, status.Errorf(codes.FailedPrecondition, "provider '%s' not found", p)
		}
	}
	if w.sandboxes[name] != nil {
		return nil, status.Errorf(codes.AlreadyExists, "sandbox '%s' already exists", name)
	}

	spec := proto.Clone(req.GetSpec()).(*openshell.SandboxSpec)
	if len(spec.Command) == 0 {
		spec.Command = []string{"/bin/bash", "-l"}
		spec.Tty = true
	}
	if spec.Template == nil {
		spec.Template = &openshell.SandboxTemplate{}
	}
	if spec.Template.Image == "" {
		spec.Template.Image = g.opts.DefaultImage
	}
	now := time.Now()
	g.seq++
	r := &record{seq: g.seq, sb: &openshell.Sandbox{
		Metadata: &openshell.ObjectMeta{
			Id:              uuid.NewString(),
			Name:            name,
			CreatedAtMs:     now.UnixMilli(),
			Labels:          maps.Clone(req.GetLabels()),
			Annotations:     maps.Clone(req.GetAnnotations()),
			Workspace:       wsName,
			ResourceVersion: 0,
		},
		Spec:   spec,
		Status: &openshell.SandboxStatus{SandboxName: name},
	}}
	g.setPhaseLocked(r, openshell.SandboxPhase_SANDBOX_PHASE_PROVISIONING)
	w.sandboxes[name] = r
	g.byID[r.sb.Metadata.Id] = r
	g.creates[[2]string{wsName, name}]++
	if g.opts.ReadyAfter >= 0 {
		r.readyAt = now.Add(g.opts.ReadyAfter)
		g.pending[r] = struct{}{}
	}
	return clone(r.sb), nil
}

// deleteLocked is DeleteSandbox (wire-facts §1.4).
func (g *Gateway) deleteLocked(req *openshell.DeleteSandboxRequest) (bool, error) {
	if req.GetName() == "" {
		return false, status.Error(codes.InvalidArgument, "name is required")
	}
	r, err := g.lookupLocked(req.GetWorkspace(), req.GetName())
	if err != nil {
		return false, err
	}
	switch {
	case r.sb.Status.Phase == openshell.SandboxPhase_SANDBOX_PHASE_DELETING:
		return true, nil
	case r.vanished:
		g.removeLocked(r)
		return false, nil
	}
	now := time.Now()
	r.readyAt = time.Time{}
	r.sb.Metadata.DeletionTimestampMs = now.UnixMilli()
	g.setPhaseLocked(r, openshell.SandboxPhase_SANDBOX_PHASE_DELETING)
	delete(g.pending, r)
	if g.opts.DeleteLinger >= 0 {
		r.goneAt = now.Add(g.opts.DeleteLinger)
		g.pending[r] = struct{}{}
	}
	return true, nil
}

// sandboxDirLocked returns r's exec directory, making it on first use.
func (g *Gateway) sandboxDirLocked(r *record) (string, error) {
	if r.dir != "" {
		return r.dir, nil
	}
	root := g.opts.Dir
	if root == "" {
		if g.dir == "" {
			d, err := os.MkdirTemp("", "openshelltest-")
			if err != nil {
				return "", err
			}
			g.dir = d
		}
		root = g.dir
	}
	d, err := os.MkdirTemp(root, r.sb.Metadata.Name+"-")
	if err != nil {
		return "", err
	}
	r.dir = d
	return d, nil
}

// --- calls ---

// begin counts a call of method, checks its credentials and takes an
// injected fault. It returns the fault to apply after the method ran
// (AfterCommit), or the error to fail with now.
func (g *Gateway) begin(ctx context.Context, method string) (after error, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls[method]++
	if method != openshell.MethodHealth {
		if err := g.authorize(ctx); err != nil {
			return nil, err
		}
	}
	f := g.faults[method]
	if f == nil {
		return nil, nil
	}
	if f.Times--; f.Times <= 0 {
		delete(g.faults, method)
	}
	if f.AfterCommit {
		if f.Delay > 0 {
			return &delayed{f.Delay, f.Err}, nil
		}
		return f.Err, nil
	}
	return nil, f.Err
}
