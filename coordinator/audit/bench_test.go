package audit

import (
	"io"
	"log/slog"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkRecord: what Record costs its caller, a request handler (a JSON
// log line and a queue send; the publish runs on the publisher's
// goroutine), with a queue large enough that nothing is dropped.
//
// Run: go test -run '^$' -bench Record -benchtime 5000x ./coordinator/audit
func BenchmarkRecord(b *testing.B) {
	f := newFixture(b, func(c *Config) {
		c.QueueSize = b.N + 1
		c.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	})
	p := protocol.ExecParams{Argv: []string{"/bin/true"}, Env: map[string]string{"A": "1"}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		code := 0
		f.r.Record(&protocol.AuditEvent{Identity: "nats:alice", Operation: "exec", Result: protocol.AuditOK, JobID: "j",
			Nodes: []string{"node-0"}, Command: protocol.AuditExecCommand(&p), ExitCode: &code, DurationMS: 1.5})
	}
	b.StopTimer()
	f.waitStored(b, uint64(b.N))
}
