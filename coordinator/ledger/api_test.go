package ledger_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
)

// apiClient sends API requests and decodes replies or APIErrors.
type apiClient struct {
	t  *testing.T
	nc *nats.Conn
}

// call sends req to subject and decodes the reply into resp; it returns
// the APIError of an error reply.
func (c apiClient) call(subject string, req, resp any) *protocol.APIError {
	c.t.Helper()
	var body []byte
	switch r := req.(type) {
	case string:
		body = []byte(r)
	default:
		body, _ = json.Marshal(req)
	}
	msg, err := c.nc.Request(subject, body, defaultTestTimeout)
	if err != nil {
		c.t.Fatalf("request %s: %v", subject, err)
	}
	if msg.Header.Get(micro.ErrorCodeHeader) != "" {
		var e protocol.APIError
		if err := json.Unmarshal(msg.Data, &e); err != nil {
			c.t.Fatalf("%s: undecodable error %q: %v", subject, msg.Data, err)
		}
		if fmt.Sprint(e.Status) != msg.Header.Get(micro.ErrorCodeHeader) {
			c.t.Errorf("%s: error header %s, body status %d", subject, msg.Header.Get(micro.ErrorCodeHeader), e.Status)
		}
		return &e
	}
	if err := json.Unmarshal(msg.Data, resp); err != nil {
		c.t.Fatalf("%s: undecodable reply %q: %v", subject, msg.Data, err)
	}
	return nil
}

func TestAPI(t *testing.T) {
	re := newReaperEnv(t)
	svc, err := micro.AddService(re.l.nc, micro.Config{Name: protocol.ServiceName, Version: "0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	if err := re.l.AddEndpoints(svc, re.r); err != nil {
		t.Fatal(err)
	}
	if err := re.l.nc.Flush(); err != nil { // subscriptions first, then requests
		t.Fatal(err)
	}
	c := apiClient{t, re.conn()}

	// Leases.
	var ls protocol.LeaseInfo
	if e := c.call(protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "run-1", TTLMS: 30000, Holder: "h"}, &ls); e != nil {
		t.Fatal(e)
	}
	if ls.Run != "run-1" || ls.TTLMS != 30000 || !ls.ExpiresAt.Equal(re.clock.Now().Add(30*time.Second)) {
		t.Errorf("open = %+v", ls)
	}
	re.clock.Advance(10 * time.Second)
	if e := c.call(protocol.SubjectLeaseRenew, protocol.LeaseRequest{Run: "run-1"}, &ls); e != nil || !ls.ExpiresAt.Equal(re.clock.Now().Add(30*time.Second)) {
		t.Errorf("renew = %+v, %v", ls, e)
	}
	for _, tc := range []struct {
		subject string
		req     any
		status  int
		code    string
	}{
		{protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "bad/run"}, 400, protocol.ErrCodeInvalid},
		{protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "r", TTLMS: 5}, 400, protocol.ErrCodeInvalid},
		{protocol.SubjectLeaseOpen, `{"run":"r","bogus":1}`, 400, protocol.ErrCodeUnknownField},
		{protocol.SubjectLeaseRenew, protocol.LeaseRequest{Run: "unknown"}, 404, protocol.ErrCodeNotFound},
		{protocol.SubjectSandboxesList, protocol.SandboxesListRequest{State: "zombie"}, 400, protocol.ErrCodeInvalid},
		{protocol.SubjectSandboxesRegister, protocol.SandboxRegisterRequest{Provider: "docker", Node: "n1", ID: "x"}, 400, protocol.ErrCodeInvalid},
		{protocol.SubjectSandboxesReap, protocol.ReapRequest{}, 400, protocol.ErrCodeInvalid},
	} {
		e := c.call(tc.subject, tc.req, &struct{}{})
		if e == nil || e.Status != tc.status || e.Code != tc.code {
			t.Errorf("%s %v: error %v, want %d %s", tc.subject, tc.req, e, tc.status, tc.code)
		}
	}

	// Registration and listing, paged.
	re.l.reconcile(t, "n1", re.clock.Now(), nil, complete())
	for i := range 5 {
		var info protocol.SandboxInfo
		req := protocol.SandboxRegisterRequest{Provider: protocol.ProviderOpenShell, Node: "n1", ID: fmt.Sprintf("id-%d", i), Name: fmt.Sprintf("sb-%d", i), Workspace: "default", Run: "run-1", TTLMS: 3_600_000}
		if e := c.call(protocol.SubjectSandboxesRegister, req, &info); e != nil {
			t.Fatal(e)
		}
		if info.State != protocol.SandboxLive || info.Source != protocol.SourceRegister || !info.Managed || info.Owner != "run-1" || info.TTLMS != 3_600_000 || info.Revision == 0 {
			t.Errorf("registered = %+v", info)
		}
	}
	var ids []string
	after := ""
	for pages := 0; ; pages++ {
		var page protocol.SandboxesListResponse
		if e := c.call(protocol.SubjectSandboxesList, protocol.SandboxesListRequest{Run: "run-1", Limit: 2, After: after}, &page); e != nil {
			t.Fatal(e)
		}
		for _, s := range page.Sandboxes {
			ids = append(ids, s.ID)
		}
		if page.Next == "" {
			if pages != 2 {
				t.Errorf("%d pages, want 3", pages+1)
			}
			break
		}
		after = page.Next
	}
	if fmt.Sprint(ids) != "[id-0 id-1 id-2 id-3 id-4]" {
		t.Errorf("listed %v", ids)
	}

	// Reap: a dry run lists what the reap would (as if the run were
	// closed), a real one closes the run and queues.
	var rr protocol.ReapResponse
	if e := c.call(protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: "run-1", DryRun: true}, &rr); e != nil {
		t.Fatal(e)
	}
	if !rr.DryRun || rr.Queued || len(rr.Candidates) != 5 || rr.Candidates[0].Reason != protocol.ReasonRunClosed {
		t.Errorf("dry run with a live lease = %+v", rr)
	}
	if e := c.call(protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: "run-1"}, &rr); e != nil {
		t.Fatal(e)
	}
	if !rr.Queued || len(rr.Candidates) != 5 || rr.Candidates[0].Reason != protocol.ReasonRunClosed {
		t.Errorf("reap = %+v", rr)
	}
	if e := c.call(protocol.SubjectLeaseRenew, protocol.LeaseRequest{Run: "run-1"}, &ls); e == nil || e.Status != 409 || e.Code != protocol.ErrCodeLeaseClosed {
		t.Errorf("renew after reap: %v, want 409 lease_closed", e)
	}
	if p := re.pass(t); p.Reaped != 5 {
		t.Errorf("pass after reap request = %+v", p)
	}
	var closed protocol.LeaseInfo
	if e := c.call(protocol.SubjectLeaseClose, protocol.LeaseRequest{Run: "run-1"}, &closed); e != nil || !closed.Closed {
		t.Errorf("close again = %+v, %v", closed, e)
	}
	var page protocol.SandboxesListResponse
	if e := c.call(protocol.SubjectSandboxesList, protocol.SandboxesListRequest{State: protocol.SandboxDeleted}, &page); e != nil || len(page.Sandboxes) != 5 {
		t.Errorf("list deleted = %d records, %v", len(page.Sandboxes), e)
	}
	// The API states match the ledger's.
	if got := re.l.List(ledger.Filter{State: protocol.SandboxDeleted}); len(got) != 5 {
		t.Errorf("ledger has %d deleted", len(got))
	}
}
