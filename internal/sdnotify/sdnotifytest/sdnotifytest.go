// Package sdnotifytest is a service manager's end of the sd_notify
// protocol for tests: a unixgram socket that records every datagram sent
// to it, as systemd's $NOTIFY_SOCKET does.
//
// Listen starts one goroutine, the reader, which the test's cleanup stops
// and waits for. Only tests import this package.
package sdnotifytest

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Message is one datagram: its KEY=VALUE lines and when it arrived.
type Message struct {
	At    time.Time
	Lines []string
}

// Has reports whether m has the line kv ("READY=1").
func (m Message) Has(kv string) bool { return slices.Contains(m.Lines, kv) }

// Value returns the value of key in m ("STATUS" → "serving 1 agents") and
// whether m has it.
func (m Message) Value(key string) (string, bool) {
	for _, l := range m.Lines {
		if k, v, ok := strings.Cut(l, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// Socket records the messages sent to Path.
type Socket struct {
	// Path is the socket's file name: what $NOTIFY_SOCKET would hold.
	Path string

	conn *net.UnixConn
	done chan struct{}
	mu   sync.Mutex
	msgs []Message
	wake chan struct{} // closed and replaced on each message
}

// Listen binds a unixgram socket in a fresh directory under os.TempDir
// (a test's TempDir may exceed the 108 bytes a socket path may have) and
// records what arrives until the test ends.
func Listen(tb testing.TB) *Socket {
	tb.Helper()
	dir, err := os.MkdirTemp("", "sdn")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		tb.Fatal(err)
	}
	s := &Socket{Path: path, conn: conn, done: make(chan struct{}), wake: make(chan struct{})}
	go s.read()
	tb.Cleanup(func() {
		conn.Close()
		<-s.done
	})
	return s
}

func (s *Socket) read() {
	defer close(s.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := s.conn.Read(buf)
		if err != nil {
			return
		}
		m := Message{At: time.Now(), Lines: strings.Split(string(buf[:n]), "\n")}
		s.mu.Lock()
		s.msgs = append(s.msgs, m)
		close(s.wake)
		s.wake = make(chan struct{})
		s.mu.Unlock()
	}
}

// Messages returns every message received so far, in order.
func (s *Socket) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// Wait waits up to timeout for a message, received at any time, for which
// match is true, and returns it; it fails the test when none came, naming
// what and listing what did come.
func (s *Socket) Wait(tb testing.TB, timeout time.Duration, what string, match func(Message) bool) Message {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	seen := 0
	for {
		s.mu.Lock()
		msgs, wake := s.msgs[seen:], s.wake
		s.mu.Unlock()
		for _, m := range msgs {
			seen++
			if match(m) {
				return m
			}
		}
		select {
		case <-wake:
		case <-deadline.C:
			tb.Fatalf("sd_notify: no %s within %v; got %q", what, timeout, s.Messages())
			return Message{}
		}
	}
}
