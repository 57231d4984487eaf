package coordinator

import (
	"context"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// TestControlWriter: a cancel-stream frame goes only to an agent that
// listed cancel_stream, and only after its Welcome; a failed write stops
// the writer.
func TestControlWriter(t *testing.T) {
	agentSide, coordSide := tunneltest.Pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name     string
		features []string
		welcomed bool
		want     bool
	}{
		{"old agent", nil, true, false},
		{"before welcome", []string{protocol.FeatureCancelStream}, false, false},
		{"unknown features only", []string{"time_travel"}, true, false},
		{"agent that takes them", []string{"time_travel", protocol.FeatureCancelStream}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan protocol.Frame, 1)
			go func() {
				st, _, err := coordSide.Accept(ctx)
				if err != nil {
					close(got)
					return
				}
				defer st.Close()
				st.SetReadDeadline(time.Now().Add(10 * time.Second))
				fr := protocol.NewFrameReader(st)
				f, err := fr.Next()
				if err == nil && tc.welcomed {
					if f.Type != protocol.FrameWelcome {
						t.Errorf("first frame %v, want the welcome", f.Type)
					}
					f, err = fr.Next()
				}
				if err != nil {
					close(got)
					return
				}
				got <- protocol.Frame{Type: f.Type, Payload: append([]byte(nil), f.Payload...)}
			}()
			ctl, err := agentSide.Open(ctx, protocol.KindControl, protocol.ControlParams{})
			if err != nil {
				t.Fatal(err)
			}
			defer ctl.Close()
			// The writer writes on its stream; here the agent's end is
			// the writer's, the frame is read on the other.
			w := newControlWriter(ctl, &protocol.Hello{Features: tc.features}, time.Second)
			if tc.welcomed {
				if err := w.welcome(&protocol.Welcome{SessionID: "s"}); err != nil {
					t.Fatal(err)
				}
			}
			sent, err := w.cancelStream(7)
			if err != nil || sent != tc.want {
				t.Fatalf("cancelStream = %v, %v; want %v", sent, err, tc.want)
			}
			if !tc.want {
				ctl.Close() // nothing was written: the reader sees EOF
			}
			f, ok := <-got
			if ok != tc.want {
				t.Fatalf("frame on the control stream: %v %s (read %v), want one: %v", f.Type, f.Payload, ok, tc.want)
			}
			if ok && (f.Type != protocol.FrameCancelStream || string(f.Payload) != `{"stream_id":7}`) {
				t.Errorf("frame %v %s, want cancel-stream {\"stream_id\":7}", f.Type, f.Payload)
			}
		})
	}

	// A write that fails (the stream is closed) is reported, and nothing
	// is written afterwards.
	ctl, err := agentSide.Open(ctx, protocol.KindControl, protocol.ControlParams{})
	if err != nil {
		t.Fatal(err)
	}
	w := newControlWriter(ctl, &protocol.Hello{Features: []string{protocol.FeatureCancelStream}}, time.Second)
	go func() { // the other end reads the welcome
		if st, _, err := coordSide.Accept(ctx); err == nil {
			st.SetReadDeadline(time.Now().Add(10 * time.Second))
			protocol.NewFrameReader(st).Next()
			st.Close()
		}
	}()
	if err := w.welcome(&protocol.Welcome{SessionID: "s"}); err != nil {
		t.Fatal(err)
	}
	ctl.Close()
	if _, err := w.cancelStream(1); err == nil {
		t.Fatal("cancelStream on a closed stream: no error")
	}
	if sent, err := w.cancelStream(3); sent || err == nil {
		t.Errorf("cancelStream after a failure = %v, %v; want the first failure", sent, err)
	}
}
