package coordinator_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
)

// failingAgent writes stderr and exits with code, reporting failed.
func failingAgent(stderr []byte, code int, failed *int) func(*fakeAgent, *yamux.Stream, protocol.ExecParams) {
	return func(_ *fakeAgent, st *yamux.Stream, _ protocol.ExecParams) {
		stderr := stderr
		for len(stderr) > 0 {
			n := min(len(stderr), protocol.ChunkSize)
			protocol.WriteFrame(st, protocol.FrameStderr, stderr[:n])
			stderr = stderr[n:]
		}
		protocol.WriteJSONFrame(st, protocol.FrameExit, &protocol.ExitStatus{ExitCode: code, FailedCommand: failed})
	}
}

func intp(i int) *int { return &i }

// A failed node's result carries NeMo Gym's error text (wire-facts §4.1).
func TestExecFailureText(t *testing.T) {
	h := newHarness(t, nil)
	h.dialAgent(t, agentOpts{id: "ng1", handler: failingAgent([]byte("  boom\n\n"), 1, nil)})
	h.dialAgent(t, agentOpts{id: "ff", handler: failingAgent([]byte("no such dir\n"), 2, intp(1))})
	big := append(bytes.Repeat([]byte("a"), 70<<10), "\nlast line\n"...)
	h.dialAgent(t, agentOpts{id: "big", handler: failingAgent(big, 5, nil)})
	tests := []struct {
		name string
		req  protocol.ExecRequest
		want string
	}{
		{"NG-1: a batch runs as bash -s", protocol.ExecRequest{Target: protocol.Target{Node: "ng1"}, Commands: []string{"echo a", "false"}},
			"Command failed (exec on ng1) with exit code 1:\n  bash -s\nboom"},
		{"a script runs as bash -s", protocol.ExecRequest{Target: protocol.Target{Node: "ng1"}, Script: "false"},
			"Command failed (exec on ng1) with exit code 1:\n  bash -s\nboom"},
		{"argv joined by spaces", protocol.ExecRequest{Target: protocol.Target{Node: "ng1"}, Argv: []string{"ls", "-l", "/x y"}},
			"Command failed (exec on ng1) with exit code 1:\n  ls -l /x y\nboom"},
		{"fail-fast shows the failing command", protocol.ExecRequest{Target: protocol.Target{Node: "ff"}, Commands: []string{"true", "cd /nope", "echo"}, FailFast: true},
			"Command failed (exec on ff) with exit code 2:\n  cd /nope\nno such dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.exec(tt.req)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if got := r.result.Results[0].Failure; got != tt.want {
				t.Errorf("failure = %q, want %q", got, tt.want)
			}
		})
	}
	if r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "ff"}, Commands: []string{"true", "x"}, FailFast: true}); r.result.Results[0].FailedCommand == nil || *r.result.Results[0].FailedCommand != 1 {
		t.Errorf("failed_command = %v, want 1", r.result.Results[0].FailedCommand)
	}

	// Only the last 64 KiB of stderr are kept.
	r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "big"}, Argv: []string{"x"}})
	f := r.result.Results[0].Failure
	head := "Command failed (exec on big) with exit code 5:\n  x\n"
	if !strings.HasPrefix(f, head) || !strings.HasSuffix(f, "\nlast line") || len(f)-len(head) > 64<<10 || len(f)-len(head) < 60<<10 {
		t.Errorf("failure of %d bytes: %.80q...", len(f), f)
	}
}

// A silent job gets keepalive replies, in the reply sequence.
func TestExecKeepAlive(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.KeepAliveInterval = 40 * time.Millisecond })
	// A silent workload that ends only once its client has seen three
	// keepalives: the count is the property, not how many fit in some time.
	const want = 3
	release := make(chan struct{})
	h.dialAgent(t, agentOpts{id: "n1", handler: func(_ *fakeAgent, st *yamux.Stream, _ protocol.ExecParams) {
		select {
		case <-release:
		case <-t.Context().Done():
		}
		protocol.WriteJSONFrame(st, protocol.FrameExit, &protocol.ExitStatus{})
	}})
	inbox := h.client.NewInbox()
	sub, err := h.client.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	body := mustJSON(t, protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"x"}})
	if err := h.client.PublishRequest(protocol.SubjectExec, inbox, body); err != nil {
		t.Fatal(err)
	}
	keepalives := 0
	var seqd []*nats.Msg
	for done := false; !done; {
		m, err := sub.NextMsg(defaultTestTimeout)
		if err != nil {
			t.Fatalf("after %d keepalives of a silent job (want %d): %v", keepalives, want, err)
		}
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			t.Fatalf("exec failed: %s %s", code, m.Data)
		}
		switch m.Header.Get(protocol.HeaderType) {
		case protocol.ReplyKeepAlive:
			if keepalives++; keepalives == want {
				close(release)
			}
		case protocol.ReplyProbe:
			if m.Header.Get(protocol.HeaderSeq) != "" {
				t.Errorf("probe with a sequence number")
			}
			continue
		case protocol.ReplyResult:
			done = true
		}
		seqd = append(seqd, m)
	}
	checkSeq(t, execReply{msgs: seqd})
}

// untilCancel is a fake agent's exec handler for a job that runs until
// it is cancelled: it closes cancelled when the cancel frame comes, then
// exits 137 cancelled.
func untilCancel(cancelled chan struct{}) func(*fakeAgent, *yamux.Stream, protocol.ExecParams) {
	return func(_ *fakeAgent, st *yamux.Stream, _ protocol.ExecParams) {
		fr := protocol.NewFrameReader(st)
		for {
			f, err := fr.Next()
			if err != nil {
				return
			}
			if f.Type == protocol.FrameCancel {
				close(cancelled)
				protocol.WriteJSONFrame(st, protocol.FrameExit, &protocol.ExitStatus{ExitCode: 137, Cancelled: true})
				return
			}
		}
	}
}

// A client whose heartbeats stop (its reply subscription gone) gets its
// job cancelled; heartbeats for the job from another user do not keep it
// alive.
func TestExecClientGoneCancelsJob(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.KeepAliveInterval = 30 * time.Millisecond })
	cancelled := make(chan struct{})
	h.dialAgent(t, agentOpts{id: "n1", handler: untilCancel(cancelled)})
	inbox := h.client.NewInbox()
	sub, err := h.client.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	body := mustJSON(t, protocol.ExecRequest{ID: "orphan", Target: protocol.Target{Node: "n1"}, Argv: []string{"x"}})
	if err := h.client.PublishRequest(protocol.SubjectExec, inbox, body); err != nil {
		t.Fatal(err)
	}
	alive := func(nc *nats.Conn) {
		nc.PublishMsg(&nats.Msg{Subject: protocol.SubjectExecAlive, Header: nats.Header{protocol.HeaderJob: {"orphan"}}})
	}
	// Answer keepalives and probes for a while, as the client package
	// does: the job keeps running.
	for i := 0; i < 2*3+2; i++ {
		if _, err := sub.NextMsg(defaultTestTimeout); err != nil {
			t.Fatalf("no reply: %v", err)
		}
		alive(h.client)
	}
	select {
	case <-cancelled:
		t.Fatal("the job of a client that sends heartbeats was cancelled")
	default:
	}
	// Then go away, while another user keeps sending heartbeats for it.
	sub.Unsubscribe()
	mallory := h.env.Client(t, "mallory")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				alive(mallory)
			}
		}
	}()
	select {
	case <-cancelled:
	case <-time.After(defaultTestTimeout):
		t.Fatal("the job of a vanished client was not cancelled")
	}
}

// A client that says it will send heartbeats (protocol.HeaderHeartbeats,
// as the client package does) and vanishes before the first keepalive
// has its job cancelled too: it used to count as a client that never
// sends any (the nats CLI), so `tether exec` killed in its first seconds
// left its job running to its timeout. One that does not say so (the
// nats CLI) is left running, as before.
func TestExecClientGoneBeforeFirstHeartbeat(t *testing.T) {
	for _, promised := range []bool{true, false} {
		t.Run(fmt.Sprintf("promised=%v", promised), func(t *testing.T) {
			h := newHarness(t, func(c *coordinator.Config) { c.KeepAliveInterval = 30 * time.Millisecond })
			cancelled := make(chan struct{})
			h.dialAgent(t, agentOpts{id: "n1", handler: untilCancel(cancelled)})
			body := mustJSON(t, protocol.ExecRequest{ID: "early", Target: protocol.Target{Node: "n1"}, Argv: []string{"x"}})
			msg := &nats.Msg{Subject: protocol.SubjectExec, Reply: h.client.NewInbox(), Data: body, Header: nats.Header{}}
			if promised {
				msg.Header.Set(protocol.HeaderHeartbeats, "1")
			}
			// Nobody reads the replies or sends a heartbeat: the client
			// died right after its request.
			if err := h.client.PublishMsg(msg); err != nil {
				t.Fatal(err)
			}
			wait := defaultTestTimeout
			if !promised {
				wait = 30 * 30 * time.Millisecond // 30 keepalive intervals
			}
			select {
			case <-cancelled:
				if !promised {
					t.Fatal("the job of a client that never promised heartbeats was cancelled")
				}
			case <-time.After(wait):
				if promised {
					t.Fatal("the job of a client that vanished before its first heartbeat was not cancelled")
				}
			}
		})
	}
}

// A coordinator that shuts down says so in the results of the jobs it
// cancels.
func TestShutdownResultSaysWhy(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.DrainTimeout = 50 * time.Millisecond })
	a := h.dialAgent(t, agentOpts{id: "n1", heartbeat: true})
	h.dialAgent(t, agentOpts{id: "n2", heartbeat: true})
	done := h.execAsync(protocol.ExecRequest{Target: protocol.Target{All: true}, Script: "hang", MaxParallel: 1})
	checkFor(t, defaultTestTimeout, func() error {
		if a.execs.Load() != 1 {
			return fmt.Errorf("agent has not seen the exec yet")
		}
		return nil
	})
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, res := range r.result.Results {
		if res.Error != "coordinator coord-test is shutting down; job cancelled" || res.ErrorCode != protocol.ResultCodeShutdown || !res.Cancelled {
			t.Errorf("result = %+v, want the shutdown error", res)
		}
	}
}

func TestJobEndpointErrors(t *testing.T) {
	h := newHarness(t, nil)
	h.dialAgent(t, agentOpts{id: "n1"})
	tests := []struct {
		name, subject string
		body          any
		status        string
		code          string
	}{
		{"unknown node", protocol.SubjectJobStatus, protocol.JobRequest{Node: "nope", ID: "j"}, "404", protocol.ErrCodeUnknownNode},
		{"bad id", protocol.SubjectJobCancel, protocol.JobRequest{Node: "n1", ID: "../x"}, "400", protocol.ErrCodeInvalid},
		{"bad stream", protocol.SubjectJobOutput, protocol.JobOutputRequest{Node: "n1", ID: "j", Stream: "stdin"}, "400", protocol.ErrCodeInvalid},
		{"limit too large", protocol.SubjectJobOutput, protocol.JobOutputRequest{Node: "n1", ID: "j", Stream: "stdout", Limit: 1 << 30}, "400", protocol.ErrCodeInvalid},
		// The fake agent closes job streams unanswered.
		{"no answer", protocol.SubjectJobStatus, protocol.JobRequest{Node: "n1", ID: "j"}, "503", protocol.ErrCodeUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := h.request(tt.subject, tt.body)
			var e protocol.APIError
			json.Unmarshal(m.Data, &e)
			if got := m.Header.Get(micro.ErrorCodeHeader); got != tt.status || e.Code != tt.code {
				t.Errorf("reply %s %+v, want %s %s", got, e, tt.status, tt.code)
			}
		})
	}
}
