package openshelltest

import (
	"net"
	"sync"
)

// acceptor owns the gateway's listener and hands accepted connections to
// the current generation of listeners, so that Restart can stop one grpc
// server (which closes its listener) and serve a new one on the same
// socket without re-binding a port.
type acceptor struct {
	ln    net.Listener
	conns chan net.Conn
	done  chan struct{} // closed when ln failed or was closed
	once  sync.Once
}

func newAcceptor(ln net.Listener) *acceptor {
	return &acceptor{ln: ln, conns: make(chan net.Conn), done: make(chan struct{})}
}

// run accepts until ln fails; the caller runs it in a tracked goroutine.
func (a *acceptor) run() {
	defer a.once.Do(func() { close(a.done) })
	for {
		c, err := a.ln.Accept()
		if err != nil {
			return
		}
		select {
		case a.conns <- c:
		case <-a.done:
			c.Close()
			return
		}
	}
}

// close closes the real listener and makes every generation's Accept fail.
func (a *acceptor) close() {
	a.once.Do(func() { close(a.done) })
	a.ln.Close()
}

// generation returns a listener view whose Close ends only itself.
func (a *acceptor) generation() net.Listener {
	return &genListener{a: a, closed: make(chan struct{})}
}

type genListener struct {
	a      *acceptor
	closed chan struct{}
	once   sync.Once
}

func (l *genListener) Accept() (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-l.a.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-l.a.done:
		return nil, net.ErrClosed
	}
}

func (l *genListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *genListener) Addr() net.Addr { return l.a.ln.Addr() }
