package natsauth

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkRequestRoundTrip measures one request/reply round trip three
// ways, interleaved in the same loop so that load on the machine hits all
// three alike: a TETHER caller in its own account (today's setup, no
// identity), a CLIENTS caller through the import (share: true stamps
// Nats-Request-Info), and the same through the import with the responder
// calling Identify. It reports each in ns per request and the ratios to the
// same-account round trip.
func BenchmarkRequestRoundTrip(b *testing.B) {
	l := testLayout(b, Config{})
	s := startServer(b, l)
	coord, _ := connect(b, s, mintCoordinator(b, l, "c1"))
	v := l.Verifier()
	ok := []byte("ok")
	if _, err := coord.QueueSubscribe(protocol.SubjectNodes, "q", func(m *nats.Msg) { m.Respond(ok) }); err != nil {
		b.Fatal(err)
	}
	if _, err := coord.QueueSubscribe(protocol.SubjectJobStatus, "q", func(m *nats.Msg) {
		if _, err := v.Identify(m.Header); err != nil {
			m.Respond([]byte(err.Error()))
			return
		}
		m.Respond(ok)
	}); err != nil {
		b.Fatal(err)
	}
	coord.Flush()
	same, _ := connect(b, s, mintCoordinator(b, l, "c2"))
	client, _ := connect(b, s, mintClient(b, l, "alice"))
	do := func(nc *nats.Conn, subject string) time.Duration {
		t0 := time.Now()
		m, err := nc.Request(subject, []byte("{}"), wait)
		d := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if string(m.Data) != "ok" {
			b.Fatalf("reply %q", m.Data)
		}
		return d
	}
	// Warm up each path (inbox subscriptions, the verifier's cache).
	for range 100 {
		do(same, protocol.SubjectNodes)
		do(client, protocol.SubjectNodes)
		do(client, protocol.SubjectJobStatus)
	}
	var dSame, dImport, dIdent time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Rotate the order so none always runs first.
		switch i % 3 {
		case 0:
			dSame += do(same, protocol.SubjectNodes)
			dImport += do(client, protocol.SubjectNodes)
			dIdent += do(client, protocol.SubjectJobStatus)
		case 1:
			dImport += do(client, protocol.SubjectNodes)
			dIdent += do(client, protocol.SubjectJobStatus)
			dSame += do(same, protocol.SubjectNodes)
		default:
			dIdent += do(client, protocol.SubjectJobStatus)
			dSame += do(same, protocol.SubjectNodes)
			dImport += do(client, protocol.SubjectNodes)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(dSame.Nanoseconds())/n, "same-ns/req")
	b.ReportMetric(float64(dImport.Nanoseconds())/n, "import-ns/req")
	b.ReportMetric(float64(dIdent.Nanoseconds())/n, "import+identify-ns/req")
	b.ReportMetric(float64(dImport)/float64(dSame), "import/same")
	b.ReportMetric(float64(dIdent)/float64(dSame), "identify/same")
	if p := pending(b, s, l, ""); p > 0 {
		b.Logf("%d response mappings left (singleton exports should leave none)", p)
	}
}

// BenchmarkIdentify measures Identify on a header as the server stamps it:
// cached (this header value seen before: a map lookup and the checks),
// new connection (the user's JWT seen before, the header value not: JSON
// decoding too) and cold (the JWT's signature verified too).
func BenchmarkIdentify(b *testing.B) {
	l := testLayout(b, Config{})
	alice := mintClient(b, l, "alice")
	h := stamp(l.AccountKey(AccountClients), alice.PublicKey(), alice.JWT, mustPublic(l.clientSigner))
	b.Run("cached", func(b *testing.B) {
		v := l.Verifier()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := v.Identify(h); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new connection", func(b *testing.B) {
		v := l.Verifier()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			v.mu.Lock()
			clear(v.headers)
			v.mu.Unlock()
			if _, err := v.Identify(h); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cold", func(b *testing.B) {
		v := l.Verifier()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			v.mu.Lock()
			clear(v.cache)
			clear(v.headers)
			v.mu.Unlock()
			if _, err := v.Identify(h); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// micro.Headers is nats.Header under another name: a micro handler passes
// nats.Header(req.Headers()) to Identify.
var _ nats.Header = nats.Header(micro.Headers{})
