package tunnel

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestRedialerPermanent: an error serve marks Permanent ends Run at once
// with that error, unwrapped; other errors are redialed.
func TestRedialerPermanent(t *testing.T) {
	want := errors.New("refused for good")
	calls := 0
	r := &Redialer{
		Addrs:   []string{"a", "b"},
		Dial:    func(context.Context, string) (net.Conn, error) { c, _ := net.Pipe(); return c, nil },
		Backoff: Backoff{Base: time.Millisecond, Max: time.Millisecond},
	}
	err := r.Run(context.Background(), func(_ context.Context, conn net.Conn, _ string) error {
		conn.Close()
		if calls++; calls < 3 {
			return errors.New("passing")
		}
		return Permanent(want)
	})
	if err != want || calls != 3 {
		t.Fatalf("Run: %v after %d serves, want %v after 3", err, calls, want)
	}
	if Permanent(nil) != nil {
		t.Error("Permanent(nil) is not nil")
	}
}
