package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
)

// The attacks of issue 9 on the NATS API, each tried the way an attacker
// on the same network would, with a plain nats.go client: without
// credentials, or as a client user of its own ("mallory"). Each succeeded
// against the coordinator before NATS required credentials (commit
// 3ded359, where mallory is simply an anonymous connection) and is refused
// now.

// attackErrs collects a connection's asynchronous errors (permission
// violations).
type attackErrs struct {
	mu   sync.Mutex
	errs []error
}

func (a *attackErrs) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	a.errs = append(a.errs, err)
	a.mu.Unlock()
}

// violated reports whether a permissions violation naming subject arrived.
func (a *attackErrs) violated(subject string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, err := range a.errs {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
			return true
		}
	}
	return false
}

// anonymous connects to the fleet's NATS without credentials.
func anonymous(f *fleettest.Fleet) (*nats.Conn, error) {
	return nats.Connect(f.NATS.ClientURL(), nats.NoReconnect(), nats.Timeout(5*time.Second))
}

// mallory connects as a client user of the fleet's layout, not the
// victim's (f.NC).
func mallory(t *testing.T, f *fleettest.Fleet) (*nats.Conn, *attackErrs) {
	t.Helper()
	errs := &attackErrs{}
	nc := natsauthtest.Connect(t, f.NATS.ClientURL(), natsauthtest.ClientCreds(t, f.Layout, "mallory"), nats.ErrorHandler(errs.handler))
	return nc, errs
}

// inspector connects with coordinator credentials, to look at what an
// attack may have changed.
func inspector(t *testing.T, f *fleettest.Fleet) *nats.Conn {
	t.Helper()
	return natsauthtest.Connect(t, f.NATS.ClientURL(), natsauthtest.CoordinatorCreds(t, f.Layout, "inspector"))
}

func attackCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*defaultTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// Without credentials, tether.v1.exec runs nothing: the connection is
// refused.
func TestAttackAnonymousExecRefused(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	nc, err := anonymous(f)
	if err == nil {
		defer nc.Close()
		res, err := client.New(nc).Exec(attackCtx(t), &protocol.ExecRequest{Target: protocol.Target{All: true}, Argv: []string{"id"}}, nil)
		t.Fatalf("an anonymous client connected and ran id: %+v, %v", res, err)
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connect: %v, want %v", err, nats.ErrAuthorization)
	}
}

// A client user subscribed to > receives nothing of another client's
// requests (a script with a secret in its env) or their replies.
func TestAttackWildcardSubscriptionSeesNothing(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	nc, errs := mallory(t, f)
	sub, err := nc.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	res, err := f.Client.Exec(attackCtx(t), &protocol.ExecRequest{Target: protocol.Target{Node: "node-0"},
		Env: map[string]string{"DB_PASSWORD": "hunter2-secret"}, Script: "echo $DB_PASSWORD"}, nil)
	if err != nil || res.Succeeded != 1 {
		t.Fatalf("victim's exec: %+v, %v", res, err)
	}
	// What the server delivered to mallory before the victim's result is
	// queued by now: a round trip orders it.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := sub.Pending(); n > 0 {
		m, _ := sub.NextMsg(time.Second)
		t.Fatalf("a subscription to > received %d messages, the first on %s: %q", n, m.Subject, m.Data)
	}
	if !errs.violated(">") {
		t.Errorf("no permissions violation for the subscription to >: %v", errs.errs)
	}
}

// A client user joining the service's queue group on tether.v1.exec is
// refused, so it cannot answer other clients' jobs with forged results:
// every failing job comes back failed.
func TestAttackQueueGroupHijackRefused(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	nc, errs := mallory(t, f)
	forge := func(m *nats.Msg) {
		var req protocol.ExecRequest
		json.Unmarshal(m.Data, &req)
		body, _ := json.Marshal(protocol.ExecResult{ID: req.ID, Nodes: 1, Succeeded: 1,
			Results: []protocol.NodeResult{{Node: "node-0", ExitCode: 0}}})
		h := nats.Header{protocol.HeaderJob: {req.ID}, protocol.HeaderType: {protocol.ReplyResult}, protocol.HeaderSeq: {"0"}}
		nc.PublishMsg(&nats.Msg{Subject: m.Reply, Header: h, Data: body})
	}
	if _, err := nc.QueueSubscribe(protocol.SubjectExec, "q", forge); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	forged := 0
	for i := 0; i < 20; i++ {
		res, err := f.Client.Exec(attackCtx(t), &protocol.ExecRequest{Target: protocol.Target{Node: "node-0"}, Argv: []string{"false"}}, nil)
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
		if res.Succeeded != 0 || len(res.Results) != 1 || res.Results[0].ExitCode != 1 {
			forged++
		}
	}
	if forged > 0 {
		t.Fatalf("%d of 20 failing jobs came back with a forged result", forged)
	}
	if !errs.violated(protocol.SubjectExec) {
		t.Errorf("no permissions violation for the queue subscription: %v", errs.errs)
	}
}

// Without credentials neither lease.close on a live run nor a
// tether.v1.stream dial gets anywhere: the connection is refused, and the
// run's lease stays open.
func TestAttackLeaseCloseAndStreamWithoutCredentials(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Gateways: &fleettest.GatewayOptions{}})
	ctx := attackCtx(t)
	if _, err := f.Client.OpenLease(ctx, "victim-run", time.Minute, "victim"); err != nil {
		t.Fatal(err)
	}
	nc, err := anonymous(f)
	if err == nil {
		defer nc.Close()
		c := client.New(nc)
		closed, cerr := c.CloseLease(ctx, "victim-run")
		st, serr := c.OpenStream(ctx, "node-0", protocol.KindExec, protocol.ExecParams{Argv: []string{"id"}})
		if serr == nil {
			st.Close()
		}
		t.Errorf("an anonymous client connected: lease.close %+v, %v; stream %v", closed, cerr, serr)
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("anonymous connect: %v, want %v", err, nats.ErrAuthorization)
	}
	if _, err := f.Client.RenewLease(ctx, "victim-run"); err != nil {
		t.Fatalf("the victim's lease after the attack: %v", err)
	}
}

// A client user can neither write the KV bucket tether_locks (through the
// KV API or a raw publish to $KV) nor reach the JetStream API at all.
func TestAttackKVWriteRefused(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Gateways: &fleettest.GatewayOptions{}})
	ctx := attackCtx(t)
	nc, errs := mallory(t, f)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if kv, err := js.KeyValue(short, "tether_locks"); err == nil {
		_, perr := kv.Put(short, "reaper", []byte("forged"))
		t.Errorf("a client user opened tether_locks (put: %v)", perr)
	}
	if err := nc.Publish("$KV.tether_locks.reaper", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Request("$JS.API.INFO", nil, 2*time.Second); err == nil {
		t.Error("a client user got an answer from the JetStream API")
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if !errs.violated("$KV.tether_locks.reaper") {
		t.Errorf("no permissions violation for the publish to $KV: %v", errs.errs)
	}
	ijs, err := jetstream.New(inspector(t, f))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := ijs.KeyValue(ctx, "tether_locks")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "reaper"); err == nil && string(e.Value()) == "forged" {
		t.Fatal("the forged reaper lock is in tether_locks")
	}
}

// A client user cannot publish into another user's pipe, even when it
// knows the pipe's subject: the coordinator drops what the opener did not
// send, and the victim's stream goes on untouched.
func TestAttackPipeInjectionIgnored(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	ctx := attackCtx(t)
	params, _ := json.Marshal(protocol.ExecParams{Argv: []string{"cat"}, Stdin: true})
	body, _ := json.Marshal(protocol.StreamRequest{Node: "node-0", Kind: "exec", Params: params})
	p, err := natspipe.Dial(ctx, f.NC, protocol.SubjectStream, nil, body, natspipe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// Mallory writes stdin as the victim's first data message, then
	// closes the pipe, on the subject the coordinator receives on.
	nc, _ := mallory(t, f)
	var frame strings.Builder
	protocol.WriteFrame(&frame, protocol.FrameStdin, []byte("INJECTED\n"))
	inject := []*nats.Msg{
		{Subject: p.Peer(), Header: nats.Header{protocol.HeaderPipeOp: {"data"}, protocol.HeaderPipeSeq: {"0"}}, Data: []byte(frame.String())},
		{Subject: p.Peer(), Header: nats.Header{protocol.HeaderPipeOp: {"close"}, protocol.HeaderPipeError: {"injected"}}},
	}
	for _, m := range inject {
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	go func() {
		protocol.WriteFrame(p, protocol.FrameStdin, []byte("hello\n"))
		protocol.WriteFrame(p, protocol.FrameStdinClose, nil)
		p.CloseWrite()
	}()
	out, es := readExec(t, p)
	if out != "hello\n" || es.ExitCode != 0 {
		t.Fatalf("the victim's stream: stdout %q, exit %d", out, es.ExitCode)
	}
}
