package coordinator

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// An agent's channel event is audited with a reason only when it was
// refused: local_policy for a refused channel, the agent's reason for a
// refused login (login_not_granted, local_policy), unauthenticated for a
// failed authentication; a failed channel has none.
func TestSSHAuditEventReasons(t *testing.T) {
	rec := &sshSession{identity: "ssh-key:SHA256:x", node: "node-a", start: time.Now()}
	cases := []struct {
		name             string
		ev               protocol.SSHChannelEvent
		result, reason   string
		runAs, errorText string
	}{
		{"refused exec", protocol.SSHChannelEvent{Type: protocol.SSHChannelExec, Login: "root", Result: protocol.AuditRefused, Error: "exec refused by the local policy: no"},
			protocol.AuditRefused, protocol.AuditReasonLocalPolicy, "root", "exec refused by the local policy: no"},
		{"exec past the limit", protocol.SSHChannelEvent{Type: protocol.SSHChannelExec, Login: "root", Result: protocol.AuditFailed, Error: "start: node node-a is running 1 execs, its limit"},
			protocol.AuditFailed, "", "root", "start: node node-a is running 1 execs, its limit"},
		{"channel closed before a request", protocol.SSHChannelEvent{Type: protocol.SSHChannelShell, Login: "root", Result: protocol.AuditFailed, Error: "the channel was closed before any command was requested"},
			protocol.AuditFailed, "", "root", "the channel was closed before any command was requested"},
		{"login not granted", protocol.SSHChannelEvent{Type: protocol.SSHChannelAuth, Login: "daemon", Reason: protocol.AuditReasonLoginNotGranted, Result: protocol.AuditRefused, Error: "login daemon is not one of the logins"},
			protocol.AuditRefused, protocol.AuditReasonLoginNotGranted, "daemon", "login daemon is not one of the logins"},
		{"login refused by the local policy", protocol.SSHChannelEvent{Type: protocol.SSHChannelAuth, Login: "svc", Reason: protocol.AuditReasonLocalPolicy, Result: protocol.AuditRefused, Error: "login svc refused"},
			protocol.AuditRefused, protocol.AuditReasonLocalPolicy, "svc", "login svc refused"},
		{"wrong key", protocol.SSHChannelEvent{Type: protocol.SSHChannelAuth, Login: "root", Result: protocol.AuditRefused, Error: "key is not the key the coordinator vouched for"},
			protocol.AuditRefused, protocol.ErrCodeUnauthenticated, "root", "key is not the key the coordinator vouched for"},
		{"unknown agent reason", protocol.SSHChannelEvent{Type: protocol.SSHChannelAuth, Reason: "made-up", Result: protocol.AuditRefused, Error: "x"},
			protocol.AuditRefused, protocol.ErrCodeUnauthenticated, "", "x"},
	}
	for _, c := range cases {
		c.ev.Session = "0123456789abcdef0123456789abcdef"
		if err := checkSSHChannelEvent(&c.ev); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := sshAuditEvent("node-a", rec, &c.ev)
		if got.Result != c.result || got.Reason != c.reason || got.RunAs != c.runAs || got.Error != c.errorText {
			t.Errorf("%s: result %q reason %q run_as %q error %q; want %q %q %q %q", c.name,
				got.Result, got.Reason, got.RunAs, got.Error, c.result, c.reason, c.runAs, c.errorText)
		}
	}
}
