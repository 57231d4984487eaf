package client

import (
	"context"
	"errors"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// OpenLease opens (or renews, if open) the lease of run for ttl (zero:
// protocol.DefaultLeaseTTL) held by holder. Sandboxes the run owns are
// reaped once the lease expires unrenewed or is closed. A closed run's
// lease cannot be reopened: *protocol.APIError with code
// protocol.ErrCodeLeaseClosed.
func (c *Client) OpenLease(ctx context.Context, run string, ttl time.Duration, holder string) (*protocol.LeaseInfo, error) {
	var li protocol.LeaseInfo
	req := protocol.LeaseOpenRequest{Run: run, TTLMS: ttl.Milliseconds(), Holder: holder}
	if e := req.Validate(); e != nil {
		return nil, e
	}
	if err := c.request(ctx, protocol.SubjectLeaseOpen, req, &li); err != nil {
		return nil, err
	}
	return &li, nil
}

// RenewLease renews run's open lease by its TTL. An unknown run is a
// *protocol.APIError with code protocol.ErrCodeNotFound, a closed one
// protocol.ErrCodeLeaseClosed.
func (c *Client) RenewLease(ctx context.Context, run string) (*protocol.LeaseInfo, error) {
	return c.leaseOp(ctx, protocol.SubjectLeaseRenew, run)
}

// CloseLease closes run's lease: the run is over and its sandboxes are
// reaped now. Closing twice is not an error.
func (c *Client) CloseLease(ctx context.Context, run string) (*protocol.LeaseInfo, error) {
	return c.leaseOp(ctx, protocol.SubjectLeaseClose, run)
}

func (c *Client) leaseOp(ctx context.Context, subject, run string) (*protocol.LeaseInfo, error) {
	req := protocol.LeaseRequest{Run: run}
	if e := req.Validate(); e != nil {
		return nil, e
	}
	var li protocol.LeaseInfo
	if err := c.request(ctx, subject, req, &li); err != nil {
		return nil, err
	}
	return &li, nil
}

// Sandboxes lists the ledger's records matching f (its Limit is the page
// size; After is ignored), following every page and halving the page size
// when a page is too large for the NATS server's max payload. Records are
// sorted by ledger key (provider, node, id).
func (c *Client) Sandboxes(ctx context.Context, f protocol.SandboxesListRequest) ([]protocol.SandboxInfo, error) {
	f.After = ""
	if e := f.Validate(); e != nil {
		return nil, e
	}
	if f.Limit == 0 {
		f.Limit = protocol.DefaultSandboxesLimit
	}
	var all []protocol.SandboxInfo
	for {
		var resp protocol.SandboxesListResponse
		err := c.request(ctx, protocol.SubjectSandboxesList, f, &resp)
		if errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeTooLarge}) && f.Limit > 1 {
			f.Limit /= 2 // a page of large records: ask for fewer
			continue
		}
		if err != nil {
			return nil, err
		}
		all = append(all, resp.Sandboxes...)
		if resp.Next == "" || len(resp.Sandboxes) == 0 {
			return all, nil
		}
		f.After = resp.Next
	}
}

// RegisterSandbox records a sandbox created on a node's gateway directly
// (not through a facade) in the ledger, as managed.
func (c *Client) RegisterSandbox(ctx context.Context, r protocol.SandboxRegisterRequest) (*protocol.SandboxInfo, error) {
	if e := r.Validate(); e != nil {
		return nil, e
	}
	var si protocol.SandboxInfo
	if err := c.request(ctx, protocol.SubjectSandboxesRegister, r, &si); err != nil {
		return nil, err
	}
	return &si, nil
}

// Reap asks the reaper what it would delete (dry run: every candidate, or
// one run's), or to reap one run's sandboxes now (which closes the run's
// lease).
func (c *Client) Reap(ctx context.Context, r protocol.ReapRequest) (*protocol.ReapResponse, error) {
	if e := r.Validate(); e != nil {
		return nil, e
	}
	var resp protocol.ReapResponse
	if err := c.request(ctx, protocol.SubjectSandboxesReap, r, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// SyncSandboxes has the coordinator take every node's inventory now and
// waits until the ledger reconciled them (up to 2 minutes; a ctx without a
// deadline is bounded by that, not by RequestTimeout).
func (c *Client) SyncSandboxes(ctx context.Context) (*protocol.SandboxesSyncResponse, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute+10*time.Second)
		defer cancel()
	}
	var resp protocol.SandboxesSyncResponse
	if err := c.request(ctx, protocol.SubjectSandboxesSync, struct{}{}, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}
