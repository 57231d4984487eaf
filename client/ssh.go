package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/tetherfleet/tether/protocol"
)

// ErrSSHRefused is wrapped by SSH's error when the node's agent answered
// but refused the connection (its local policy allows none of the logins
// the coordinator's policy grants, or it serves no SSH); the agent's
// *protocol.ErrorInfo is wrapped too.
var ErrSSHRefused = errors.New("ssh refused by the node")

// SSHInfo asks the coordinator what an OpenSSH client needs to reach the
// caller's nodes (protocol.SubjectSSHInfo): the jump host, the host CA's
// known_hosts line and the nodes the caller may log in to. A ctx without
// deadline is bounded by RequestTimeout. The coordinator's refusal is a
// *protocol.APIError.
func (c *Client) SSHInfo(ctx context.Context) (*protocol.SSHInfo, error) {
	var resp protocol.SSHInfo
	if err := c.request(ctx, protocol.SubjectSSHInfo, protocol.SSHInfoRequest{}, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// SSH opens a raw byte stream to node's own SSH server (a tether.v1.stream
// of kind ssh, relayed over a NATS pipe): what an OpenSSH client speaks
// through tether ssh-proxy. The coordinator vouches for the caller's NATS
// identity, so the SSH client authenticates with "none" as one of the
// logins policy grants it there. node may carry protocol.SSHHostSuffix
// ("node-a.tether"). ctx bounds only the setup.
//
// Errors: a *protocol.APIError when the coordinator refuses (403 naming
// the identity, operation ssh and the node; 404 unknown node; 501 an agent
// without SSH); an error wrapping ErrSSHRefused and the agent's
// *protocol.ErrorInfo when the agent refuses. The caller must Close the
// stream; CloseWrite half-closes toward the node.
func (c *Client) SSH(ctx context.Context, node string) (*Stream, error) {
	node = strings.TrimSuffix(node, protocol.SSHHostSuffix)
	if err := protocol.ValidNodeID(node); err != nil {
		return nil, fmt.Errorf("ssh to node %s: %w", protocol.Clip(node), err)
	}
	s, err := c.OpenStream(ctx, node, protocol.KindSSH, struct{}{})
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { s.p.CloseWithError(context.Cause(ctx)) })
	fr := protocol.NewFrameReader(s)
	fr.Max = 4 << 10
	f, err := fr.Next()
	if !stop() && err == nil {
		err = context.Cause(ctx) // ctx ended just as the answer came
	}
	if err != nil {
		s.Close()
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("ssh to node %s: no answer from the agent: %w", node, err)
	}
	switch f.Type {
	case protocol.FrameDialOK:
		return s, nil
	case protocol.FrameError:
		s.Close()
		var ei protocol.ErrorInfo
		if err := protocol.DecodeJSON(f.Payload, &ei); err != nil {
			return nil, fmt.Errorf("ssh to node %s: %w", node, err)
		}
		return nil, fmt.Errorf("ssh to node %s: %w: %w", node, ErrSSHRefused, &ei)
	default:
		s.Close()
		return nil, fmt.Errorf("ssh to node %s: %w: %s frame", node, protocol.ErrUnexpected, f.Type)
	}
}
