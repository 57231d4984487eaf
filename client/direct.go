package client

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// DirectMode selects how OpenStream carries a stream's bytes.
type DirectMode int

const (
	// DirectAuto (the zero value) uses the direct path when the
	// coordinator holding the node offers it and its tunnel listener is
	// reachable, and relays over NATS otherwise: a listener that cannot
	// be reached (dial or TLS failure within DirectDialTimeout), a
	// coordinator without one, or one that predates it. After such a
	// fallback the Client relays over NATS for DirectRetryAfter before it
	// tries again. A listener whose certificate does not match the pin
	// is no outage: OpenStream fails with *PinMismatchError.
	DirectAuto DirectMode = iota
	// DirectOff always relays over NATS (`TETHER_DIRECT=0` in the CLI).
	DirectOff
	// DirectOnly uses the direct path or fails: no fallback.
	DirectOnly
)

// Defaults of the direct path.
const (
	// DefaultDirectDialTimeout bounds the TCP dial and TLS handshake with
	// a coordinator's tunnel listener before OpenStream falls back.
	DefaultDirectDialTimeout = 2 * time.Second
	// DirectRetryAfter is how long a Client relays over NATS after the
	// direct path was found unusable.
	DirectRetryAfter = 30 * time.Second
)

// directClient is a Client's direct sessions, one per coordinator listener
// (address and pin), reused by every stream. Its zero value is ready.
type directClient struct {
	mu       sync.Mutex
	sessions map[string]*directSession   // the ones new streams use, by key
	all      map[*directSession]struct{} // every live one, for Close
	until    time.Time                   // relay over NATS until then
	closed   bool                        // Client.Close ran
}

// skip reports whether the direct path was found unusable a short while
// ago.
func (d *directClient) skip() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return time.Now().Before(d.until)
}

// noteFallback remembers, for DirectRetryAfter, that the direct path is
// unusable, when err says so (not for a ticket refused once).
func (d *directClient) noteFallback(err error) {
	var ue *directUnreachableError
	var ae *protocol.APIError
	if errors.As(err, &ue) || errors.As(err, &ae) && ae.Code != protocol.ErrCodeTicket {
		d.mu.Lock()
		d.until = time.Now().Add(DirectRetryAfter)
		d.mu.Unlock()
	}
}

// directUnreachableError is a direct listener that could not be reached or
// did not prove itself (dial, TLS, pin, ALPN).
type directUnreachableError struct {
	addr string
	err  error
}

func (e *directUnreachableError) Error() string {
	return fmt.Sprintf("direct listener %s unusable: %v", e.addr, e.err)
}

func (e *directUnreachableError) Unwrap() error { return e.err }

// PinMismatchError is a direct listener that answered with a certificate
// whose key pin (tunnel.CertPin) is not the one the coordinator gave over
// NATS. OpenStream returns it in every mode, DirectAuto included, instead
// of falling back to the NATS relay: the listener was reached, and what
// answered is not the coordinator (an interception, or a misconfiguration
// such as a --direct-addr that names another server, or a proxy that
// terminates TLS in front of the listener). Falling back would hide it.
type PinMismatchError struct {
	Addr string // the address dialed (host:port)
	Want string // the pin the coordinator gave
	Got  string // the pin of the certificate the listener presented
}

func (e *PinMismatchError) Error() string {
	return fmt.Sprintf("direct listener %s presented a certificate with key pin %s, but the coordinator gave %s over NATS: refusing the connection and not falling back to NATS (an interception, or --direct-addr naming a server other than the coordinator's tunnel listener, or a proxy terminating TLS in front of it; TETHER_DIRECT=0 relays over NATS meanwhile)", e.Addr, e.Got, e.Want)
}

// fallBack reports whether a direct open that failed with err may be tried
// again over NATS: the listener is out of reach, or the coordinator does
// not offer the direct path (or predates it: its strict decoder refuses
// the field), or the ticket was refused (it expired while dialing).
func fallBack(err error) bool {
	var ue *directUnreachableError
	if errors.As(err, &ue) || errors.Is(err, errSessionGone) {
		return true
	}
	var ae *protocol.APIError
	if errors.As(err, &ae) {
		switch ae.Code {
		case protocol.ErrCodeDirectUnavailable, protocol.ErrCodeUnknownField, protocol.ErrCodeTicket:
			return true
		}
	}
	return false
}

// errSessionGone is a cached session that takes no more streams (the
// coordinator's GoAway, or the session died).
var errSessionGone = errors.New("direct session takes no new streams")

// Close releases the Client's direct sessions: their streams fail. The
// NATS connection is the caller's to close. The Client may still be used
// afterwards, over NATS only.
func (c *Client) Close() error {
	d := &c.direct
	d.mu.Lock()
	d.closed = true
	all := make([]*directSession, 0, len(d.all))
	for s := range d.all {
		all = append(all, s)
	}
	d.sessions, d.all = nil, nil
	d.mu.Unlock()
	for _, s := range all {
		s.sess.Close()
		<-s.done
	}
	return nil
}

func (c *Client) directDialTimeout() time.Duration {
	if c.DirectDialTimeout > 0 {
		return c.DirectDialTimeout
	}
	return DefaultDirectDialTimeout
}

// openDirect opens a stream on the direct path: a ticket over NATS, then a
// data stream on the coordinator's listener (a cached session, or a new
// one).
func (c *Client) openDirect(ctx context.Context, node string, kind protocol.Kind, raw json.RawMessage) (*Stream, error) {
	body, err := json.Marshal(protocol.StreamRequest{Node: node, Kind: kind.String(), Params: raw, Direct: true})
	if err != nil {
		return nil, fmt.Errorf("open %s stream to node %s: encode request: %w", kind, node, err)
	}
	msg, err := c.NC.RequestWithContext(ctx, protocol.SubjectStream, body)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, c.noCoordinator(protocol.SubjectStream)
		}
		return nil, fmt.Errorf("open %s stream to node %s through %s: %w", kind, node, c.serverName(), err)
	}
	if e := apiError(msg); e != nil {
		return nil, e
	}
	var rep protocol.DirectStreamReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil || rep.Ticket == "" || rep.Pin == "" || rep.Addr == "" {
		return nil, fmt.Errorf("open %s stream to node %s: malformed direct stream reply %q (%v)", kind, node, protocol.ClipUTF8(string(msg.Data), 256), err)
	}
	for attempt := 0; ; attempt++ {
		s, err := c.directSession(ctx, rep)
		if err != nil {
			return nil, err
		}
		ds, err := s.open(ctx, rep.Ticket)
		if errors.Is(err, errSessionGone) && attempt == 0 {
			c.dropSession(s)
			continue // a new session, once
		}
		if err != nil {
			return nil, err
		}
		return &Stream{p: ds, node: node, kind: kind, direct: true}, nil
	}
}

// directSession returns the session to rep's listener, dialing it if
// there is none.
func (c *Client) directSession(ctx context.Context, rep protocol.DirectStreamReply) (*directSession, error) {
	d := &c.direct
	key := rep.Addr + " " + rep.Pin
	d.mu.Lock()
	if s := d.sessions[key]; s != nil {
		d.mu.Unlock()
		return s, nil
	}
	d.mu.Unlock()
	s, err := c.dialDirect(ctx, rep)
	if err != nil {
		return nil, err
	}
	s.key = key
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		s.sess.Close()
		<-s.done
		return nil, &directUnreachableError{addr: rep.Addr, err: errors.New("client closed")}
	}
	if old := d.sessions[key]; old != nil {
		// Another stream dialed meanwhile: keep one session.
		d.mu.Unlock()
		s.sess.Close()
		<-s.done
		return old, nil
	}
	if d.sessions == nil {
		d.sessions, d.all = map[string]*directSession{}, map[*directSession]struct{}{}
	}
	d.sessions[key] = s
	d.all[s] = struct{}{}
	s.owner = d
	d.mu.Unlock()
	return s, nil
}

// dropSession stops handing s out to new streams; it closes once its
// streams ended.
func (c *Client) dropSession(s *directSession) {
	d := &c.direct
	d.mu.Lock()
	if d.sessions[s.key] == s {
		delete(d.sessions, s.key)
	}
	d.mu.Unlock()
	s.drain()
}

// dialDirect connects to rep's listener: TCP, TLS checked against the pin
// (the reply came over the authenticated NATS connection; the client has
// none of the coordinator's CAs), ALPN protocol.ALPNClient, then the yamux
// session and its control stream.
func (c *Client) dialDirect(ctx context.Context, rep protocol.DirectStreamReply) (*directSession, error) {
	host, port, err := net.SplitHostPort(rep.Addr)
	if err != nil {
		return nil, &directUnreachableError{addr: rep.Addr, err: err}
	}
	if host == "" {
		// A listener on every interface: the host we reach NATS by.
		if u, err := url.Parse(c.NC.ConnectedUrl()); err == nil {
			host = u.Hostname()
		}
		if host == "" {
			return nil, &directUnreachableError{addr: rep.Addr, err: errors.New("no host, and none known from the NATS connection")}
		}
	}
	addr := net.JoinHostPort(host, port)
	dctx, cancel := context.WithTimeout(ctx, c.directDialTimeout())
	defer cancel()
	pin := rep.Pin
	cfg := tunnel.TunedTLS(&tls.Config{
		ServerName: host,
		NextProtos: []string{protocol.ALPNClient},
		// The certificate is verified against the pin below, not a CA.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the listener presented no certificate")
			}
			if got := tunnel.CertPin(cs.PeerCertificates[0]); subtle.ConstantTimeCompare([]byte(got), []byte(pin)) != 1 {
				return &PinMismatchError{Addr: addr, Want: pin, Got: got}
			}
			return nil
		},
	})
	conn, err := tunnel.DialTLS(dctx, addr, cfg)
	if err != nil {
		if pm := (*PinMismatchError)(nil); errors.As(err, &pm) {
			// Not an outage: no fallback (fallBack), whatever the mode.
			return nil, pm
		}
		return nil, &directUnreachableError{addr: addr, err: err}
	}
	if p := conn.(*tls.Conn).ConnectionState().NegotiatedProtocol; p != protocol.ALPNClient {
		conn.Close()
		return nil, &directUnreachableError{addr: addr, err: fmt.Errorf("ALPN protocol %q negotiated, want %s: the listener does not serve direct streams", p, protocol.ALPNClient)}
	}
	sess, err := tunnel.Client(conn, tunnel.DefaultConfig())
	if err != nil {
		return nil, &directUnreachableError{addr: addr, err: err}
	}
	ctl, err := sess.OpenRaw(dctx)
	if err == nil {
		if d, ok := dctx.Deadline(); ok {
			ctl.SetWriteDeadline(d)
		}
		err = protocol.WriteFrame(ctl, protocol.FrameDirectControl, nil)
		ctl.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		sess.Close()
		return nil, &directUnreachableError{addr: addr, err: fmt.Errorf("open the control stream: %w", err)}
	}
	s := &directSession{addr: addr, sess: sess, ctl: ctl, streams: map[uint32]*directStream{}, done: make(chan struct{})}
	go s.read()
	return s, nil
}

// directSession is one yamux session with a coordinator's listener. Its
// reader goroutine (read) owns the control stream's reading and ends when
// the session does; Client.Close waits for it.
type directSession struct {
	key   string
	addr  string
	owner *directClient
	sess  *tunnel.Session
	done  chan struct{} // read returned

	wmu sync.Mutex // orders writes on ctl
	ctl *yamux.Stream

	mu       sync.Mutex
	streams  map[uint32]*directStream
	err      error // why the session ended
	draining bool  // dropped from the cache: close when streams is empty
}

// read reads the coordinator's control frames until the session ends,
// then fails the streams still open.
func (s *directSession) read() {
	defer close(s.done)
	fr := protocol.NewFrameReader(s.ctl)
	fr.Max = protocol.MaxDirectFrame
	var err error
	for err == nil {
		var f protocol.Frame
		f, err = fr.Next()
		if err != nil {
			break
		}
		switch f.Type {
		case protocol.FrameDirectEnd:
			var e protocol.DirectEnd
			if err = protocol.DecodeJSON(f.Payload, &e); err != nil {
				break
			}
			s.mu.Lock()
			ds := s.streams[e.Stream]
			s.mu.Unlock()
			if ds != nil {
				ds.onEnd(e.Error)
			}
		case protocol.FrameReject:
			var ei protocol.ErrorInfo
			protocol.DecodeJSON(f.Payload, &ei)
			err = fmt.Errorf("refused by the coordinator: %s", ei.Message)
		default:
			err = fmt.Errorf("%w: %s frame on the direct control stream", protocol.ErrUnexpected, f.Type)
		}
	}
	s.sess.Close()
	if serr := s.sess.Err(); serr != nil && (errors.Is(err, io.EOF) || err == nil) {
		err = serr
	}
	gone := &natspipe.Error{Msg: fmt.Sprintf("direct session with coordinator listener %s lost: %v", s.addr, err), Kind: natspipe.ErrPeerGone, Cause: err}
	s.mu.Lock()
	s.err = gone
	streams := make([]*directStream, 0, len(s.streams))
	for _, ds := range s.streams {
		streams = append(streams, ds)
	}
	s.mu.Unlock()
	for _, ds := range streams {
		ds.sessionGone(gone)
	}
	if d := s.owner; d != nil {
		d.mu.Lock()
		if d.sessions[s.key] == s {
			delete(d.sessions, s.key)
		}
		delete(d.all, s)
		d.mu.Unlock()
	}
}

// drain closes the session once its last stream is forgotten.
func (s *directSession) drain() {
	s.mu.Lock()
	s.draining = true
	idle := len(s.streams) == 0
	s.mu.Unlock()
	if idle {
		s.sess.Close()
	}
}

// forget removes ds from the session.
func (s *directSession) forget(ds *directStream) {
	s.mu.Lock()
	if s.streams[ds.id] == ds {
		delete(s.streams, ds.id)
	}
	idle := s.draining && len(s.streams) == 0
	s.mu.Unlock()
	if idle {
		s.sess.Close()
	}
}

// writeControl writes one control frame; a failure closes the session.
func (s *directSession) writeControl(t protocol.FrameType, v any) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.ctl.SetWriteDeadline(time.Now().Add(tunnel.DefaultConfig().WriteTimeout))
	if err := protocol.WriteJSONFrame(s.ctl, t, v); err != nil {
		s.sess.Close()
		return fmt.Errorf("direct control stream to %s: %w", s.addr, err)
	}
	return nil
}

// open opens a data stream and redeems ticket on it: the stream once the
// coordinator opened the node's, its *protocol.APIError when refused, or
// errSessionGone when the session takes no new streams.
func (s *directSession) open(ctx context.Context, ticket string) (*directStream, error) {
	st, err := s.sess.OpenRaw(ctx)
	if err != nil {
		if errors.Is(err, yamux.ErrRemoteGoAway) || errors.Is(err, yamux.ErrSessionShutdown) || s.sess.IsClosed() {
			return nil, fmt.Errorf("%w: %w", errSessionGone, err)
		}
		return nil, fmt.Errorf("direct stream to %s: %w", s.addr, err)
	}
	ds := &directStream{s: s, st: st, id: st.StreamID(), endCh: make(chan struct{})}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		st.Close()
		return nil, fmt.Errorf("%w: %w", errSessionGone, s.err)
	}
	s.streams[ds.id] = ds
	s.mu.Unlock()
	if d, ok := ctx.Deadline(); ok {
		st.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	err = protocol.WriteJSONFrame(st, protocol.FrameDirectOpen, &protocol.DirectOpen{Ticket: ticket})
	var f protocol.Frame
	if err == nil {
		fr := protocol.NewFrameReader(st)
		fr.Max = protocol.MaxDirectFrame
		f, err = fr.Next()
	}
	if !stop() {
		err = ctx.Err()
	}
	st.SetDeadline(time.Time{})
	if err == nil && f.Type != protocol.FrameDirectAnswer {
		err = fmt.Errorf("%w: %s frame, want %s", protocol.ErrUnexpected, f.Type, protocol.FrameDirectAnswer)
	}
	var a protocol.DirectAnswer
	if err == nil {
		err = protocol.DecodeJSON(f.Payload, &a)
	}
	if err != nil {
		ds.Close()
		if s.sess.IsClosed() {
			return nil, fmt.Errorf("%w: %w", errSessionGone, err)
		}
		return nil, fmt.Errorf("direct stream to %s: open: %w", s.addr, err)
	}
	if a.Error != nil {
		// The coordinator closed its side after the answer.
		ds.mu.Lock()
		ds.closed, ds.ended = true, true
		ds.mu.Unlock()
		st.Close()
		s.forget(ds)
		return nil, a.Error
	}
	return ds, nil
}

// directStream is the client's end of a stream on the direct path: the
// data stream's bytes, and what the control stream says of it.
type directStream struct {
	s  *directSession
	st *yamux.Stream
	id uint32

	endCh chan struct{} // closed by the first DirectEnd or the session's end

	mu          sync.Mutex
	ended       bool  // endCh is closed
	err         error // the coordinator's failure, or the session's loss
	cancelled   bool
	closed      bool
	writeClosed bool
	finPending  bool // closed before the end came: FIN once it does
}

// onEnd takes the coordinator's DirectEnd: msg empty for a clean end.
func (ds *directStream) onEnd(msg string) {
	ds.mu.Lock()
	if msg != "" && ds.err == nil {
		// As the NATS pipe reports its peer's close, so that callers
		// find the coordinator's reason the same way on either path.
		ds.err = &natspipe.Error{Msg: "closed by the coordinator: " + msg, Kind: natspipe.ErrPeerClosed, Reason: msg}
	}
	if !ds.ended {
		ds.ended = true
		close(ds.endCh)
	}
	// After Close, the FIN waits for the coordinator's answer to it (a
	// failed end): a FIN seen first would read as a half-close.
	fin := ds.finPending && (msg != "" || ds.writeClosed)
	if fin {
		ds.finPending = false
	}
	ds.mu.Unlock()
	if msg != "" {
		// The coordinator reads no more: blocked writes fail now.
		ds.st.SetWriteDeadline(time.Now())
	}
	if fin {
		ds.st.Close()
		ds.s.forget(ds)
	}
}

// sessionGone fails the stream because its session ended.
func (ds *directStream) sessionGone(err error) {
	ds.mu.Lock()
	if !ds.ended {
		ds.ended = true
		if ds.err == nil {
			ds.err = err
		}
		close(ds.endCh)
	}
	ds.mu.Unlock()
}

func (ds *directStream) failure() error {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.err
}

// Read reads the agent's bytes; at the coordinator's FIN it returns io.EOF
// after a clean end, else the failure the coordinator reported.
func (ds *directStream) Read(p []byte) (int, error) {
	n, err := ds.st.Read(p)
	if err == io.EOF {
		// The coordinator sends its DirectEnd before its FIN.
		<-ds.endCh
		if e := ds.failure(); e != nil {
			return n, e
		}
		return n, io.EOF
	}
	if err != nil {
		if e := ds.failure(); e != nil {
			return n, e
		}
		ds.mu.Lock()
		closed := ds.closed
		ds.mu.Unlock()
		if closed {
			return n, errStreamClosed
		}
		return n, fmt.Errorf("direct stream to %s: %w", ds.s.addr, err)
	}
	return n, nil
}

// errStreamClosed is what a closed direct stream's Read and Write return.
var errStreamClosed = errors.New("stream closed")

func (ds *directStream) Write(p []byte) (int, error) {
	ds.mu.Lock()
	cancelled, closed, wc := ds.cancelled, ds.closed, ds.writeClosed
	ds.mu.Unlock()
	switch {
	case cancelled:
		return 0, errStreamCancelled
	case closed:
		return 0, errStreamClosed
	case wc:
		return 0, errors.New("write after CloseWrite")
	}
	n, err := ds.st.Write(p)
	if err != nil {
		if e := ds.failure(); e != nil {
			return n, e
		}
		ds.mu.Lock()
		cancelled, closed = ds.cancelled, ds.closed
		ds.mu.Unlock()
		switch {
		case cancelled:
			return n, errStreamCancelled
		case closed:
			return n, errStreamClosed
		}
		return n, fmt.Errorf("direct stream to %s: %w", ds.s.addr, err)
	}
	return n, nil
}

// CloseWrite half-closes: the agent reads EOF after the bytes written.
func (ds *directStream) CloseWrite() error {
	ds.mu.Lock()
	ds.writeClosed = true
	ds.mu.Unlock()
	return ds.st.Close() // yamux's close is a half-close
}

// ResetWrite is Stream.Cancel: the coordinator learns of it on the control
// stream, ahead of the bytes queued in the data stream.
func (ds *directStream) ResetWrite(error) error {
	ds.mu.Lock()
	if ds.cancelled || ds.closed {
		ds.mu.Unlock()
		return nil
	}
	ds.cancelled = true
	ds.mu.Unlock()
	ds.st.SetWriteDeadline(time.Now())
	return ds.s.writeControl(protocol.FrameDirectCancel, &protocol.DirectRef{Stream: ds.id})
}

// CloseWithError is Close (the reason stays local: the coordinator's
// relay records the client's close).
func (ds *directStream) CloseWithError(error) error { return ds.Close() }

// Close aborts the stream unless both directions ended, and releases it.
// The abort goes on the control stream; the data stream's FIN follows the
// coordinator's end, so that the coordinator never reads it as a
// half-close first.
func (ds *directStream) Close() error {
	ds.mu.Lock()
	if ds.closed {
		ds.mu.Unlock()
		return nil
	}
	ds.closed = true
	halfClosed := ds.writeClosed
	// Both directions over, or the coordinator's side failed (its relay
	// is over or aborting): the FIN can go now. Else the coordinator is
	// told first, and the FIN follows its answer (onEnd).
	clean := ds.ended && (ds.writeClosed || ds.cancelled) && ds.err == nil
	finNow := clean || ds.err != nil
	ds.finPending = !finNow
	ds.mu.Unlock()
	ds.st.SetReadDeadline(time.Now())
	ds.st.SetWriteDeadline(time.Now())
	if !clean {
		// A failure means the session is gone, and the stream with it.
		ds.s.writeControl(protocol.FrameDirectClose, &protocol.DirectRef{Stream: ds.id, HalfClosed: halfClosed})
	}
	if finNow {
		ds.st.Close()
		ds.s.forget(ds)
	}
	return nil
}

// Err returns why the stream failed; nil while healthy or after a clean
// end.
func (ds *directStream) Err() error { return ds.failure() }
