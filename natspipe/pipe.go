package natspipe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/protocol"
)

// Config tunes one end of a pipe. The zero value of each field selects its
// default.
type Config struct {
	// Window is how many bytes this end lets its peer send ahead of the
	// local reader: the bound on the bytes it buffers. At least
	// protocol.PipeInitialCredit. Default protocol.DefaultPipeWindow (8 MiB).
	Window int
	// MaxMessage is the largest data body this end publishes, in bytes. At
	// most protocol.MaxPipeMessage and the connection's max payload minus
	// 4 KiB for headers. Default protocol.DefaultPipeMessage (128 KiB).
	MaxMessage int
	// KeepAlive is how long this end may publish nothing before it sends a
	// ping; it declares the peer gone after protocol.PipeSilenceFactor
	// intervals without receiving anything. Both ends must agree. Default
	// protocol.DefaultPipeKeepAlive (5 s).
	KeepAlive time.Duration
	// Logger receives debug logs about failures. Nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	return Config{
		Window:     protocol.DefaultPipeWindow,
		MaxMessage: protocol.DefaultPipeMessage,
		KeepAlive:  protocol.DefaultPipeKeepAlive,
	}
}

// Validate reports every problem with c, joined. Zero fields are valid
// (they select defaults).
func (c *Config) Validate() error {
	var errs []error
	if c.Window != 0 && c.Window < protocol.PipeInitialCredit {
		errs = append(errs, fmt.Errorf("natspipe config: Window %d is below the minimum of %d", c.Window, protocol.PipeInitialCredit))
	}
	if c.MaxMessage < 0 || c.MaxMessage > protocol.MaxPipeMessage {
		errs = append(errs, fmt.Errorf("natspipe config: MaxMessage %d is outside 1..%d", c.MaxMessage, protocol.MaxPipeMessage))
	}
	if c.KeepAlive < 0 || (c.KeepAlive > 0 && c.KeepAlive < time.Millisecond) {
		errs = append(errs, fmt.Errorf("natspipe config: KeepAlive %v is negative or below 1ms", c.KeepAlive))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.MaxMessage == 0 {
		c.MaxMessage = d.MaxMessage
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = d.KeepAlive
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// headerRoom is what MaxMessage leaves of the connection's max payload for
// headers.
const headerRoom = 4 << 10

// Sentinel errors. Pipe errors wrap one of them; compare with errors.Is.
var (
	// ErrClosed: the pipe was closed locally.
	ErrClosed = errors.New("natspipe: pipe closed")
	// ErrPeerClosed: the peer aborted (its reason, if any, is in the text).
	ErrPeerClosed = errors.New("natspipe: closed by peer")
	// ErrPeerGone: nothing arrived from the peer for PipeSilenceFactor
	// keepalive intervals.
	ErrPeerGone = errors.New("natspipe: peer gone")
	// ErrLost: a message was lost (sequence gap).
	ErrLost = errors.New("natspipe: message lost")
	// ErrProtocol: the peer broke the pipe protocol.
	ErrProtocol = errors.New("natspipe: protocol violation")
	// ErrWriteClosed: Write after CloseWrite.
	ErrWriteClosed = errors.New("natspipe: write after CloseWrite")
	// ErrPeerReset: the peer reset its direction (ResetWrite); its reason,
	// if any, is in the text. Reads fail with it; writes go on.
	ErrPeerReset = errors.New("natspipe: peer reset its direction")
	// ErrWriteReset: Write or CloseWrite after ResetWrite.
	ErrWriteReset = errors.New("natspipe: write after ResetWrite")
)

// Error is a pipe failure: its text names the peer subject and the cause,
// and errors.Is matches its sentinel and its cause.
type Error struct {
	Msg   string
	Kind  error // one of the sentinels
	Cause error // may be nil
	// Reason is the text the peer gave with its close or reset
	// (ErrPeerClosed, ErrPeerReset; also in Msg), empty if it gave none.
	Reason string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the sentinel and the cause.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}

// RejectedError is returned by Dial when the answering end replied with
// something other than an open message, typically a NATS micro error reply.
// Msg is that reply; callers decode it (client turns it into a
// *protocol.APIError).
type RejectedError struct {
	Subject string
	Msg     *nats.Msg
}

func (e *RejectedError) Error() string {
	if s := e.Msg.Header.Get("Nats-Service-Error"); s != "" {
		return fmt.Sprintf("natspipe: %s refused the pipe: %s", e.Subject, s)
	}
	return fmt.Sprintf("natspipe: %s answered without opening a pipe", e.Subject)
}

// Pipe is one end of a pipe. Read, Write and the Close methods are safe for
// concurrent use; Reads (like Writes) should come from one goroutine at a
// time for the byte order to mean anything.
type Pipe struct {
	nc    *nats.Conn
	local string
	cfg   Config
	log   *slog.Logger
	sub   *nats.Subscription
	epoch time.Time // monotonic base of lastRecv and lastSend

	lastRecv atomic.Int64 // ns since epoch
	lastSend atomic.Int64

	// admit, if set (AcceptOn), sees every message of the inbox first;
	// dropped counts those it refused.
	admit   func(*nats.Msg) bool
	dropped atomic.Uint64

	// wmu serialises data and eof publishes; it owns dataHdr and seqVal.
	wmu     sync.Mutex
	dataHdr nats.Header
	seqVal  []string

	mu   sync.Mutex
	cond sync.Cond // on mu: data, credit or state changed

	peer    string         // "" while Dial waits for open
	openCh  chan *nats.Msg // Dial: the first reply
	dialing bool           // Dial waits for the first reply
	timer   *time.Timer    // keepalive, nil until established
	closed  bool           // Close was called
	err     error          // failure: reads and writes return it
	werr    error          // write side only: peer closed after its eof
	queue   [][]byte       // received bodies not yet read; queue[0][off:] is next
	off     int            // read offset in queue[0]
	nextSeq uint64         // expected seq of the next data message
	recvd   uint64         // bytes received
	used    uint64         // bytes consumed by the reader
	granted uint64         // credit granted to the peer
	rEOF    bool           // the peer's eof arrived
	rReset  error          // the peer reset its direction: reads return this
	credit  uint64         // credit the peer granted us
	sent    uint64         // bytes published
	sendSeq uint64         // seq of the next data message
	wClosed bool           // CloseWrite sent eof
	wReset  bool           // ResetWrite sent reset

	// done is closed once the pipe failed or was closed (closeDoneLocked);
	// peerReset once the peer's reset arrived. Both are closed under mu.
	done, peerReset chan struct{}
	doneClosed      bool
}

// newPipe builds an unsubscribed pipe.
func newPipe(nc *nats.Conn, local, peer string, cfg Config) (*Pipe, error) {
	if nc == nil {
		return nil, errors.New("natspipe: nil NATS connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if max := int(nc.MaxPayload()) - headerRoom; max > 0 && cfg.MaxMessage > max {
		cfg.MaxMessage = max
	}
	p := &Pipe{
		nc:        nc,
		local:     local,
		peer:      peer,
		cfg:       cfg,
		log:       cfg.Logger.With("component", "natspipe", "inbox", local),
		epoch:     time.Now(),
		seqVal:    []string{"0"},
		granted:   protocol.PipeInitialCredit,
		credit:    protocol.PipeInitialCredit,
		done:      make(chan struct{}),
		peerReset: make(chan struct{}),
	}
	p.dataHdr = nats.Header{protocol.HeaderPipeOp: {"data"}, protocol.HeaderPipeSeq: p.seqVal}
	p.cond.L = &p.mu
	return p, nil
}

func (p *Pipe) subscribe() error {
	sub, err := p.nc.Subscribe(p.local, p.handle)
	if err != nil {
		return fmt.Errorf("natspipe: subscribe to %s: %w", p.local, err)
	}
	// Flow control bounds what is pending; nats.go's own limits (64 MiB)
	// only matter for a misbehaving peer, whose excess is then dropped and
	// reported as a sequence gap.
	p.sub = sub
	return nil
}

// New creates the end of a pipe that receives on localInbox and sends to
// peerSubject, and subscribes localInbox. Both ends must already be
// subscribed before either writes (each starts with only
// protocol.PipeInitialCredit of credit); Dial and Accept run a handshake
// that guarantees it.
func New(nc *nats.Conn, localInbox, peerSubject string, cfg Config) (*Pipe, error) {
	if err := protocol.ValidPipeInbox(peerSubject); err != nil {
		return nil, fmt.Errorf("natspipe: peer subject: %w", err)
	}
	p, err := newPipe(nc, localInbox, peerSubject, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.subscribe(); err != nil {
		return nil, err
	}
	p.establish(false)
	return p, nil
}

// Accept answers a pipe request whose reply subject is peerInbox: it
// subscribes a fresh inbox, sends the open message naming it and an ack
// granting its whole window, and returns the established pipe.
func Accept(nc *nats.Conn, peerInbox string, cfg Config) (*Pipe, error) {
	if nc == nil {
		return nil, errors.New("natspipe: nil NATS connection")
	}
	return AcceptOn(nc, nc.NewInbox(), peerInbox, nil, cfg)
}

// AcceptOn is Accept with the local end on local, a literal subject the
// caller chose (across NATS accounts the peer can publish only to exported
// subjects, not to this end's inboxes: natsauth.PipeSubject), which nobody
// else may subscribe to. When admit is not nil it sees every message
// published to local before the pipe does, on the subscription's
// goroutine (it must not block); a message it refuses is dropped as if it
// never came: it is no sign of the peer's life, and it cannot close, feed
// or ack the pipe (Dropped counts them). The coordinator admits only what
// the pipe's opener published, since anyone may publish to an exported
// subject.
func AcceptOn(nc *nats.Conn, local, peerInbox string, admit func(*nats.Msg) bool, cfg Config) (*Pipe, error) {
	if err := protocol.ValidPipeInbox(peerInbox); err != nil {
		return nil, fmt.Errorf("natspipe: accept: %w", err)
	}
	if err := protocol.ValidPipeInbox(local); err != nil {
		return nil, fmt.Errorf("natspipe: accept: local subject: %w", err)
	}
	p, err := newPipe(nc, local, peerInbox, cfg)
	if err != nil {
		return nil, err
	}
	p.admit = admit
	if err := p.subscribe(); err != nil {
		return nil, err
	}
	open := &nats.Msg{Subject: peerInbox, Header: nats.Header{
		protocol.HeaderPipeOp:    {"open"},
		protocol.HeaderPipeInbox: {p.local},
	}}
	if err := nc.PublishMsg(open); err != nil {
		p.sub.Unsubscribe()
		return nil, fmt.Errorf("natspipe: accept: send open to %s: %w", peerInbox, err)
	}
	p.establish(true)
	return p, nil
}

// Dial opens a pipe through a request: it subscribes a fresh inbox, then
// publishes data (with hdr, which may be nil) to subject with that inbox as
// reply subject, and waits until ctx ends for the answer. An open message
// establishes the pipe; a "no responders" status returns an error wrapping
// nats.ErrNoResponders; anything else (a micro error reply) returns a
// *RejectedError holding the reply.
func Dial(ctx context.Context, nc *nats.Conn, subject string, hdr nats.Header, data []byte, cfg Config) (*Pipe, error) {
	if nc == nil {
		return nil, errors.New("natspipe: nil NATS connection")
	}
	p, err := newPipe(nc, nc.NewInbox(), "", cfg)
	if err != nil {
		return nil, err
	}
	p.openCh = make(chan *nats.Msg, 1)
	p.dialing = true
	if err := p.subscribe(); err != nil {
		return nil, err
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: p.local, Header: hdr, Data: data}); err != nil {
		p.Close()
		return nil, fmt.Errorf("natspipe: publish request to %s: %w", subject, err)
	}
	select {
	case msg := <-p.openCh:
		p.mu.Lock()
		ok := p.peer != ""
		p.mu.Unlock()
		if !ok {
			p.Close()
			if msg.Header.Get("Status") == "503" && len(msg.Data) == 0 {
				return nil, fmt.Errorf("natspipe: request to %s: %w", subject, nats.ErrNoResponders)
			}
			return nil, &RejectedError{Subject: subject, Msg: msg}
		}
		p.establish(true)
		return p, nil
	case <-ctx.Done():
		p.Close()
		return nil, fmt.Errorf("natspipe: open pipe through %s: %w", subject, ctx.Err())
	}
}

// establish starts the keepalive and, after a handshake, grants the whole
// window at once.
func (p *Pipe) establish(grant bool) {
	now := p.now()
	p.lastRecv.Store(now)
	p.lastSend.Store(now)
	p.mu.Lock()
	var credit uint64
	if grant && p.granted < uint64(p.cfg.Window) {
		p.granted = uint64(p.cfg.Window)
		credit = p.granted
	}
	if !p.closed {
		p.timer = time.AfterFunc(p.cfg.KeepAlive/2, p.tick)
	}
	p.mu.Unlock()
	if credit > 0 {
		p.sendAck(credit)
	}
}

func (p *Pipe) now() int64 { return int64(time.Since(p.epoch)) }

// LocalInbox is the subject this end receives on.
func (p *Pipe) LocalInbox() string { return p.local }

// Dropped is the number of messages the admit function of AcceptOn
// refused.
func (p *Pipe) Dropped() uint64 { return p.dropped.Load() }

// Peer is the subject this end sends to ("" before a Dial completes).
func (p *Pipe) Peer() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peer
}

// handle processes one message of the inbox. It runs on nats.go's
// subscription goroutine and never blocks on the reader.
func (p *Pipe) handle(msg *nats.Msg) {
	if p.admit != nil && !p.admit(msg) {
		p.dropped.Add(1)
		return
	}
	p.lastRecv.Store(p.now())
	p.mu.Lock()
	if p.dialing {
		p.dialing = false
		if m, err := protocol.ParsePipeHeader(msg.Header, len(msg.Data)); err == nil && m.Op == protocol.PipeOpen {
			p.peer = m.Inbox
		}
		p.mu.Unlock()
		p.openCh <- msg // buffered; the only send
		return
	}
	if p.closed || p.err != nil || p.peer == "" {
		p.mu.Unlock()
		return
	}
	m, err := protocol.ParsePipeHeader(msg.Header, len(msg.Data))
	if err != nil {
		p.failLocked(p.errorf(ErrProtocol, err, "%v", err), true)
		return
	}
	switch m.Op {
	case protocol.PipeData:
		if p.rReset != nil {
			// Published by a Write that was under way when the peer
			// reset: dropped, like everything of that direction.
			break
		}
		switch {
		case p.rEOF:
			p.failLocked(p.errorf(ErrProtocol, nil, "data message %d after eof", m.Seq), true)
			return
		case m.Seq != p.nextSeq:
			p.failLocked(p.errorf(ErrLost, nil, "message %d lost (got %d)", p.nextSeq, m.Seq), true)
			return
		}
		p.nextSeq++
		p.recvd += uint64(len(msg.Data))
		if p.recvd > p.granted {
			p.failLocked(p.errorf(ErrProtocol, nil, "peer sent %d bytes, past the %d it was granted", p.recvd, p.granted), true)
			return
		}
		// nats.go gives every message its own payload buffer: keep it.
		p.queue = append(p.queue, msg.Data)
		if len(p.queue) == 1 {
			p.cond.Broadcast()
		}
	case protocol.PipeAck:
		if m.Credit > p.credit {
			wake := p.sent >= p.credit
			p.credit = m.Credit
			if wake {
				p.cond.Broadcast()
			}
		}
	case protocol.PipeEOF:
		if p.rReset != nil {
			break
		}
		if m.Seq != p.nextSeq {
			p.failLocked(p.errorf(ErrLost, nil, "message %d lost (got eof after %d)", p.nextSeq, m.Seq), true)
			return
		}
		p.rEOF = true
		p.cond.Broadcast()
	case protocol.PipeClose:
		e := p.errorf(ErrPeerClosed, nil, "closed by peer")
		if m.Error != "" {
			e = p.errorf(ErrPeerClosed, nil, "closed by peer: %s", m.Error)
			e.Reason = m.Error
		}
		if p.rEOF || p.rReset != nil {
			// Everything the peer sent arrived (or was abandoned by
			// the peer): let the reader finish.
			p.werr = e
			p.cond.Broadcast()
			p.mu.Unlock()
			return
		}
		p.failLocked(e, false)
		return
	case protocol.PipeReset:
		if p.rReset == nil {
			e := p.errorf(ErrPeerReset, nil, "peer reset its direction")
			if m.Error != "" {
				e = p.errorf(ErrPeerReset, nil, "peer reset its direction: %s", m.Error)
				e.Reason = m.Error
			}
			p.rReset = e
			p.queue, p.off = nil, 0
			close(p.peerReset)
			p.cond.Broadcast()
		}
	case protocol.PipePing:
	case protocol.PipeOpen:
		p.failLocked(p.errorf(ErrProtocol, nil, "unexpected open message"), true)
		return
	}
	p.mu.Unlock()
}

// errorf builds a pipe error naming the peer. p.mu must be held.
func (p *Pipe) errorf(kind, cause error, format string, args ...any) *Error {
	return &Error{Msg: fmt.Sprintf("pipe to %s: ", p.peer) + fmt.Sprintf(format, args...), Kind: kind, Cause: cause}
}

// failLocked records err as the pipe's failure, drops buffered data, wakes
// every waiter and unlocks p.mu; with tell it sends the peer a close
// carrying the reason.
func (p *Pipe) failLocked(err error, tell bool) {
	if p.err != nil || p.closed {
		p.mu.Unlock()
		return
	}
	p.err = err
	p.queue, p.off = nil, 0
	p.stopTimerLocked()
	p.closeDoneLocked()
	p.cond.Broadcast()
	peer := p.peer
	p.mu.Unlock()
	p.log.Debug("pipe failed", "peer", peer, "err", err)
	if tell && peer != "" {
		p.sendClose(peer, err.Error())
	}
}

// closeDoneLocked closes the Done channel, once. p.mu must be held.
func (p *Pipe) closeDoneLocked() {
	if !p.doneClosed {
		p.doneClosed = true
		close(p.done)
	}
}

func (p *Pipe) stopTimerLocked() {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

// tick runs every KeepAlive/2: it sends a ping when nothing was published
// for KeepAlive and fails the pipe after PipeSilenceFactor×KeepAlive of
// silence.
func (p *Pipe) tick() {
	now := p.now()
	silence := time.Duration(protocol.PipeSilenceFactor) * p.cfg.KeepAlive
	if time.Duration(now-p.lastRecv.Load()) >= silence {
		p.mu.Lock()
		p.failLocked(p.errorf(ErrPeerGone, nil, "peer silent for %v", silence), true)
		return
	}
	if time.Duration(now-p.lastSend.Load()) >= p.cfg.KeepAlive {
		p.mu.Lock()
		peer, ok := p.peer, !p.closed && p.err == nil
		p.mu.Unlock()
		if ok {
			p.publish(&nats.Msg{Subject: peer, Header: nats.Header{protocol.HeaderPipeOp: {"ping"}}})
		}
	}
	p.mu.Lock()
	if p.timer != nil {
		p.timer.Reset(p.cfg.KeepAlive / 2)
	}
	p.mu.Unlock()
}

// publish sends a control message; a failure fails the pipe.
func (p *Pipe) publish(m *nats.Msg) error {
	p.lastSend.Store(p.now())
	if err := p.nc.PublishMsg(m); err != nil {
		p.mu.Lock()
		e := p.errorf(ErrProtocol, err, "publish %s: %v", m.Header.Get(protocol.HeaderPipeOp), err)
		p.failLocked(e, false)
		return e
	}
	return nil
}

func (p *Pipe) sendAck(credit uint64) {
	p.mu.Lock()
	peer := p.peer
	p.mu.Unlock()
	p.publish(&nats.Msg{Subject: peer, Header: nats.Header{
		protocol.HeaderPipeOp:     {"ack"},
		protocol.HeaderPipeCredit: {strconv.FormatUint(credit, 10)},
	}})
}

func (p *Pipe) sendClose(peer, reason string) {
	h := nats.Header{protocol.HeaderPipeOp: {"close"}}
	if reason != "" {
		h[protocol.HeaderPipeError] = []string{protocol.TruncatePipeError(reason)}
	}
	p.lastSend.Store(p.now())
	// Best effort: the peer also notices silence.
	p.nc.PublishMsg(&nats.Msg{Subject: peer, Header: h})
}

// consumedLocked accounts n bytes taken by the reader and returns the credit
// to grant now, or 0. p.mu must be held.
func (p *Pipe) consumedLocked(n int) uint64 {
	p.used += uint64(n)
	w := uint64(p.cfg.Window)
	if p.granted-p.used <= w/2 && p.err == nil && !p.rEOF && p.rReset == nil {
		p.granted = p.used + w
		return p.granted
	}
	return 0
}

// waitReadLocked waits until data, EOF or an error is there and returns
// the error to report if no data is. p.mu must be held.
func (p *Pipe) waitReadLocked() error {
	for len(p.queue) == 0 && p.err == nil && !p.rEOF && p.rReset == nil && !p.closed {
		p.cond.Wait()
	}
	if len(p.queue) > 0 {
		return nil
	}
	switch {
	case p.closed:
		return ErrClosed
	case p.err != nil:
		return p.err
	case p.rReset != nil:
		return p.rReset
	}
	return io.EOF
}

// Read reads the next bytes of the stream. It returns io.EOF after the
// peer's CloseWrite (once everything before it was read), ErrClosed after
// Close, an error matching ErrPeerReset once the peer reset its direction
// (unread bytes are dropped), and the failure otherwise.
func (p *Pipe) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	p.mu.Lock()
	if err := p.waitReadLocked(); err != nil {
		p.mu.Unlock()
		return 0, err
	}
	n := 0
	for n < len(b) && len(p.queue) > 0 {
		c := copy(b[n:], p.queue[0][p.off:])
		n += c
		p.off += c
		if p.off == len(p.queue[0]) {
			p.popLocked()
		}
	}
	credit := p.consumedLocked(n)
	p.mu.Unlock()
	if credit > 0 {
		p.sendAck(credit)
	}
	return n, nil
}

func (p *Pipe) popLocked() {
	p.queue[0] = nil
	p.queue = p.queue[1:]
	p.off = 0
	if len(p.queue) == 0 {
		p.queue = p.queue[:0:0] // let the backing array go
	}
}

// WriteTo writes the stream to w until EOF (returning nil) or an error,
// handing each received body to w without copying it.
func (p *Pipe) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		p.mu.Lock()
		if err := p.waitReadLocked(); err != nil {
			p.mu.Unlock()
			if err == io.EOF {
				err = nil
			}
			return total, err
		}
		chunk := p.queue[0][p.off:]
		p.popLocked()
		credit := p.consumedLocked(len(chunk))
		p.mu.Unlock()
		if credit > 0 {
			p.sendAck(credit)
		}
		n, err := w.Write(chunk)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
}

// writeErrLocked returns why writing is impossible now, or nil.
func (p *Pipe) writeErrLocked() error {
	switch {
	case p.closed:
		return ErrClosed
	case p.err != nil:
		return p.err
	case p.wReset:
		return ErrWriteReset
	case p.wClosed:
		return ErrWriteClosed
	case p.werr != nil:
		return p.werr
	}
	return nil
}

// Write sends b, split into messages of at most MaxMessage bytes. It blocks
// while the peer has granted no credit, until Close, a failure or the
// peer-silence timeout.
func (p *Pipe) Write(b []byte) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	total := 0
	for len(b) > 0 {
		p.mu.Lock()
		for p.writeErrLocked() == nil && p.sent >= p.credit {
			p.cond.Wait()
		}
		if err := p.writeErrLocked(); err != nil {
			p.mu.Unlock()
			return total, err
		}
		n := min(uint64(len(b)), uint64(p.cfg.MaxMessage), p.credit-p.sent)
		seq := p.sendSeq
		p.sendSeq++
		p.sent += n
		peer := p.peer
		p.mu.Unlock()

		p.seqVal[0] = strconv.FormatUint(seq, 10)
		p.lastSend.Store(p.now())
		// PublishMsg copies b into the connection's buffer before it
		// returns.
		if err := p.nc.PublishMsg(&nats.Msg{Subject: peer, Header: p.dataHdr, Data: b[:n]}); err != nil {
			p.mu.Lock()
			e := p.errorf(ErrProtocol, err, "publish data: %v", err)
			p.failLocked(e, false)
			return total, e
		}
		total += int(n)
		b = b[n:]
	}
	return total, nil
}

// ReadFrom writes what it reads from r until r's EOF (returning nil) or an
// error, reading into a buffer of MaxMessage bytes so messages are full.
func (p *Pipe) ReadFrom(r io.Reader) (int64, error) {
	buf := make([]byte, p.cfg.MaxMessage)
	var total int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			m, werr := p.Write(buf[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// CloseWrite half-closes the pipe: it sends eof after every byte written
// (the peer's Read returns io.EOF once it read them) and makes later
// Writes fail with ErrWriteClosed. Reading goes on. It waits for a Write in
// progress to finish. Calling it again does nothing.
func (p *Pipe) CloseWrite() error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.mu.Lock()
	if p.wClosed {
		p.mu.Unlock()
		return nil
	}
	if err := p.writeErrLocked(); err != nil {
		p.mu.Unlock()
		return err
	}
	p.wClosed = true
	seq, peer := p.sendSeq, p.peer
	p.cond.Broadcast()
	p.mu.Unlock()
	return p.publish(&nats.Msg{Subject: peer, Header: nats.Header{
		protocol.HeaderPipeOp:  {"eof"},
		protocol.HeaderPipeSeq: {strconv.FormatUint(seq, 10)},
	}})
}

// ResetWrite abandons this end's direction of the pipe at once, out of
// band (the reset op of protocol/pipe.go): the peer drops every byte of it
// that it has not read yet, and its reads fail with an error matching
// ErrPeerReset that carries reason's text (if reason is not nil). A Write
// blocked on credit returns, and later Writes and CloseWrite fail with
// ErrWriteReset; unlike CloseWrite it does not wait for a Write in progress.
// The other direction goes on: Read returns the peer's bytes until its eof
// or close. Use it to say "stop, and forget what I sent" when the bytes
// already sent may never be read (a command that does not read its stdin):
// the peer learns of it at once. It returns the pipe's failure if it
// already failed or was closed, else the error of publishing the reset;
// calling it again does nothing and returns nil. A peer that predates the
// reset op fails the whole pipe instead, as if Close had been called.
func (p *Pipe) ResetWrite(reason error) error {
	p.mu.Lock()
	if err := p.writeErrLocked(); err != nil && err != ErrWriteClosed {
		p.mu.Unlock()
		if err == ErrWriteReset {
			return nil
		}
		return err
	}
	p.wReset = true
	peer := p.peer
	p.cond.Broadcast()
	p.mu.Unlock()
	h := nats.Header{protocol.HeaderPipeOp: {"reset"}}
	if reason != nil {
		h[protocol.HeaderPipeError] = []string{protocol.TruncatePipeError(reason.Error())}
	}
	return p.publish(&nats.Msg{Subject: peer, Header: h})
}

// Done returns a channel that is closed once the pipe failed (Err is then
// set: a protocol violation, a lost message, the peer's silence, its close
// before its eof) or was closed locally. A clean end (both eofs) does not
// close it; a Close after it does.
func (p *Pipe) Done() <-chan struct{} { return p.done }

// PeerReset returns a channel that is closed once the peer reset its
// direction (ResetWrite): what it sent and this end did not read yet is
// gone, and Read fails with ErrPeerReset.
func (p *Pipe) PeerReset() <-chan struct{} { return p.peerReset }

// Close aborts the pipe: CloseWithError(nil).
func (p *Pipe) Close() error { return p.CloseWithError(nil) }

// CloseWithError aborts the pipe: unless it already failed, it sends the
// peer a close carrying reason's text (if reason is not nil), so the peer's
// unread data is dropped and its Read and Write fail with ErrPeerClosed
// (a peer that already read our eof only loses its write side). Then it
// stops the keepalive and unsubscribes. Local Read and Write return
// ErrClosed afterwards. It does not wait for a blocked Write. Calling it
// again does nothing and returns nil.
func (p *Pipe) CloseWithError(reason error) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	tell := p.err == nil && p.peer != ""
	if reason != nil && p.err == nil {
		p.err = reason
	}
	p.queue, p.off = nil, 0
	p.stopTimerLocked()
	p.closeDoneLocked()
	p.cond.Broadcast()
	peer := p.peer
	p.mu.Unlock()
	if tell {
		text := ""
		if reason != nil {
			text = reason.Error()
		}
		p.sendClose(peer, text)
	}
	if err := p.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		return fmt.Errorf("natspipe: unsubscribe %s: %w", p.local, err)
	}
	return nil
}

// Err returns why the pipe failed: a protocol failure, a lost message, the
// peer's silence or abort (ErrPeerClosed, with its reason), or the reason
// given to CloseWithError. It is nil while the pipe is healthy and after a
// clean end (both eofs, or Close without a reason).
func (p *Pipe) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Buffered reports how many received bytes wait for the reader (at most
// Config.Window).
func (p *Pipe) Buffered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := -p.off
	for _, b := range p.queue {
		n += len(b)
	}
	return n
}

var _ io.ReadWriteCloser = (*Pipe)(nil)
var _ io.WriterTo = (*Pipe)(nil)
var _ io.ReaderFrom = (*Pipe)(nil)
