package coordinator

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/protocol"
)

// TestFanoutPartOf: only a detached exec that came over a node subject
// from a coordinator, marked as a part of the job with its own id, is a
// part of another coordinator's fan-out (written no record of its own); a
// client's request on the public subject with the same headers is not.
func TestFanoutPartOf(t *testing.T) {
	marked := nats.Header{HeaderForwardedBy: []string{"c1"}, headerFanoutRun: []string{"job-x"}}
	for _, tc := range []struct {
		name     string
		subject  string
		header   nats.Header
		id       string
		detached bool
		want     bool
	}{
		{"forwarded detached part", nodeSubject("n1", "exec"), marked, "job-x", true, true},
		{"public subject, forged headers", protocol.SubjectExec, marked, "job-x", true, false},
		{"attached part", nodeSubject("n1", "exec"), marked, "job-x", false, false},
		{"part of another job", nodeSubject("n1", "exec"), marked, "job-y", true, false},
		{"no forwarder", nodeSubject("n1", "exec"), nats.Header{headerFanoutRun: []string{"job-x"}}, "job-x", true, false},
		{"single-node forward", nodeSubject("n1", "exec"), nats.Header{HeaderForwardedBy: []string{"c1"}}, "job-x", true, false},
	} {
		req := &forwardedRequest{msg: &nats.Msg{Subject: tc.subject, Header: tc.header}}
		var r micro.Request = noReply{req} // wrapped, as the guard does
		if got := fanoutPartOf(r, tc.id, tc.detached); got != tc.want {
			t.Errorf("%s: fanoutPartOf = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A client's exec on the public subject loses the headers only
// coordinators may set, so neither the forward to the node's holder (which
// copies the request's headers onto a node subject) nor the job-slot
// check takes it for a fan-out's part; a request that came over a node
// subject keeps them (review: a forged Tether-Fanout-Run was forwarded
// and ran unrecorded on the holder).
func TestDropCoordinatorHeaders(t *testing.T) {
	forged := func() nats.Header {
		return nats.Header{HeaderForwardedBy: []string{"c1"}, HeaderForwardReply: []string{"_INBOX.x"}, headerFanoutRun: []string{"job-x"}, "Other": []string{"kept"}}
	}
	pub := &forwardedRequest{msg: &nats.Msg{Subject: protocol.SubjectExec, Header: forged()}}
	dropCoordinatorHeaders(noReply{pub})
	if h := pub.msg.Header; len(h) != 1 || h.Get("Other") != "kept" {
		t.Errorf("public subject: headers left %v, want only Other", h)
	}
	node := &forwardedRequest{msg: &nats.Msg{Subject: nodeSubject("n1", "exec"), Header: forged()}}
	dropCoordinatorHeaders(noReply{node})
	if h := node.msg.Header; len(h) != 4 {
		t.Errorf("node subject: headers left %v, want all 4", h)
	}
}
