package natsauth

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/protocol"
)

// BenchmarkImportCost splits what the CLIENTS→TETHER service import costs
// an exec-shaped request (one request, two streamed replies, a reply
// subscription per request as client.Exec makes), four ways interleaved in
// one loop so that load falls on all alike:
//
//   - same: the caller is in the responder's account (no import; how the
//     anonymous single-account fleet runs);
//   - share-false: through a config-mode import without share (the server
//     stamps only the account and RTT);
//   - share-true: through a config-mode import with share (the stamped
//     header names the user, but carries no JWT);
//   - operator-same: a coordinator user of this package's Layout (operator
//     mode, JetStream on), in TETHER with the responder: no import;
//   - operator: a client user of the Layout, through its import (share:
//     true: the header carries the user JWT), the setup Tether runs.
//
// It reports each path's median in µs and the ratio of each median to
// same's (operator's also to operator-same's). share-false minus same is
// what any import costs (the response mapping of each reply included),
// share-true minus share-false what naming the user costs, and operator
// minus operator-same less share-true minus same what the JWT adds.
func BenchmarkImportCost(b *testing.B) {
	conf := filepath.Join(b.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(`
accounts {
  T: { users: [{user: t, password: t}], exports: [{service: "tether.v1.>", response_type: stream}] }
  C: { users: [{user: c, password: c}], imports: [{service: {account: T, subject: "tether.v1.>"}, share: true}] }
  N: { users: [{user: n, password: n}], imports: [{service: {account: T, subject: "tether.v1.>"}}] }
}
`), 0o600); err != nil {
		b.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		b.Fatal(err)
	}
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", server.RANDOM_PORT, true, true
	cs := runServer(b, opts)
	l := testLayout(b, Config{})
	ops := startServer(b, l)

	twice := func(nc *nats.Conn) {
		if _, err := nc.Subscribe(protocol.SubjectExec, func(m *nats.Msg) {
			nc.Publish(m.Reply, []byte(`{"node":"n"}`))
			nc.Publish(m.Reply, []byte(`{"id":"x"}`))
		}); err != nil {
			b.Fatal(err)
		}
		nc.Flush()
	}
	userConn := func(user string) *nats.Conn {
		nc, err := nats.Connect(cs.ClientURL(), nats.UserInfo(user, user))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		return nc
	}
	twice(userConn("t"))
	coord, _ := connect(b, ops, mintCoordinator(b, l, "c1"))
	twice(coord)
	alice, _ := connect(b, ops, mintClient(b, l, "alice"))
	c2, _ := connect(b, ops, mintCoordinator(b, l, "c2"))
	paths := []struct {
		name string
		nc   *nats.Conn
		lat  []time.Duration
	}{
		{name: "same", nc: userConn("t")},
		{name: "share-false", nc: userConn("n")},
		{name: "share-true", nc: userConn("c")},
		{name: "operator-same", nc: c2},
		{name: "operator", nc: alice},
	}
	ch := make(chan *nats.Msg, 4)
	do := func(nc *nats.Conn) time.Duration {
		t0 := time.Now()
		inbox := nc.NewInbox()
		sub, err := nc.ChanSubscribe(inbox, ch)
		if err != nil {
			b.Fatal(err)
		}
		if err := nc.PublishRequest(protocol.SubjectExec, inbox, []byte(`{"target":{"node":"n"},"argv":["/bin/true"]}`)); err != nil {
			b.Fatal(err)
		}
		nc.Flush()
		for range 2 {
			select {
			case <-ch:
			case <-time.After(wait):
				b.Fatal("no reply")
			}
		}
		sub.Unsubscribe()
		return time.Since(t0)
	}
	for range 200 {
		for i := range paths {
			do(paths[i].nc)
		}
	}
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for k := range paths {
			p := &paths[(n+k)%len(paths)] // rotate which goes first
			p.lat = append(p.lat, do(p.nc))
		}
	}
	b.StopTimer()
	med := func(l []time.Duration) float64 {
		s := slices.Clone(l)
		slices.Sort(s)
		return float64(s[len(s)/2].Nanoseconds()) / 1e3
	}
	base := med(paths[0].lat)
	for _, p := range paths {
		b.ReportMetric(med(p.lat), p.name+"-p50-µs")
		if p.name != "same" {
			b.ReportMetric(med(p.lat)/base, p.name+"/same")
		}
	}
	b.ReportMetric(med(paths[4].lat)/med(paths[3].lat), "operator/operator-same")
	// Each reply subscription was dropped: the server should have dropped
	// its streamed response mapping with it, or they pile up until the
	// response threshold.
	b.ReportMetric(float64(pending(b, ops, l, "")), "mappings-left")
}
