package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// ExecStream runs req on its one node (req.Target.Node) through an exec
// stream relayed by the coordinator (tether.v1.stream) rather than as an
// exec job, so that stdin is streamed to the command with no size limit:
// the bytes of stdin are sent as they are read, paced by the stream's flow
// control (the command's own reading), until stdin's EOF, which the command
// then reads. A nil stdin gives the command /dev/null. req.Stdin must be
// empty (give the bytes as stdin instead); req.Detach cannot be combined
// with a stdin; MaxParallel does not apply. A req without Timeout gets the
// coordinator's default timeout, as a job does.
//
// Output is delivered through opts.Output and the node's result through
// opts.NodeResult, from the calling goroutine, as ExecWith does, and the
// returned ExecResult has the same shape (one result; its ID is req.ID, set
// to a NewJobID if empty, though the coordinator does not know the run by
// it: tether.v1.cancel does not reach it, ending ctx does).
//
// When ctx ends ExecStream cancels the command (Stream.Cancel: out of band,
// so stdin the command leaves unread cannot hold the cancel up) and waits
// up to CancelGrace for its (cancelled) exit status, returning it with an
// error wrapping ctx.Err(); without the status the error still wraps
// ctx.Err(). A read error of stdin cancels the command too and is
// returned: the command never sees a cut stdin as its end. A coordinator
// that shuts down while the command runs cancels it and ends the stream
// with its shutdown error: the result is then the job path's (error
// "coordinator ID is shutting down; job cancelled", error_code shutdown,
// cancelled), with no error returned. A stream that breaks (tunnel lost,
// coordinator gone) is an error naming the node; whether the command ran
// to its end is then unknown.
//
// ExecStream copies stdin on a goroutine of its own. When it returns, that
// goroutine has ended, unless it is blocked in stdin's Read: ExecStream then
// calls stdin's SetReadDeadline(time.Now()) if stdin has one (*os.File of a
// pipe, or net.Conn) and waits for the Read to return; a stdin without one
// is left to the goroutine, which ends at its Read's next return without
// reading further.
func (c *Client) ExecStream(ctx context.Context, req *protocol.ExecRequest, stdin io.Reader, opts ExecOptions) (*protocol.ExecResult, error) {
	if c.NC == nil {
		return nil, errors.New("client: exec stream: nil NATS connection")
	}
	node := req.Target.Node
	if node == "" || req.Target.Selector != "" || req.Target.All {
		return nil, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "an exec stream runs on one node: set target.node only")
	}
	if len(req.Stdin) > 0 {
		return nil, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "an exec stream takes its stdin as a reader, not in the request")
	}
	if req.ID == "" {
		req.ID = NewJobID()
	}
	if e := req.Validate(); e != nil {
		return nil, e
	}
	p := req.Params(0)
	p.Stdin = stdin != nil
	if err := p.Validate(); err != nil {
		return nil, protocol.NewAPIError(400, protocol.ErrCodeInvalid, "exec on node %s: %v", node, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("exec %s on node %s: %w", req.ID, node, err)
	}
	out := opts.Output
	if out == nil {
		out = func(string, string, []byte) {}
	}
	onResult := opts.NodeResult
	if onResult == nil {
		onResult = func(*protocol.NodeResult) {}
	}

	st, err := c.OpenStream(ctx, node, protocol.KindExec, &p)
	if err != nil {
		return nil, err
	}
	x := &execStream{st: st, node: node, id: req.ID, p: &p, out: out, cancelGrace: c.cancelGrace()}
	start := time.Now()
	var wg sync.WaitGroup
	stdinDone := make(chan struct{})
	if stdin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(stdinDone)
			x.copyStdin(stdin)
		}()
	} else {
		close(stdinDone)
	}
	res, err := x.run(ctx)
	st.Close() // ends a write blocked on the stream's window
	select {
	case <-stdinDone:
		wg.Wait()
	default:
		if d, ok := stdin.(interface{ SetReadDeadline(time.Time) error }); ok && d.SetReadDeadline(time.Now()) == nil {
			wg.Wait()
		}
	}
	x.mu.Lock()
	x.closed = true
	x.mu.Unlock()
	if res == nil {
		return nil, err
	}
	if res.DurationMS == 0 {
		res.DurationMS = float64(time.Since(start)) / float64(time.Millisecond)
	}
	if res.Error == "" && res.ExitCode != 0 && !res.Cancelled && !res.Detached {
		res.Failure = protocol.FailureMessage(node, &p, res, x.tail.bytes())
	}
	onResult(res)
	er := &protocol.ExecResult{ID: req.ID, Results: []protocol.NodeResult{*res}, Nodes: 1, Truncated: res.Truncated}
	if res.OK() {
		er.Succeeded = 1
	} else {
		er.Failed = 1
	}
	return er, err
}

// execStream is one ExecStream call's state.
type execStream struct {
	st          *Stream
	node, id    string
	p           *protocol.ExecParams
	out         OutputHandler
	cancelGrace time.Duration

	wmu      sync.Mutex // one frame at a time on st
	mu       sync.Mutex // guards stdinErr and closed
	stdinErr error      // a local read error of stdin, which cancelled the command
	closed   bool       // ExecStream is returning: no more cancels
	once     sync.Once

	tail   tailBuffer
	counts [2]int64 // stdout, stderr bytes received
}

// send writes one frame to the agent.
func (x *execStream) send(t protocol.FrameType, payload []byte) error {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	return protocol.WriteFrame(x.st, t, payload)
}

// cancel asks the agent to stop the command, once (Stream.Cancel). It does
// not block: a stdin write blocked on the stream's window returns.
func (x *execStream) cancel() {
	x.once.Do(func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.closed {
			return
		}
		x.st.Cancel()
	})
}

// copyStdin sends stdin as stdin frames, then a stdin close at its EOF. A
// read error cancels the command (the agent must not see a cut stdin as
// its end); a write error means the stream ended, which run reports.
func (x *execStream) copyStdin(stdin io.Reader) {
	buf := make([]byte, protocol.ChunkSize)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			if werr := x.send(protocol.FrameStdin, buf[:n]); werr != nil {
				return
			}
		}
		switch {
		case err == io.EOF:
			x.send(protocol.FrameStdinClose, nil)
			return
		case err != nil:
			x.mu.Lock()
			x.stdinErr = fmt.Errorf("read standard input: %w", err)
			x.mu.Unlock()
			x.cancel()
			return
		}
	}
}

func (x *execStream) readErr() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.stdinErr
}

// errGaveUp closes the stream of a cancelled command whose exit status did
// not come within the cancel grace.
var errGaveUp = errors.New("no exit status within the cancel grace")

// run reads the agent's frames until its final one and returns the node's
// result, with an error when ctx ended, stdin failed or the stream broke.
// When ctx ends it sends a cancel, and past CancelGrace closes the stream.
func (x *execStream) run(ctx context.Context) (*protocol.NodeResult, error) {
	var (
		gaveUp    atomic.Bool
		mu        sync.Mutex
		timer     *time.Timer
		afterDone = make(chan struct{})
	)
	stop := context.AfterFunc(ctx, func() {
		defer close(afterDone)
		x.cancel()
		mu.Lock()
		timer = time.AfterFunc(x.cancelGrace, func() {
			gaveUp.Store(true)
			x.st.p.CloseWithError(errGaveUp)
		})
		mu.Unlock()
	})
	defer func() {
		if !stop() {
			<-afterDone
		}
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}()
	fr := protocol.NewFrameReader(x.st)
	for {
		f, err := fr.Next()
		if err != nil {
			if gaveUp.Load() {
				return nil, fmt.Errorf("exec %s on node %s: %w (cancel requested; no exit status within %v)", x.id, x.node, ctx.Err(), x.cancelGrace)
			}
			if ctx.Err() != nil {
				// A coordinator that predates the pipe's reset ends the
				// stream at the cancel.
				return nil, fmt.Errorf("exec %s on node %s: %w (cancel requested; the stream ended without an exit status: %v)", x.id, x.node, ctx.Err(), err)
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if serr := x.readErr(); serr != nil {
				return nil, fmt.Errorf("exec %s on node %s: %w (the command was cancelled)", x.id, x.node, serr)
			}
			return nil, fmt.Errorf("exec %s on node %s: no exit status: %w", x.id, x.node, err)
		}
		res, err := x.frame(f.Type, f.Payload)
		if res == nil && err == nil {
			continue
		}
		if err == nil {
			err = x.readErr()
		}
		if err == nil && ctx.Err() != nil {
			err = fmt.Errorf("exec %s on node %s: %w", x.id, x.node, ctx.Err())
		}
		return res, err
	}
}

// frame handles one frame: output goes to the handler (payload copied, so
// the handler may keep it); an exit or error frame becomes the result.
func (x *execStream) frame(t protocol.FrameType, payload []byte) (*protocol.NodeResult, error) {
	switch t {
	case protocol.FrameStdout:
		x.counts[0] += int64(len(payload))
		x.out(x.node, protocol.ReplyStdout, bytes.Clone(payload))
	case protocol.FrameStderr:
		x.counts[1] += int64(len(payload))
		x.tail.write(payload)
		x.out(x.node, protocol.ReplyStderr, bytes.Clone(payload))
	case protocol.FrameExit:
		var es protocol.ExitStatus
		if err := protocol.DecodeJSON(payload, &es); err != nil {
			return nil, fmt.Errorf("exec %s on node %s: exit status: %w", x.id, x.node, err)
		}
		r := &protocol.NodeResult{
			Node:            x.node,
			ExitCode:        es.ExitCode,
			Signal:          es.Signal,
			TimedOut:        es.TimedOut,
			Cancelled:       es.Cancelled,
			DurationMS:      es.DurationMS,
			StdoutBytes:     es.StdoutBytes,
			StderrBytes:     es.StderrBytes,
			StdoutTruncated: es.StdoutTruncated,
			StderrTruncated: es.StderrTruncated,
			FailedCommand:   es.FailedCommand,
			OutputCut:       es.OutputCut,
			Detached:        es.Detached,
		}
		r.Truncated = r.OutputTruncated()
		if es.Detached {
			r.ExitCode = 0
		}
		return r, nil
	case protocol.FrameError:
		var ei protocol.ErrorInfo
		if err := protocol.DecodeJSON(payload, &ei); err != nil {
			return nil, fmt.Errorf("exec %s on node %s: error frame: %w", x.id, x.node, err)
		}
		return &protocol.NodeResult{
			Node:      x.node,
			ExitCode:  -1,
			Error:     withoutNodePrefix(x.node, ei.Message),
			ErrorCode: ei.Code,
			// The coordinator's shutdown (its relay ends the stream
			// with this error) cancelled the command, as on the job
			// path.
			Cancelled:   ei.Code == protocol.ResultCodeShutdown,
			StdoutBytes: x.counts[0],
			StderrBytes: x.counts[1],
		}, nil
	}
	// Other frame types are newer than this client.
	return nil, nil
}

// withoutNodePrefix strips the "node <id>: " an agent puts in front of its
// messages, as the coordinator does for a job's results.
func withoutNodePrefix(node, msg string) string {
	if len(msg) > len(node)+7 && msg[:5] == "node " && msg[5:5+len(node)] == node && msg[5+len(node):7+len(node)] == ": " {
		return msg[7+len(node):]
	}
	return msg
}

// tailBuffer keeps the last protocol.FailureStderrTail bytes written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) write(p []byte) {
	const n = protocol.FailureStderrTail
	if len(p) >= n {
		t.b = append(t.b[:0], p[len(p)-n:]...)
		return
	}
	t.b = append(t.b, p...)
	if len(t.b) > 2*n {
		t.b = append(t.b[:0], t.b[len(t.b)-n:]...)
	}
}

func (t *tailBuffer) bytes() []byte {
	if len(t.b) > protocol.FailureStderrTail {
		return t.b[len(t.b)-protocol.FailureStderrTail:]
	}
	return t.b
}
