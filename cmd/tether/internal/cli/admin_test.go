package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// checkServerLimits fails unless srv bounds every wait a client can make it
// do and the size of a request's headers.
func checkServerLimits(t *testing.T, name string, srv *http.Server) {
	t.Helper()
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Errorf("%s: ReadHeaderTimeout %v, ReadTimeout %v, WriteTimeout %v, IdleTimeout %v; want all set",
			name, srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
	if srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 64<<10 {
		t.Errorf("%s: MaxHeaderBytes %d, want set and at most 64 KiB (net/http's default is 1 MiB)", name, srv.MaxHeaderBytes)
	}
}

// The coordinator's admin server sheds idle keep-alive connections and
// bounds every read, write and header.
func TestCoordinatorAdminServerLimits(t *testing.T) {
	cs, err := startCoordinator(testCoordinatorOptions(t, t.TempDir()), "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer cs.close()
	checkServerLimits(t, "coordinator admin server", cs.admin)
	if _, ok := cs.adminLn.(*limitListener); !ok {
		t.Errorf("admin listener is %T, want a connection cap", cs.adminLn)
	}
}

// serveTest serves h with limits l on loopback until the test ends and
// returns its address.
func serveTest(t *testing.T, h http.Handler, l httpLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(h, l)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(limitConns(ln, l.MaxConns))
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// waitClosed reads from c until the server closes it, failing the test if
// that takes longer than defaultTestTimeout.
func waitClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	_, err := io.Copy(io.Discard, c)
	if isTimeout(err) {
		t.Fatalf("%s: connection still open after %v", what, defaultTestTimeout)
	}
}

// waitRefused sends a request on c and fails the test unless the server
// closes c without an answer.
func waitRefused(t *testing.T, c net.Conn, what string) {
	t.Helper()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	got, err := io.ReadAll(c)
	if isTimeout(err) || len(got) > 0 {
		t.Fatalf("%s: read %q, %v; want it closed unanswered", what, got, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// The limits hold: an idle keep-alive connection is closed, a client that
// sends its headers too slowly is cut, oversized headers get 431, and a
// connection past MaxConns is closed at once while the others are served.
func TestHTTPServerShedsIdleAndAbusiveClients(t *testing.T) {
	l := adminLimits
	l.ReadHeaderTimeout = 200 * time.Millisecond
	l.IdleTimeout = 200 * time.Millisecond
	l.MaxHeaderBytes = 1 << 10
	l.MaxConns = 4
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	addr := serveTest(t, ok, l)
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("idle keep-alive", func(t *testing.T) {
		c := dial()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 || resp.Close {
			t.Fatalf("response %v, %v; want a 200 kept alive", resp, err)
		}
		resp.Body.Close()
		waitClosed(t, c, "idle keep-alive connection")
	})
	t.Run("slow loris", func(t *testing.T) {
		c := dial()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-A: ") // and never the rest
		waitClosed(t, c, "connection with unfinished headers")
	})
	t.Run("huge headers", func(t *testing.T) {
		c := dial()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-A: %s\r\n\r\n", strings.Repeat("a", 16<<10))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("response %v, %v; want 431", resp, err)
		}
	})
	t.Run("connection cap", func(t *testing.T) {
		l := l
		l.ReadHeaderTimeout = time.Minute // the held connections stay
		addr := serveTest(t, ok, l)
		var held []net.Conn
		for range l.MaxConns {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			held = append(held, c)
		}
		// The server accepts in order: once the extra one is closed, the
		// others hold every place.
		extra, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer extra.Close()
		waitRefused(t, extra, "connection past MaxConns")
		// A held connection is still served, and closing one frees a
		// place for a newcomer.
		io.WriteString(held[0], "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(held[0]), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("held connection: %v, %v; want 200", resp, err)
		}
		resp.Body.Close()
		held[0].Close()
		checkFor(t, defaultTestTimeout, func() error {
			resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + addr + "/")
			if err != nil {
				return err
			}
			resp.Body.Close()
			return nil
		})
	})
}

// The agent's metrics server runs with the same limits: its connection cap
// holds.
func TestAgentMetricsServerLimits(t *testing.T) {
	checkServerLimits(t, "admin limits", newHTTPServer(nil, adminLimits))
	if adminLimits.MaxConns <= 0 {
		t.Errorf("adminLimits.MaxConns = %d, want a cap", adminLimits.MaxConns)
	}
	addr, stop, err := serveMetrics("127.0.0.1:0", prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range adminLimits.MaxConns {
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	waitRefused(t, extra, "metrics connection past MaxConns")
}

// A daemon's registry serves the heap figures the e2e copy test bounds: the
// live heap of the last collection and the heap in use.
func TestRegistryServesHeapFigures(t *testing.T) {
	runtime.GC() // the live heap is 0 until a collection ran
	mfs, err := newRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"go_gc_heap_live_bytes": false, "go_memstats_heap_inuse_bytes": false, "go_memstats_heap_sys_bytes": false}
	for _, mf := range mfs {
		if _, ok := want[mf.GetName()]; ok {
			want[mf.GetName()] = true
			if len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge().GetValue() <= 0 {
				t.Errorf("%s = %v, want one positive gauge", mf.GetName(), mf.GetMetric())
			}
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("registry lacks %s", name)
		}
	}
}
