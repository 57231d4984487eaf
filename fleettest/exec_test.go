package fleettest_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// faultyDial wraps an agent's tunnel connections so a test can freeze them
// (reads and writes block until the connection is closed) or cut them.
type faultyDial struct {
	mu     sync.Mutex
	frozen bool
	conns  []*faultyConn
}

func (d *faultyDial) hook(c *agent.Config) {
	tlsCfg := tunnel.TunedTLS(c.TLS)
	c.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		conn, err := tunnel.DialTLS(ctx, addr, tlsCfg)
		if err != nil {
			return nil, err
		}
		fc := &faultyConn{Conn: conn, d: d, closed: make(chan struct{})}
		d.mu.Lock()
		d.conns = append(d.conns, fc)
		d.mu.Unlock()
		return fc, nil
	}
}

func (d *faultyDial) freeze() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.frozen = true
}

// cut closes the current connections (the agent redials).
func (d *faultyDial) cut() {
	d.mu.Lock()
	conns := d.conns
	d.conns = nil
	d.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (d *faultyDial) isFrozen() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.frozen
}

type faultyConn struct {
	net.Conn
	d      *faultyDial
	once   sync.Once
	closed chan struct{}
}

func (c *faultyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.d.isFrozen() {
		<-c.closed
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *faultyConn) Write(p []byte) (int, error) {
	if c.d.isFrozen() {
		<-c.closed
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

func (c *faultyConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// thaw lets new connections (the agent's redial) through again.
func (d *faultyDial) thaw() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.frozen = false
}

// A node whose tunnel freezes mid-job never holds up the others: their
// results stream in while it is frozen, and the frozen node's result is an
// error once its session is gone. The order is caused, not timed: the
// others' scripts finish only after node-1 froze (a file the test makes),
// and node-1's tunnel is cut only after the three other results arrived;
// a fan-out that waited for node-1 would see no result before the silence
// window (15 s with the defaults; tunnel and coordinator deadpeer tests
// prove that bound) dropped it, and node-1 would not come last.
func TestFanOutFrozenNodeDoesNotBlockOthers(t *testing.T) {
	var bad faultyDial
	f := fleettest.Start(t, fleettest.Options{
		Agents: 4,
		Agent: func(i int, c *agent.Config) {
			if i == 1 {
				bad.hook(c)
			}
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	frozen := filepath.Join(t.TempDir(), "node-1-frozen")
	var mu sync.Mutex
	var order []string
	res, err := f.Client.ExecWith(ctx, &protocol.ExecRequest{
		Target: protocol.Target{All: true},
		Script: "echo start\nuntil [ -e '" + frozen + "' ]; do sleep 0.01; done\necho done",
	}, client.ExecOptions{
		Output: func(node, stream string, data []byte) {
			if node == "node-1" && strings.Contains(string(data), "start") {
				bad.freeze()
				if err := os.WriteFile(frozen, nil, 0o644); err != nil {
					t.Error(err)
				}
			}
		},
		NodeResult: func(r *protocol.NodeResult) {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, r.Node)
			if len(order) == 3 && !slices.Contains(order, "node-1") {
				// Every other node is done while node-1 is frozen: end
				// its tunnel (its agent redials on a thawed dial).
				bad.cut()
				bad.thaw()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 4 || order[3] != "node-1" {
		t.Fatalf("node results arrived in order %v, want node-1 last", order)
	}
	for _, r := range res.Results {
		switch {
		case r.Node == "node-1":
			if r.ExitCode != -1 || !strings.Contains(r.Error, "tunnel lost") {
				t.Errorf("frozen node result = %+v", r)
			}
		case !r.OK():
			t.Errorf("%s = %+v", r.Node, r)
		}
	}
	if res.Nodes != 4 || res.Succeeded != 3 || res.Failed != 1 {
		t.Errorf("counts = %d/%d/%d", res.Nodes, res.Succeeded, res.Failed)
	}
}

// Batches end to end through real agents: NeMo Gym's SSH run (NG-1, NG-2)
// and its fail-fast local run, with the failure text users read.
func TestFleetBatches(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tests := []struct {
		name        string
		req         protocol.ExecRequest
		wantOut     string
		wantCode    int
		wantFailure string
	}{
		{"NG-1", protocol.ExecRequest{Commands: []string{"echo a", "echo oops >&2; false"}}, "a\n", 1,
			"Command failed (exec on node-0) with exit code 1:\n  bash -s\noops"},
		{"NG-2", protocol.ExecRequest{Commands: []string{"false", "echo a"}}, "a\n", 0, ""},
		{"fail-fast", protocol.ExecRequest{Commands: []string{"echo a", "echo oops >&2; exit 4", "echo b"}, FailFast: true}, "a\n", 4,
			"Command failed (exec on node-0) with exit code 4:\n  echo oops >&2; exit 4\noops"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			req.Target = protocol.Target{Node: "node-0"}
			var out strings.Builder
			res, err := f.Client.Exec(ctx, &req, func(_, stream string, data []byte) {
				if stream == protocol.ReplyStdout {
					out.Write(data)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			r := res.Results[0]
			if out.String() != tt.wantOut || r.ExitCode != tt.wantCode || r.Failure != tt.wantFailure {
				t.Errorf("stdout %q, result %+v; want %q, exit %d, failure %q", out.String(), r, tt.wantOut, tt.wantCode, tt.wantFailure)
			}
		})
	}
}

// A detached job survives its tunnel and is queried, read and cancelled
// through the coordinator after the agent reconnected.
func TestFleetDetachedJob(t *testing.T) {
	var d faultyDial
	f := fleettest.Start(t, fleettest.Options{Agent: func(i int, c *agent.Config) { d.hook(c) }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{
		ID: "det-1", Target: protocol.Target{Node: "node-0"}, Detach: true,
		Script: "echo hello\nsleep 1\necho bye >&2\nexit 4",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Results[0]; !r.Detached || !r.OK() {
		t.Fatalf("result = %+v, want detached", r)
	}
	long, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: "det-2", Target: protocol.Target{Node: "node-0"}, Detach: true, Argv: []string{"sleep", "60"}}, nil)
	if err != nil || !long.Results[0].Detached {
		t.Fatalf("second job: %v %+v", err, long)
	}

	// Cut the tunnel; the agent redials.
	before := f.Coordinator.Nodes(protocol.Selector{})[0].SessionID
	d.cut()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ns := f.Coordinator.Nodes(protocol.Selector{})
		if len(ns) == 1 && ns[0].SessionID != before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent did not reconnect")
		}
		time.Sleep(20 * time.Millisecond)
	}

	var st *protocol.JobStatus
	for deadline := time.Now().Add(20 * time.Second); ; {
		st, err = f.Client.JobStatus(ctx, "node-0", "det-1")
		if err != nil {
			t.Fatal(err)
		}
		if st.State == protocol.JobExited || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.State != protocol.JobExited || st.ExitCode == nil || *st.ExitCode != 4 || st.Node != "node-0" {
		t.Fatalf("status = %+v", st)
	}
	out, err := f.Client.JobOutput(ctx, "node-0", "det-1", "stdout", 0, 0)
	if err != nil || string(out.Data) != "hello\n" || !out.EOF || out.Total != 6 {
		t.Errorf("stdout = %+v, %v", out, err)
	}
	out, err = f.Client.JobOutput(ctx, "node-0", "det-1", "stderr", 0, 0)
	if err != nil || string(out.Data) != "bye\n" || !out.EOF {
		t.Errorf("stderr = %+v, %v", out, err)
	}

	st, err = f.Client.JobCancel(ctx, "node-0", "det-2")
	if err != nil || st.State != protocol.JobExited || !st.Cancelled {
		t.Errorf("cancel = %+v, %v", st, err)
	}
	if _, err := f.Client.JobStatus(ctx, "node-0", "nope"); !isCode(err, protocol.ErrCodeNotFound) {
		t.Errorf("unknown job: %v", err)
	}
}

func isCode(err error, code string) bool {
	e, ok := err.(*protocol.APIError)
	return ok && e.Code == code
}
