package agent

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// fakeEnrollRefuser plays a coordinator that answers every Enroll on conn
// with a reject of code.
func fakeEnrollRefuser(t *testing.T, conn net.Conn, code string) {
	defer conn.Close()
	sess, err := tunnel.Server(conn, tunnel.DefaultConfig())
	if err != nil {
		t.Errorf("fake coordinator: %v", err)
		return
	}
	defer sess.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	st, _, err := sess.Accept(ctx)
	if err != nil {
		return // the agent gave up on this session
	}
	f, err := protocol.NewFrameReader(st).Next()
	if err != nil || f.Type != protocol.FrameEnroll {
		t.Errorf("fake coordinator: got %v %v, want an Enroll", f.Type, err)
		return
	}
	protocol.WriteJSONFrame(st, protocol.FrameReject, &protocol.ErrorInfo{Code: code, Message: "join token 1234 is used up"})
	st.Close()
}

// TestEnrollRefusal: an enrollment refused for good (enroll_refused,
// version_mismatch) stops the agent after that one attempt, Run returning
// ErrEnrollRefused (tether agent then exits 78); a refusal the coordinator
// says is passing (internal) is retried with the usual backoff.
func TestEnrollRefusal(t *testing.T) {
	for _, c := range []struct {
		code      string
		permanent bool
	}{
		{protocol.CodeEnrollRefused, true},
		{protocol.CodeVersion, true},
		{protocol.CodeInternal, false},
	} {
		t.Run(c.code, func(t *testing.T) {
			var dials atomic.Int32
			cfg := testConfig(t)
			cfg.SharedToken = false
			cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
				dials.Add(1)
				agentSide, coordSide := net.Pipe()
				go fakeEnrollRefuser(t, coordSide, c.code)
				return agentSide, nil
			}
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- a.Run(ctx) }()
			if c.permanent {
				var err error
				select {
				case err = <-errc:
				case <-time.After(testWait):
					t.Fatalf("the agent keeps retrying a permanent refusal (%d dials)", dials.Load())
				}
				if !errors.Is(err, ErrEnrollRefused) {
					t.Fatalf("Run: %v, want ErrEnrollRefused", err)
				}
				if info := (*protocol.ErrorInfo)(nil); !errors.As(err, &info) || info.Code != c.code {
					t.Errorf("Run's error %v does not carry the coordinator's reject %s", err, c.code)
				}
				// Said once: who refused, why, the code.
				if msg := err.Error(); strings.Count(strings.TrimSuffix(msg, "("+c.code+")"), "refused") != 1 || !strings.Contains(msg, "enrollment refused by ") || !strings.HasSuffix(msg, "("+c.code+")") {
					t.Errorf("Run's error %q: want \"agent N: enrollment refused by ADDR: REASON (%s)\", refused once", msg, c.code)
				}
				if n := dials.Load(); n != 1 {
					t.Errorf("%d dials, want 1", n)
				}
				return
			}
			waitFor(t, testWait, "three enrollment attempts", func() bool { return dials.Load() >= 3 })
			cancel()
			if err := <-errc; err != nil {
				t.Fatalf("Run after a cancel: %v", err)
			}
		})
	}
}
