package client

import (
	"context"

	"github.com/tetherfleet/tether/protocol"
)

// Audit reads one page of the audit log (protocol.SubjectAuditQuery; the
// caller needs the policy's admin operation). Go on with the response's
// Next as q.Cursor. A ctx without deadline is bounded by RequestTimeout.
func (c *Client) Audit(ctx context.Context, q protocol.AuditQueryRequest) (*protocol.AuditQueryResponse, error) {
	if e := q.Validate(); e != nil {
		return nil, e
	}
	var resp protocol.AuditQueryResponse
	if err := c.request(ctx, protocol.SubjectAuditQuery, q, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}
