package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
)

// Config tunes a Session. The zero value is not valid; start from
// DefaultConfig.
//
// A session finds a dead peer (one that stopped answering with its
// connection left open: a frozen process, a host that lost power behind a
// NAT) by two means, either or both: its own pings (KeepAliveInterval,
// answered within WriteTimeout) and the silence of the peer (IdleTimeout).
// DeadPeerBound reports the resulting bound.
type Config struct {
	// MaxStreamWindow is each stream's receive window, in bytes. Larger
	// windows keep a single bulk stream from stalling on round trips; memory
	// is only used while data is buffered. Default 16 MiB (yamux's own default
	// of 256 KiB halves single-stream throughput over TLS).
	MaxStreamWindow uint32
	// KeepAliveInterval is how long the session waits after each answered
	// ping before it pings its peer again; a ping not sent and answered
	// within WriteTimeout closes the session, so a dead peer is found within
	// KeepAliveInterval+WriteTimeout. Zero disables pings (the coordinator
	// watches for silence instead, see IdleTimeout, saving a goroutine per
	// agent). Default 5 s.
	KeepAliveInterval time.Duration
	// WriteTimeout bounds a frame's wait to be written, and a ping's wait for
	// its answer. Default 10 s.
	WriteTimeout time.Duration
	// IdleTimeout, if positive, closes the session when nothing at all (no
	// frame of any stream, no ping, no answer to one) has been read from the
	// connection for that long; Err then reports ErrPeerSilent. It suits the
	// side that does not ping, when its peer sends something more often
	// (the agent's heartbeats and pings). With KeepAliveInterval set it must
	// be at least twice that interval, so that the answers to our own pings
	// keep a live session open. It costs a timer per session, no goroutine.
	// Default 0 (off): agents rely on their pings.
	IdleTimeout time.Duration
	// AcceptBacklog bounds streams opened by the peer but not yet accepted.
	// Default 256.
	AcceptBacklog int
	// HeaderTimeout bounds the wait for a stream header after a stream is
	// accepted. Default 10 s.
	HeaderTimeout time.Duration
	// Logger receives yamux's messages at debug level. Nil discards them.
	Logger *slog.Logger
	// Flow, if set, turns on the session's flow-control telemetry
	// (flow.go: window stalls of its streams and the bytes it is writing
	// into its connection, reported by Session.FlowStats) and adds the
	// session's events to these counters, shared by every session
	// configured with them. Nil (the default) tracks nothing: FlowStats
	// then reports only the RTT of the session's pings. The counters are
	// the caller's; the session never resets them.
	Flow *FlowCounters
}

// DefaultConfig returns the configuration agents use: a dead coordinator is
// found within 15 s (a ping 5 s after the last answer, 10 s to answer).
func DefaultConfig() Config {
	return Config{
		MaxStreamWindow:   16 << 20,
		KeepAliveInterval: 5 * time.Second,
		WriteTimeout:      10 * time.Second,
		AcceptBacklog:     256,
		HeaderTimeout:     10 * time.Second,
	}
}

// DeadPeerBound returns the longest a session with this configuration takes
// to close itself once its peer stopped answering with the connection left
// open: KeepAliveInterval+WriteTimeout with pings, IdleTimeout when set, the
// smaller of the two with both. Zero means the session never finds a dead
// peer by itself (its user must, e.g. by deadlines on its reads).
func (c *Config) DeadPeerBound() time.Duration {
	var d time.Duration
	if c.KeepAliveInterval > 0 {
		d = c.KeepAliveInterval + c.WriteTimeout
	}
	if c.IdleTimeout > 0 && (d == 0 || c.IdleTimeout < d) {
		d = c.IdleTimeout
	}
	return d
}

// Validate reports every invalid field.
func (c *Config) Validate() error {
	var errs []error
	if c.MaxStreamWindow < 256<<10 {
		errs = append(errs, fmt.Errorf("tunnel config: MaxStreamWindow %d is below yamux's minimum of 262144", c.MaxStreamWindow))
	}
	if c.KeepAliveInterval < 0 {
		errs = append(errs, fmt.Errorf("tunnel config: KeepAliveInterval %v is negative", c.KeepAliveInterval))
	}
	if c.WriteTimeout <= 0 {
		errs = append(errs, fmt.Errorf("tunnel config: WriteTimeout %v must be positive", c.WriteTimeout))
	}
	if c.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("tunnel config: IdleTimeout %v is negative", c.IdleTimeout))
	}
	if c.IdleTimeout > 0 && c.KeepAliveInterval > 0 && c.IdleTimeout < 2*c.KeepAliveInterval {
		errs = append(errs, fmt.Errorf("tunnel config: IdleTimeout %v is below twice KeepAliveInterval %v: a live session would be closed between pings",
			c.IdleTimeout, c.KeepAliveInterval))
	}
	if c.AcceptBacklog <= 0 {
		errs = append(errs, fmt.Errorf("tunnel config: AcceptBacklog %d must be positive", c.AcceptBacklog))
	}
	if c.HeaderTimeout <= 0 {
		errs = append(errs, fmt.Errorf("tunnel config: HeaderTimeout %v must be positive", c.HeaderTimeout))
	}
	return errors.Join(errs...)
}

func (c *Config) yamux() *yamux.Config {
	yc := yamux.DefaultConfig()
	yc.MaxStreamWindowSize = c.MaxStreamWindow
	yc.EnableKeepAlive = c.KeepAliveInterval > 0
	if yc.EnableKeepAlive {
		yc.KeepAliveInterval = c.KeepAliveInterval
	}
	yc.ConnectionWriteTimeout = c.WriteTimeout
	yc.AcceptBacklog = c.AcceptBacklog
	// Opening a stream only waits for a backlog slot; OpenStream's ctx
	// bounds that. yamux's own open timeout would kill the whole session.
	yc.StreamOpenTimeout = 0
	yc.LogOutput = nil
	yc.Logger = yamuxLogger{c.Logger}
	return yc
}

// yamuxConfigs holds the yamux configurations built by sharedYamux, at
// most maxSharedConfigs of them: a process starts sessions with a few
// distinct Configs (the coordinator one for its agents and one for its
// direct clients, an agent one), and a yamux.Config (96 bytes) per
// session is a measurable share of an idle agent's cost on a coordinator
// (BenchmarkIdleAgentMemory). yamux only reads its Config. The first
// maxSharedConfigs distinct ones are kept for the process's life (with the
// Logger and FlowCounters they name); a process that makes more (tests
// starting many coordinators) gets a fresh one for each session of the
// others, as before.
var yamuxConfigs struct {
	sync.Mutex
	keys []Config
	vals []*yamux.Config
}

const maxSharedConfigs = 8

// sharedYamux returns c's yamux configuration, the same one for every
// equal Config while fewer than maxSharedConfigs distinct ones were seen,
// and a fresh one beyond that.
func (c *Config) sharedYamux() *yamux.Config {
	yamuxConfigs.Lock()
	defer yamuxConfigs.Unlock()
	if i := slices.Index(yamuxConfigs.keys, *c); i >= 0 {
		return yamuxConfigs.vals[i]
	}
	yc := c.yamux()
	if len(yamuxConfigs.keys) < maxSharedConfigs {
		yamuxConfigs.keys = append(yamuxConfigs.keys, *c)
		yamuxConfigs.vals = append(yamuxConfigs.vals, yc)
	}
	return yc
}

// yamuxLogger bridges yamux's printf logger to slog at debug level.
type yamuxLogger struct{ l *slog.Logger }

func (y yamuxLogger) Print(v ...any) {
	if y.l != nil {
		y.l.Debug(fmt.Sprint(v...), "component", "yamux")
	}
}
func (y yamuxLogger) Printf(format string, v ...any) {
	if y.l != nil {
		y.l.Debug(fmt.Sprintf(format, v...), "component", "yamux")
	}
}
func (y yamuxLogger) Println(v ...any) { y.Print(v...) }

// Session is a multiplexed tunnel over one connection. It is safe for
// concurrent use.
type Session struct {
	y    *yamux.Session
	cfg  Config
	idle *idleWatch // nil unless Config.IdleTimeout is set
	wc   *watchConn // beneath yamux: Watch and OnClose (watch.go)
	// cc is the frame coalescer beneath yamux (coalesce.go), nil for a
	// stock session; OpenGated arms it to send a stream's SYN with its
	// header.
	cc *coalesceConn
	// opening counts the calls inside yamux's OpenStream (openStream).
	opening atomic.Int64
}

// Client starts the dialing side's session over conn (the agent). The
// Session owns conn: closing the Session closes it.
func Client(conn net.Conn, cfg Config) (*Session, error) { return newSession(conn, cfg, true, true) }

// Server starts the listening side's session over conn (the coordinator). The
// Session owns conn.
func Server(conn net.Conn, cfg Config) (*Session, error) { return newSession(conn, cfg, false, true) }

// newSession starts a session; coalesce is false only in benchmarks that
// measure what coalescing saves (a session with Config.Flow then still
// shows its frames to the flow telemetry, writing them as stock yamux).
func newSession(conn net.Conn, cfg Config, client, coalesce bool) (*Session, error) {
	if err := cfg.Validate(); err != nil {
		conn.Close()
		return nil, err
	}
	var cc net.Conn = conn
	// The session's clock origin, for the flow telemetry and the idle
	// watch (silent from now on).
	wc := &watchConn{Conn: cc, idle: cfg.IdleTimeout > 0}
	wc.flow.epoch = time.Now()
	var flow *flowState
	if cfg.Flow != nil {
		wc.flow.agg = cfg.Flow
		flow = &wc.flow
	}
	cc = wc
	var co *coalesceConn
	if coalesce || flow != nil {
		fw, _ := conn.(frameWriter)
		co = &coalesceConn{Conn: cc, cork: corkOf(conn), frames: fw, stock: !coalesce, flow: flow}
		cc = co
	}
	var (
		y   *yamux.Session
		err error
	)
	if client {
		y, err = yamux.Client(cc, cfg.sharedYamux())
	} else {
		y, err = yamux.Server(cc, cfg.sharedYamux())
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("tunnel: start session with %s: %w", conn.RemoteAddr(), err)
	}
	s := &Session{y: y, cfg: cfg, wc: wc, cc: co}
	if wc.idle {
		s.idle = watchIdle(y, wc, cfg.IdleTimeout)
	}
	return s, nil
}

// Open opens a stream of kind k and writes its header with params. It gives
// up when ctx ends. The caller owns the returned stream and must Close it;
// Close half-closes (the peer reads EOF), and the stream is released once
// both sides closed.
func (s *Session) Open(ctx context.Context, k protocol.Kind, params any) (*yamux.Stream, error) {
	return s.OpenGated(ctx, k, params, nil)
}

// OpenGated is Open with the header held back until gate returns: the
// stream is opened at once (waiting, if need be, for room in the peer's
// accept backlog while gate's work is under way), and its header, which
// is what makes the peer act on it, is written only once gate returned
// nil. On gate's error the stream is closed without a
// header (the peer's ReadHeader fails; it acts on nothing) and that error
// is returned, as is ctx's error when ctx ended while gate ran. gate runs
// in the caller's goroutine after the stream opened, outside ctx's bound
// (it bounds itself); nil means none.
//
// The stream's SYN waits for the next frame the session writes (at the
// latest the header, or the close that replaces it), so that the SYN and
// the header usually leave in one write: the peer accepts the stream when
// it can act on it, one write and one wake-up earlier on each side
// (issue 12).
func (s *Session) OpenGated(ctx context.Context, k protocol.Kind, params any, gate func() error) (*yamux.Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	type result struct {
		st  *yamux.Stream
		err error
	}
	// OpenStream blocks while the peer's accept backlog is full: then it
	// runs aside so ctx can win; while the backlog surely has room it
	// runs here (no goroutine, no hand-off). Every stream it returns is
	// followed by a frame of its own (header or close, here or in the
	// cleanup below), which releases a held SYN.
	open := func(hold bool) (*yamux.Stream, error) {
		if hold && s.cc != nil {
			s.cc.armSYNHold()
		}
		st, err := s.y.OpenStream()
		if err != nil && hold && s.cc != nil {
			s.cc.disarmSYNHold()
		}
		return st, err
	}
	var r result
	if s.roomToOpen() {
		r.st, r.err = open(true)
		s.opening.Add(-1)
	} else {
		ch := make(chan result, 1)
		go func() {
			defer s.opening.Add(-1)
			st, err := open(true)
			ch <- result{st, err}
		}()
		select {
		case r = <-ch:
		case <-ctx.Done():
			go func() {
				if r := <-ch; r.st != nil {
					r.st.Close()
				}
			}()
			return nil, fmt.Errorf("tunnel: open %s stream to %s: %w", k, s.RemoteAddr(), ctx.Err())
		}
	}
	if r.err != nil {
		return nil, fmt.Errorf("tunnel: open %s stream to %s: %w", k, s.RemoteAddr(), r.err)
	}
	if gate != nil {
		if err := gate(); err != nil {
			r.st.Close()
			return nil, err
		}
		if err := ctx.Err(); err != nil { // ended while gate ran: act on nothing
			r.st.Close()
			return nil, fmt.Errorf("tunnel: open %s stream to %s: %w", k, s.RemoteAddr(), err)
		}
	}
	if d, ok := ctx.Deadline(); ok {
		r.st.SetWriteDeadline(d)
	}
	if err := protocol.WriteHeader(r.st, k, params); err != nil {
		r.st.Close()
		return nil, fmt.Errorf("tunnel: open %s stream to %s: %w", k, s.RemoteAddr(), err)
	}
	r.st.SetWriteDeadline(time.Time{})
	return r.st, nil
}

// roomToOpen counts a call about to enter yamux's OpenStream (the caller
// takes it back with opening.Add(-1) once OpenStream returned) and
// reports whether OpenStream surely will not wait for its semaphore of
// opens the peer has not acknowledged yet (AcceptBacklog of them): each
// such open is an open stream or a call under way, so while those are
// fewer than the backlog there is room. OpenStream then waits only for the
// send loop to take its SYN (bounded by WriteTimeout; with the SYN held,
// no write at all).
func (s *Session) roomToOpen() bool {
	n := s.opening.Add(1)
	return int(n)+s.y.NumStreams() <= s.cfg.AcceptBacklog
}

// OpenRaw opens a stream without writing a header, for sessions whose
// streams begin otherwise (the direct client protocol,
// protocol/direct.go). It gives up when ctx ends; the caller owns the
// stream.
func (s *Session) OpenRaw(ctx context.Context) (*yamux.Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	type result struct {
		st  *yamux.Stream
		err error
	}
	ch := make(chan result, 1)
	go func() {
		st, err := s.y.OpenStream()
		ch <- result{st, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("tunnel: open stream to %s: %w", s.RemoteAddr(), r.err)
		}
		return r.st, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.st != nil {
				r.st.Close()
			}
		}()
		return nil, fmt.Errorf("tunnel: open stream to %s: %w", s.RemoteAddr(), ctx.Err())
	}
}

// Accept waits for the peer to open a stream and reads its header, waiting at
// most Config.HeaderTimeout for it: AcceptRaw followed by ReadHeader. It
// returns io.EOF once the session is closed, and only then. A stream whose
// header is missing or malformed is answered with an error frame and
// closed, and the error is returned together with a nil stream; callers
// log it and keep accepting.
//
// Accept blocks the caller while it waits for the header, so a peer that
// opens a stream and sends nothing holds up the next Accept for up to
// HeaderTimeout. Servers of many streams use AcceptRaw and call ReadHeader
// in each stream's own goroutine instead.
func (s *Session) Accept(ctx context.Context) (*yamux.Stream, protocol.Header, error) {
	st, err := s.AcceptRaw(ctx)
	if err != nil {
		return nil, protocol.Header{}, err
	}
	h, err := s.ReadHeader(st)
	if err != nil {
		return nil, h, err
	}
	return st, h, nil
}

// AcceptRaw waits for the peer to open a stream and returns it without
// reading its header; the caller must call ReadHeader (or close the stream).
// It returns io.EOF once the session is closed, and ctx's error when ctx
// ends first.
func (s *Session) AcceptRaw(ctx context.Context) (*yamux.Stream, error) {
	st, err := s.y.AcceptStreamWithContext(ctx)
	if err != nil {
		// yamux reports a dead session in several ways (shutdown,
		// keepalive timeout, connection error); callers only need to know
		// that no more streams will come.
		if errors.Is(err, yamux.ErrSessionShutdown) || s.y.IsClosed() {
			return nil, io.EOF
		}
		return nil, err
	}
	return st, nil
}

// ErrNoHeader is wrapped by the error of Accept and ReadHeader for a
// stream its opener closed before writing a header (an open given up on,
// see OpenGated). Such an error never wraps io.EOF: that is Accept's word
// for the session's end.
var ErrNoHeader = errors.New("tunnel: stream without a header")

// ReadHeader reads the header of a stream returned by AcceptRaw, waiting at
// most Config.HeaderTimeout for it. If the header is missing or malformed it
// answers with an error frame (code version_mismatch, unsupported_kind or
// bad_request), closes st and returns the error (wrapping the protocol
// sentinel, or ErrNoHeader for a stream closed before its header); the
// caller must not use st then. It is safe to call from any goroutine, one
// call per stream.
func (s *Session) ReadHeader(st *yamux.Stream) (protocol.Header, error) {
	st.SetReadDeadline(time.Now().Add(s.cfg.HeaderTimeout))
	h, err := protocol.ReadHeader(st)
	st.SetReadDeadline(time.Time{})
	if errors.Is(err, io.EOF) {
		// The opener closed the stream before its header (an open it gave
		// up on: OpenGated's refused gate). That ends this stream only;
		// io.EOF from Accept means the session ended, and a caller that
		// stopped accepting on this one would leave every later stream
		// unacknowledged, each holding one of the opener's backlog slots.
		err = fmt.Errorf("%w: stream closed before its header: %w", ErrNoHeader, io.ErrUnexpectedEOF)
	}
	if err != nil {
		code := protocol.CodeBadRequest
		if errors.Is(err, protocol.ErrVersion) {
			code = protocol.CodeVersion
		} else if errors.Is(err, protocol.ErrUnknownKind) {
			code = protocol.CodeUnsupported
		}
		st.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: code, Message: err.Error()})
		st.Close()
		return h, fmt.Errorf("tunnel: stream %d from %s: %w", st.StreamID(), s.RemoteAddr(), err)
	}
	return h, nil
}

// Ping measures the round trip to the peer. It fails after
// Config.WriteTimeout without an answer. An answered ping's round trip is
// also kept for FlowStats.
func (s *Session) Ping() (time.Duration, error) {
	d, err := s.y.Ping()
	if err == nil {
		s.wc.flow.rttNanos.Store(int64(d))
		s.wc.flow.pings.Add(1)
	}
	return d, err
}

// GoAway tells the peer to open no more streams; streams in flight continue.
func (s *Session) GoAway() error { return s.y.GoAway() }

// Close closes the session, every stream on it and the connection.
func (s *Session) Close() error {
	if s.idle != nil {
		s.idle.stop()
	}
	return s.y.Close()
}

// Err reports why the session ended: nil while it is open; an error
// wrapping ErrPeerSilent when it was closed because the peer sent nothing
// for Config.IdleTimeout; net.ErrClosed for every other end (closed by
// either side, a ping not answered in time, a connection error: yamux does
// not tell them apart).
func (s *Session) Err() error {
	if !s.y.IsClosed() {
		return nil
	}
	if s.idle != nil {
		if err := s.idle.err(); err != nil {
			return err
		}
	}
	return net.ErrClosed
}

// Done is closed when the session has ended, for whatever reason.
func (s *Session) Done() <-chan struct{} { return s.y.CloseChan() }

// IsClosed reports whether the session has ended.
func (s *Session) IsClosed() bool { return s.y.IsClosed() }

// NumStreams reports the number of open streams.
func (s *Session) NumStreams() int { return s.y.NumStreams() }

// RemoteAddr is the peer's address.
func (s *Session) RemoteAddr() net.Addr { return s.y.RemoteAddr() }

// LocalAddr is this end's address.
func (s *Session) LocalAddr() net.Addr { return s.y.LocalAddr() }
