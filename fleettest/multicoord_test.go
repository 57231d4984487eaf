package fleettest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// Several coordinators on one NATS server (coordinator/fleet.go): agent i
// is held by coordinator i mod 2, and requests land on either one (the
// micro queue group picks), so about half of them reach a coordinator that
// does not hold their node. Each test sends enough of them that both
// cases happen (the chance that none of n lands on the non-owner is 2^-n)
// and checks that some were forwarded.

func startMulti(t *testing.T, coordinators, agents int) *fleettest.Fleet {
	t.Helper()
	return fleettest.Start(t, fleettest.Options{Coordinators: coordinators, Agents: agents, HeartbeatInterval: time.Second})
}

func TestMultiCoordinatorRegistry(t *testing.T) {
	f := startMulti(t, 2, 4)
	for k, c := range f.Coordinators {
		ns := c.FleetNodes(protocol.Selector{})
		if len(ns) != 4 {
			t.Fatalf("coordinator %d sees %d nodes, want 4: %+v", k, len(ns), ns)
		}
		for i, n := range ns {
			if want := fmt.Sprintf("fleettest-%d", i%2); n.Coordinator != want || n.ID != fmt.Sprintf("node-%d", i) {
				t.Errorf("coordinator %d: node %s held by %q, want %q", k, n.ID, n.Coordinator, want)
			}
		}
		if local := c.Nodes(protocol.Selector{}); len(local) != 2 {
			t.Errorf("coordinator %d holds %d nodes, want 2", k, len(local))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 8 {
		ns, err := f.Client.Nodes(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(ns) != 4 {
			t.Fatalf("nodes.list = %d nodes, want the whole fleet's 4", len(ns))
		}
		for _, n := range ns {
			// Live state from the owner, whichever coordinator answered.
			if n.LastHeartbeat.IsZero() {
				t.Errorf("nodes.list: %s (held by %s) has no last heartbeat", n.ID, n.Coordinator)
			}
		}
	}
}

func TestMultiCoordinatorExecOnAnyCoordinator(t *testing.T) {
	f := startMulti(t, 2, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 24 {
		node := fmt.Sprintf("node-%d", i%4)
		var out strings.Builder
		res, err := f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: node}, Script: "echo hi-" + node + "; echo err >&2; exit 3"},
			func(n, stream string, data []byte) {
				if stream == "stdout" && n == node {
					out.Write(data)
				}
			})
		if err != nil {
			t.Fatalf("exec %d on %s: %v", i, node, err)
		}
		if len(res.Results) != 1 || res.Results[0].Node != node || res.Results[0].ExitCode != 3 || out.String() != "hi-"+node+"\n" {
			t.Fatalf("exec %d on %s: %+v, stdout %q", i, node, res, out.String())
		}
		if !strings.Contains(res.Results[0].Failure, "err") {
			t.Errorf("exec %d on %s: failure %q does not carry stderr", i, node, res.Results[0].Failure)
		}
	}
	if f.Forwarded(t) == 0 {
		t.Error("no request was forwarded between the coordinators")
	}
}

func TestMultiCoordinatorFanOut(t *testing.T) {
	f := startMulti(t, 3, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for round := range 6 {
		var mu sync.Mutex
		seen := map[string]string{}
		res, err := f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{All: true}, Script: "echo out"},
			func(n, stream string, data []byte) {
				mu.Lock()
				seen[n] += string(data)
				mu.Unlock()
			})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if res.Nodes != 6 || res.Succeeded != 6 || len(res.Results) != 6 {
			t.Fatalf("round %d: %+v, want 6 nodes succeeded", round, res)
		}
		for i := range 6 {
			if n := fmt.Sprintf("node-%d", i); seen[n] != "out\n" || res.Results[i].Node != n {
				t.Errorf("round %d: node %s output %q, result %+v", round, n, seen[n], res.Results[i])
			}
		}
		// A selector across the coordinators.
		sel, err := f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Selector: "index in (1,2,4)"}, Script: "true"}, nil)
		if err != nil {
			t.Fatalf("round %d: selector: %v", round, err)
		}
		var ids []string
		for _, r := range sel.Results {
			ids = append(ids, r.Node)
		}
		if !slices.Equal(ids, []string{"node-1", "node-2", "node-4"}) || sel.Succeeded != 3 {
			t.Fatalf("round %d: selector ran on %v (%+v)", round, ids, sel)
		}
	}
	if f.Forwarded(t) == 0 {
		t.Error("no node run was forwarded between the coordinators")
	}
}

func TestMultiCoordinatorCancel(t *testing.T) {
	f := startMulti(t, 2, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 6 {
		id := fmt.Sprintf("long-%d", i)
		done := make(chan *protocol.ExecResult, 1)
		go func() {
			res, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: id, Target: protocol.Target{Node: fmt.Sprintf("node-%d", i%2)}, Script: "sleep 30"}, nil)
			if err != nil {
				t.Errorf("exec %s: %v", id, err)
			}
			done <- res
		}()
		// The cancel lands on either coordinator; retry until the job runs.
		for {
			r, err := f.Client.Cancel(ctx, id)
			if err == nil && r.Cancelled {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("cancel %s: %v", id, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		res := <-done
		if res == nil || len(res.Results) != 1 || !res.Results[0].Cancelled {
			t.Fatalf("job %s: %+v, want cancelled", id, res)
		}
	}
	if _, err := f.Client.Cancel(ctx, "no-such-job"); !isCode(err, protocol.ErrCodeNotFound) {
		t.Errorf("cancel of an unknown job: %v, want not found", err)
	}
}

func TestMultiCoordinatorDetachedJob(t *testing.T) {
	f := startMulti(t, 2, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: "det-m", Target: protocol.Target{Node: "node-1"}, Detach: true, Script: "echo hello"}, nil)
	if err != nil || !res.Results[0].Detached {
		t.Fatalf("detached exec: %v %+v", err, res)
	}
	for i := range 12 {
		st, err := f.Client.JobStatus(ctx, "node-1", "det-m")
		if err != nil || st.Node != "node-1" {
			t.Fatalf("status %d: %+v, %v", i, st, err)
		}
		if st.State == protocol.JobExited {
			out, err := f.Client.JobOutput(ctx, "node-1", "det-m", "stdout", 0, 0)
			if err != nil || string(out.Data) != "hello\n" {
				t.Fatalf("output %d: %+v, %v", i, out, err)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMultiCoordinatorStreamRelay(t *testing.T) {
	f := startMulti(t, 2, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 8 {
		node := fmt.Sprintf("node-%d", i%2)
		res, err := f.Client.ExecStream(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: node}, Argv: []string{"cat"}},
			strings.NewReader("through the relay\n"), client.ExecOptions{Output: func(n, stream string, data []byte) {}})
		if err != nil || res.Results[0].ExitCode != 0 {
			t.Fatalf("stream %d on %s: %+v, %v", i, node, res, err)
		}
	}
}

func TestMultiCoordinatorRehome(t *testing.T) {
	f := startMulti(t, 2, 4)
	f.StopCoordinator(1)
	// Its agents move to coordinator 0, which then holds all four, and the
	// registry says so.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ns := f.Coordinators[0].FleetNodes(protocol.Selector{})
		held := f.Coordinators[0].Nodes(protocol.Selector{})
		ok := len(ns) == 4 && len(held) == 4
		for _, n := range ns {
			ok = ok && n.Coordinator == "fleettest-0"
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not re-homed: registry %+v, held %d", ns, len(held))
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{All: true}, Script: "true"}, nil)
	if err != nil || res.Succeeded != 4 {
		t.Fatalf("after re-homing: %+v, %v", res, err)
	}
}

// DialTarget (the facades' way to a node) reaches a node another
// coordinator holds: through a pipe to the owner, which splices it onto
// the node's dial stream.
func TestMultiCoordinatorDialTarget(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 2, HeartbeatInterval: time.Second,
		Agent: func(i int, c *agent.Config) { c.Targets = map[string]string{"echo": echo.Addr().String()} }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for k, c := range f.Coordinators {
		for _, node := range []string{"node-0", "node-1"} {
			conn, err := c.DialTarget(ctx, node, "echo")
			if err != nil {
				t.Fatalf("coordinator %d: dial echo on %s: %v", k, node, err)
			}
			msg := fmt.Sprintf("hello %d %s", k, node)
			if _, err := conn.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			conn.(interface{ CloseWrite() error }).CloseWrite()
			got, err := io.ReadAll(conn)
			conn.Close()
			if err != nil || string(got) != msg {
				t.Fatalf("coordinator %d, %s: echoed %q, %v; want %q", k, node, got, err, msg)
			}
		}
		if _, err := c.DialTarget(ctx, "node-1", "nope"); !errors.Is(err, coordinator.ErrUnknownTarget) {
			t.Errorf("coordinator %d: unknown target: %v", k, err)
		}
	}
}

// The SSH jump host's way to a node (SSHNodes) reaches a node another
// coordinator holds: policy labels and host key from the registry, the
// ssh stream opened by the owner and piped back; the agent's SSH server
// greets through it.
func TestMultiCoordinatorSSH(t *testing.T) {
	f := startMulti(t, 2, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	for k, c := range f.Coordinators {
		for _, node := range []string{"node-0", "node-1"} {
			nodes := c.SSHNodes()
			if pn, ok := nodes.Node(node); !ok || pn.Labels["index"] != node[len("node-"):] {
				t.Fatalf("coordinator %d: node %s = %+v, %v", k, node, pn, ok)
			}
			if len(nodes.HostKey(node)) == 0 {
				t.Fatalf("coordinator %d: no host key for %s", k, node)
			}
			conn, err := nodes.OpenSSH(ctx, node, protocol.SSHParams{
				Session: fmt.Sprintf("%031x%s", k, node[len("node-"):]), Identity: "ssh-principal:test", Logins: []string{u.Username}, Auth: protocol.SSHAuthNone,
			})
			if err != nil {
				t.Fatalf("coordinator %d: open ssh to %s: %v", k, node, err)
			}
			banner := make([]byte, 8)
			if _, err := io.ReadFull(conn, banner); err != nil || string(banner) != "SSH-2.0-" {
				t.Fatalf("coordinator %d, %s: banner %q, %v", k, node, banner, err)
			}
			conn.Close()
		}
	}
}

// ssh.info (tether ssh-config) lists the whole fleet's SSH nodes from any
// coordinator.
func TestMultiCoordinatorSSHInfo(t *testing.T) {
	f := startMulti(t, 2, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 8 {
		info, err := f.Client.SSHInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NodesTotal != 4 {
			t.Fatalf("ssh.info %d (from %s): %d nodes, want 4: %+v", i, info.Coordinator, info.NodesTotal, info.Nodes)
		}
	}
}

// A coordinator that is gone without draining (kill -9) leaves its records
// behind; the others remove them once it is missing from the service's
// instances, and a live coordinator's records stay.
func TestMultiCoordinatorStaleRecordsSwept(t *testing.T) {
	f := startMulti(t, 2, 2)
	kv, err := coordinator.OpenFleetBucket(context.Background(), f.CoordNCs[0], 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	ghost, _ := json.Marshal(protocol.NodeInfo{ID: "ghost-node", Coordinator: "ghost-coordinator", SessionID: "s1", Labels: map[string]string{"index": "9"}})
	if _, err := kv.Put(context.Background(), "ghost-node", ghost); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	sawGhost := false
	for {
		ns := f.Coordinators[1].FleetNodes(protocol.Selector{})
		has := slices.ContainsFunc(ns, func(n protocol.NodeInfo) bool { return n.ID == "ghost-node" })
		sawGhost = sawGhost || has
		if sawGhost && !has {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ghost record not swept (seen: %v): %+v", sawGhost, ns)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ns := f.Coordinators[0].FleetNodes(protocol.Selector{}); len(ns) != 2 {
		t.Fatalf("after the sweep: %+v, want the two live nodes", ns)
	}
}

// A coordinator cut off from NATS hands its agents to the others (and
// refuses them while it stays cut off): the fleet keeps serving them.
func TestMultiCoordinatorPartitionedCoordinatorShedsAgents(t *testing.T) {
	f := startMulti(t, 2, 4)
	// Let a sweep see the other coordinator first.
	time.Sleep(1500 * time.Millisecond)
	f.CoordNCs[1].Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		held := f.Coordinators[0].Nodes(protocol.Selector{})
		if len(held) == 4 && len(f.Coordinators[1].Nodes(protocol.Selector{})) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinator 0 holds %d nodes, coordinator 1 %d; want 4 and 0", len(held), len(f.Coordinators[1].Nodes(protocol.Selector{})))
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The registry follows (the records were re-put by coordinator 0).
	for {
		ns := f.Coordinators[0].FleetNodes(protocol.Selector{})
		ok := len(ns) == 4
		for _, n := range ns {
			ok = ok && n.Coordinator == "fleettest-0"
		}
		if ok {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("registry not re-homed: %+v", ns)
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{All: true}, Script: "true"}, nil)
	if err != nil || res.Succeeded != 4 {
		t.Fatalf("after the partition: %+v, %v", res, err)
	}
}

// A node the registry names this coordinator for while it holds no
// session of it (its view lags after a partition or reconnect, or the
// node is moving between coordinators) is not an unknown node: an exec
// for it is answered 503 unavailable, the API's "retry", and not 404
// unknown_node, whichever coordinator the request lands on. (After the
// heal of a partition in e2e TestCluster clients were told 404 for nodes
// that were connected.)
func TestMultiCoordinatorLaggingRecordIsRetry(t *testing.T) {
	f := startMulti(t, 2, 2)
	kv, err := coordinator.OpenFleetBucket(context.Background(), f.CoordNCs[0], 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(protocol.NodeInfo{ID: "lagging-node", Coordinator: "fleettest-0", SessionID: "s1", Labels: map[string]string{"index": "9"}})
	if _, err := kv.Put(context.Background(), "lagging-node", rec); err != nil {
		t.Fatal(err)
	}
	// fleettest-1 lists it as the other's; fleettest-0 lists only the
	// nodes it holds, and gets the same watch delivery.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if slices.ContainsFunc(f.Coordinators[1].FleetNodes(protocol.Selector{}), func(n protocol.NodeInfo) bool { return n.ID == "lagging-node" }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fleettest-1 never saw the record")
		}
	}
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Requests spread over both coordinators (queue group): some land
	// on fleettest-0 directly, the others are forwarded to it.
	for range 6 {
		_, err := f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "lagging-node"}, Script: "true"}, nil)
		var ae *protocol.APIError
		if !errors.As(err, &ae) || ae.Status != 503 || ae.Code != protocol.ErrCodeUnavailable {
			t.Fatalf("exec on a node registered to a coordinator without its session: %v, want 503 unavailable", err)
		}
	}
}

// A coordinator that dies (its NATS connection gone at once, as after
// kill -9) leaves its jobs to the others: the client of its attached job
// learns from whichever coordinator answers that the job was lost, long
// before its keepalive timeout, and its detached job is taken over and
// settled with the node's own result once its node re-homed.
//
// With a silent subscriber on the coordinator subjects (an operator's
// `nats sub '>'` in TETHER), NATS never says "no responders": the
// verdict then rests on the fleet sweep missing the coordinator too.
func TestMultiCoordinatorDeadHolderJobsTakenOver(t *testing.T) {
	for _, silent := range []bool{false, true} {
		t.Run(fmt.Sprintf("silent_subscriber=%v", silent), func(t *testing.T) { testDeadHolderJobsTakenOver(t, silent) })
	}
}

func testDeadHolderJobsTakenOver(t *testing.T, silent bool) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 2, HeartbeatInterval: time.Second, Jobs: true})
	if silent {
		sub, err := f.CoordNCs[0].Subscribe(coordinator.CoordSubjectPrefix+">", func(*nats.Msg) {})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	det, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: "det-dead", Target: protocol.Target{Node: "node-1"}, Detach: true, Script: "sleep 6; echo done"}, nil)
	if err != nil || !det.Results[0].Detached {
		t.Fatalf("detached exec: %v %+v", err, det)
	}
	cl := &client.Client{NC: f.Client.NC}
	cl.KeepAliveTimeout = 10 * time.Minute // the outcome must come from the fate check
	cl.FateCheckAfter = time.Second
	type outcome struct {
		res *protocol.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := cl.Exec(ctx, &protocol.ExecRequest{ID: "att-dead", Target: protocol.Target{Node: "node-1"}, Script: "sleep 120"}, nil)
		done <- outcome{res, err}
	}()
	for {
		rec, err := f.Client.JobGet(ctx, "att-dead")
		if err == nil && rec.State == protocol.JobStateRunning {
			if rec.Coordinator != "fleettest-1" {
				t.Fatalf("attached job held by %s, want fleettest-1 (node-1's)", rec.Coordinator)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("attached job never running: %+v %v", rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.KillCoordinator(1)

	o := <-done
	if o.err != nil || o.res == nil || len(o.res.Results) != 1 || o.res.Results[0].ExitCode != -1 ||
		!strings.Contains(o.res.Results[0].Error, "lost") {
		t.Fatalf("attached job's client got %+v, %v; want node-1 lost", o.res, o.err)
	}
	rec, err := f.Client.JobGet(ctx, "att-dead")
	if err != nil || rec.State != protocol.JobStateLost || rec.Coordinator != "fleettest-0" || rec.Epoch == 0 {
		t.Fatalf("attached record = %+v, %v; want lost, taken over by fleettest-0", rec, err)
	}
	if n := f.CounterSum(t, "tether_coordinator_jobs_taken_over_total"); n < 1 {
		t.Errorf("jobs taken over = %v, want at least the attached one", n)
	}
	// The detached job ran on: its record ends with the node's result.
	w, err := f.Client.JobWait(ctx, "det-dead", 200*time.Millisecond)
	if err != nil || w.State != protocol.JobSucceeded || w.Coordinator != "fleettest-0" {
		t.Fatalf("detached record = %+v, %v; want succeeded, held by fleettest-0 (coordinator 0 holds %+v; registry %+v)", w, err,
			f.Coordinators[0].Nodes(protocol.Selector{}), f.Coordinators[0].FleetNodes(protocol.Selector{}))
	}
}

// A fan-out's run on another coordinator ends when the fan-out's
// coordinator dies: nobody reads its output any more (it used to run to
// its own timeout).
func TestMultiCoordinatorFanOutRunEndsWithItsCoordinator(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 2, HeartbeatInterval: time.Second, Jobs: true,
		Coordinator: func(c *coordinator.Config) { c.KeepAliveInterval = time.Second }})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	go f.Client.Exec(ctx, &protocol.ExecRequest{ID: "fan-dead", Target: protocol.Target{All: true}, Script: "sleep 120"}, nil)
	running := func(k int) int {
		n := 0
		for _, ni := range f.Coordinators[k].Nodes(protocol.Selector{}) {
			n += ni.RunningExecs
		}
		return n
	}
	var holder int
	for {
		rec, err := f.Client.JobGet(ctx, "fan-dead")
		if err == nil && rec.State == protocol.JobStateRunning && running(0) == 1 && running(1) == 1 {
			holder = map[string]int{"fleettest-0": 0, "fleettest-1": 1}[rec.Coordinator]
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("fan-out never running on both: %+v %v", rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	other := 1 - holder
	f.KillCoordinator(holder)
	for running(other) != 0 {
		if ctx.Err() != nil {
			t.Fatalf("the fan-out's run on coordinator %d still runs after its coordinator %d died", other, holder)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An idempotent job lost with its coordinator runs again (at least
// once): the client submits it anew under the same idempotency key, and
// gets the second attempt's output and result.
func TestMultiCoordinatorIdempotentJobRunsAgain(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 2, HeartbeatInterval: time.Second, Jobs: true})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	mark := t.TempDir() + "/first"
	cl := &client.Client{NC: f.Client.NC}
	cl.KeepAliveTimeout = 10 * time.Minute
	cl.FateCheckAfter = time.Second
	req := &protocol.ExecRequest{ID: "idem-dead", Target: protocol.Target{Node: "node-1"}, Idempotent: true,
		Script: fmt.Sprintf("if [ -e %[1]s ]; then echo second; exit 0; fi; touch %[1]s; sleep 120", mark)}
	var reruns []string
	var out strings.Builder
	type outcome struct {
		res *protocol.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := cl.ExecWith(ctx, req, client.ExecOptions{
			Output: func(_, _ string, b []byte) { out.Write(b) },
			Rerun:  func(lost, next, why string) { reruns = append(reruns, lost+"→"+next+": "+why) },
		})
		done <- outcome{res, err}
	}()
	for {
		rec, err := f.Client.JobGet(ctx, "idem-dead")
		if err == nil && rec.State == protocol.JobStateRunning && rec.Coordinator == "fleettest-1" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("idempotent job never running on fleettest-1: %+v %v", rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Running is recorded when the agent took the job, which can be before
	// its shell got to the touch: killed then, the second attempt would be
	// the first to touch and sleep (CI under load: the rerun slept until
	// the test's deadline).
	for {
		if _, err := os.Stat(mark); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the first attempt never touched %s", mark)
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.KillCoordinator(1)
	o := <-done
	if o.err != nil || o.res == nil || o.res.Succeeded != 1 || out.String() != "second\n" {
		t.Fatalf("idempotent job after its coordinator died: %+v, %v, output %q; want the second attempt's success", o.res, o.err, out.String())
	}
	if len(reruns) != 1 || !strings.Contains(reruns[0], "idem-dead→") || req.ID == "idem-dead" {
		t.Errorf("reruns %q, request id now %s", reruns, req.ID)
	}
	if rec, err := f.Client.JobGet(ctx, "idem-dead"); err != nil || rec.State != protocol.JobStateLost {
		t.Errorf("the first attempt's record = %+v, %v; want lost", rec, err)
	}
	// The final record is written after the final reply (job.run), so
	// it may still say running for a moment (CI of 721c961 read it so).
	for {
		rec, err := f.Client.JobGet(ctx, req.ID)
		if err == nil && rec.State.Terminal() {
			if rec.State != protocol.JobSucceeded {
				t.Errorf("the second attempt's record = %+v; want succeeded", rec)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the second attempt's record = %+v, %v; want succeeded", rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A coordinator asks a node another coordinator holds about a detached
// job through that coordinator (node.<id>.job.query): the node's status,
// "no such job" for one it does not know, "unreachable" for a node nobody
// holds; a malformed query is answered with an error, never a status.
func TestMultiCoordinatorJobQueryThroughTheOwner(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 2, HeartbeatInterval: time.Second, Jobs: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: "q-det", Target: protocol.Target{Node: "node-1"}, Detach: true, Script: "sleep 30"}, nil); err != nil {
		t.Fatal(err)
	}
	c0 := f.Coordinators[0] // node-1 is coordinator 1's
	st, err := c0.JobStatus(ctx, "node-1", "q-det")
	if err != nil || st.State != protocol.JobRunning || st.Node != "node-1" {
		t.Fatalf("status through the owner = %+v, %v; want running on node-1", st, err)
	}
	if _, err := c0.JobStatus(ctx, "node-1", "no-such-job"); !errors.Is(err, jobstore.ErrNoSuchJob) {
		t.Errorf("unknown job = %v, want ErrNoSuchJob", err)
	}
	if _, err := c0.JobStatus(ctx, "node-9", "q-det"); !errors.Is(err, jobstore.ErrNodeUnreachable) {
		t.Errorf("unknown node = %v, want ErrNodeUnreachable", err)
	}
	for _, body := range []string{"{", `{"id":"bad id!"}`, `{"id":""}`} {
		m, err := f.CoordNCs[0].RequestMsg(&nats.Msg{Subject: coordinator.NodeSubjectPrefix + "node-1.job.query",
			Header: nats.Header{coordinator.HeaderForwardedBy: []string{"fleettest-0"}}, Data: []byte(body)}, 5*time.Second)
		if err != nil {
			t.Fatalf("query %q: %v", body, err)
		}
		var a struct {
			Status *protocol.JobStatus `json:"status"`
			Error  string              `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &a); err != nil || a.Status != nil || !strings.Contains(a.Error, "bad job query for node node-1") {
			t.Errorf("query %q answered %s (%v); want an error naming the node", body, m.Data, err)
		}
	}
}

// A drain lets a job in flight finish on the session it drains, also once
// the agent registered with another coordinator (the session it left used
// to be closed as superseded, killing the job).
func TestMultiCoordinatorDrainKeepsJobsInFlight(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 2, HeartbeatInterval: time.Second, Jobs: true})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	type outcome struct {
		res *protocol.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	var out strings.Builder
	go func() {
		res, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: "drain-inflight", Target: protocol.Target{Node: "node-1"}, Script: "sleep 4; echo done"},
			func(_, _ string, b []byte) { out.Write(b) })
		done <- outcome{res, err}
	}()
	for {
		rec, err := f.Client.JobGet(ctx, "drain-inflight")
		if err == nil && rec.State == protocol.JobStateRunning {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("job never running: %+v %v", rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() { f.StopCoordinator(1); close(stopped) }()
	// node-1 moves to coordinator 0 while its job runs on.
	for {
		ns := f.Coordinators[0].FleetNodes(protocol.Selector{})
		moved := len(ns) == 2
		for _, n := range ns {
			moved = moved && n.Coordinator == "fleettest-0"
		}
		if moved {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node-1 never moved: %+v", ns)
		}
		time.Sleep(20 * time.Millisecond)
	}
	o := <-done
	if o.err != nil || o.res.Succeeded != 1 || out.String() != "done\n" {
		t.Fatalf("job in flight across the drain: %+v, %v, output %q; want it to finish", o.res, o.err, out.String())
	}
	<-stopped
}
