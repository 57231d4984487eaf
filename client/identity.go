package client

import (
	"context"

	"github.com/tetherfleet/tether/protocol"
)

// CreateToken mints a join token (protocol.SubjectTokensCreate; needs the
// admin right). The token is in the response only.
func (c *Client) CreateToken(ctx context.Context, req protocol.TokenCreateRequest) (protocol.TokenCreateResponse, error) {
	var resp protocol.TokenCreateResponse
	err := c.request(ctx, protocol.SubjectTokensCreate, req, &resp)
	return resp, err
}

// RevokeNode refuses every certificate of node from now on and closes its
// session (protocol.SubjectNodesRevoke; needs the admin right).
func (c *Client) RevokeNode(ctx context.Context, node string) (protocol.NodeRevokeResponse, error) {
	var resp protocol.NodeRevokeResponse
	err := c.request(ctx, protocol.SubjectNodesRevoke, protocol.NodeRevokeRequest{Node: node}, &resp)
	return resp, err
}
