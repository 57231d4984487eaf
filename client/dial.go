package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/tetherfleet/tether/protocol"
)

// ErrDialRefused is wrapped by Dial's error when the node's agent answered
// but refused the dial: it has no such target (protocol.CodeUnknownTarget)
// or could not reach it (protocol.CodeDialFailed, CodeBusy).
var ErrDialRefused = errors.New("dial refused by the node")

// dialRefusedError is the agent's refusal of a dial, with the node named
// once: "dial T on node N: REASON (CODE)", the agent's own "node N: "
// prefix dropped. It is ErrDialRefused (errors.Is) and unwraps to the
// agent's *protocol.ErrorInfo.
type dialRefusedError struct {
	target, node string
	info         *protocol.ErrorInfo
}

func (e *dialRefusedError) Error() string {
	msg := strings.TrimPrefix(e.info.Message, "node "+e.node+": ")
	msg = strings.TrimPrefix(msg, "dial target "+e.target+" at ") // the target is named already
	if strings.HasPrefix(msg, "node "+e.node+" ") {               // "node N has no target ...": names both itself
		return fmt.Sprintf("%s (%s)", msg, e.info.Code)
	}
	return fmt.Sprintf("dial %s on node %s: %s (%s)", e.target, e.node, msg, e.info.Code)
}
func (e *dialRefusedError) Is(target error) bool { return target == ErrDialRefused }
func (e *dialRefusedError) Unwrap() error        { return e.info }

// Dial opens a raw byte stream to target (an allow-listed name such as
// "openshell") on node, through the coordinator and the node's tunnel (a
// dial stream relayed over a NATS pipe). It returns once the agent has
// connected to the target. ctx bounds only the setup.
//
// Errors: a *protocol.APIError when the coordinator refuses (unknown node,
// bad target name); an error wrapping ErrDialRefused with the agent's
// *protocol.ErrorInfo when the agent refuses. The caller must Close the
// stream; CloseWrite half-closes toward the target.
func (c *Client) Dial(ctx context.Context, node, target string) (*Stream, error) {
	if err := protocol.ValidTargetName(target); err != nil {
		return nil, fmt.Errorf("dial %s on node %s: %w", target, node, err)
	}
	s, err := c.OpenStream(ctx, node, protocol.KindDial, protocol.DialParams{Target: target})
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { s.p.CloseWithError(context.Cause(ctx)) })
	f, err := protocol.NewFrameReader(s).Next()
	if !stop() && err == nil {
		// ctx ended just as the answer came: the pipe is being closed.
		err = context.Cause(ctx)
	}
	if err != nil {
		s.Close()
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("dial %s on node %s: no answer from the agent: %w", target, node, err)
	}
	switch f.Type {
	case protocol.FrameDialOK:
		return s, nil
	case protocol.FrameError:
		s.Close()
		var ei protocol.ErrorInfo
		if err := protocol.DecodeJSON(f.Payload, &ei); err != nil {
			return nil, fmt.Errorf("dial %s on node %s: %w", target, node, err)
		}
		return nil, &dialRefusedError{target: target, node: node, info: &ei}
	default:
		s.Close()
		return nil, fmt.Errorf("dial %s on node %s: %w: %s frame", target, node, protocol.ErrUnexpected, f.Type)
	}
}
