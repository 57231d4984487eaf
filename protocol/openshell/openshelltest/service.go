package openshelltest

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/protocol/openshell"
)

// serviceDesc is openshell.v1.OpenShell by hand: unary handlers decode the
// generated request message, streams receive it themselves.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: openshell.ServiceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		unary("Health", (*Gateway).health),
		unary("CreateSandbox", (*Gateway).createSandbox),
		unary("GetSandbox", (*Gateway).getSandbox),
		unary("ListSandboxes", (*Gateway).listSandboxes),
		unary("DeleteSandbox", (*Gateway).deleteSandbox),
		unary("StopSandbox", (*Gateway).stopSandbox),
		unary("StartSandbox", (*Gateway).startSandbox),
	},
	Streams: []grpc.StreamDesc{
		{StreamName: "ExecSandbox", Handler: streamHandler(openshell.MethodExecSandbox, (*Gateway).execSandbox), ServerStreams: true},
		{StreamName: "WatchSandbox", Handler: streamHandler(openshell.MethodWatchSandbox, (*Gateway).watchSandbox), ServerStreams: true},
		{StreamName: "ExecSandboxInteractive", Handler: streamHandler(openshell.MethodExecSandboxInteractive, (*Gateway).execInteractive), ServerStreams: true, ClientStreams: true},
	},
	Metadata: "openshell.proto",
}

// unary adapts a typed handler to a grpc.MethodDesc: decode, count,
// authenticate, apply injected faults, run.
func unary[Req any, P interface {
	*Req
	proto.Message
}, Resp proto.Message](name string, h func(*Gateway, P) (Resp, error)) grpc.MethodDesc {
	method := "/" + openshell.ServiceName + "/" + name
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		g := srv.(*Gateway)
		req := P(new(Req))
		if err := dec(req); err != nil {
			return nil, err
		}
		call := func(ctx context.Context, r any) (any, error) {
			after, err := g.begin(ctx, method)
			if err != nil {
				return nil, err
			}
			resp, err := h(g, r.(P))
			if err != nil {
				return nil, err
			}
			if d, ok := after.(*delayed); ok {
				t := time.NewTimer(d.d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return nil, status.FromContextError(ctx.Err()).Err()
				}
				after = d.err
			}
			if after != nil {
				return nil, after
			}
			return resp, nil
		}
		if icpt == nil {
			return call(ctx, req)
		}
		return icpt(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, call)
	}}
}

// streamHandler adapts a stream method: count, authenticate, apply faults.
func streamHandler(method string, h func(*Gateway, grpc.ServerStream) error) grpc.StreamHandler {
	return func(srv any, stream grpc.ServerStream) error {
		g := srv.(*Gateway)
		after, err := g.begin(stream.Context(), method)
		if err != nil {
			return err
		}
		if err := h(g, stream); err != nil {
			return err
		}
		if d, ok := after.(*delayed); ok {
			return d.err
		}
		return after
	}
}

// authorize checks the bearer token when one is configured (wire-facts
// §1.1). g.mu is held (opts are immutable anyway).
func (g *Gateway) authorize(ctx context.Context) error {
	if g.opts.Token == "" {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(openshell.AuthorizationHeader)
	if len(vals) == 0 {
		return status.Error(codes.Unauthenticated, "missing authorization header")
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token != g.opts.Token {
		return status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	return nil
}

func (g *Gateway) health(*openshell.HealthRequest) (*openshell.HealthResponse, error) {
	return &openshell.HealthResponse{Status: openshell.ServiceStatus_SERVICE_STATUS_HEALTHY, Version: g.opts.Version}, nil
}

func (g *Gateway) createSandbox(req *openshell.CreateSandboxRequest) (*openshell.SandboxResponse, error) {
	sb, err := g.Create(req)
	if err != nil {
		return nil, err
	}
	return &openshell.SandboxResponse{Sandbox: sb}, nil
}

func (g *Gateway) getSandbox(req *openshell.GetSandboxRequest) (*openshell.SandboxResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	r, err := g.lookupLocked(req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	return &openshell.SandboxResponse{Sandbox: clone(r.sb)}, nil
}

// listSandboxes filters by workspace and selector in creation order, then
// applies offset and limit (wire-facts §1.4, OS-6..OS-8).
func (g *Gateway) listSandboxes(req *openshell.ListSandboxesRequest) (*openshell.ListSandboxesResponse, error) {
	if req.GetAllWorkspaces() && req.GetWorkspace() != "" {
		return nil, status.Error(codes.InvalidArgument, "workspace and all_workspaces are mutually exclusive")
	}
	sel, err := openshell.ParseLabelSelector(req.GetLabelSelector())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	if !req.GetAllWorkspaces() {
		if _, err := g.workspaceLocked(req.GetWorkspace()); err != nil {
			return nil, err
		}
	}
	limit, skip := openshell.ListLimit(req.GetLimit()), int(req.GetOffset())
	resp := &openshell.ListSandboxesResponse{}
	for _, r := range g.sortedLocked(req.GetWorkspace(), req.GetAllWorkspaces()) {
		if !openshell.MatchLabels(sel, r.sb.Metadata.Labels) {
			continue
		}
		if skip > 0 {
			skip--
			continue
		}
		if len(resp.Sandboxes) == limit {
			break
		}
		resp.Sandboxes = append(resp.Sandboxes, clone(r.sb))
	}
	return resp, nil
}

func (g *Gateway) deleteSandbox(req *openshell.DeleteSandboxRequest) (*openshell.DeleteSandboxResponse, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	deleted, err := g.deleteLocked(req)
	if err != nil {
		return nil, err
	}
	return &openshell.DeleteSandboxResponse{Deleted: deleted}, nil
}

// stopSandbox moves a READY sandbox to STOPPED.
func (g *Gateway) stopSandbox(req *openshell.StopSandboxRequest) (*openshell.SandboxResponse, error) {
	return g.transition(req.GetWorkspace(), req.GetName(), openshell.SandboxPhase_SANDBOX_PHASE_READY, openshell.SandboxPhase_SANDBOX_PHASE_STOPPED)
}

// startSandbox moves a STOPPED sandbox to READY.
func (g *Gateway) startSandbox(req *openshell.StartSandboxRequest) (*openshell.SandboxResponse, error) {
	return g.transition(req.GetWorkspace(), req.GetName(), openshell.SandboxPhase_SANDBOX_PHASE_STOPPED, openshell.SandboxPhase_SANDBOX_PHASE_READY)
}

func (g *Gateway) transition(ws, name string, from, to openshell.SandboxPhase) (*openshell.SandboxResponse, error) {
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settleLocked()
	r, err := g.lookupLocked(ws, name)
	if err != nil {
		return nil, err
	}
	if r.sb.Status.Phase != from {
		return nil, status.Errorf(codes.FailedPrecondition, "sandbox is %s, not %s", r.sb.Status.Phase, from)
	}
	g.setPhaseLocked(r, to)
	return &openshell.SandboxResponse{Sandbox: clone(r.sb)}, nil
}

// watchSandbox sends the sandbox's current state, then (follow_status) every
// change of it, ending after a READY or ERROR snapshot when
// stop_on_terminal is set, or when the sandbox is gone. Logs and platform
// events are not modelled: follow_logs / follow_events keep the stream open
// without sending any.
func (g *Gateway) watchSandbox(stream grpc.ServerStream) error {
	req := new(openshell.WatchSandboxRequest)
	if err := stream.RecvMsg(req); err != nil {
		return err
	}
	if req.GetId() == "" {
		return status.Error(codes.InvalidArgument, "id is required")
	}
	ctx := stream.Context()
	var lastVersion uint64
	for first := true; ; first = false {
		g.mu.Lock()
		g.settleLocked()
		r := g.byID[req.GetId()]
		changed, next := g.changed, g.nextDeadlineLocked()
		var sb *openshell.Sandbox
		if r != nil {
			sb = clone(r.sb)
		}
		g.mu.Unlock()
		if sb == nil {
			if first {
				return status.Error(codes.NotFound, "sandbox not found")
			}
			return nil
		}
		if first || sb.Metadata.ResourceVersion != lastVersion {
			lastVersion = sb.Metadata.ResourceVersion
			if err := stream.SendMsg(&openshell.SandboxStreamEvent{Payload: &openshell.SandboxStreamEvent_Sandbox{Sandbox: sb}}); err != nil {
				return err
			}
			phase := sb.Status.GetPhase()
			if req.GetStopOnTerminal() && (phase == openshell.SandboxPhase_SANDBOX_PHASE_READY || phase == openshell.SandboxPhase_SANDBOX_PHASE_ERROR) {
				return nil
			}
		}
		if !req.GetFollowStatus() {
			if !req.GetFollowLogs() && !req.GetFollowEvents() {
				return nil
			}
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		var wake <-chan time.Time
		var timer *time.Timer
		if !next.IsZero() {
			timer = time.NewTimer(time.Until(next))
			wake = timer.C
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-wake:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// execSandbox is ExecSandbox: one request, then output events and exactly
// one exit event, or a status error.
func (g *Gateway) execSandbox(stream grpc.ServerStream) error {
	req := new(openshell.ExecSandboxRequest)
	if err := stream.RecvMsg(req); err != nil {
		return err
	}
	return g.runExec(stream, req, io.NopCloser(strings.NewReader(string(req.GetStdin()))))
}

// execInteractive is ExecSandboxInteractive: the first input must be start;
// later stdin inputs feed the command, a half-close ends its input, resize
// inputs are accepted and ignored (commands get no terminal).
func (g *Gateway) execInteractive(stream grpc.ServerStream) error {
	first := new(openshell.ExecSandboxInput)
	if err := stream.RecvMsg(first); err != nil {
		if errors.Is(err, io.EOF) {
			return status.Error(codes.InvalidArgument, "first message must be start")
		}
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "first message must be start")
	}
	pr, pw := io.Pipe()
	g.wg.Add(1) // the handler is running, so Close has not begun waiting
	go func() {
		defer g.wg.Done()
		if len(start.GetStdin()) > 0 {
			pw.Write(start.GetStdin())
		}
		for {
			in := new(openshell.ExecSandboxInput)
			if err := stream.RecvMsg(in); err != nil {
				if errors.Is(err, io.EOF) {
					pw.Close()
				} else {
					pw.CloseWithError(err)
				}
				return // RecvMsg fails at the latest when the handler returned
			}
			if data, ok := in.GetPayload().(*openshell.ExecSandboxInput_Stdin); ok {
				pw.Write(data.Stdin) // fails once the command's input is closed: input dropped
			}
		}
	}()
	defer pr.Close()
	return g.runExec(stream, start, pr)
}

// errExecTimeout is the cause of an exec context whose timeout_seconds
// elapsed.
var errExecTimeout = errors.New("exec timeout")

// runExec validates req, finds its READY sandbox and runs the command
// through opts.Exec, translating its result to events (wire-facts §1.4).
func (g *Gateway) runExec(stream grpc.ServerStream, req *openshell.ExecSandboxRequest, stdin io.ReadCloser) error {
	if err := openshell.ValidateExecRequest(req); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	g.mu.Lock()
	g.settleLocked()
	r := g.byID[req.GetSandboxId()]
	if r == nil {
		g.mu.Unlock()
		return status.Error(codes.NotFound, "sandbox not found")
	}
	if r.sb.Status.Phase != openshell.SandboxPhase_SANDBOX_PHASE_READY {
		g.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "sandbox is not ready")
	}
	dir, err := g.sandboxDirLocked(r)
	sb := clone(r.sb)
	g.mu.Unlock()
	if err != nil {
		return status.Errorf(codes.Internal, "sandbox %s: exec directory: %v", sb.Metadata.Name, err)
	}

	ctx := stream.Context()
	runCtx, cancel := context.WithCancel(ctx)
	if t := req.GetTimeoutSeconds(); t > 0 {
		runCtx, cancel = context.WithTimeoutCause(ctx, time.Duration(t)*time.Second, errExecTimeout)
	}
	out := &eventSender{stream: stream}
	code, err := g.opts.Exec(runCtx, &Exec{
		Sandbox: sb,
		Request: req,
		Dir:     dir,
		Stdin:   stdin,
		Stdout:  outWriter{out, false},
		Stderr:  outWriter{out, true},
	})
	timedOut := runCtx.Err() != nil && errors.Is(context.Cause(runCtx), errExecTimeout)
	cancel()
	switch {
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case timedOut:
		code, err = openshell.ExecTimeoutExitCode, nil
	case errors.Is(err, ErrNoExit):
		out.finish()
		return nil
	case err != nil:
		out.finish()
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Errorf(codes.Internal, "exec: %v", err)
	}
	if err := out.finish(); err != nil {
		return err
	}
	return stream.SendMsg(&openshell.ExecSandboxEvent{Payload: &openshell.ExecSandboxEvent_Exit{Exit: &openshell.ExecSandboxExit{ExitCode: code}}})
}
