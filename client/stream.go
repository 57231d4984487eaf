package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
)

// Stream is a tunnel stream to an agent: on the direct path, a yamux
// stream on the coordinator's own tunnel listener spliced onto the node's
// tunnel stream (direct.go); else relayed by the coordinator over a NATS
// pipe (tether.v1.stream). Its bytes are the stream kind's frames:
// protocol.WriteFrame and protocol.NewFrameReader work on it. Read and Write
// may be used from two goroutines at once; Close may be called from any.
type Stream struct {
	p      streamConn
	node   string
	kind   protocol.Kind
	direct bool
}

// streamConn is what a Stream runs on: a *natspipe.Pipe, or a
// *directStream. Their methods mean what Stream's say; ResetWrite is
// Cancel.
type streamConn interface {
	io.ReadWriter
	CloseWrite() error
	ResetWrite(reason error) error
	CloseWithError(reason error) error
	Close() error
	Err() error
}

var (
	_ streamConn = (*natspipe.Pipe)(nil)
	_ streamConn = (*directStream)(nil)
)

// OpenStream asks the coordinator to open a stream of kind (exec, copy,
// pty, dial or ssh) with params (the kind's params struct, sent to the
// agent in the stream header) to node, and returns it once the coordinator
// opened the tunnel stream. ctx bounds only this handshake; a ctx without
// deadline is bounded by RequestTimeout. A request the coordinator refuses
// (unknown node, bad kind or params, the policy) returns its
// *protocol.APIError; no coordinator at all returns an error wrapping
// nats.ErrNoResponders. Exec or pty params holding a string that is not
// UTF-8 are refused before anything is sent, with the 400 invalid_request
// *protocol.APIError the coordinator answers bad params with (JSON would
// carry U+FFFD in their place).
//
// By Direct's mode, the stream goes over the direct path (the
// coordinator's tunnel listener, direct.go) when the coordinator holding
// the node offers it and the listener is reachable, else over a NATS pipe
// (natspipe's default tuning: 8 MiB window, 5 s keepalive, peer gone after
// 15 s of silence). The caller must Close the stream.
func (c *Client) OpenStream(ctx context.Context, node string, kind protocol.Kind, params any) (*Stream, error) {
	if c.NC == nil {
		return nil, errors.New("client: open stream: nil NATS connection")
	}
	if err := checkParamsUTF8(node, kind, params); err != nil {
		return nil, err
	}
	raw, err := protocol.MarshalJSON(params)
	if err != nil {
		return nil, fmt.Errorf("open %s stream to node %s: encode params: %w", kind, node, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.requestTimeout())
		defer cancel()
	}
	if c.Direct != DirectOff && (c.Direct == DirectOnly || !c.direct.skip()) {
		s, err := c.openDirect(ctx, node, kind, raw)
		if err == nil || c.Direct == DirectOnly || !fallBack(err) {
			return s, err
		}
		c.direct.noteFallback(err)
	}
	body, err := json.Marshal(protocol.StreamRequest{Node: node, Kind: kind.String(), Params: raw})
	if err != nil {
		return nil, fmt.Errorf("open %s stream to node %s: encode request: %w", kind, node, err)
	}
	p, err := natspipe.Dial(ctx, c.NC, protocol.SubjectStream, nil, body, natspipe.Config{})
	if err != nil {
		var rej *natspipe.RejectedError
		switch {
		case errors.As(err, &rej):
			if e := apiError(rej.Msg); e != nil {
				return nil, e
			}
			return nil, fmt.Errorf("open %s stream to node %s: %w", kind, node, err)
		case errors.Is(err, nats.ErrNoResponders):
			return nil, c.noCoordinator(protocol.SubjectStream)
		}
		return nil, fmt.Errorf("open %s stream to node %s through %s: %w", kind, node, c.serverName(), err)
	}
	return &Stream{p: p, node: node, kind: kind}, nil
}

// wrap names the stream in errors other than io.EOF.
func (s *Stream) wrap(err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return fmt.Errorf("%s stream on node %s: %w", s.kind, s.node, err)
}

// Read reads the agent's bytes. It returns io.EOF after the agent closed
// its side, and an error naming the node when the stream was aborted (the
// coordinator lost the tunnel, the pipe went silent, Close was called).
func (s *Stream) Read(p []byte) (int, error) {
	n, err := s.p.Read(p)
	return n, s.wrap(err)
}

// Write sends bytes to the agent. It blocks while the pipe's window is
// full.
func (s *Stream) Write(p []byte) (int, error) {
	n, err := s.p.Write(p)
	return n, s.wrap(err)
}

// CloseWrite half-closes the stream: the agent reads EOF after the bytes
// written so far. Reading goes on.
func (s *Stream) CloseWrite() error { return s.wrap(s.p.CloseWrite()) }

// Cancel stops the agent's operation now while its answer still arrives:
// it abandons this direction out of band (natspipe.ResetWrite), so the
// coordinator learns of it however many bytes written so far wait unread
// in the pipe or the tunnel stream (stdin a command does not read, say). The
// coordinator drops those bytes, tells the agent on the session's control
// stream and in the stream itself, and half-closes the stream; Read then
// returns the agent's last frames (an exec's cancelled exit status) and
// io.EOF. Writes fail afterwards. It does not block; calling it again does
// nothing. A coordinator that predates the pipe's reset aborts the whole
// stream instead (as Close), and an agent that predates the out-of-band
// cancel only sees the in-band one, behind those bytes.
func (s *Stream) Cancel() error { return s.wrap(s.p.ResetWrite(errStreamCancelled)) }

// errStreamCancelled is the reason a Cancel gives the coordinator.
var errStreamCancelled = errors.New("cancelled by the client")

// Close aborts both directions (if they have not ended already) and
// releases the pipe. The coordinator then sends the agent FrameCancel (at a
// frame boundary) and closes the tunnel stream, so the operation stops.
// Calling it again does nothing.
func (s *Stream) Close() error { return s.wrap(s.p.Close()) }

// Err returns why the stream failed, or nil if it is healthy or ended
// cleanly.
func (s *Stream) Err() error { return s.wrap(s.p.Err()) }

// Direct reports whether the stream is on the direct path (else it is
// relayed over NATS).
func (s *Stream) Direct() bool { return s.direct }

// Node is the node the stream goes to.
func (s *Stream) Node() string { return s.node }

var _ io.ReadWriteCloser = (*Stream)(nil)
