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
