package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// OpenShell lists, gets and deletes the sandboxes of one OpenShell gateway
// (wire-facts §1). It calls methods by full path with the messages of
// protocol/openshell. The zero value is not usable: Conn is required. It
// holds no state besides its fields, which must not change while it is in
// use, and is safe for concurrent use.
type OpenShell struct {
	// Conn reaches the gateway: a *grpc.ClientConn over loopback (agent) or
	// over a tunnel dial stream (coordinator). The caller owns and closes it.
	Conn grpc.ClientConnInterface
	// Workspaces are the workspaces List covers, in order; empty means
	// ["default"].
	Workspaces []string
	// Selector is List's label_selector (comma-separated key=value pairs,
	// ANDed; wire-facts §1.4), e.g. "nemo-gym.sandbox=1"; "" lists all.
	Selector string
	// Token, when set, is sent as "authorization: Bearer <Token>" on every
	// call.
	Token string
}

// List page geometry: pages of openShellPage rows; each page after the
// first re-reads the last openShellOverlap rows of the one before, so
// that sandboxes created or deleted between two pages (which shift the
// gateway's plain row offsets) neither hide a row nor repeat one.
const (
	openShellPage    = 500
	openShellOverlap = 50
	// openShellListTries bounds how often List restarts a workspace whose
	// rows shifted by more than the overlap between two pages.
	openShellListTries = 3
)

// errShifted says a page no longer overlapped the previous one.
var errShifted = errors.New("rows shifted by more than the page overlap between two pages")

// List returns every sandbox matching Selector in each of Workspaces,
// paging ListSandboxes with limit and offset until a short page. A sandbox
// that exists during the whole listing is reported exactly once; one
// created or deleted meanwhile may or may not be. On error List returns
// the sandboxes listed so far with an error naming the workspace: the
// listing is then incomplete, and absence from it means nothing.
func (o *OpenShell) List(ctx context.Context) ([]protocol.Sandbox, error) {
	workspaces := o.Workspaces
	if len(workspaces) == 0 {
		workspaces = []string{openshell.DefaultWorkspace}
	}
	var out []protocol.Sandbox
	for _, ws := range workspaces {
		var got []protocol.Sandbox
		var err error
		for try := 0; try < openShellListTries; try++ {
			got, err = o.listWorkspace(ctx, ws)
			if !errors.Is(err, errShifted) {
				break
			}
		}
		if err != nil {
			return out, fmt.Errorf("openshell: list workspace %s: %w", ws, err)
		}
		out = append(out, got...)
	}
	return out, nil
}

// unavailableError is a gRPC UNAVAILABLE status in a user's words (the
// gateway could not be reached, and why); it unwraps to the status, so
// status.FromError and status.Code still see UNAVAILABLE.
type unavailableError struct {
	msg string
	err error
}

func (e *unavailableError) Error() string { return e.msg }
func (e *unavailableError) Unwrap() error { return e.err }

// callError words err, from a call to the gateway: an UNAVAILABLE status
// becomes "gateway not reachable: dial tcp ADDR: connect: connection
// refused" instead of grpc's `rpc error: code = Unavailable desc =
// connection error: desc = "transport: Error while dialing: ..."`; other
// errors are returned as they are.
func callError(err error) error {
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.Unavailable {
		return err
	}
	why := s.Message()
	const dialing = "Error while dialing: "
	if i := strings.LastIndex(why, dialing); i >= 0 {
		why = strings.TrimSuffix(why[i+len(dialing):], `"`)
	} else {
		why = strings.TrimPrefix(why, "connection error: ")
	}
	return &unavailableError{msg: "gateway not reachable: " + why, err: err}
}

// listWorkspace pages through one workspace (see openShellOverlap).
func (o *OpenShell) listWorkspace(ctx context.Context, ws string) ([]protocol.Sandbox, error) {
	var out []protocol.Sandbox
	seen := map[string]bool{}
	var tail map[string]int // ids of the previous page's last rows -> order
	for offset := uint32(0); ; {
		resp := new(openshell.ListSandboxesResponse)
		req := &openshell.ListSandboxesRequest{Limit: openShellPage, Offset: offset, LabelSelector: o.Selector, Workspace: ws}
		if err := o.Conn.Invoke(o.ctx(ctx), openshell.MethodListSandboxes, req, resp); err != nil {
			if offset == 0 {
				return out, callError(err)
			}
			return out, fmt.Errorf("page from row %d: %w", offset, callError(err))
		}
		page := resp.GetSandboxes()
		start := 0
		if tail != nil {
			// Continue after the last row already seen: the anchor with
			// the highest order among the previous page's tail.
			anchor, best := -1, -1
			for i, sb := range page {
				if ord, ok := tail[sb.GetMetadata().GetId()]; ok && ord > best {
					anchor, best = i, ord
				}
			}
			if anchor < 0 && len(page) > 0 {
				return out, fmt.Errorf("offset %d: %w", offset, errShifted)
			}
			start = anchor + 1
		}
		for _, sb := range page[start:] {
			if id := sb.GetMetadata().GetId(); !seen[id] {
				seen[id] = true
				out = append(out, OpenShellSandbox(sb, ws))
			}
		}
		if len(page) < openShellPage {
			return out, nil
		}
		tail = map[string]int{}
		for i, sb := range page[len(page)-openShellOverlap:] {
			tail[sb.GetMetadata().GetId()] = i
		}
		offset += openShellPage - openShellOverlap
	}
}

// Get returns sandbox name of workspace ws ("" = "default"). A gateway
// NOT_FOUND (sandbox or workspace) is returned as ErrNotFound, wrapped.
func (o *OpenShell) Get(ctx context.Context, ws, name string) (protocol.Sandbox, error) {
	resp := new(openshell.SandboxResponse)
	err := o.Conn.Invoke(o.ctx(ctx), openshell.MethodGetSandbox, &openshell.GetSandboxRequest{Name: name, Workspace: ws}, resp)
	if err != nil {
		return protocol.Sandbox{}, openShellError("get", ws, name, err)
	}
	return OpenShellSandbox(resp.GetSandbox(), ws), nil
}

// Delete asks the gateway to delete sandbox name of workspace ws ("" =
// "default"). deleted is the gateway's answer: true when it is removing the
// compute resource (the sandbox may show DELETING for a while), false when
// the compute was already gone. A gateway NOT_FOUND is returned as
// ErrNotFound, wrapped: the sandbox is gone, so the delete is done. Other
// errors wrap the gRPC status (status.Code works on them).
func (o *OpenShell) Delete(ctx context.Context, ws, name string) (deleted bool, err error) {
	resp := new(openshell.DeleteSandboxResponse)
	err = o.Conn.Invoke(o.ctx(ctx), openshell.MethodDeleteSandbox, &openshell.DeleteSandboxRequest{Name: name, Workspace: ws}, resp)
	if err != nil {
		return false, openShellError("delete", ws, name, err)
	}
	return resp.GetDeleted(), nil
}

// ctx adds the bearer token, if any, to ctx's outgoing metadata.
func (o *OpenShell) ctx(ctx context.Context) context.Context {
	if o.Token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, openshell.AuthorizationHeader, "Bearer "+o.Token)
}

func openShellError(op, ws, name string, err error) error {
	ws = openshell.Workspace(ws)
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("openshell: %s %s/%s: %w (%s)", op, ws, name, ErrNotFound, status.Convert(err).Message())
	}
	return fmt.Errorf("openshell: %s %s/%s: %w", op, ws, name, err)
}

// OpenShellSandbox converts a gateway's Sandbox to Tether's view: id, name,
// workspace (ws when the gateway left it empty, then "default"), labels,
// State = the phase's enum name (e.g. "SANDBOX_PHASE_READY"), CreatedAt from
// created_at_ms, Deleting when the phase is DELETING or a deletion
// timestamp is set.
func OpenShellSandbox(sb *openshell.Sandbox, ws string) protocol.Sandbox {
	md := sb.GetMetadata()
	phase := sb.GetStatus().GetPhase()
	w := md.GetWorkspace()
	if w == "" {
		w = openshell.Workspace(ws)
	}
	s := protocol.Sandbox{
		Provider:  protocol.ProviderOpenShell,
		ID:        md.GetId(),
		Name:      md.GetName(),
		Workspace: w,
		State:     phase.String(),
		Deleting:  phase == openshell.SandboxPhase_SANDBOX_PHASE_DELETING || md.GetDeletionTimestampMs() != 0,
	}
	if len(md.GetLabels()) > 0 {
		s.Labels = maps.Clone(md.GetLabels())
	}
	if ms := md.GetCreatedAtMs(); ms != 0 {
		s.CreatedAt = time.UnixMilli(ms).UTC()
	}
	return s
}
