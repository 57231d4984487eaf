package opensandboxtest

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/gorilla/websocket"

	"github.com/tetherfleet/tether/protocol/opensandbox"
)

// ptySignals maps the signal names execd recognises to signals.
var ptySignals = map[string]syscall.Signal{
	"SIGINT": syscall.SIGINT, "SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL,
	"SIGQUIT": syscall.SIGQUIT, "SIGHUP": syscall.SIGHUP,
}

// ptySession is one PTY session: its command, its output ring and, while
// running, its process; at most one socket (holder) is attached.
type ptySession struct {
	e       *Execd
	id      string
	cwd     string
	command string

	mu     sync.Mutex
	ring   ring
	proc   *ptyProc    // nil when not running
	holder *attachment // the attached socket, nil if none
	gone   bool        // deleted or execd closed
}

// ptyProc is a running process of a session.
type ptyProc struct {
	cmd  *exec.Cmd
	mode string   // opensandbox.ModePTY or ModePipe
	ptmx *os.File // PTY mode: the terminal's master
	in   *os.File // pipe mode: the write end of stdin
	// outs are the read ends the pumps read (the master in PTY mode).
	outs []*os.File
	// exited is set once Wait returned.
	exited atomic.Bool
}

func (s *ptySession) status() opensandbox.PTYStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return opensandbox.PTYStatus{SessionID: s.id, Running: s.proc != nil, OutputOffset: s.ring.total}
}

// kill forgets the session: it SIGKILLs the process group (the waiter then
// tells the attached client exit -1 and closes it with 1000) or, with no
// process, drops the attached socket.
func (s *ptySession) kill() {
	s.mu.Lock()
	s.gone = true
	p, h := s.proc, s.holder
	if p == nil {
		s.holder = nil
	}
	s.mu.Unlock()
	if p != nil {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	} else if h != nil {
		h.shutdown()
	}
}

// startLocked starts the session's command in mode; s.mu is held.
func (s *ptySession) startLocked(mode string) error {
	args := []string{"--norc", "--noprofile"}
	if s.command != "" {
		args = append(args, "-c", s.command)
	}
	cmd := exec.Command("bash", args...)
	cmd.Dir = s.cwd
	cmd.Env = os.Environ()
	p := &ptyProc{cmd: cmd, mode: mode}
	if mode == opensandbox.ModePTY {
		ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: opensandbox.InitialCols, Rows: opensandbox.InitialRows})
		if err != nil {
			return err
		}
		p.ptmx = ptmx
		p.outs = []*os.File{ptmx}
	} else {
		var files []*os.File
		closeAll := func() {
			for _, f := range files {
				f.Close()
			}
		}
		for range 3 {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll()
				return err
			}
			files = append(files, r, w)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[3], files[5]
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			closeAll()
			return err
		}
		files[0].Close()
		files[3].Close()
		files[5].Close()
		p.in = files[1]
		p.outs = []*os.File{files[2], files[4]}
	}
	if !s.e.goTracked(func() { s.supervise(p) }) {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		p.close()
		cmd.Wait()
		return errors.New("execd is shutting down")
	}
	s.proc = p
	return nil
}

// supervise runs p's output pumps and then its waiter; it returns when
// all of them did.
func (s *ptySession) supervise(p *ptyProc) {
	channels := []byte{opensandbox.ChannelStdout, opensandbox.ChannelStderr}
	var pumps sync.WaitGroup
	for i, f := range p.outs {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			s.pump(f, channels[i])
		}()
	}
	pumpsDone := make(chan struct{})
	go func() {
		pumps.Wait()
		close(pumpsDone)
	}()
	s.wait(p, pumpsDone)
}

// close closes the process's terminal or pipe ends.
func (p *ptyProc) close() {
	for _, f := range p.outs {
		f.Close() // unblocks a pump stuck behind a lingering child
	}
	if p.in != nil {
		p.in.Close()
	}
}

// pump reads one output of the process and records and forwards it.
func (s *ptySession) pump(f *os.File, ch byte) {
	buf := make([]byte, opensandbox.MaxLiveChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			s.output(ch, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// output appends b to the ring and sends it to the holder, atomically with
// respect to an attach's snapshot.
func (s *ptySession) output(ch byte, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ring.write(b)
	if s.holder != nil {
		frame := opensandbox.EncodeBinaryFrame(opensandbox.BinaryFrame{Channel: ch, Data: b})
		if !s.holder.enqueue(outMsg{typ: websocket.BinaryMessage, data: frame}) {
			s.holder.shutdown()
			s.holder = nil
		}
	}
}

// wait waits for p to exit and for its output to drain (at most drainGrace
// after the exit), then sends the holder the exit frame and close 1000.
func (s *ptySession) wait(p *ptyProc, pumpsDone <-chan struct{}) {
	p.cmd.Wait()
	p.exited.Store(true)
	timer := time.NewTimer(drainGrace)
	select {
	case <-pumpsDone:
	case <-timer.C:
	}
	timer.Stop()
	p.close()
	<-pumpsDone
	code := p.cmd.ProcessState.ExitCode() // -1 when a signal killed it
	s.mu.Lock()
	if s.proc == p {
		s.proc = nil
	}
	h := s.holder
	s.holder = nil
	s.mu.Unlock()
	if h != nil {
		if !h.enqueue(outMsg{typ: websocket.TextMessage, data: opensandbox.EncodeControlFrame(opensandbox.ExitFrame(code))}) ||
			!h.enqueue(outMsg{closeCode: opensandbox.CloseNormal, closeText: opensandbox.ReasonProcessExited}) {
			h.shutdown()
		}
	}
}

// stdin writes b to the process's input; a session without a process
// ignores it.
func (s *ptySession) stdin(b []byte) error {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil || len(b) == 0 {
		return nil
	}
	w := p.in
	if w == nil {
		w = p.ptmx
	}
	if _, err := w.Write(b); err != nil {
		if p.exited.Load() {
			return nil // the process exited meanwhile: like a session without one
		}
		return err
	}
	return nil
}

func (s *ptySession) resize(cols, rows int) {
	if cols <= 0 || rows <= 0 || cols > 0xffff || rows > 0xffff {
		return
	}
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil && p.ptmx != nil {
		pty.Setsize(p.ptmx, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
	}
}

func (s *ptySession) signal(name string) {
	sig, ok := ptySignals[name]
	if !ok {
		s.e.log.Debug("ignoring unsupported signal", "session", s.id, "signal", name)
		return
	}
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// attach serves GET /pty/<id>/ws (wire-facts §3.2).
func (e *Execd) attach(w http.ResponseWriter, r *http.Request, id string) {
	s := e.session(id)
	if s == nil {
		writeSessionNotFound(w, id)
		return
	}
	opts := opensandbox.ParseAttachQuery(r.URL.Query())
	s.mu.Lock()
	held := s.holder != nil
	s.mu.Unlock()
	if held && !opts.Takeover {
		writeAlreadyConnected(w, id)
		return
	}
	conn, err := e.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered
	}
	a := &attachment{e: e, s: s, conn: conn, out: make(chan outMsg, attachQueue), stop: make(chan struct{})}

	s.mu.Lock()
	var evicted *attachment
	switch {
	case s.gone:
		s.mu.Unlock()
		a.fail(opensandbox.CodeSessionGone, "pty session "+id+" is gone")
		return
	case s.holder != nil && !opts.Takeover:
		// Another client attached between the check and the upgrade.
		s.mu.Unlock()
		a.fail(opensandbox.CodeAlreadyConnected, "another client is already connected to pty session "+id)
		return
	case s.holder != nil:
		evicted, s.holder = s.holder, nil
	}
	if s.proc == nil {
		mode := opensandbox.ModePTY
		if opts.Pipe {
			mode = opensandbox.ModePipe
		}
		if err := s.startLocked(mode); err != nil {
			s.mu.Unlock()
			evicted.closeWith(opensandbox.CloseTakenOver, opensandbox.ReasonTakenOver)
			a.fail(opensandbox.CodeStartFailed, "start pty session "+id+": "+err.Error())
			return
		}
	}
	// Snapshot and live attach under one lock: no byte lost or doubled.
	if off, data := s.ring.since(opts.Since); len(data) > 0 {
		a.enqueue(outMsg{typ: websocket.BinaryMessage, data: opensandbox.EncodeBinaryFrame(opensandbox.BinaryFrame{Channel: opensandbox.ChannelReplay, Offset: uint64(off), Data: data})})
	}
	a.enqueue(outMsg{typ: websocket.TextMessage, data: opensandbox.EncodeControlFrame(opensandbox.ConnectedFrame(id, s.proc.mode))})
	s.holder = a
	s.mu.Unlock()
	evicted.closeWith(opensandbox.CloseTakenOver, opensandbox.ReasonTakenOver)

	if !e.goTracked(a.writeLoop) || !e.goTracked(a.pingLoop) {
		a.drop()
		return
	}
	a.readLoop()
}

func writeAlreadyConnected(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusConflict, opensandbox.ErrorBody{Code: opensandbox.CodeAlreadyConnected, Message: "another client is already connected to pty session " + id})
}

// outMsg is one frame queued for a socket: a data message, or a close
// frame when closeCode is set.
type outMsg struct {
	typ       int
	data      []byte
	closeCode int
	closeText string
}

// attachment is one attached socket. Its writer goroutine owns writes of
// data frames; close frames and pings go through WriteControl, which
// gorilla allows concurrently.
type attachment struct {
	e    *Execd
	s    *ptySession
	conn *websocket.Conn
	out  chan outMsg
	stop chan struct{}
	once sync.Once
}

// enqueue queues m without blocking; false when the queue is full (the
// client is too slow) or the socket is shut down.
func (a *attachment) enqueue(m outMsg) bool {
	select {
	case <-a.stop:
		return false
	default:
	}
	select {
	case a.out <- m:
		return true
	default:
		return false
	}
}

// shutdown closes the socket and stops its goroutines; it does not touch
// the session.
func (a *attachment) shutdown() {
	a.once.Do(func() {
		close(a.stop)
		a.conn.Close()
	})
}

// drop detaches a from its session if it is the holder, then shuts it
// down (detach first: whoever sees the socket close may attach at once).
func (a *attachment) drop() {
	a.s.mu.Lock()
	if a.s.holder == a {
		a.s.holder = nil
	}
	a.s.mu.Unlock()
	a.shutdown()
}

// closeWith sends a close frame (best effort, 200 ms) and shuts a down. a
// may be nil.
func (a *attachment) closeWith(code int, text string) {
	if a == nil {
		return
	}
	a.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(200*time.Millisecond))
	a.shutdown()
}

// fail sends an error frame and closes a socket that never became the
// holder.
func (a *attachment) fail(code, text string) {
	a.conn.SetWriteDeadline(time.Now().Add(a.e.cfg.WriteTimeout))
	a.conn.WriteMessage(websocket.TextMessage, opensandbox.EncodeControlFrame(opensandbox.ErrorFrame(code, text)))
	a.closeWith(websocket.CloseInternalServerErr, "")
}

func (a *attachment) writeLoop() {
	defer a.drop()
	for {
		select {
		case <-a.stop:
			return
		case m := <-a.out:
			if m.closeCode != 0 {
				a.closeWith(m.closeCode, m.closeText)
				return
			}
			a.conn.SetWriteDeadline(time.Now().Add(a.e.cfg.WriteTimeout))
			if err := a.conn.WriteMessage(m.typ, m.data); err != nil {
				return
			}
		}
	}
}

func (a *attachment) pingLoop() {
	t := time.NewTicker(a.e.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
			if err := a.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(a.e.cfg.WriteTimeout)); err != nil {
				a.drop()
				return
			}
		}
	}
}

// readLoop handles the client's frames until the socket ends or stays
// silent for ReadTimeout; then it detaches (the process keeps running).
func (a *attachment) readLoop() {
	defer a.drop()
	extend := func() { a.conn.SetReadDeadline(time.Now().Add(a.e.cfg.ReadTimeout)) }
	extend()
	a.conn.SetPongHandler(func(string) error { extend(); return nil })
	a.conn.SetPingHandler(func(data string) error {
		extend()
		err := a.conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(a.e.cfg.WriteTimeout))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		return err
	})
	a.conn.SetReadLimit(8 << 20)
	for {
		typ, data, err := a.conn.ReadMessage()
		if err != nil {
			return
		}
		extend()
		switch typ {
		case websocket.BinaryMessage:
			f, err := opensandbox.DecodeBinaryFrame(data)
			if err != nil || f.Channel != opensandbox.ChannelStdin {
				continue // execd ignores empty frames and other channels
			}
			if err := a.s.stdin(f.Data); err != nil {
				a.stdinFailed(err)
				return
			}
		case websocket.TextMessage:
			f, err := opensandbox.DecodeControlFrame(data)
			if err != nil {
				continue // invalid JSON is ignored
			}
			switch f.Type {
			case opensandbox.TypePing:
				a.enqueue(outMsg{typ: websocket.TextMessage, data: opensandbox.EncodeControlFrame(opensandbox.ControlFrame{Type: opensandbox.TypePong})})
			case opensandbox.TypeResize:
				a.s.resize(f.Cols, f.Rows)
			case opensandbox.TypeSignal:
				a.s.signal(f.Signal)
			case opensandbox.TypeStdin:
				if err := a.s.stdin([]byte(f.Data)); err != nil {
					a.stdinFailed(err)
					return
				}
			default:
				a.enqueue(outMsg{typ: websocket.TextMessage, data: opensandbox.EncodeControlFrame(opensandbox.UnknownFrameError(f.Type))})
			}
		}
	}
}

func (a *attachment) stdinFailed(err error) {
	a.enqueue(outMsg{typ: websocket.TextMessage, data: opensandbox.EncodeControlFrame(opensandbox.ErrorFrame(opensandbox.CodeStdinWriteFailed, err.Error()))})
	if !a.enqueue(outMsg{closeCode: websocket.CloseInternalServerErr}) {
		a.drop()
	}
}

// ring keeps the last opensandbox.ReplayBufferSize bytes of output and the
// count of all bytes ever written.
type ring struct {
	buf   []byte
	total int64
}

func (r *ring) write(p []byte) {
	const size = opensandbox.ReplayBufferSize
	if r.buf == nil {
		r.buf = make([]byte, size)
	}
	if len(p) > size { // only the tail survives
		r.total += int64(len(p) - size)
		p = p[len(p)-size:]
	}
	for len(p) > 0 {
		n := copy(r.buf[r.total%size:], p)
		p = p[n:]
		r.total += int64(n)
	}
}

// since returns the retained bytes from offset off (clamped to the oldest
// retained byte) and the offset of the first: nothing when off ≥ total.
func (r *ring) since(off int64) (int64, []byte) {
	const size = opensandbox.ReplayBufferSize
	oldest := max(0, r.total-size)
	if off >= r.total {
		return r.total, nil
	}
	off = max(off, oldest)
	out := make([]byte, 0, r.total-off)
	for pos := off; pos < r.total; {
		i := pos % size
		end := min(int64(size), i+(r.total-pos))
		out = append(out, r.buf[i:end]...)
		pos += end - i
	}
	return off, out
}
