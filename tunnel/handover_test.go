package tunnel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRedialerHandoverIsQuiet: a session that serve hands over on purpose
// (ErrHandover, wrapped) is dialed again like a session that ended, but
// logged at debug level only; OnRetry sees it. A session that just ended
// is still logged at info level, a failed one as a warning.
func TestRedialerHandoverIsQuiet(t *testing.T) {
	var (
		mu   sync.Mutex
		buf  bytes.Buffer
		seen []error
	)
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelInfo}))
	stop := errors.New("stop")
	calls := 0
	r := &Redialer{
		Addrs:   []string{"a"},
		Dial:    func(context.Context, string) (net.Conn, error) { c, _ := net.Pipe(); return c, nil },
		Backoff: Backoff{Base: time.Millisecond, Max: time.Millisecond},
		Logger:  log,
		OnRetry: func(_ int, err error) { seen = append(seen, err) },
	}
	err := r.Run(context.Background(), func(_ context.Context, conn net.Conn, _ string) error {
		conn.Close()
		calls++
		switch calls {
		case 1:
			return fmt.Errorf("agent n1: enrolled: %w", ErrHandover)
		case 2:
			mu.Lock()
			defer mu.Unlock()
			if buf.Len() != 0 {
				t.Errorf("a hand-over logged at info level or above:\n%s", buf.String())
			}
			return nil
		case 3:
			return errors.New("tunnel lost")
		}
		return Permanent(stop)
	})
	if err != stop || calls != 4 {
		t.Fatalf("Run: %v after %d serves, want %v after 4", err, calls, stop)
	}
	if len(seen) != 3 || !errors.Is(seen[0], ErrHandover) || seen[1] != nil {
		t.Errorf("OnRetry saw %v, want the hand-over, nil, the failure", seen)
	}
	out := buf.String()
	if !strings.Contains(out, `level=INFO msg="tunnel session ended; redialing"`) || !strings.Contains(out, `level=WARN msg="tunnel disconnected; redialing"`) {
		t.Errorf("a real redial is no longer logged:\n%s", out)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestRedialerRefusedStreakLogsSparsely: a streak of refused dials (no
// coordinator listening) warns at its 1st, 2nd, 4th, 8th and 16th dial,
// not at each of the 20 (the rest are debug); a dial failing otherwise
// still warns every time.
func TestRedialerRefusedStreakLogsSparsely(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"refused", fmt.Errorf("dial tcp: %w", syscall.ECONNREFUSED), 5},
		{"other failure", errors.New("no route to host"), 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return buf.Write(p)
			}), &slog.HandlerOptions{Level: slog.LevelInfo}))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dials := 0
			r := &Redialer{
				Addrs: []string{"a:1"},
				Dial: func(context.Context, string) (net.Conn, error) {
					if dials++; dials > 20 {
						cancel()
						return nil, context.Canceled
					}
					return nil, c.err
				},
				Backoff: Backoff{Base: time.Microsecond, Max: time.Microsecond},
				Logger:  log,
			}
			if err := r.Run(ctx, func(context.Context, net.Conn, string) error { return nil }); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run = %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if n := strings.Count(buf.String(), "level=WARN"); n != c.want {
				t.Errorf("%d warnings for 20 failed dials, want %d:\n%s", n, c.want, buf.String())
			}
		})
	}
}
